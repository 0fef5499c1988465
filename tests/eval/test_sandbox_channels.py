"""The box's third round (issue 46): no channel between samples through the inodes every box
shares, no machine-wide budget taken, no rlimit inherited from the caller.

Two concurrent samples decoded each other's bytes through `flock(2)` and inotify on the
read-only binds of the interpreter (the host's inodes, the same in every box); `io_setup`
took the machine's AIO budget; the sample's RTPRIO, NICE, RTTIME, MEMLOCK, SIGPENDING,
MSGQUEUE and STACK limits were the caller's. Each call is made directly (ctypes, past the
audit hook) in the namespaces box and in the 'uid' box, and must fail with the filter's
EPERM (without the filter each of them succeeds for an unprivileged process here, or gives
another errno).
"""

import os
import resource

import pytest
from test_sandbox import CI, FULL, UID_BASE, run

from spec_jax.eval import sandbox
from spec_jax.eval.sandbox import launcher

FIXTURES = (run,)  # test_sandbox's `run`: run_python, then checks the machine is as it was.
pytestmark = pytest.mark.skipif(
    not FULL and not CI, reason='needs root, namespaces, cgroups and libseccomp'
)
SYSTEM_PYTHON = '/usr/bin/python3'  # The 'uid' box needs an interpreter its uid can run.
# io_setup, memfd_secret, inotify_init (x86_64 only); the rest through libc or fcntl.
NR = {'x86_64': (206, 447, 253), 'aarch64': (0, 447, -1)}.get(os.uname().machine)
# Each refused call, as a statement that leaves (return value, errno) in `out`.
CALLS = {
    'flock': 'out = call(libc.flock, fd, 2)',  # LOCK_EX on a file of the private /tmp.
    'lockf': 'out = call(fcntl.lockf, fd, fcntl.LOCK_EX)',  # F_SETLKW
    'ofd_setlk': 'out = call(fcntl.fcntl, fd, 37, bytes(32))',  # F_OFD_SETLK
    'getlk': 'out = call(fcntl.fcntl, fd, 5, bytes(32))',  # F_GETLK
    'dnotify': 'out = call(fcntl.fcntl, os.open("/", os.O_RDONLY), 1026, 1)',  # F_NOTIFY
    'inotify_init1': 'out = call(libc.inotify_init1, 0)',
    'inotify_init': 'out = call(libc.syscall, NR[2]) if NR[2] >= 0 else (-1, errno.EPERM)',
    'fanotify_init': 'out = call(libc.fanotify_init, 0x200, 0)',  # FAN_REPORT_FID, unprivileged
    'io_setup': 'out = call(libc.syscall, NR[0], 1024, ctypes.byref(ctypes.c_ulong(0)))',
    'memfd_secret': 'out = call(libc.syscall, NR[1], 0)',
}
PROBE = """
import ctypes, errno, fcntl, os
libc = ctypes.CDLL(None, use_errno=True)
NR = @NR@
fd = os.open('probe', os.O_CREAT | os.O_RDWR, 0o600)
def call(f, *args):
    try:
        ret = f(*args)
    except OSError as e:
        return -1, e.errno
    return ret, ctypes.get_errno() if ret == -1 else 0
results = {}
for name, statement in @CALLS@.items():
    scope = dict(globals())
    exec(statement, scope)
    ret, err = scope['out']
    results[name] = [ret if ret == -1 else 'ok', errno.errorcode.get(err, err)]
__sandbox_report__(results)
"""


def _probe() -> str:
    return PROBE.replace('@NR@', repr(NR)).replace('@CALLS@', repr(CALLS))


@pytest.mark.skipif(NR is None, reason='syscall numbers for x86_64 and aarch64 only')
def test_shared_inode_and_machine_budget_calls_are_refused(run):
    """flock, the fcntl lock commands, dnotify, inotify, fanotify, io_setup and memfd_secret:
    EPERM from the filter in both boxes (before: flock, lockf and inotify worked, and B read
    A's byte through them in 3 of 3 runs; io_setup took fs.aio-max-nr)."""
    expected = {name: [-1, 'EPERM'] for name in CALLS}
    box = run(_probe())
    assert box.passed and box.report == expected, (box.report, box.stderr[-800:])
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f'the uid box needs {SYSTEM_PYTHON}')
    uid = sandbox.run_python(_probe(), isolation='uid', allow_weak=True, uid_base=UID_BASE,
                             python=SYSTEM_PYTHON)  # fmt: skip
    assert uid.passed and uid.report == expected, (uid.report, uid.stderr[-800:])


LIMITS = """
rows = {}
for line in open('/proc/self/limits').read().splitlines()[1:]:
    name, soft, hard = line[:26].strip(), line[26:47].strip(), line[47:68].strip()
    rows[name] = [soft, hard]
__sandbox_report__(rows)
"""
# /proc/self/limits row names (fs/proc/base.c) by `resource` name.
ROWS = {
    'RLIMIT_CPU': 'Max cpu time', 'RLIMIT_FSIZE': 'Max file size', 'RLIMIT_DATA': 'Max data size',
    'RLIMIT_STACK': 'Max stack size', 'RLIMIT_CORE': 'Max core file size',
    'RLIMIT_RSS': 'Max resident set', 'RLIMIT_NPROC': 'Max processes',
    'RLIMIT_NOFILE': 'Max open files', 'RLIMIT_MEMLOCK': 'Max locked memory',
    'RLIMIT_AS': 'Max address space', 'RLIMIT_LOCKS': 'Max file locks',
    'RLIMIT_SIGPENDING': 'Max pending signals', 'RLIMIT_MSGQUEUE': 'Max msgqueue size',
    'RLIMIT_NICE': 'Max nice priority', 'RLIMIT_RTPRIO': 'Max realtime priority',
    'RLIMIT_RTTIME': 'Max realtime timeout',
}  # fmt: skip


def test_every_rlimit_is_set_for_the_sample(run):
    """All 16 of Linux's rlimits are the sample's own (soft = hard, never above the caller's
    hard limit), none the caller's: here the caller's STACK, RTTIME and LOCKS hard limits are
    unlimited and its MEMLOCK, SIGPENDING and MSGQUEUE large (before: inherited)."""
    cfg = {'cpu_s': 10.0, 'cgroup_procs': ['x'], 'memory_bytes': 2 << 30, 'nice': 10,
           'file_bytes': 16 << 20, 'open_files': 256, 'max_processes': 16}  # fmt: skip
    result = run(LIMITS)
    assert result.passed, result.stderr[-800:]
    for row in ('Max locked memory', 'Max file locks', 'Max msgqueue size',
                'Max realtime priority', 'Max realtime timeout'):  # fmt: skip
        assert result.report[row] == ['0', '0'], (row, result.report[row])
    assert result.report['Max stack size'] == [str(8 << 20)] * 2  # The caller's: unlimited.
    limits = launcher.sample_limits(cfg)
    assert set(limits) == set(ROWS)  # Every rlimit Linux has, by name.
    for name, (soft, hard) in limits.items():
        which = getattr(resource, name, launcher._RLIMIT_NUMBERS.get(name))
        held = resource.getrlimit(which)[1]
        if held != resource.RLIM_INFINITY:
            soft, hard = min(soft, held), min(hard, held)
        want = [str(soft), str(hard)]
        assert result.report[ROWS[name]] == want, (name, result.report[ROWS[name]], want)
