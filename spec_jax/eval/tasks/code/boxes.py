"""Two boxes per sample: the candidate's code serves calls, a checker that never loads it
decides the verdict.

The candidate box (`server_source`) runs the candidate's program (for HumanEval the prompt
and completion, as `humaneval_solution` builds it), then answers calls read from a pipe: a
frame `(name, args)` (the `wire` encoding) gets `('ok', result)` or `('err', (type name,
message))`; a result that cannot be encoded is an `err`. It exits at the end of the calls.

The checker box (`checker_source`) runs the task's tests, which are dataset code (so it is a
sandboxed run too), with each function the tests call bound to a proxy that sends the
arguments to the candidate's box and returns the decoded answer. The checker never loads the
candidate's code and receives only plain data; expected values (MBPP+'s reference outputs)
live in it alone. A candidate's exception surfaces as `CandidateError`; a closed channel (the
candidate's box crashed, exited or was stopped: its CPU time, its blocked-time backstop, the
OOM killer) ends the checks with 'closed', an answer that does not decode with 'bad answer'.
Time is the candidate box's to judge, by its CPU time and a backstop that a loaded machine
moves (the sandbox's `wall_s`): the checker's own wall-clock deadline (status 'timeout') lies
beyond the latest end of the candidate's box, a last resort. The checker reports `{'status',
'checks', 'calls', 'reason', ...}` through the sandbox's report channel.

`run_pair` runs both on pipes it opens and returns the `Verdict`: passed only if the checker
ran to its end, reported status 'ok' and ran the number of checks the caller expected.
`detail['status']` is 'ok', 'failed', 'timeout' (either box's CPU or blocked-time limit) or
'infra' (what a sample cannot cause: a box that could not be set up, a box starved twice by
the machine's load, a checker that died without a report), so a report can count timeouts
and infrastructure errors apart. The checker's verdict, once it has one ('ok' or 'failed'),
stands whatever the candidate's box reports (a wrong answer stays wrong); a starved box
reruns the pair once (`detail['attempts']` 2). The candidate box's reports are never read
(`run_python(read_report=False)`). Scored runs need the 'namespaces' box (`SCORED_LEVELS`).
"""

from __future__ import annotations

import dataclasses
import inspect
import os
import re
import threading
from typing import Any

from spec_jax.eval import sandbox
from spec_jax.eval.tasks.code import wire

WIRE_SOURCE = inspect.getsource(wire)
START_SLACK_S = 3.0  # The checker's CPU and wall limits beyond the candidate's.
# The isolation levels a scored run may use: below 'namespaces' the gold data are readable.
SCORED_LEVELS = ('namespaces',)
_CONTROL = re.compile(r'[\x00-\x08\x0b-\x1f\x7f-\x9f]')

# Runs in the candidate's box after the wire module's source. Placeholders: RFD, WFD, CODE.
_SERVER = r"""
def _serve(rfd=@RFD@, wfd=@WFD@, code=@CODE@):
    import time as _time
    g = {'__name__': '__sandbox__', '__builtins__': __builtins__}
    exec(compile(code, 'solution.py', 'exec'), g)
    forever = _time.monotonic() + 10 ** 7
    while True:
        try:
            frame = read_frame(rfd, forever)
        except EOFError:
            return
        name, args = decode(frame)
        try:
            out = encode(('ok', g[name](*args)))
        except BaseException as e:  # noqa: BLE001 - every failure is an answer
            try:
                message = str(e)[:500]
            except BaseException:  # noqa: BLE001
                message = '?'
            out = encode(('err', (type(e).__name__, message)))
        write_frame(wfd, out)
_serve()
"""

