"""The sandbox's launcher: the privileged set-up of one run, run as a script by the caller.

The caller (`spec_jax.eval.sandbox`) runs this file by its path, as root, with
`python -I -S launcher.py --launch CONFIG` (CONFIG: a JSON object) in a process group of its
own: the source on stdin, the sample's stdout and stderr as its own, and two inherited
descriptors, the result fd (for the harness) and the status fd, to which the launcher writes
what it knows as JSON lines (`pid`, `init`, `wait_status`, `writable`, `error`). With
isolation 'namespaces' it unshares mount, network, PID and IPC namespaces and forks the
namespace's init, which sets up the mounts and runs the sample as its child; otherwise it
becomes the sample itself. Becoming the sample: rlimits, nice, the uid drop, NO_NEW_PRIVS,
the scratch dir as cwd, then exec of the interpreter on the harness.

`--kill-uid UID` sends SIGKILL to every process of UID, sent as UID (kill(-1)).

Run with -I -S by file path, this file cannot import the package (nor anything beside it):
it stays standard-library-only and self-contained. The caller side imports it as a module for
`LAUNCHER` (its path), `SCRATCH` and `SAMPLE_ENV` only.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import resource
import signal
import sys

LAUNCHER = os.path.abspath(__file__)  # This file, which the caller runs as a script.
SCRATCH = '/tmp/sandbox'  # The sample's cwd and HOME inside the mount namespace.
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
    """The sample's filesystem view (see the package's docstring); returns mounts left
    writable."""
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


def _kill_all_as(uid: int) -> None:
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)
    try:
        os.kill(-1, signal.SIGKILL)  # Every process this uid may signal, except this one.
    except OSError:
        pass


if __name__ == '__main__' and sys.argv[1:2] == ['--launch']:
    _launch(json.loads(sys.argv[2]))
elif __name__ == '__main__' and sys.argv[1:2] == ['--kill-uid']:
    _kill_all_as(int(sys.argv[2]))
