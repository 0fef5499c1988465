"""The outcome of one run: `RunResult`, and reading it back from the run's files.

The launcher leaves JSON lines in the status channel (the sample's `pid`, its `wait_status`,
an `error`), the harness its reports (`R <json>`) and its sentinel (`<token> <pid>`) in the
result channel; with stdout and stderr they are memfds of the caller (read by descriptor).
`_result` turns them into a `RunResult`: an OOM kill in the run's cgroup is the sample's
failure ('memory') whatever else is missing, checked before any 'no status' decision.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import mmap
import os
import re
import signal
from typing import Any

STATUSES = (
    'ok', 'failed', 'incomplete', 'timeout', 'cpu_timeout', 'memory', 'killed', 'error', 'infra',
    'cancelled',
)  # fmt: skip
INFRASTRUCTURE = ('error', 'infra')  # Statuses that are the machine's fault, not the sample's.
TIMEOUTS = ('timeout', 'cpu_timeout')
# C0 and C1 control characters (ESC, BEL, BS, CR, DEL, CSI, ...) except tab and newline.
_CONTROL = re.compile('[\x00-\x08\x0b-\x1f\x7f-\x9f]')


def clean(text: str) -> str:
    """`text` without control characters (a sample's output cannot drive a terminal)."""
    return _CONTROL.sub('', text)


@dataclasses.dataclass(frozen=True)
class RunResult:
    """The outcome of one `run_python`.

    Attributes:
      passed: the source ran to its end and the process exited 0 within its limits.
      finished: the harness's sentinel came back (the source's last statement ran), whatever
        the exit code.
      status: the candidate's failures: 'ok' (passed); 'failed' (an exception or a nonzero
        exit: an assert, a MemoryError, ...; or a report the caller could not decode, `error`
        says why); 'incomplete' (exit 0 without the sentinel: an early sys.exit(0) or
        os._exit(0)); 'memory' (the OOM killer fired in its cgroup); 'killed' (another
        signal: os.kill(-1, 9), an abort, ...; an output flood is a 'failed' EFBIG, Python
        ignores SIGXFSZ). Timeouts (`TIMEOUTS`): 'cpu_timeout' (the cgroup's CPU time, or
        RLIMIT_CPU, passed `cpu_s`); 'timeout' (blocked until the wall-clock backstop).
        Infrastructure errors (`INFRASTRUCTURE`, `infrastructure_error`): 'error' (the
        sandbox itself failed: `error` says why); 'infra' (starved twice: runnable but not
        run for most of the backstop, on a machine too busy to judge it). 'cancelled': the
        caller stopped it (`run_python(cancel=)`).
      returncode: the sample's exit code, or minus the signal that killed it; None if unknown.
      stdout: the tail of its stdout (`tail_chars`).
      stderr: the tail of its stderr (the traceback of a failure).
      seconds: wall-clock seconds of the whole run.
      report: the last JSON object the source passed to `__sandbox_report__(obj)` (a function
        in its globals), None if none: how a test harness returns structured results.
      isolation: the isolation level it ran under (see `ISOLATIONS`).
      error: for 'error' and 'infra' the sandbox's message; for 'failed' a bad report.
      cpu_seconds: CPU time of the whole sample (its cgroup), None without cgroups.
      attempts: 2 if the run was starved once and retried.
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
    cpu_seconds: float | None = None
    attempts: int = 1

    @property
    def infrastructure_error(self) -> bool:
        """The machine failed, not the sample (`INFRASTRUCTURE`)."""
        return self.status in INFRASTRUCTURE

    @property
    def timed_out(self) -> bool:
        """The sample ran out of time (`TIMEOUTS`)."""
        return self.status in TIMEOUTS

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


def _read(fd: int, limit: int, offset: int = 0) -> bytes:
    """Up to `limit` bytes of the file `fd` from `offset` (its own offset untouched)."""
    size = os.fstat(fd).st_size
    return os.pread(fd, max(0, min(limit, size - offset)), offset) if size > offset else b''


def _tail(fd: int, chars: int) -> str:
    size = os.fstat(fd).st_size
    start = max(0, size - 4 * chars)
    return clean(_read(fd, size - start, start).decode(errors='replace'))[-chars:]


def _read_lines(fd: int, limit: int) -> list[str]:
    return _read(fd, limit).decode(errors='replace').splitlines()


def _reports(fd: int, limit: int, max_line: int, token: str, pid, decode: bool = True) -> tuple:
    """(last report, sentinel seen, decode error or '') from the first `limit` bytes of the
    result file, at a cost bounded by its size whatever it holds: the sentinel is a byte
    search, and only the last report line is decoded (`decode`: at all); a line longer than
    `max_line` or one that does not decode (bad JSON, nesting past the recursion limit) is an
    error, never an exception. The file is mapped, not copied."""
    size = min(limit, os.fstat(fd).st_size)
    if size <= 0:
        return None, False, ''
    with mmap.mmap(fd, size, prot=mmap.PROT_READ) as data:
        line = f'{token} {pid}\n'.encode()
        finished = data[: len(line)] == line or data.find(b'\n' + line) >= 0
        if not decode:
            return None, finished, ''
        start = data.rfind(b'\nR ') + 1  # The last report line.
        if start == 0 and data[:2] != b'R ':
            return None, finished, ''
        end = data.find(b'\n', start)
        end = size if end < 0 else end
        if end - start > max_line:
            return None, finished, f'a result line of {end - start} bytes (limit {max_line})'
        raw = data[start + 2 : end]
    try:
        return json.loads(raw.decode(errors='replace')), finished, ''
    except (ValueError, RecursionError, MemoryError) as e:
        error = f'an undecodable report: {type(e).__name__}: {clean(str(e))[:200]}'
        return None, finished, error


def _result(fds, token, stopped, launcher_code, isolation, seconds, tail_chars,
            report_bytes, max_line, cpu_seconds=None, oom=False, read_report=True):  # fmt: skip
    """The RunResult of a run from its channels `fds` ('out', 'err', 'res', 'status');
    `stopped`: None (the launcher exited) or why the caller stopped it ('cpu_timeout',
    'memory', 'timeout', 'starved', 'cancelled')."""
    info = {}
    for line in _read_lines(fds['status'], 1 << 20):
        try:
            fields = json.loads(line)
        except (ValueError, RecursionError):
            continue
        if isinstance(fields, dict):
            info.update(fields)
    stdout, stderr = _tail(fds['out'], tail_chars), _tail(fds['err'], tail_chars)
    sample_pid = info.get('pid')
    report, finished, bad = _reports(
        fds['res'], report_bytes, max_line, token, sample_pid, decode=read_report
    )
    returncode = None
    if 'wait_status' in info:
        returncode = os.waitstatus_to_exitcode(info['wait_status'])
    elif isolation == 'none' and sample_pid is not None:
        returncode = launcher_code  # The launcher exec'd into the sample.
    common = dict(stdout=stdout, stderr=stderr, seconds=seconds, report=report)
    common.update(isolation=isolation, finished=finished, returncode=returncode)
    common.update(cpu_seconds=cpu_seconds)
    if stopped == 'memory':  # The launcher was alive to be stopped.
        return RunResult(False, status='memory', error='out of memory (cgroup)', **common)
    if stopped is not None:
        return RunResult(False, status=stopped, **common)
    if oom:  # The launcher and init are exempt: the OOM killer killed the sample's process.
        error = 'out of memory (cgroup)'
        lost = returncode is None or (isolation == 'namespaces' and launcher_code != 0)
        if lost:  # Never seen with the exemption: said, not hidden.
            error += f'; the launcher exited {launcher_code}, sample status {returncode}'
        return RunResult(False, status='memory', error=error, **common)
    if 'error' in info:
        return RunResult(False, status='error', error=clean(str(info['error'])), **common)
    if returncode is None:
        msg = f'the launcher exited {launcher_code} without a status; stderr: {stderr[-500:]}'
        return RunResult(False, status='error', error=msg, **common)
    if returncode < 0:
        sig = -returncode
        status = 'cpu_timeout' if sig == signal.SIGXCPU else 'killed'
        return RunResult(False, status=status, **common)
    if bad:
        return RunResult(False, status='failed', error=bad, **common)
    if returncode != 0:
        return RunResult(False, status='failed', **common)
    if not finished:
        return RunResult(False, status='incomplete', **common)
    return RunResult(True, status='ok', **common)


def _memfd(name: str, data: bytes = b'') -> int:
    """An anonymous in-memory file (close-on-exec in the caller; `pass_fds` and the std
    streams hand it on), opened for appends, holding `data` with its offset at 0."""
    fd = os.memfd_create(f'spec_jax_sbx_{name}', os.MFD_CLOEXEC)
    with open(fd, 'wb', closefd=False) as f:
        f.write(data)
    os.lseek(fd, 0, os.SEEK_SET)
    fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) | os.O_APPEND)
    return fd
