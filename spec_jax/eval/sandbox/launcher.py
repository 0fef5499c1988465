"""The sandbox's launcher: the privileged set-up of one run, run as a script by the caller.

The caller (`spec_jax.eval.sandbox`) runs this file by its path, as root, with
`python -I -S launcher.py --launch CONFIG` (CONFIG: a JSON object) in a process group of its
own: the source on stdin, the sample's stdout and stderr as its own, and two inherited
descriptors, the result fd (for the harness) and the status fd, to which the launcher writes
what it knows as JSON lines (`pid`, `init`, `wait_status`, `writable`, `error`). With
isolation 'namespaces' it joins the run's cgroup, unshares mount, network, PID, IPC and cgroup
namespaces and forks the namespace's init, which blanks its command line (the sample can read
/proc/1/cmdline), builds the private root (`rootfs.py`) and runs the sample as its child;
otherwise it joins the cgroup (if any) and becomes the sample itself. The launcher and the
init are exempt from the OOM killer (`OOM_EXEMPT`), the sample is its first pick
(`OOM_FIRST`). Becoming the sample: rlimits, an absolute niceness, the uid drop, NO_NEW_PRIVS,
the syscall filter (`seccomp.py`), the scratch dir as cwd, then exec of the interpreter on the
harness.

`--kill-uid UID` sends SIGKILL to every process of UID, sent as UID (kill(-1)).

Run with -I -S by file path, this file cannot import the package: it stays
standard-library-only and loads its two standard-library-only siblings, `rootfs.py` and
`seccomp.py`, by their paths (`_sibling`), before the private root hides them. The caller
side imports it as a module for `LAUNCHER` (its path), `SCRATCH` and `SAMPLE_ENV` only.
"""

from __future__ import annotations

import ctypes
import errno
import importlib.util
import json
import math
import os
import resource
import signal
import sys

LAUNCHER = os.path.abspath(__file__)  # This file, which the caller runs as a script.
SCRATCH = '/tmp/sandbox'  # The sample's cwd and HOME inside the mount namespace.
SAMPLE_ENV = {'PATH': '/usr/local/bin:/usr/bin:/bin', 'LANG': 'C.UTF-8'}
# How a status error starts when the machine does not allow the namespaces or the private root
# (the kernel refused: EPERM, EACCES, EINVAL, ENOSYS), as opposed to a box that failed.
NO_NAMESPACES = 'no namespaces'
_REFUSALS = (errno.EPERM, errno.EACCES, errno.EINVAL, errno.ENOSYS)

# Linux constants (include/uapi/linux/sched.h, mount.h, prctl.h).
_CLONE_NEWNS = 0x00020000
_CLONE_NEWCGROUP = 0x02000000
_CLONE_NEWIPC = 0x08000000
_CLONE_NEWPID = 0x20000000
_CLONE_NEWNET = 0x40000000
_PR_SET_PDEATHSIG = 1
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_CHILD_SUBREAPER = 36
# The caller's signal to a 'uid' launcher: stop the sample, kill its uid's processes, reap them.
STOP_SIGNAL = signal.SIGUSR1
# The OOM killer's ranks (/proc/<pid>/oom_score_adj): the launcher and init are never its pick
# (a killed one would leave no status: an infrastructure error the sample caused); the
# sample's processes always are, and cannot lower theirs (root sets it, so the floor too).
OOM_EXEMPT, OOM_FIRST = -1000, 1000
_RLIMIT_NUMBERS = {'RLIMIT_LOCKS': 10}  # Linux's, where `resource` lacks the name.


def _libc():
    return ctypes.CDLL(None, use_errno=True)


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise OSError(err, f'{what}: {os.strerror(err)}')


