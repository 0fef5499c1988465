"""Ways out of the box (issue 40): sockets outside the network namespace, the host's disk, the
OOM killer, the host seen through /proc, and the isolation probe.

Each attack is a HumanEval/0 completion scored through the public API (`HumanEval().score`,
default data root and timeouts): module-level code probes a way out and sets `ESCAPES`, then
the function answers correctly only if `ESCAPES` is empty, so a correct score shows that the
probe ran and found nothing (the reason names what it found otherwise).
"""

import json
import os
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import time

import pytest
from test_sandbox import CI, FULL, REPO, UID_BASE, run

from spec_jax.eval import sandbox
from spec_jax.eval.tasks import code

FIXTURES = (run,)  # test_sandbox's `run`: run_python, then checks the machine is as it was.
pytestmark = pytest.mark.skipif(
    not FULL and not CI, reason='needs root, namespaces, cgroups and libseccomp'
)
GUARDED = """
def has_close_elements(numbers, threshold):
    if ESCAPES:
        raise RuntimeError(f'{len(ESCAPES)} ways out: {ESCAPES[:5]}')
    return any(abs(a - b) < threshold for i, a in enumerate(numbers) for b in numbers[i + 1:])
"""
# socket(2) and socketpair(2) numbers.
SOCKET_NR = {'x86_64': (41, 53), 'aarch64': (198, 199)}.get(os.uname().machine)
_NR = SOCKET_NR or (-1, -1)
SYSTEM_PYTHON = '/usr/bin/python3'
SOCKET_PROBE = f"""
import ctypes, errno, os, socket
def _probe():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    pair = (ctypes.c_int * 2)()
    found = []
    for family in range(46):
        for kind in (1, 2, 3, 5):  # stream, datagram, raw, seqpacket
            calls = [('socket', {_NR[0]}, ())]
            if family != 1:
                calls.append(('socketpair', {_NR[1]}, (pair,)))
            for name, nr, extra in calls:
                args = [ctypes.c_long(a) for a in (nr, family, kind, 0)] + list(extra)
                ret = libc.syscall(*args)
                err = ctypes.get_errno()
                if ret >= 0:
                    os.close(ret if name == 'socket' else pair[0])
                if ret != -1 or err != errno.EPERM:
                    found.append((name, family, kind, errno.errorcode.get(err, err)))
    try:
        a, b = socket.socketpair()  # The allow-list: AF_UNIX pairs within the box.
        a.send(b'x')
        assert b.recv(1) == b'x'
    except OSError as e:
        found.append(('socketpair(AF_UNIX) refused', str(e)))
    return found
ESCAPES = _probe()
"""


@pytest.fixture(scope='module')
def he0():
    return code.HumanEval().load(limit=1)[0]


def score(item, probe: str):
    return code.HumanEval().score(item, textwrap.dedent(probe) + GUARDED)


@pytest.mark.skipif(SOCKET_NR is None, reason='syscall numbers for x86_64 and aarch64 only')
def test_every_socket_family_is_refused_by_the_filter(he0, run):
    """Families 0-45, four socket types, socket and socketpair, made through ctypes (past the
    audit hook): each gets the filter's EPERM (not EAFNOSUPPORT, not a socket), vsock (40),
    INET, INET6 and NETLINK included; socketpair(AF_UNIX) still works. In the box the scorer
    uses and in the 'uid' box (which also claims containment)."""
    result = score(he0, SOCKET_PROBE)
    assert result.correct, result.detail
    if not os.path.exists(SYSTEM_PYTHON):  # The 'uid' box needs one its uid can run.
        return
    uid = sandbox.run_python(textwrap.dedent(SOCKET_PROBE) + 'assert not ESCAPES, ESCAPES\n',
                             isolation='uid', allow_weak=True, uid_base=UID_BASE,
                             python=SYSTEM_PYTHON, site=False)  # fmt: skip
    assert uid.passed, (uid.status, uid.error, uid.stderr[-600:])


def _free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_fallocate_takes_no_host_disk(he0):
    """A KEEP_SIZE fallocate (past RLIMIT_FSIZE) of 384 MiB on every descriptor the sample
    holds (its stdout, stderr and result channel among them), held 1.5 s: the host's free
    space under the scorer's temporary directory stays within 192 MiB of what it was (the
    other jobs of the machine write there too; before the fix it fell by 1152 MiB)."""
    probe = """
        import ctypes, os, time
        def _probe():
            libc = ctypes.CDLL(None, use_errno=True)
            libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_long]
            for fd in range(1, 64):
                libc.fallocate(fd, 1, 0, 384 << 20)  # FALLOC_FL_KEEP_SIZE
            time.sleep(1.5)
            return []
        ESCAPES = _probe()
    """
    where = tempfile.gettempdir()
    before, lowest, done = _free_bytes(where), [_free_bytes(where)], threading.Event()

    def watch():
        while not done.is_set():
            lowest[0] = min(lowest[0], _free_bytes(where))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        result = score(he0, probe)
    finally:
        done.set()
        watcher.join()
    assert result.correct, result.detail
    taken = (before - lowest[0]) / (1 << 20)
    assert taken < 192, f'{taken:.0f} MiB of {where} taken during the run'


