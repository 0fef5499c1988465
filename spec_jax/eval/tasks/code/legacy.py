"""Today's in-box harness (before the two-box design of `boxes`), kept only so that tests
can compare verdicts: the candidate and its tests in ONE sandboxed process, passing iff it
runs to its end. Never used for scoring: a sample can forge these verdicts (the sentinel,
an always-true `__eq__`, the comparator's globals, MBPP+'s expected values in its box).

`program(item, code)` builds the program of any code task's item; for MBPP+ it first runs the
reference in the sandbox (`legacy_expected`) for the pickled expected outputs.
"""

from __future__ import annotations

import base64
import pickle
from typing import Any

from spec_jax.eval import sandbox
from spec_jax.eval.tasks.base import Item
from spec_jax.eval.tasks.code import wire
from spec_jax.eval.tasks.code.extract import sanitize
from spec_jax.eval.tasks.code.humaneval import humaneval_solution
from spec_jax.eval.tasks.code.mbppplus import MATCH_SOURCE, MBPP_NOT_NONE, MBPP_SET_EQ

# Runs in the sandbox: the reference on every input; reports the pickled outputs.
_REFERENCE = """
import base64, copy, pickle
inputs = pickle.loads(base64.b64decode(@INPUTS@))
g = {'__name__': '__reference__'}
exec(compile(@CODE@, 'reference.py', 'exec'), g)
fn = g[@ENTRY@]
out = {}
for split, args in inputs.items():
    out[split] = [fn(*copy.deepcopy(a)) for a in args]
    if @NOT_NONE@:
        out[split] = [r is not None for r in out[split]]
__sandbox_report__({'expected': base64.b64encode(pickle.dumps(out)).decode()})
"""

# Runs in the sandbox: the candidate on every input, compared with the expected outputs.
_CANDIDATE = """
import base64, copy, math, pickle
inputs = pickle.loads(base64.b64decode(@INPUTS@))
expected = pickle.loads(base64.b64decode(@EXPECTED@))
ENTRY, ATOL, SET_EQ, NOT_NONE = @ENTRY@, @ATOL@, @SET_EQ@, @NOT_NONE@

@MATCH@

g = {'__name__': '__sandbox__'}
exec(compile(@CODE@, 'solution.py', 'exec'), g)
fn = g[ENTRY]
report = {}
for split in ('base', 'plus'):
    ok = []
    for inp, exp in zip(inputs[split], expected[split]):
        try:
            ok.append(bool(match(fn(*copy.deepcopy(inp)), exp, inp)))
        except (Exception, SystemExit):
            ok.append(False)
    report[split] = ok
    __sandbox_report__(report)
""".replace('@MATCH@', MATCH_SOURCE)


def _fill(template: str, **values: Any) -> str:
    for key, value in values.items():
        template = template.replace(f'@{key}@', repr(value))
    return template


def _inputs_b64(item: Item) -> str:
    inputs = wire.decode(base64.b64decode(item.gold['inputs_wire']))
    return base64.b64encode(pickle.dumps(inputs)).decode()


def legacy_expected(item: Item, timeout_s: float = 60.0) -> str:
    """The pickled (base64) outputs of MBPP+ `item`'s reference, run in the sandbox."""
    g = item.gold
    source = _fill(
        _REFERENCE,
        INPUTS=_inputs_b64(item),
        CODE=g['canonical_solution'],
        ENTRY=g['entry_point'],
        NOT_NONE=g['entry_point'] in MBPP_NOT_NONE,
    )
    run = sandbox.run_python(source, timeout_s=timeout_s, file_bytes=256 << 20,
                             report_bytes=256 << 20)  # fmt: skip
    if not (run.passed and isinstance(run.report, dict)):
        raise RuntimeError(f'the reference of {item.id} failed: {run.summary()}')
    return run.report['expected']


def program(item: Item, code: str, expected_b64: str = '') -> str:
    """The one-process program that passes in the sandbox iff `code` passes `item`'s tests
    (HumanEval, MBPP or MBPP+; for MBPP+ `expected_b64` from `legacy_expected`)."""
    g = item.gold
    if item.task == 'humaneval':
        solution = humaneval_solution(g['prompt'], code, g['entry_point'])
        return f'{solution}\n\n{g["test"]}\n\ncheck({g["entry_point"]})\n'
    if item.task == 'mbpp':
        imports = '\n'.join(g['test_imports'])
        tests = '\n'.join(g['test_list'])
        return f'{imports}\n{sanitize(code)}\n\n{tests}\n'
    if item.task == 'mbppplus':
        return _fill(
            _CANDIDATE,
            INPUTS=_inputs_b64(item),
            EXPECTED=expected_b64 or legacy_expected(item),
            CODE=sanitize(code),
            ENTRY=g['entry_point'],
            ATOL=g['atol'],
            SET_EQ=g['entry_point'] in MBPP_SET_EQ,
            NOT_NONE=g['entry_point'] in MBPP_NOT_NONE,
        )
    raise ValueError(f'no legacy program for task {item.task!r} (humaneval, mbpp, mbppplus)')


def passes(item: Item, code: str, timeout_s: float = 20.0, expected_b64: str = '') -> bool:
    """Whether `code` passes `item` in today's in-box harness."""
    run = sandbox.run_python(program(item, code, expected_b64), timeout_s=timeout_s)
    if item.task != 'mbppplus':
        return run.passed
    report = run.report if isinstance(run.report, dict) else {}
    return run.passed and all(
        isinstance(report.get(k), list) and len(report[k]) == n and all(report[k])
        for k, n in item.gold['counts'].items()
    )
