"""The sandbox: outcomes (pass, fail, early exit, reports) and containment of each threat.

Every hostile sample must score as a failure, leave the test process and the machine as they
were (no process of the sandbox uids, no run directory, no cgroup, no mount, no pty, no file
outside its namespace), and leave the sandbox working for the next sample. The containment
tests need every layer (root, namespaces, cgroups, libseccomp) and skip without it, except
under CI=true, where a missing layer fails them (CI runs as root on machines that have all).
The new layers' own tests: test_sandbox_box.py.
"""

import json
import os
import socket
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from spec_jax.eval import sandbox
from spec_jax.eval.sandbox import cgroups

FULL = sandbox.isolation_level() == 'namespaces' and not sandbox.missing_layers()
CI = os.environ.get('CI', '').lower() == 'true'
needs_full = pytest.mark.skipif(
    not FULL and not CI, reason='needs root, namespaces, cgroups and libseccomp'
)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# This session's own uid pool, so that other users of the sandbox cannot disturb the checks.
UID_BASE = sandbox.UID_BASE + 1_000_000 + (os.getpid() % 1000) * sandbox.UID_SLOTS
UIDS = range(UID_BASE, UID_BASE + sandbox.UID_SLOTS)


@pytest.fixture
def run(tmp_path):
    """run_python with this session's uid pool and a run dir under tmp_path; checks after the
    test that no sandbox process and no run directory is left."""
    workdir = tmp_path / 'runs'
    workdir.mkdir()

    def call(source, **kwargs):
        kwargs.setdefault('timeout_s', 10.0)
        if not FULL and not CI:  # The outcome tests also run in the weaker modes.
            kwargs.setdefault('allow_weak', True)
        if sandbox.isolation_level() != 'none':
            kwargs.setdefault('uid_base', UID_BASE)
        return sandbox.run_python(textwrap.dedent(source), workdir=str(workdir), **kwargs)

    before = machine_state()
    yield call
    assert os.listdir(workdir) == []
    if sandbox.isolation_level() != 'none':
        assert sandbox.leftover_processes(UIDS) == []
    assert machine_state() == before


def machine_state() -> dict:
    """What a run must leave as it found it: this process's cgroups, the host's mounts, the
    pty count."""
    with open('/proc/self/mountinfo') as f:
        mounts = sorted(line.split()[4] for line in f)
    with open('/proc/sys/kernel/pty/nr') as f:
        ptys = int(f.read())
    mine = f'{cgroups.PREFIX}{os.getpid()}_'
    groups = [g for g in cgroups.leftover_groups() if os.path.basename(g).startswith(mine)]
    return {'mounts': mounts, 'ptys': ptys, 'cgroups': groups}


def test_outcomes(run):
    ok = run('x = 1\nprint("hello")\n')
    assert (ok.passed, ok.finished, ok.status, ok.returncode) == (True, True, 'ok', 0)
    assert ok.stdout == 'hello\n'
    failed = run('assert 1 == 2, "nope"')
    assert (failed.passed, failed.status, failed.returncode) == (False, 'failed', 1)
    assert 'AssertionError: nope' in failed.stderr
    assert run('def f(:\n  pass').status == 'failed'  # SyntaxError
    assert run('raise SystemExit(3)').returncode == 3


@pytest.mark.parametrize(
    'early', ['import sys; sys.exit(0)', 'import os; os._exit(0)', 'raise SystemExit', 'quit()']
)
def test_early_exit_is_a_failure(run, early):
    """Exit status 0 before the tests end: no sentinel, no pass."""
    source = f'def candidate(x):\n    {early}\n    return x\nassert candidate(1) == 2\n'
    result = run(source)
    assert (result.passed, result.finished, result.status) == (False, False, 'incomplete')
    assert result.returncode == 0


def test_sentinel_from_a_forked_child_does_not_count(run):
    """A child that runs to the end while the sample itself exits 0 early is no pass."""
    source = """
        import os
        if os.fork() != 0:
            os._exit(0)
    """
    assert run(source).status == 'incomplete'


def test_report(run):
    result = run('__sandbox_report__({"a": [1, 2]})\n__sandbox_report__({"b": None})')
    assert result.passed and result.report == {'b': None}
    assert run('__sandbox_report__({"x": 1})\nassert False').report == {'x': 1}


def test_stdin_is_empty_and_name_is_not_main(run):
    source = """
        import sys
        assert sys.stdin.read() == ''
        assert __name__ != '__main__'
        if __name__ == '__main__':
            raise SystemExit(1)
    """
    assert run(source).passed


def test_wall_timeout(run):
    """A blocked sample: the wall backstop (`wall_s`) stops it, as a timeout."""
    start = time.monotonic()
    result = run('import time\nwhile True: time.sleep(0.01)', timeout_s=1.0, wall_s=1.0)
    assert (result.passed, result.status) == (False, 'timeout')
    assert time.monotonic() - start < 4


