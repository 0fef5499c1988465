"""Running untrusted Python (model-written code and its tests) in a contained child process.

`run_python(source)` runs `source` in a fresh interpreter and returns a `RunResult`: whether it
ran to its end and exited 0 (`passed`), a `status` (`STATUSES`: a candidate's failure, a
timeout, or an infrastructure error, `RunResult.infrastructure_error`), the tails of its
stdout and stderr (control characters stripped), its CPU time and the seconds it took.
`run_many(sources, workers=2)` runs several at once on a small thread pool. Both are safe to
call from any thread: nothing runs Python between fork and exec in the caller (no
`preexec_fn`); the privileged set-up happens in a small launcher process (`launcher.py` run as
a script with the standard library only).

The package: this module (the caller side: `run_python`, `run_many`, `isolation_level`,
`missing_layers`), `launcher.py` (the privileged set-up, run by its path), `rootfs.py` (the
private root), `seccomp.py` (the syscall filter), `cgroups.py` (the run's cgroup: memory,
pids, CPU time), `harness.py` (the code around the source in the sample's interpreter),
`result.py` (`RunResult`, read back from a run's channels: memfds, never the host's disk),
`watch.py` (the caller's watch: limits, the moving backstop) and `uids.py` (the pool of
sample uids).

The box, with every layer (root, namespaces, cgroups, libseccomp; docs/sandbox.md has the
threat model, what each layer contains and what it does not):

- a new session (no controlling terminal), an unprivileged uid of its own, NO_NEW_PRIVS;
- a private root (`rootfs.py`): a tmpfs holding read-only binds of the interpreter's prefix and
  the shared libraries it loads, a /dev of null, zero, full, random and urandom only, private
  tmpfs /tmp (the scratch dir), /var/tmp and /dev/shm, its own /proc; nothing else of the host;
- new mount, network, PID, IPC and cgroup namespaces; the PID namespace dies with its init,
  whose command line is blank; the launcher and init are exempt from the OOM killer;
- a syscall filter (`seccomp.py`): no namespaces, mounts, ptrace, bpf, io_uring, AIO, TIOCSTI,
  file locks, inotify, fanotify, no socket in any domain (socketpair AF_UNIX only), ...;
- a cgroup per run (`cgroups.py`): total memory (`memory_bytes`) and processes
  (`max_processes`) whatever it forks, one CPU share however many sessions it makes; CPU
  time of the whole sample against `cpu_s`, with a backstop (`wall_s`) on the wall time less
  the run-queue delay of its most delayed task: blocked until it is a 'timeout', runnable
  but starved until `STARVED_FACTOR` times it is retried once, then 'infra'; stdout, stderr
  and the result channel are memfds charged to the cgroup (the caller decodes only the last
  report line);
- every rlimit set for the sample (`launcher.sample_limits`), an absolute niceness, and the
  sentinel: `passed` needs the harness's token after the source's last statement (early
  `sys.exit(0)` is 'incomplete').

Weaker modes (`isolation='uid'`: root without namespaces; 'none': not root) and machines
without cgroups or libseccomp lack layers: `missing_layers()` names them, `isolation_level()`
logs a warning, and `run_python` refuses to run unless the caller opts in with
`allow_weak=True`, the module default `ALLOW_WEAK`, or `SPEC_JAX_SANDBOX_WEAK=1`.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence

from . import cgroups, rootfs, seccomp
from .harness import harness_source
from .launcher import LAUNCHER, NO_NAMESPACES, SAMPLE_ENV, SCRATCH, STOP_SIGNAL
from .result import STATUSES, RunResult, _memfd, _result
from .uids import UID_BASE, UID_SLOTS, _kill_uid, _UidLease, leftover_processes, remove_files_of
from .watch import (
    ALARM_MARGIN_S,
    STARVED_FACTOR,
    STARVED_SHARE,
    _kill_init,
    _wait,
    _watch,
    latest_end_s,
)

__all__ = [
    'ALLOW_WEAK',
    'BASE_PYTHON',
    'ISOLATIONS',
    'LAYERS',
    'RUN_PREFIX',
    'SAMPLE_ENV',
    'SCRATCH',
    'STARVED_FACTOR',
    'STARVED_SHARE',
    'STATUSES',
    'UID_BASE',
    'UID_SLOTS',
    'RunResult',
    'WeakSandboxError',
    'isolation_level',
    'leftover_processes',
    'missing_layers',
    'run_many',
    'run_python',
]

log = logging.getLogger(__name__)

# The interpreter samples run on: the base installation, not a virtual environment (generated
# code needs the standard library only; the private root binds this interpreter's prefix).
BASE_PYTHON = getattr(sys, '_base_executable', None) or sys.executable
RUN_PREFIX = 'spec_jax_sbx_'  # The caller's private run directories (under tempfile's dir).
ISOLATIONS = ('namespaces', 'uid', 'none')
LAYERS = ('namespaces', 'cgroups', 'seccomp')
WEAK_ENV = 'SPEC_JAX_SANDBOX_WEAK'
# Whether `run_python` may run with layers missing when its caller does not say
# (`allow_weak=None`); `launch/evaluate.py --weak_sandbox` sets it. Default: $SPEC_JAX_SANDBOX_WEAK.
ALLOW_WEAK = os.environ.get(WEAK_ENV, '') not in ('', '0')
OOM_GRACE_S = 5.0  # After an OOM kill, how long the launcher may take to report and exit.


class WeakSandboxError(RuntimeError):
    """The machine lacks isolation layers and the caller did not opt in to the weaker box."""


_probe_lock = threading.Lock()
_level: list[str] = []  # The probed level, once known.


def _probe() -> str:
    """The isolation level; cached only when known: a box that failed for another reason
    than missing namespaces (a full disk, no memory, a spawn failure) is not 'no namespaces
    here', and the next call probes again."""
    if os.geteuid() != 0:
        level = 'none'
    else:
        cgroups.sweep_stale()  # Left by callers that died before removing them.
        result = run_python('pass', isolation='namespaces', timeout_s=30, allow_weak=True)
        if result.status == 'ok':
            level = 'namespaces'
        elif result.error.startswith(NO_NAMESPACES):
            level = 'uid'
            log.warning('sandbox: no namespaces here (%s)', result.error)
        else:
            log.warning('sandbox: the probe\'s box failed (%s: %s); not cached, the next run '
                        'probes again', result.status, result.error)  # fmt: skip
            return 'namespaces'
    _level.append(level)
    missing = _missing(level)
    if missing:
        log.warning(
            'sandbox: isolation layers missing on this machine: %s; untrusted code runs only '
            'with allow_weak=True / sandbox.ALLOW_WEAK / %s=1 (docs/sandbox.md)',
            ', '.join(missing),
            WEAK_ENV,
        )
    return level