# Runs in the checker's box after the wire module's source and before the task's checks.
# Placeholders: RFD, WFD, TIMEOUT. The checks set CHECKS[0] and may add to REPORT.
_CHECKER = r'''
import time as _time

DEADLINE = _time.monotonic() + @TIMEOUT@
CHECKS, CALLS, REPORT = [0], [0], {}


class CandidateError(Exception):
    """The candidate raised (or its answer could not cross)."""


class _Stop(BaseException):  # Not an Exception: a test's `except Exception` cannot hide it.
    def __init__(self, status, reason):
        super().__init__(reason)
        self.status, self.reason = status, reason


class Proxy:
    """Stands for the candidate's function `name`: a call crosses to the candidate's box."""

    def __init__(self, name):
        self.name = name

    def __call__(self, *args):
        CALLS[0] += 1
        try:
            write_frame(@WFD@, encode((self.name, args)))
        except WireError as e:
            raise _Stop('infra', f'the test passed an argument that cannot cross: {e}')
        except OSError as e:
            raise _Stop('closed', f'the candidate box is gone ({type(e).__name__})')
        try:
            answer = decode(read_frame(@RFD@, DEADLINE))
        except TimeoutError:
            raise _Stop('timeout', f'no answer to call {CALLS[0]} ({self.name}) in time')
        except (EOFError, OSError):
            raise _Stop('closed', f'the candidate box closed at call {CALLS[0]} ({self.name})')
        except (WireError, RecursionError, MemoryError) as e:
            raise _Stop('bad answer', f'call {CALLS[0]}: {str(e)[:200]}')
        if not (isinstance(answer, tuple) and len(answer) == 2 and answer[0] in ('ok', 'err')):
            raise _Stop('bad answer', f'call {CALLS[0]}: not an answer')
        if answer[0] == 'ok':
            return answer[1]
        info = answer[1]
        if not (isinstance(info, tuple) and len(info) == 2
                and all(isinstance(s, str) for s in info)):
            raise _Stop('bad answer', f'call {CALLS[0]}: not an error')
        raise CandidateError(f'{info[0][:80]}: {info[1][:300]}')


def _finish(status, reason=''):
    out = dict(REPORT)
    out.update(status=status, reason=reason[:400], checks=CHECKS[0], calls=CALLS[0])
    __sandbox_report__(out)


def _run_checks(checks):
    try:
        checks()
    except _Stop as e:
        _finish(e.status, e.reason)
    except BaseException as e:  # noqa: BLE001 - an assertion or anything the test raised
        _finish('failed', f'{type(e).__name__}: {e}'[:400])
    else:
        _finish('ok')
'''


def server_source(code: str, rfd: int, wfd: int) -> str:
    """The candidate box's program: `code`, then the call loop on fds `rfd` / `wfd`."""
    body = _SERVER.replace('@RFD@', str(rfd)).replace('@WFD@', str(wfd))
    return WIRE_SOURCE + body.replace('@CODE@', repr(code))


def checker_source(checks: str, rfd: int, wfd: int, timeout_s: float) -> str:
    """The checker box's program: the proxies on fds `rfd` / `wfd`, then `checks` (source that
    defines `checks()` and ends with `_run_checks(checks)`)."""
    head = _CHECKER.replace('@RFD@', str(rfd)).replace('@WFD@', str(wfd))
    return WIRE_SOURCE + head.replace('@TIMEOUT@', repr(float(timeout_s))) + checks


def fill(template: str, **values: Any) -> str:
    """`template` with each `@KEY@` replaced by the repr of its value."""
    for key, value in values.items():
        template = template.replace(f'@{key}@', repr(value))
    return template


def clean(text: Any, limit: int = 400) -> str:
    """`text` as a short string without control characters (for `detail`)."""
    return _CONTROL.sub('?', str(text))[:limit]


@dataclasses.dataclass(frozen=True)
class Verdict:
    """The outcome of `run_pair`: `passed`, the checker's `report` (a dict, {} if none) and
    `detail` (JSON-ready: status, reason, checks, calls, seconds, the boxes' summaries)."""

    passed: bool
    report: dict
    detail: dict


def backstop_s(timeout_s: float) -> float:
    """The wall-clock backstop of a candidate's box with `timeout_s` of CPU time."""
    return 2 * timeout_s + 10


def _status(cand: sandbox.RunResult, chk: sandbox.RunResult, report: dict, checks: int) -> str:
    reported = report.get('status')
    if chk.infrastructure_error:  # The checker's box: set-up failed, or starved.
        return 'infra'
    if reported in ('ok', 'failed'):  # The checker's verdict, whatever the candidate's box says.
        passed = chk.passed and reported == 'ok' and report.get('checks') == checks
        return 'ok' if passed else 'failed'
    if reported == 'timeout' or chk.timed_out:
        return 'timeout'
    if reported in ('closed', 'bad answer'):
        if cand.timed_out:
            return 'timeout'
        # A box that never ran the sample (set-up) or that the machine starved; the OOM
        # killer, a crash, an exit, a signal are the sample's ('memory', 'failed', 'killed').
        return 'infra' if cand.infrastructure_error else 'failed'
    if reported is None:  # The checker died without a report.
        return 'failed' if chk.status in ('failed', 'killed', 'memory') else 'infra'
    return 'infra' if reported == 'infra' else 'failed'  # An argument that cannot cross.


