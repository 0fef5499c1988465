"""Several processes (hosts) as one job: JAX's distributed runtime from flags or the
environment, each process's share of the work, and a barrier.

A job on a TPU pod slice or on several GPU nodes runs one process per host, all with the
same command. By default each process decodes on a mesh of its own devices
(`sharding.make_mesh`) and takes a deterministic share of the samples (`share`); with a
mesh over every host (`mesh_config(hosts='all')`) all processes decode every batch
together. The evaluation writes one results file per process and process 0 merges them
after a barrier (spec_jax/eval/records.py; docs/sharding.md, "Several hosts").

How the processes find each other (`initialize`), first that applies:
  - arguments (a launcher's --coordinator, --num_processes, --process_id flags);
  - $SPEC_JAX_COORDINATOR (host:port, or 'auto'), $SPEC_JAX_NUM_PROCESSES and
    $SPEC_JAX_PROCESS_ID;
  - coordinator 'auto': JAX's own cluster detection (Cloud TPU pods, SLURM, Open MPI, ...);
    under Slurm with one task on the node (launch/gpu/evaluate.sbatch) the process gets
    every local GPU (`slurm_params`), not JAX's default of GPU [$SLURM_LOCALID];
  - none of them: one process, nothing initialized.
"""

from __future__ import annotations

import glob
import json
import os
import re
from collections.abc import Sequence
from typing import TypeVar

import jax
import numpy as np
from absl import logging
from jax._src.clusters import ClusterEnv, SlurmCluster
from jax.experimental import multihost_utils

ENV_COORDINATOR = 'SPEC_JAX_COORDINATOR'
ENV_NUM_PROCESSES = 'SPEC_JAX_NUM_PROCESSES'
ENV_PROCESS_ID = 'SPEC_JAX_PROCESS_ID'
AUTO = 'auto'

T = TypeVar('T')


def initialize(
    coordinator: str = '',
    num_processes: int = 0,
    process_id: int = -1,
    heartbeat_timeout_s: int = 100,
) -> bool:
    """Starts JAX's distributed runtime when the arguments or the environment ask for it.

    Call it before anything touches a JAX device (a launcher's first step).

    Args:
      coordinator: 'host:port' of process 0's coordination service, 'auto' (JAX's cluster
        detection), or '' (then $SPEC_JAX_COORDINATOR, else one process).
      num_processes: how many processes (0: $SPEC_JAX_NUM_PROCESSES; 'auto' detects it).
      process_id: this process's index (-1: $SPEC_JAX_PROCESS_ID; 'auto' detects it).
      heartbeat_timeout_s: how long the others wait for a process that stopped answering
        before the whole job fails (a killed host ends the job; rerun it to resume).

    Returns:
      True when the runtime was started (several processes), False for one process.

    Raises:
      ValueError: an explicit coordinator without a process count or id, or an id out of
        range.
    """
    coordinator = coordinator or os.environ.get(ENV_COORDINATOR, '')
    if not coordinator:
        return False
    # The CPU backend's collectives (the barrier) need gloo; GPU and TPU use their own.
    jax.config.update('jax_cpu_collectives_implementation', 'gloo')
    if coordinator == AUTO:
        jax.distributed.initialize(*slurm_params(), heartbeat_timeout_seconds=heartbeat_timeout_s)
    else:
        count = num_processes or int(os.environ.get(ENV_NUM_PROCESSES, 0))
        index = process_id if process_id >= 0 else int(os.environ.get(ENV_PROCESS_ID, -1))
        if count < 1 or not 0 <= index < count:
            raise ValueError(
                f'coordinator {coordinator!r} needs the number of processes (got {count}) and '
                f'this process id in [0, {count}) (got {index}): pass --num_processes and '
                f'--process_id, or set ${ENV_NUM_PROCESSES} and ${ENV_PROCESS_ID}'
            )
        jax.distributed.initialize(
            coordinator, count, index, heartbeat_timeout_seconds=heartbeat_timeout_s
        )
    logging.info('process %d of %d, local devices %s', jax.process_index(),
                 jax.process_count(), jax.local_devices())  # fmt: skip
    return True