def isolation_level() -> str:
    """The best isolation this machine allows ('namespaces', 'uid' or 'none'; see the module
    docstring); probed once per process with a trivial run (a warning names missing layers)."""
    with _probe_lock:
        return _level[0] if _level else _probe()


def _missing(isolation: str) -> list[str]:
    missing = [] if isolation == 'namespaces' else ['namespaces']
    if cgroups.available() is None:
        missing.append('cgroups')
    if not seccomp.available():
        missing.append('seccomp')
    return missing


def missing_layers(isolation: str = 'auto') -> list[str]:
    """The layers of `LAYERS` a run at `isolation` ('auto': `isolation_level()`) lacks here."""
    return _missing(isolation_level() if isolation == 'auto' else isolation)


@functools.cache
def _root_plan(python: str) -> dict:
    return rootfs.plan(python)


def run_python(
    source: str,
    *,
    timeout_s: float = 10.0,
    cpu_s: float | None = None,
    wall_s: float | None = None,
    memory_bytes: int = 2 << 30,
    max_processes: int = 16,
    file_bytes: int = 16 << 20,
    scratch_bytes: int = 64 << 20,
    open_files: int = 256,
    block_sockets: bool = True,
    isolation: str = 'auto',
    allow_weak: bool | None = None,
    python: str | None = None,
    site: bool = True,
    nice: int = 10,
    uid_base: int = UID_BASE,
    tail_chars: int = 4000,
    report_bytes: int = 64 << 20,
    max_line_bytes: int = 1 << 20,
    workdir: str | None = None,
    pass_fds: Sequence[int] = (),
    cancel: threading.Event | None = None,
    retry_starved: bool = True,
    read_report: bool = True,
) -> RunResult:
    """Runs `source` in a contained child interpreter (see the module docstring).

    Args:
      source: Python source; it passes if it runs to its end (and exits 0).
      timeout_s: the time limit: the default of `cpu_s` (and, through it, of `wall_s`).
      cpu_s: CPU seconds of the whole sample, every process it forks included (its cgroup;
        the interpreter's start-up counts): past it the run stops as 'cpu_timeout'. Each
        process also has RLIMIT_CPU at this value (the only CPU limit without cgroups).
      wall_s: the wall-clock backstop (default `3 * cpu_s + 10`; `cpu_s` without cgroups),
        moved by the time the sample waited for a CPU (its run-queue delay): a sample still
        running then is a 'timeout'; one starved (runnable, not run) until `STARVED_FACTOR`
        times `wall_s` is retried once, then 'infra'.
      memory_bytes: memory of the whole sample (its cgroup; tmpfs pages included) and
        address space of each process (RLIMIT_AS).
      max_processes: processes and threads of the sample (its cgroup's pids.max, and
        RLIMIT_NPROC of its uid).
      file_bytes: largest file the sample may write, stdout and stderr included (RLIMIT_FSIZE).
      scratch_bytes: size of each private tmpfs (/tmp with the scratch dir, /var/tmp, /dev/shm).
      open_files: RLIMIT_NOFILE.
      block_sockets: install the audit hook that refuses network sockets.
      isolation: 'auto' (the best `isolation_level()`), 'namespaces', 'uid' or 'none'.
      allow_weak: run even with layers missing (`missing_layers`); None: `ALLOW_WEAK`.
        Without it a missing layer raises `WeakSandboxError`.
      python: the interpreter (default `BASE_PYTHON`).
      site: import site (site-packages) in the sample; False runs `-S` (stdlib only).
      nice: the sample's niceness (absolute: not added to the caller's).
      uid_base: first uid of the pool of `UID_SLOTS` sample uids.
      tail_chars: how much of stdout and stderr to keep.
      report_bytes: how much of the result channel (reports + sentinel) to read.
      max_line_bytes: longest report line accepted (a longer one fails the sample).
      workdir: where the caller's private run directory goes (default: tempfile's); it is
        removed when the run ends.
      pass_fds: descriptors of the caller the sample inherits at the same numbers (e.g. the
        ends of pipes over which a trusted process talks to the sample).
      cancel: an event another thread sets to stop the run (status 'cancelled'), e.g. the
        candidate's box once the checker has its verdict, so that a blocked candidate does
        not hold its slot until the backstop.
      retry_starved: retry a starved run once; False returns it at once as 'infra' (a caller
        that must rerun more than this box, e.g. the code tasks' pair of boxes).
      read_report: decode the last report; False leaves `report` None (the caller pays only
        for the sentinel's byte search: e.g. a box whose reports it never uses).
    """
    if isolation == 'auto':
        isolation = isolation_level()
    if isolation not in ISOLATIONS:
        raise ValueError(f'isolation must be auto or one of {ISOLATIONS}, got {isolation!r}')
    if isolation != 'none' and os.geteuid() != 0:
        raise ValueError(f'isolation {isolation!r} needs root; use isolation="none"')
    missing = _missing(isolation)
    if missing and not (ALLOW_WEAK if allow_weak is None else allow_weak):
        raise WeakSandboxError(
            f'sandbox layers missing here: {", ".join(missing)} (isolation {isolation!r}); '
            f'refusing to run untrusted code. Opt in to the weaker box with allow_weak=True, '
            f'sandbox.ALLOW_WEAK = True or {WEAK_ENV}=1 (docs/sandbox.md)'
        )
    cpu_s = timeout_s if cpu_s is None else cpu_s
    use_cgroups = 'cgroups' not in missing
    if wall_s is None:
        wall_s = 3 * cpu_s + 10 if use_cgroups else cpu_s
    args = dict(
        isolation=isolation, cpu_s=cpu_s, wall_s=wall_s, memory_bytes=memory_bytes,
        max_processes=max_processes, file_bytes=file_bytes, scratch_bytes=scratch_bytes,
        open_files=open_files, block_sockets=block_sockets, python=python or BASE_PYTHON,
        site=site, nice=nice, uid_base=uid_base, tail_chars=tail_chars,
        report_bytes=report_bytes, max_line_bytes=max_line_bytes, workdir=workdir,
        pass_fds=pass_fds, use_cgroups=use_cgroups, use_seccomp='seccomp' not in missing,
        cancel=cancel, read_report=read_report,
    )  # fmt: skip
    result = _run_once(source, **args)
    if result.status == 'starved' and not retry_starved:
        error = 'starved: runnable but not run for most of the wall time'
        return _replace(result, status='infra', error=error)
    if result.status == 'starved':  # The machine's fault, not the sample's: once more.
        result = _run_once(source, **args)
        if result.status == 'starved':
            error = 'starved twice: runnable but not run for most of the wall time'
            return _replace(result, status='infra', error=error, attempts=2)
        return _replace(result, attempts=2)
    return result


