"""The outcome of one run: `RunResult`, and reading it back from the run's files.

The launcher leaves JSON lines in the status file (the sample's `pid`, its `wait_status`, an
`error`), the harness its reports (`R <json>`) and its sentinel (`<token> <pid>`) in the
result file; stdout and stderr are files too. `_result` turns them into a `RunResult`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
from typing import Any

STATUSES = ('ok', 'failed', 'incomplete', 'timeout', 'cpu_timeout', 'killed', 'error')


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


def _tail(path: str, chars: int) -> str:
    with open(path, 'rb') as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        f.seek(max(0, size - 4 * chars))
        return f.read().decode(errors='replace')[-chars:]


def _read_lines(path: str, limit: int) -> list[str]:
    with open(path, 'rb') as f:
        return f.read(limit).decode(errors='replace').splitlines()


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
