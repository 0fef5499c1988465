"""The 'uid' box cleans up after itself (issue 46), and scored runs refuse it.

A killed sample's orphans stayed zombies of the host's init (counted against their uid's
process limit), the next run leased the same uid, and what the sample wrote to the host's
/tmp, /var/tmp and /dev/shm outlived it (255 MiB in /dev/shm; markers the next sample read).
Now the launcher stays as the subreaper of the sample's processes and reaps them all, a lease
takes the uid released longest ago and counts zombies as busy, and the uid's files in those
places are removed after each run. The caller here is a subreaper that never reaps, as a
host init that does not would be: before, the orphans stayed its zombies.
"""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from test_sandbox import CI, FULL, REPO, UID_BASE

from spec_jax.eval import sandbox
from spec_jax.eval.tasks import code

pytestmark = pytest.mark.skipif(
    not FULL and not CI, reason='needs root, namespaces, cgroups and libseccomp'
)
SYSTEM_PYTHON = '/usr/bin/python3'  # The 'uid' box needs an interpreter its uid can run.
# Writes a marker in each shared place, leaves a grandchild orphaned (reparented to the
# nearest subreaper), then blocks until its backstop, or exits at once (EXIT).
SAMPLE = """
import os, time
for place in ('/tmp', '/var/tmp', '/dev/shm'):
    with open(f'{place}/spec_jax_marker_{os.getuid()}', 'w') as f:
        f.write('left for the next sample')
os.makedirs(f'/tmp/spec_jax_dir_{os.getuid()}/inner')
if os.fork() == 0:
    if os.fork() == 0:
        time.sleep(1000)
    os._exit(0)
__sandbox_report__(os.getuid())
if not @EXIT@:
    time.sleep(1000)
"""
CALLER = r"""
import ctypes, json, os, sys
from spec_jax.eval import sandbox
ctypes.CDLL(None).prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER; this process never reaps.
def processes_of(uid):  # Zombies included.
    found = []
    for pid in filter(str.isdigit, os.listdir('/proc')):
        try:
            status = open(f'/proc/{pid}/status').read()
        except OSError:
            continue
        if f'\nUid:\t{uid}\t' in status:
            found.append(int(pid))
    return found
out = []
for exit_at_once in (False, True):
    source = @SAMPLE@.replace('@EXIT@', repr(exit_at_once))
    r = sandbox.run_python(source, isolation='uid', allow_weak=True, python=@PYTHON@,
                           uid_base=@BASE@, timeout_s=5.0, wall_s=1.5)
    uid = r.report
    left = processes_of(uid) if uid else None
    files = [p for p in (f'/tmp/spec_jax_marker_{uid}', f'/var/tmp/spec_jax_marker_{uid}',
                         f'/dev/shm/spec_jax_marker_{uid}', f'/tmp/spec_jax_dir_{uid}')
             if os.path.lexists(p)]
    out.append({'status': r.status, 'uid': uid, 'left': left, 'files': files})
print(json.dumps(out))
"""


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f'needs {SYSTEM_PYTHON}')
def test_the_uid_box_leaves_no_zombie_and_no_file():
    """A sample stopped at its backstop, then one that exits leaving an orphan: after each
    run no process of its uid is left, zombies included, nor any of its files in /tmp,
    /var/tmp, /dev/shm; the second run leases another uid (the least recently used)."""
    caller = (
        textwrap.dedent(CALLER)
        .replace('@SAMPLE@', repr(textwrap.dedent(SAMPLE)))
        .replace('@PYTHON@', repr(SYSTEM_PYTHON))
        .replace('@BASE@', str(UID_BASE))
    )
    proc = subprocess.run([sys.executable, '-c', caller], capture_output=True, text=True,
                          timeout=120, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.splitlines()[-1])
    print(out)
    assert [r['status'] for r in out] == ['timeout', 'ok'], out
    for r in out:
        assert r['left'] == [] and r['files'] == [], out
    assert out[0]['uid'] != out[1]['uid'], out  # Rotated, not the first free slot again.
    assert sandbox.leftover_processes(range(UID_BASE, UID_BASE + sandbox.UID_SLOTS), True) == []


def test_a_zombie_makes_its_uid_busy():
    """`leftover_processes(zombies=True)` sees a zombie (this process's unreaped child), the
    default does not: a lease asks for zombies."""
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    try:
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # Exited, not reaped: a zombie.
        assert pid in sandbox.leftover_processes([os.getuid()], zombies=True)
        assert pid not in sandbox.leftover_processes([os.getuid()])
    finally:
        os.waitpid(pid, 0)


def test_scoring_refuses_a_box_below_namespaces(monkeypatch):
    """At the 'uid' level a candidate read the gold file (it answered with the canonical
    solution): scored runs refuse it, saying why, even with the weak sandbox allowed."""
    monkeypatch.setattr(sandbox, '_level', ['uid'])
    monkeypatch.setattr(sandbox, 'ALLOW_WEAK', True)
    task = code.HumanEval()
    item = task.load(limit=1)[0]
    with pytest.raises(sandbox.WeakSandboxError, match='reference solutions'):
        task.score(item, item.meta['reference'])


@pytest.mark.skipif(not os.access(SYSTEM_PYTHON, os.X_OK), reason=f'needs {SYSTEM_PYTHON}')
def test_the_uid_sample_starts_with_no_signal_blocked():
    """The reaper blocks its stop signal until the sample has its uid; the sample (which
    keeps the mask across exec) must not inherit that."""
    source = 'import signal\nprint(sorted(signal.pthread_sigmask(signal.SIG_BLOCK, ())))'
    result = sandbox.run_python(source, isolation='uid', allow_weak=True, python=SYSTEM_PYTHON,
                                uid_base=UID_BASE)  # fmt: skip
    assert result.passed and result.stdout.strip() == '[]', result.summary()