def _setup_error(message: str, isolation: str, start: float) -> RunResult:
    """The result of a run whose box could not be set up (an infrastructure error)."""
    seconds = time.monotonic() - start
    return RunResult(False, False, 'error', None, '', '', seconds, isolation=isolation,
                     error=message)  # fmt: skip


def _replace(result: RunResult, **fields) -> RunResult:
    return dataclasses.replace(result, **fields)


def _run_once(source: str, *, isolation, cpu_s, wall_s, memory_bytes, max_processes,
              file_bytes, scratch_bytes, open_files, block_sockets, python, site, nice,
              uid_base, tail_chars, report_bytes, max_line_bytes, workdir, pass_fds,
              use_cgroups, use_seccomp, cancel, read_report) -> RunResult:  # fmt: skip
    """One attempt of `run_python` (its arguments, resolved)."""
    start = time.monotonic()
    lease = _UidLease(uid_base, sweep=isolation == 'uid') if isolation != 'none' else None
    uid = lease.uid if lease else None
    fds, group, run_dir = {}, None, None
    try:
        try:  # Only a mount point (or the 'uid' scratch dir): nothing the sample writes.
            run_dir = tempfile.mkdtemp(prefix=RUN_PREFIX, dir=workdir)
        except OSError as e:
            return _setup_error(f'no run directory: {e}', isolation, start)
        token = secrets.token_hex(16)
        # The source, the sample's stdout and stderr, the result and status channels: memfds,
        # memory of the cgroup of whoever writes it (the sample's, for what it writes), never
        # the host's disk; a fallocate on them is bounded by the cgroup's memory.
        fds['src'] = _memfd('src', source.encode('utf-8', 'surrogatepass'))
        for k in ('out', 'err', 'res', 'status'):  # Appends: several processes write them.
            fds[k] = _memfd(k)
        res_fd, status_fd = fds['res'], fds['status']
        wrapper = harness_source(res_fd, token, block_sockets)
        flags = ['-I', '-B'] + ([] if site else ['-S'])
        if use_cgroups:  # Launcher and init count too: two more processes.
            name = f'{os.getpid()}_{secrets.token_hex(6)}'
            try:
                group = cgroups.Cgroup.create(name, int(memory_bytes), int(max_processes) + 2)
            except OSError as e:
                return _setup_error(f'no cgroup for the run: {e}', isolation, start)
        cfg = {
            'mode': isolation,
            'parent': os.getpid(),
            'status_fd': status_fd,
            'python': python,
            'argv': [python, *flags, '-c', wrapper],
            'uid': uid,
            'cpu_s': cpu_s,
            'memory_bytes': int(memory_bytes),
            'max_processes': int(max_processes),
            'file_bytes': int(file_bytes),
            'scratch_bytes': int(scratch_bytes),
            'open_files': int(open_files),
            'nice': int(nice),
            'deadline_s': latest_end_s(wall_s) + ALARM_MARGIN_S,  # Past the caller's end.
            'scratch': SCRATCH,
            'seccomp': use_seccomp,
            'cgroup_procs': group.procs_files() if group else [],
        }
        if isolation == 'namespaces':
            cfg['root'] = os.path.join(run_dir, 'root')
            os.mkdir(cfg['root'], 0o700)
            try:
                cfg['rootfs'] = _root_plan(python)
            except (OSError, RuntimeError, subprocess.SubprocessError) as e:
                return _setup_error(f'no private root for {python}: {e}', isolation, start)
        else:
            os.chmod(run_dir, 0o711)
            scratch = cfg['scratch'] = os.path.join(run_dir, 'scratch')
            os.mkdir(scratch, 0o700)
            if uid is not None:
                os.chown(scratch, uid, uid)
            if isolation == 'none':
                cfg['max_processes'] += len(leftover_processes([os.getuid()]))
        proc = subprocess.Popen(
            [sys.executable, '-I', '-S', LAUNCHER, '--launch', json.dumps(cfg)],
            stdin=fds['src'],
            stdout=fds['out'],
            stderr=fds['err'],
            pass_fds=(res_fd, status_fd, *pass_fds),
            env=dict(SAMPLE_ENV),
            cwd='/',
            start_new_session=True,  # No controlling terminal: the caller's is out of reach.
        )
        stopped = _watch(proc, group, cpu_s, wall_s, start, cancel)
        # After an OOM kill the init reports the sample's end (its wait status) once the
        # kernel has freed what it held (a second or more for gigabytes of memfds): a killed
        # child whose sample lives on costs this grace.
        exited = stopped == 'memory' and _wait(proc, OOM_GRACE_S, None)
        if stopped is not None and isolation == 'namespaces' and not exited:
            _kill_init(status_fd, proc)
        elif stopped is not None and isolation == 'uid' and not exited:
            proc.send_signal(STOP_SIGNAL)  # It kills the uid's processes and reaps them.
            _wait(proc, 10.0, None)
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # Reserved until reaped: no other group's id.
        except ProcessLookupError:
            pass
        launcher_code = proc.wait()
        if uid is not None and isolation == 'uid':
            _kill_uid(uid)  # A backstop: the launcher has killed them (and reaped them).
            remove_files_of(uid)
        cpu = group.cpu_ns() / 1e9 if group else None
        oom = group.oom_killed() if group else False
        seconds = time.monotonic() - start
        return _result(
            fds, token, stopped, launcher_code, isolation, seconds, tail_chars,
            report_bytes, max_line_bytes, cpu, oom, read_report,
        )  # fmt: skip
    finally:
        for fd in fds.values():  # Frees the pages they hold (before the group goes).
            os.close(fd)
        if group is not None:
            group.remove()
        if run_dir is not None:
            shutil.rmtree(run_dir, ignore_errors=True)
        if lease:
            lease.release()


def run_many(sources: Sequence[str], workers: int = 2, **kwargs) -> list[RunResult]:
    """`run_python` on each of `sources`, `workers` at a time; results in order of `sources`.

    kwargs go to `run_python` (the same limits for every source).
    """
    if not sources:
        return []
    isolation_level()  # Probe once, not in every worker.
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, len(sources)))) as pool:
        return list(pool.map(functools.partial(run_python, **kwargs), sources))