def _sibling(name: str):
    """The module `name`.py beside this file, loaded by its path."""
    path = os.path.join(os.path.dirname(LAUNCHER), f'{name}.py')
    spec = importlib.util.spec_from_file_location(f'_spec_jax_sandbox_{name}', path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _prctl(libc, option: int, arg: int) -> None:
    _check(libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f'prctl {option}')


def _oom_score_adj(value: int) -> None:
    try:
        with open('/proc/self/oom_score_adj', 'w') as f:
            f.write(str(value))
    except OSError:  # Not root ('none'): the sample's own processes only.
        pass


def _hide_cmdline() -> None:
    """Blanks this process's command line: the init's /proc/1/cmdline, which the sample can
    read, would show the config (the caller's pid, the run directory, the cgroup, the token)."""
    with open('/proc/self/stat') as f:
        fields = f.read().rsplit(')', 1)[1].split()
    start, end = int(fields[45]), int(fields[46])  # arg_start, arg_end (fields 48, 49)
    ctypes.memset(start, 0, end - start)
    name = b'sandbox-init'[: max(0, end - start - 1)]
    ctypes.memmove(start, name, len(name))


def _status(cfg: dict, **fields) -> None:
    try:
        os.write(cfg['status_fd'], (json.dumps(fields) + '\n').encode())
    except OSError:
        pass


def sample_limits(cfg: dict) -> dict[str, tuple[int, int]]:
    """Every rlimit of the sample, by its name in `resource` (soft, hard): none is inherited
    from the caller (a raised RTPRIO would let the sample run SCHED_FIFO, an unlimited STACK
    moves its memory layout). The caller's cgroup bounds the whole sample; these bound each
    process (its uid, for NPROC, SIGPENDING and MSGQUEUE)."""
    # With a cgroup the caller stops the whole sample at cpu_s; RLIMIT_CPU (coarser, per
    # process) is then a second later, a backstop.
    cpu = max(1, math.ceil(cfg['cpu_s'])) + (1 if cfg['cgroup_procs'] else 0)
    memory = cfg['memory_bytes']
    limits = {
        'RLIMIT_CPU': (cpu, cpu + 1),
        'RLIMIT_AS': memory,
        'RLIMIT_DATA': memory,
        'RLIMIT_RSS': memory,  # Ignored by Linux; set all the same.
        'RLIMIT_STACK': min(8 << 20, memory),  # The usual 8 MiB (threads' default stack too).
        'RLIMIT_CORE': 0,
        'RLIMIT_FSIZE': cfg['file_bytes'],
        'RLIMIT_NOFILE': cfg['open_files'],
        'RLIMIT_NPROC': cfg['max_processes'],
        'RLIMIT_MEMLOCK': 0,  # No locked memory (mlock, SHM_LOCK, memfd_secret).
        'RLIMIT_LOCKS': 0,  # File leases (the filter refuses locks and leases too).
        'RLIMIT_SIGPENDING': 256,  # Queued signals of its uid (kernel memory).
        'RLIMIT_MSGQUEUE': 0,  # No POSIX message queue (at 'uid', the host's /dev/mqueue).
        'RLIMIT_NICE': max(0, 20 - cfg['nice']),  # No niceness below the one it was given.
        'RLIMIT_RTPRIO': 0,  # No real-time scheduling.
        'RLIMIT_RTTIME': 0,
    }
    return {k: v if isinstance(v, tuple) else (v, v) for k, v in limits.items()}


def _become_sample(libc, cfg: dict, scratch: str, filters, seccomp_lib, parent: int) -> None:
    """Limits, privileges, cwd; then exec the interpreter on the wrapper (never returns).
    `parent`: the pid whose death kills the sample (0: none, the launcher itself execs)."""
    os.set_inheritable(cfg['status_fd'], False)  # Closed by a successful exec only.
    signal.pthread_sigmask(signal.SIG_SETMASK, ())  # Kept across exec: the 'uid' reaper's.
    for name, (soft, hard) in sample_limits(cfg).items():
        which = getattr(resource, name, _RLIMIT_NUMBERS.get(name))
        # Never above the caller's hard limit: raising one needs CAP_SYS_RESOURCE, which root
        # in a container often lacks, and the caller's processes are bounded by it too.
        held = resource.getrlimit(which)[1]
        if held != resource.RLIM_INFINITY:
            soft, hard = min(soft, held), min(hard, held)
        resource.setrlimit(which, (soft, hard))
    os.setpriority(os.PRIO_PROCESS, 0, cfg['nice'])  # Absolute, not added to the caller's.
    _oom_score_adj(OOM_FIRST)
    uid = cfg['uid']
    if uid is not None:
        os.setgroups([])
        os.setresgid(uid, uid, uid)
        os.setresuid(uid, uid, uid)
    if parent:  # After the uid drop, which clears the parent-death signal.
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:
            os._exit(1)
    _prctl(libc, _PR_SET_NO_NEW_PRIVS, 1)
    if filters is not None:
        filters.install(seccomp_lib)
    os.chdir(scratch)
    os.umask(0o077)
    env = dict(SAMPLE_ENV, HOME=scratch)
    os.execve(cfg['python'], cfg['argv'], env)


def _start_sample(libc, cfg: dict, scratch: str, filters, seccomp_lib) -> int:
    """Forks the sample (`_become_sample`) and returns its pid once it has exec'd; a failure to
    start it goes to the status channel."""
    read_end, write_end = os.pipe2(os.O_CLOEXEC)
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:
        os.close(read_end)
        try:
            _become_sample(libc, cfg, scratch, filters, seccomp_lib, parent)
        except BaseException as e:  # noqa: BLE001
            os.write(write_end, f'{type(e).__name__}: {e}'.encode())
        os._exit(127)
    os.close(write_end)
    failure = b''
    while chunk := os.read(read_end, 4096):
        failure += chunk
    os.close(read_end)
    if failure:
        _status(cfg, error=f'could not start the sample: {failure.decode(errors="replace")}')
    return pid


class _Stop(BaseException):
    """`STOP_SIGNAL` arrived: the caller stops the run."""


def _raise_stop(*_) -> None:
    raise _Stop


def _reaper(libc, cfg: dict, filters, seccomp_lib) -> None:
    """'uid': the launcher stays (root) as the subreaper of every process the sample makes, so
    none is left a zombie of the host's init, counted against its uid's process limit. It
    reports the sample's end; then, or at the caller's `STOP_SIGNAL` (the sample's uid cannot
    signal it), it kills every process of the uid and reaps them all before it exits."""
    _prctl(libc, _PR_SET_CHILD_SUBREAPER, 1)
    signal.signal(STOP_SIGNAL, _raise_stop)
    signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})  # Until the sample has its uid.
    try:
        pid = _start_sample(libc, cfg, cfg['scratch'], filters, seccomp_lib)
        _status(cfg, pid=pid)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {STOP_SIGNAL})
        while True:
            done, wait_status = os.waitpid(-1, 0)
            if done == pid:
                _status(cfg, pid=pid, wait_status=wait_status)
                break
    except (_Stop, ChildProcessError):
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {STOP_SIGNAL})
    try:
        if os.fork() == 0:  # The killer: as the uid, every process of the uid but itself.
            _kill_all_as(cfg['uid'])
            os._exit(0)
    except OSError:  # No process left to fork in the cgroup: by pid, until none is left.
        _kill_by_pid(cfg['uid'])
    while True:  # The killer, the killed, their orphans: until none is left.
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            break
    os._exit(0)