def slurm_params() -> tuple:
    """What `jax.distributed.initialize` gets under coordinator 'auto': (coordinator,
    process count, process id, local device ids), all None (JAX detects them) outside Slurm.

    Under Slurm, JAX's own detection (jax._src.clusters, what `initialize` runs) gives the
    coordinator, count and id, and local device ids [$SLURM_LOCALID]: right for one task
    per GPU, but a node running one task (the launchers' `--ntasks-per-node=1`) would then
    use 1 of its GPUs. With one task on this node the ids are every GPU the process sees
    (`local_gpu_count`); with several, or where the count is unknown, JAX's default stands.
    """
    if not SlurmCluster.is_env_present():
        return None, None, None, None
    gpus = local_gpu_count()
    ids = list(range(gpus)) if gpus and _slurm_tasks_on_node() == 1 else None
    params = ClusterEnv.auto_detect_unset_distributed_params(None, None, None, ids, 'slurm', None)
    return tuple(params)


def local_gpu_count() -> int | None:
    """The GPUs this process may use, known without starting a backend: the entries of
    $CUDA_VISIBLE_DEVICES (Slurm sets it to the job's GPUs), else $SLURM_GPUS_ON_NODE, else
    the /dev/nvidia<N> device files; None where none of them says (0 is None: no GPU)."""
    visible = os.environ.get('CUDA_VISIBLE_DEVICES')
    if visible is not None:
        entries = [v for v in visible.split(',') if v.strip() and v.strip() != '-1']
        return len(entries) or None
    if os.environ.get('SLURM_GPUS_ON_NODE', '').isdigit():
        return int(os.environ['SLURM_GPUS_ON_NODE']) or None
    files = [p for p in glob.glob('/dev/nvidia*') if re.fullmatch(r'/dev/nvidia\d+', p)]
    return len(files) or None


def _slurm_tasks_on_node() -> int | None:
    """Tasks of this step on this node: $SLURM_STEP_TASKS_PER_NODE (else the job's
    $SLURM_TASKS_PER_NODE), Slurm's compressed list ('2(x3),1') at $SLURM_NODEID."""
    spec = os.environ.get('SLURM_STEP_TASKS_PER_NODE') or os.environ.get('SLURM_TASKS_PER_NODE')
    counts = []
    for count, repeat in re.findall(r'(\d+)(?:\(x(\d+)\))?', spec or ''):
        counts += [int(count)] * int(repeat or 1)
    node = int(os.environ.get('SLURM_NODEID', 0))
    return counts[node] if node < len(counts) else None


def share(work: Sequence[T], index: int | None = None, count: int | None = None) -> list[T]:
    """Process `index`'s share of `work` (every `count`-th item from its index): a
    partition of `work` that depends only on its order and the process count, so a
    restarted job gives each process the same share (defaults: this process, all)."""
    index = jax.process_index() if index is None else index
    count = jax.process_count() if count is None else count
    if not 0 <= index < count:
        raise ValueError(f'process index {index} is not in [0, {count})')
    return list(work[index::count])


def barrier(name: str) -> None:
    """Waits until every process reaches the barrier `name` (nothing with one process)."""
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)


def from_main(value):
    """Process 0's `value` (anything JSON holds) on every process, as JSON decodes it (tuples
    become lists): one view of state that each process read on its own (a shared
    filesystem's cache may lag), for decisions every process must take alike."""
    if jax.process_count() == 1:
        return json.loads(json.dumps(value))
    data = np.frombuffer(json.dumps(value).encode(), np.uint8)
    size = int(multihost_utils.broadcast_one_to_all(np.int32(data.size)))
    mine = data if is_main() else np.zeros(size, np.uint8)
    return json.loads(np.asarray(multihost_utils.broadcast_one_to_all(mine)).tobytes())


def is_main() -> bool:
    """True on process 0, the one that writes reports and merged results."""
    return jax.process_index() == 0