def test_cpu_limit(run):
    # nice=0: a niced sample on a busy machine may take long to use up a CPU-second.
    result = run('x = 0\nwhile True: x += 1', cpu_s=1, timeout_s=30.0, nice=0)
    assert (result.passed, result.status) == (False, 'cpu_timeout')
    assert result.timed_out and not result.infrastructure_error
    if FULL:  # The cgroup's CPU time stopped it (RLIMIT_CPU, SIGXCPU, comes a second later).
        assert 1.0 <= result.cpu_seconds < 2.0 and result.returncode != -24


def test_memory_limit(run):
    big = run('x = bytearray(8 << 30)', memory_bytes=512 << 20)
    assert big.status == 'failed' and 'MemoryError' in big.stderr
    grow = run('x = []\nwhile True: x.append(bytearray(1 << 24))', memory_bytes=512 << 20)
    assert grow.status == 'failed' and 'MemoryError' in grow.stderr


def test_output_flood(run):
    result = run('while True: print("x" * 10000)', file_bytes=1 << 20, tail_chars=100)
    assert not result.passed and result.status in ('failed', 'killed')
    assert len(result.stdout) <= 100


@needs_full
def test_fork_bomb_is_contained(run):
    bomb = run(
        """
        import os
        while True:
            try:
                os.fork()
            except OSError:
                pass
        """,
        timeout_s=2.0,
        max_processes=16,
    )
    assert not bomb.passed and bomb.status in ('timeout', 'cpu_timeout', 'failed')
    counted = run(
        """
        import os, time
        n = 0
        try:
            while True:
                if os.fork() == 0:
                    time.sleep(60)
                    os._exit(0)
                n += 1
        except BlockingIOError:
            print(n)
        """,
        max_processes=8,
    )
    assert counted.passed and int(counted.stdout) < 8  # RLIMIT_NPROC binds under its uid.
    assert run('print(1)').passed  # The sandbox still works.


@needs_full
def test_no_network_namespace(run):
    """With the audit hook off, a connection to a server listening on the machine's 127.0.0.1
    fails: the filter refuses the socket (test_sandbox_ways_out.py: every domain), and the
    empty network namespace would stop it (as the name lookup shows: no resolver)."""
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(1)
    server.settimeout(0.5)
    port = server.getsockname()[1]
    got = []
    try:
        source = f"""
            import socket
            s = socket.socket()
            s.settimeout(2)
            s.connect(('127.0.0.1', {port}))
        """
        result = run(source, block_sockets=False)
        assert result.status == 'failed'
        assert 'Operation not permitted' in result.stderr
        try:
            got.append(server.accept())
        except TimeoutError:
            pass
        assert got == []
        dns = run('import socket\nsocket.getaddrinfo("example.com", 80)', block_sockets=False)
        assert dns.status == 'failed' and 'gaierror' in dns.stderr
    finally:
        server.close()


@needs_full
def test_audit_hook_blocks_sockets(run):
    for source in (
        'import socket\nsocket.socket()',
        'import socket\nsocket.create_connection(("127.0.0.1", 9), timeout=1)',
        'import urllib.request\nurllib.request.urlopen("http://example.com", timeout=1)',
    ):
        result = run(source)
        assert result.status == 'failed'
        assert 'network access is disabled in the sandbox' in result.stderr
    assert run('import socket\na, b = socket.socketpair()\na.send(b"x")\nb.recv(1)').passed


@pytest.mark.skipif(
    os.geteuid() != 0 or not os.access('/usr/bin/python3', os.X_OK),
    reason='needs root and a system /usr/bin/python3 the sandbox uid can run',
)
def test_audit_hook_alone_without_namespaces():
    """The fallback ('uid' isolation): only the audit hook keeps the sample off the network.
    (Its scratch dir must be reachable by the sample's uid: the default workdir.)"""
    source = 'import socket\nsocket.create_connection(("127.0.0.1", 9), timeout=1)'
    weak = {'isolation': 'uid', 'python': '/usr/bin/python3', 'allow_weak': True}
    result = sandbox.run_python(source, uid_base=UID_BASE, **weak)
    assert result.isolation == 'uid' and result.status == 'failed', result
    assert 'network access is disabled in the sandbox' in result.stderr
    assert sandbox.run_python('print(1)', **weak).passed
    assert sandbox.leftover_processes(UIDS) == []


@needs_full
def test_writes_outside_scratch_are_contained(run, tmp_path):
    name = f'spec_jax_sandbox_probe_{os.getpid()}'
    outside = ['/tmp', '/var/tmp', '/dev/shm', REPO, str(tmp_path), os.path.expanduser('~')]
    source = f"""
        import os
        written, refused = [], []
        for d in {outside!r}:
            try:
                with open(os.path.join(d, {name!r}), 'w') as f:
                    f.write('x')
                written.append(d)
            except OSError:
                refused.append(d)
        open('here.txt', 'w').write('scratch is writable')
        __sandbox_report__({{'cwd': os.getcwd(), 'written': written}})
        assert not written
    """
    result = run(source)
    assert result.status == 'failed'
    assert result.report['cwd'] == sandbox.SCRATCH
    assert sorted(result.report['written']) == ['/dev/shm', '/tmp', '/var/tmp']  # Private.
    for d in outside:
        assert not os.path.exists(os.path.join(d, name)), d