def _kill_by_pid(uid: int) -> None:
    """SIGKILL to each live process of `uid` found in /proc, reaping as it goes, until none
    is left (each killed one frees a slot a survivor may fork into: hence the rounds)."""
    for _ in range(1000):
        found = []
        for name in filter(str.isdigit, os.listdir('/proc')):
            try:
                with open(f'/proc/{name}/status') as f:
                    status = f.read()
            except OSError:
                continue
            if f'\nUid:\t{uid}\t' in status and '\nState:\tZ' not in status:
                found.append(int(name))
        if not found:
            return
        for pid in found:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break


def _init(libc, cfg: dict, rootfs, filters, seccomp_lib) -> None:
    """PID 1 of the new namespaces (root): the private root, then the sample as its child;
    exits when the sample does, which makes the kernel kill and reap everything else in the
    namespace."""
    try:
        _prctl(libc, _PR_SET_PDEATHSIG, signal.SIGKILL)
        _hide_cmdline()
        signal.signal(signal.SIGALRM, lambda *_: os._exit(137))  # Init ignores SIG_DFL ones.
        signal.alarm(max(1, math.ceil(cfg['deadline_s'])))
        rootfs.build(libc, cfg)
    except Exception as e:  # noqa: BLE001
        refused = isinstance(e, OSError) and e.errno in _REFUSALS
        prefix = f'{NO_NAMESPACES}: ' if refused else ''
        _status(cfg, error=f'{prefix}sandbox set-up failed: {type(e).__name__}: {e}')
        os._exit(1)
    pid = _start_sample(libc, cfg, SCRATCH, filters, seccomp_lib)
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
    _oom_score_adj(OOM_EXEMPT)  # Inherited by the init, not by the sample (it sets its own).
    try:  # Loaded now: the private root hides these files and libseccomp.
        filters = _sibling('seccomp') if cfg['seccomp'] else None
        seccomp_lib = filters._library() if filters else None
        rootfs = _sibling('rootfs') if cfg['mode'] == 'namespaces' else None
        for path in cfg['cgroup_procs']:  # Every process of the run is in its cgroup.
            with open(path, 'w') as f:
                f.write('0')
    except Exception as e:  # noqa: BLE001
        _status(cfg, error=f'sandbox set-up failed: {type(e).__name__}: {e}')
        os._exit(1)
    if cfg['mode'] == 'uid':
        _reaper(libc, cfg, filters, seccomp_lib)
    if cfg['mode'] != 'namespaces':  # 'none': the launcher becomes the sample.
        _status(cfg, pid=os.getpid())
        try:
            _become_sample(libc, cfg, cfg['scratch'], filters, seccomp_lib, 0)
        except BaseException as e:  # noqa: BLE001
            _status(cfg, error=f'could not start the sample: {type(e).__name__}: {e}')
        os._exit(127)
    try:
        # A cgroup namespace too (after joining the run's group): the box's /proc/*/cgroup
        # shows '/', not the group's name (the caller's pid and a token).
        flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | _CLONE_NEWIPC | _CLONE_NEWCGROUP
        _check(libc.unshare(flags), 'unshare')
    except OSError as e:
        _status(cfg, error=f'{NO_NAMESPACES}: {e}')
        os._exit(1)
    pid = os.fork()
    if pid == 0:
        _init(libc, cfg, rootfs, filters, seccomp_lib)
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
