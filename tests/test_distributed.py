"""Each process's share of the work: a deterministic partition."""

import pytest

from spec_jax import distributed


def test_share_is_a_deterministic_partition():
    work = list(range(11))
    shares = [distributed.share(work, i, 3) for i in range(3)]
    assert sorted(sum(shares, [])) == work
    assert shares == [distributed.share(work, i, 3) for i in range(3)]
    assert [len(s) for s in shares] == [4, 4, 3]
    with pytest.raises(ValueError, match='process index 3 is not in'):
        distributed.share(work, 3, 3)


# One Slurm job of 2 nodes, one task each (launch/gpu/evaluate.sbatch), seen from node 0.
SLURM = {'SLURM_JOB_ID': '123', 'SLURM_STEP_NODELIST': 'node[01-02]', 'SLURM_NTASKS': '2',
         'SLURM_PROCID': '0', 'SLURM_LOCALID': '0', 'SLURM_NODEID': '0',
         'SLURM_STEP_TASKS_PER_NODE': '1(x2)'}  # fmt: skip


@pytest.fixture
def slurm(monkeypatch):
    for name, value in SLURM.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv('CUDA_VISIBLE_DEVICES', raising=False)
    monkeypatch.delenv('SLURM_GPUS_ON_NODE', raising=False)
    return monkeypatch


def test_slurm_one_task_a_node_gets_every_local_gpu(slurm):
    """JAX's detection alone gives ('node01:61563', 2, 0, [0]): 1 GPU of 8 a node."""
    slurm.setenv('CUDA_VISIBLE_DEVICES', '0,1,2,3,4,5,6,7')
    assert distributed.slurm_params() == ('node01:61563', 2, 0, list(range(8)))
    slurm.delenv('CUDA_VISIBLE_DEVICES')  # Without it, Slurm's count.
    slurm.setenv('SLURM_GPUS_ON_NODE', '4')
    assert distributed.slurm_params()[3] == [0, 1, 2, 3]


def test_slurm_task_per_gpu_keeps_jax_default(slurm):
    """8 tasks on a node, each seeing all 8 GPUs: task 5 takes GPU 5 (JAX's [SLURM_LOCALID])."""
    slurm.setenv('SLURM_STEP_TASKS_PER_NODE', '8(x2)')
    slurm.setenv('SLURM_NTASKS', '16')
    slurm.setenv('SLURM_PROCID', '5')
    slurm.setenv('SLURM_LOCALID', '5')
    slurm.setenv('CUDA_VISIBLE_DEVICES', '0,1,2,3,4,5,6,7')
    assert distributed.slurm_params() == ('node01:61563', 16, 5, [5])


def test_outside_slurm_jax_detects_everything(monkeypatch):
    for name in SLURM:
        monkeypatch.delenv(name, raising=False)
    assert distributed.slurm_params() == (None, None, None, None)


def test_local_gpu_count_without_a_backend(monkeypatch):
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', 'GPU-3f2a,GPU-77b1,GPU-0c9e')  # UUIDs too.
    assert distributed.local_gpu_count() == 3
    monkeypatch.setenv('CUDA_VISIBLE_DEVICES', '')  # Hidden: no GPU.
    assert distributed.local_gpu_count() is None