@needs_full
def test_every_other_mount_is_read_only(run):
    source = """
        import os
        writable = []
        for line in open('/proc/self/mountinfo'):
            path = line.split()[4].encode().decode('unicode_escape')
            if not os.path.isdir(path):
                continue
            try:
                fd = os.open(os.path.join(path, '.spec_jax_probe'), os.O_CREAT | os.O_WRONLY)
                os.close(fd)
                writable.append(path)
            except OSError:
                pass
        print(sorted(set(writable)))
    """
    result = run(source)
    assert result.passed
    assert result.stdout.strip() == "['/dev/shm', '/tmp', '/var/tmp']"


@needs_full
def test_killing_the_parent_fails_and_the_caller_survives(tmp_path):
    """In a real subprocess (so a failure could not take pytest down): samples that signal
    their parent, the caller, their process group or everything they can."""
    caller = f"""
        import json, os, sys
        from spec_jax.eval import sandbox
        me = os.getpid()
        sources = [
            'import os; os.kill(os.getppid(), 9)',
            f'import os; os.kill({{me}}, 9)',
            f'import os; os.killpg(os.getpgid({{me}}), 9)',
            'import os; os.kill(1, 9)',
            'import os; os.kill(-1, 9)',
        ]
        results = sandbox.run_many(sources, workers=2, uid_base={UID_BASE},
                                   workdir={str(tmp_path)!r}, allow_weak={not FULL and not CI})
        print(json.dumps([r.status for r in results]))
    """
    proc = subprocess.run(
        [sys.executable, '-c', textwrap.dedent(caller)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr
    statuses = json.loads(proc.stdout)
    assert len(statuses) == 5 and 'ok' not in statuses, statuses
    assert os.listdir(tmp_path) == []
    assert sandbox.leftover_processes(UIDS) == []


@needs_full
def test_parent_environment_is_out_of_reach(run, monkeypatch):
    secret = 'hunter2-' + os.urandom(4).hex()
    monkeypatch.setenv('SPEC_JAX_SANDBOX_SECRET', secret)
    env = run(
        'import os\n__sandbox_report__(sorted(os.environ))\nos.environ["SPEC_JAX_SANDBOX_SECRET"]'
    )
    assert env.status == 'failed' and 'KeyError' in env.stderr
    assert env.report == ['HOME', 'LANG', 'PATH']
    parent = run('import os\nprint(open(f"/proc/{os.getppid()}/environ").read())')
    assert parent.status == 'failed' and 'PermissionError' in parent.stderr
    scan = run(
        f"""
        import glob
        found = []
        for path in glob.glob('/proc/[0-9]*/environ'):
            try:
                if {secret!r} in open(path).read():
                    found.append(path)
            except OSError:
                pass
        __sandbox_report__(sorted(glob.glob('/proc/[0-9]*')))
        assert found
        """
    )
    assert scan.status == 'failed' and secret not in scan.stdout + scan.stderr
    assert scan.report == ['/proc/1', '/proc/2']  # Its init and itself.


@needs_full
def test_no_privileges(run):
    source = f"""
        import os
        assert {UID_BASE} <= os.getuid() < {UID_BASE + sandbox.UID_SLOTS}
        assert os.getgroups() == []
        try:
            os.setuid(0)
        except PermissionError:
            pass
        else:
            raise AssertionError('became root')
        assert int(open('/proc/self/status').read().split('NoNewPrivs:')[1].split()[0]) == 1
    """
    assert run(source).passed


@needs_full
def test_background_processes_are_cleaned_up(run):
    """A daemon (double fork, own session) outliving a passing sample is killed with it."""
    source = """
        import os, time
        if os.fork() == 0:
            os.setsid()
            if os.fork() == 0:
                time.sleep(600)
            os._exit(0)
        time.sleep(0.2)
    """
    assert run(source).passed
    assert run('import time\nwhile True: pass', timeout_s=1.0).status == 'cpu_timeout'


def test_run_many_keeps_order_and_runs_concurrently(tmp_path):
    kwargs = {'uid_base': UID_BASE} if sandbox.isolation_level() != 'none' else {}
    kwargs['allow_weak'] = not FULL and not CI
    sources = ['import time; time.sleep(1)'] * 4 + ['assert False', 'print(5)']
    start = time.monotonic()
    results = sandbox.run_many(sources, workers=4, workdir=str(tmp_path), **kwargs)
    elapsed = time.monotonic() - start
    assert [r.status for r in results] == ['ok'] * 4 + ['failed', 'ok']
    assert results[-1].stdout == '5\n'
    assert elapsed < 3.5  # Four 1-second sleeps, at least two at a time.
    assert os.listdir(tmp_path) == []


def test_thread_safety_of_the_caller(run):
    """run_python from several threads at once, while another thread holds locks."""
    results = []
    busy = threading.Event()

    def spin():
        while not busy.is_set():
            time.sleep(0.001)

    spinner = threading.Thread(target=spin)
    spinner.start()
    try:
        threads = [
            threading.Thread(target=lambda i=i: results.append(run(f'print({i})').stdout))
            for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        busy.set()
        spinner.join()
    assert sorted(results) == [f'{i}\n' for i in range(4)]