FILL = (16 << 20) - 4096  # One memfd's pages: under RLIMIT_FSIZE (16 MiB by default).


def _elf() -> bytes:
    """A one-page x86_64 ELF that loops memfd_create, fallocate(fd, 0, 0, FILL): it fills
    memfds (memory of the cgroup, in no process's RSS) with a resident size of one page."""
    entry = 0x400000 + 64 + 56
    text = (
        b'\xb8\x3f\x01\x00\x00'  # loop: mov eax, 319 (memfd_create)
        + b'\xbf\x00\x00\x40\x00'  # mov edi, 0x400000 (the name: "\x7fELF\x02\x01\x01")
        + b'\x31\xf6'  # xor esi, esi (no flags)
        + b'\x0f\x05'  # syscall
        + b'\x89\xc7'  # mov edi, eax (the memfd)
        + b'\xb8\x1d\x01\x00\x00'  # mov eax, 285 (fallocate)
        + b'\x31\xf6'  # xor esi, esi (mode 0)
        + b'\x31\xd2'  # xor edx, edx (offset 0)
        + b'\x49\xc7\xc2' + struct.pack('<I', FILL)  # mov r10, FILL
        + b'\x0f\x05'  # syscall
        + b'\xeb\xdc'  # jmp loop (-36)
    )  # fmt: skip
    size = 64 + 56 + len(text)
    header = struct.pack('<16sHHIQQQIHHHHHH', b'\x7fELF\x02\x01\x01', 2, 62, 1, entry, 64, 0,
                         0, 64, 56, 1, 0, 0, 0)  # fmt: skip
    program = struct.pack('<IIQQQQQQ', 1, 5, 0, 0x400000, 0x400000, size, size, 0x1000)
    return header + program + text


@pytest.mark.skipif(os.uname().machine != 'x86_64', reason='the ELF is x86_64 code')
def test_out_of_memory_is_the_samples_failure(he0):
    """The sample fills a memfd, then execs a one-page ELF from another memfd (a noexec /tmp
    does not stop /proc/self/fd/N) that goes on filling it: its resident size is one page, so
    without protection the OOM killer picks the launcher or the init (a Python each) every
    time, and the run was 'infra'. Now they are exempt: the sample is killed, the launcher
    reports it ('memory', with the sample's SIGKILL that the init saw) and the verdict is
    'failed'. Twice."""
    probe = f"""
        import os
        def _attack():
            fds = []
            for _ in range(96):  # 1.5 GiB
                fds.append(os.memfd_create('fill', 0))
                os.posix_fallocate(fds[-1], 0, {FILL})
            elf = os.memfd_create('elf', 0)
            os.write(elf, {_elf()!r})
            os.execv(f'/proc/self/fd/{{elf}}', ['elf'])
        ESCAPES = _attack()
    """
    for _ in range(2):
        result = score(he0, probe)
        detail = result.detail
        assert not result.correct and detail['status'] == 'failed', detail
        assert detail['candidate']['status'] == 'memory', detail
        # The init lived to report the sample's SIGKILL: the OOM killer's victim was the
        # sample (before, the init or the launcher, then no status: None).
        assert detail['candidate']['returncode'] == -9, detail


def test_proc_shows_nothing_of_the_host(he0):
    """/proc/1 (the box's init), the cgroup files and the environment hold no pid of the
    scorer, no host path, no cgroup name and no token (12 hex digits or more)."""
    needles = [str(os.getpid()), REPO, 'spec_jax', 'launch']
    probe = f"""
        import os, re
        def _probe():
            blob = repr(dict(os.environ))
            for path in ('/proc/1/cmdline', '/proc/1/environ', '/proc/1/cgroup',
                         '/proc/self/cgroup', '/proc/self/environ'):
                try:
                    blob += open(path, 'rb').read().decode(errors='replace')
                except OSError:
                    pass
            alone = r'(?<![0-9])%s(?![0-9])'  # A number not inside another.
            found = [n for n in {needles!r} if re.search(alone % re.escape(n), blob)]
            return found + re.findall('[0-9a-f]{{12,}}', blob)
        ESCAPES = _probe()
    """
    result = score(he0, probe)
    assert result.correct, result.detail


def test_the_probe_never_caches_a_failed_box():
    """A probe whose box fails for another reason than missing namespaces (here: no
    interpreter) is not 'no namespaces here' and is not cached: the next probe finds them."""
    caller = textwrap.dedent(
        """
        import json
        from spec_jax.eval import sandbox
        real = sandbox.BASE_PYTHON
        sandbox.BASE_PYTHON = '/nonexistent/python3'
        first = sandbox.isolation_level()
        sandbox.BASE_PYTHON = real
        print(json.dumps([first, sandbox.isolation_level()]))
        """
    )
    proc = subprocess.run([sys.executable, '-c', caller], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout) == ['namespaces', 'namespaces'], proc.stderr[-2000:]