def run_pair(code: str, checks: str, expected_checks: int, timeout_s: float) -> Verdict:
    """Runs `code` in a candidate box and `checks` (see `checker_source`) in a checker box,
    connected by two pipes; passed iff the checker ran `expected_checks` checks and all held.

    Limits: the candidate's box has `timeout_s` of CPU time (the sandbox's `cpu_s`, its
    start-up and every process it forks included) and a blocked-time backstop of
    `backstop_s(timeout_s)` (moved by its run-queue delay, up to `sandbox.STARVED_FACTOR`
    times); the checker waits for answers until after the latest end of the candidate's box
    and has its own CPU and wall limits. When the checker ends, the candidate's box is
    cancelled. A box starved by the machine's load reruns the pair once.

    Raises:
      sandbox.WeakSandboxError: below the 'namespaces' box (`SCORED_LEVELS`): there the
        sample reads the host's files, the gold data (tests, reference solutions) included.
    """
    level = sandbox.isolation_level()
    if level not in SCORED_LEVELS:
        raise sandbox.WeakSandboxError(
            f"code samples are scored only in the 'namespaces' box; here the sandbox is "
            f"{level!r}, whose samples can read the host's files, the tasks' tests and "
            f'reference solutions included, so a score would not measure the model (a '
            f'candidate answered with the canonical solution). Run as root where unshare '
            f'is allowed (docs/sandbox.md, "Machines without a layer")'
        )
    verdict = _run_pair_once(code, checks, expected_checks, timeout_s)
    if verdict.detail.pop('starved', False):
        verdict = _run_pair_once(code, checks, expected_checks, timeout_s)
        verdict.detail.pop('starved', False)
        verdict.detail['attempts'] = 2
    return verdict


def _run_pair_once(code: str, checks: str, expected_checks: int, timeout_s: float) -> Verdict:
    """One run of the pair (see `run_pair`); detail['starved'] if a box was starved."""
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    results: dict[str, sandbox.RunResult] = {}
    done = threading.Event()
    backstop = backstop_s(timeout_s)
    latest = sandbox.STARVED_FACTOR * backstop  # The latest end of the candidate's box.

    def candidate() -> None:
        try:
            results['candidate'] = sandbox.run_python(
                server_source(code, req_r, resp_w),
                timeout_s=timeout_s,
                wall_s=backstop,
                pass_fds=(req_r, resp_w),
                cancel=done,
                retry_starved=False,
                read_report=False,  # Never used: its reports cost the caller nothing.
            )
        finally:  # Its box is gone: the checker's next read sees EOF.
            os.close(req_r)
            os.close(resp_w)

    thread = threading.Thread(target=candidate, name='candidate-box', daemon=True)
    thread.start()
    try:
        chk = sandbox.run_python(
            checker_source(checks, resp_r, req_w, latest + START_SLACK_S),
            timeout_s=timeout_s + START_SLACK_S,
            wall_s=latest + 2 * START_SLACK_S,
            pass_fds=(resp_r, req_w),
            retry_starved=False,
        )
    finally:  # The checks are over: stop the candidate (it also sees EOF on its requests).
        done.set()
        os.close(resp_r)
        os.close(req_w)
        thread.join()
    cand = results.get('candidate')
    if cand is None:  # run_python raised in the thread (the sandbox itself failed).
        detail = {'status': 'infra', 'reason': 'the candidate box did not run'}
        return Verdict(False, {}, detail)
    starved = 'infra' in (cand.status, chk.status)  # run_python's 'infra': starved.
    report = chk.report if isinstance(chk.report, dict) else {}
    status = _status(cand, chk, report, expected_checks)
    detail = {
        'status': status,
        'reason': clean(report.get('reason', '')),
        'checks': report.get('checks', 0),
        'calls': report.get('calls', 0),
        'seconds': round(max(cand.seconds, chk.seconds), 3),
        'candidate': {
            k: clean(v, 300) if isinstance(v, str) else v for k, v in cand.summary().items()
        },  # fmt: skip
        'checker': {
            k: clean(v, 300) if isinstance(v, str) else v for k, v in chk.summary().items()
        },  # fmt: skip
    }
    if cand.stderr.strip():
        detail['stderr'] = clean(cand.stderr.strip().splitlines()[-1], 300)
    if starved and status == 'infra':
        detail['starved'] = True
    return Verdict(status == 'ok', report, detail)
