"""MBPP+ (EvalPlus): MBPP with many more inputs, graded against the reference's outputs.

Inputs. `mbpp_plus_inputs` deserialises the JSON inputs as EvalPlus does (tuples, sets,
complex numbers for the tasks whose JSON cannot carry them).

Expected outputs. `mbpp_plus_expected` runs `canonical_solution` on the base and plus inputs
in the sandbox (a success is cached per task and process, a failure is not); the outputs
come back in the `wire` encoding and go only to the checker's box, never to the candidate's.

Comparison (`boxes.run_pair`). The candidate's box serves calls; the checker's box sends it
each input and compares the decoded answer with the expected output as EvalPlus does: ==, or
within `atol` (1e-6 when the expected value is floats and `atol` is 0) for numbers and
sequences of numbers of the same type and length; set equality and 'not None' for the tasks
EvalPlus special-cases (`MBPP_SET_EQ`, `MBPP_NOT_NONE`), and its oracles for Mbpp/164, 295,
558 and 581. `detail` reports `base_pass` (all base inputs) and `plus_pass` (base and plus
inputs: the MBPP+ score, = `correct`) with counts. Unlike EvalPlus there is no per-input
time limit, only `timeout_s` over all the calls: a timeout in the plus inputs keeps the base
results (`detail['status']` 'timeout').

The prompt is the task's description, ending "The function should be named X.".
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import threading
from typing import Any, ClassVar

from spec_jax.eval import sandbox
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.code import boxes, wire
from spec_jax.eval.tasks.code.extract import extract_code, sanitize
from spec_jax.eval.tasks.code.task import _CodeTask

# Task numbers whose JSON inputs EvalPlus turns back into tuples, sets or complex numbers.
_TUPLE_ARGS = {2, 116, 132, 143, 222, 261, 273, 394, 399, 421, 424, 429, 470, 560, 579, 596,
               616, 630, 726, 740, 744, 809}  # fmt: skip
_TUPLES_IN_ARGS = {63, 64, 70, 94, 120, 237, 272, 299, 400, 409, 417, 438, 473, 614, 780}
_TUPLES_IN_FIRST = {75, 413, 444, 753}
_TUPLE_SECOND = {106, 750}
_TUPLE_FIRST = {250, 405, 446, 617, 720, 763, 808}
_NESTED_TUPLES = {259, 401, 445}
_ALL_TUPLES = {580, 615, 791}

# Entry points EvalPlus compares specially (evalplus/eval/__init__.py, _special_oracle.py).
MBPP_SET_EQ = {'similar_elements', 'find_char_long', 'common_in_nested_lists', 'extract_singly',
               'larg_nnum', 'intersection_array', 'find_dissimilar', 'Diff'}  # fmt: skip
MBPP_NOT_NONE = {'check_str', 'text_match_three', 'text_starta_endb'}


def _deep_tuple(x: Any) -> Any:
    return tuple(_deep_tuple(i) for i in x) if isinstance(x, list) else x


def mbpp_plus_inputs(task_id: str, inputs: Any) -> list:
    """MBPP+ inputs as the functions take them (EvalPlus's deserialisation of its JSON)."""
    if isinstance(inputs, str):
        inputs = json.loads(inputs)
    inputs = list(inputs or [])  # Mbpp/793 has {} for no plus inputs.
    n = int(str(task_id).split('/')[-1])
    if n in _TUPLE_ARGS:
        return [[tuple(a) for a in inp] for inp in inputs]
    if n in _TUPLES_IN_ARGS:
        return [[[tuple(x) for x in a] for a in inp] for inp in inputs]
    if n in _TUPLES_IN_FIRST:
        return [[[tuple(x) for x in inp[0]], inp[1]] for inp in inputs]
    if n in _TUPLE_SECOND:
        return [[inp[0], tuple(inp[1])] for inp in inputs]
    if n == 115:
        return [[[set(x) if isinstance(x, list) and x else {} for x in inp[0]]] for inp in inputs]
    if n == 124:
        return [(float(inp[0]), complex(inp[1])) for inp in inputs]
    if n in _TUPLE_FIRST:
        return [[tuple(inp[0]), *inp[1:]] for inp in inputs]
    if n in _NESTED_TUPLES:
        return [[tuple(tuple(x) for x in a) for a in inp] for inp in inputs]
    if n == 278:
        return [[tuple(tuple(x) if isinstance(x, list) else x for x in inp[0])] for inp in inputs]
    if n == 307:
        return [[tuple(inp[0]), inp[1], inp[2]] for inp in inputs]
    if n == 722:
        return [[{k: tuple(v) for k, v in inp[0].items()}, *inp[1:]] for inp in inputs]
    if n == 252:
        return [[complex(inp[0])] for inp in inputs]
    if n in _ALL_TUPLES:
        return [_deep_tuple(inp) for inp in inputs]
    return inputs


# Runs in the sandbox after the wire module: the reference on every input; reports the
# wire-encoded outputs (base64), which only the checker's box decodes.
_REFERENCE = """
import base64, copy
inputs = decode(base64.b64decode(@INPUTS@))
g = {'__name__': '__reference__'}
exec(compile(@CODE@, 'reference.py', 'exec'), g)
fn = g[@ENTRY@]
out = {}
for split, args in inputs.items():
    out[split] = [fn(*copy.deepcopy(a)) for a in args]
    if @NOT_NONE@:
        out[split] = [r is not None for r in out[split]]
__sandbox_report__({'expected': base64.b64encode(encode(out)).decode()})
"""

# EvalPlus's comparison of an output with the expected one (needs math, ENTRY, ATOL, SET_EQ,
# NOT_NONE in scope): `match(out, exp, inp)`.
MATCH_SOURCE = """
def is_floats(x):
    if isinstance(x, float):
        return True
    return isinstance(x, (list, tuple)) and bool(x) and all(isinstance(i, float) for i in x)

def close(a, b, atol):  # numpy.allclose(a, b, rtol=1e-7, atol) on numbers and sequences
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))):
            return False
        return len(a) == len(b) and all(close(x, y, atol) for x, y in zip(a, b))
    if not (isinstance(a, (int, float, complex)) and isinstance(b, (int, float, complex))):
        return False
    if a != a or b != b:
        return False
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        if math.isinf(a) or math.isinf(b):
            return a == b
    return abs(a - b) <= atol + 1e-7 * abs(b)

def surface_area(base_edge, height):  # EvalPlus's oracle for Mbpp/581
    slant = math.sqrt((base_edge / 2) ** 2 + height ** 2)
    return round(base_edge ** 2 + 2 * base_edge * slant)

def digit_distance(a, b):  # EvalPlus's oracle for Mbpp/558
    a, b = str(a), str(b)
    width = max(len(a), len(b))
    return sum(abs(int(x) - int(y)) for x, y in zip(a.zfill(width), b.zfill(width)))

def match(out, exp, inp):
    exact = bool(out == exp)
    if ENTRY == 'are_equivalent':
        exact = True
    elif ENTRY == 'sum_div':
        exact = exact or out == 0
    elif ENTRY == 'surface_Area':
        exact = exact or abs(out - surface_area(*inp)) <= ATOL
    elif ENTRY == 'digit_distance_nums':
        exact = exact or out == digit_distance(*inp)
    elif SET_EQ:
        exact = set(out) == set(exp)
    elif NOT_NONE:
        exact = out == exp if isinstance(out, bool) else exp == (out is not None)
    atol = ATOL if ATOL or not is_floats(exp) else 1e-6
    if exact or not atol:
        return exact
    if type(out) is not type(exp):
        return False
    return close(out, exp, atol)

"""

# The checks (the checker's box, see `boxes`): the candidate's answer on every input compared
# with the expected output, EvalPlus's way, on this side only.
_CHECKS = """
import math
ENTRY, ATOL, SET_EQ, NOT_NONE = @ENTRY@, @ATOL@, @SET_EQ@, @NOT_NONE@

@MATCH@

def checks():
    import base64
    inputs = decode(base64.b64decode(@INPUTS@))
    expected = decode(base64.b64decode(@EXPECTED@))
    fn = Proxy(ENTRY)
    for split in ('base', 'plus'):
        ok = REPORT[split] = []
        for inp, exp in zip(inputs[split], expected[split]):
            try:
                out = fn(*inp)
                held = bool(match(out, exp, inp))
            except Exception:
                held = False
            ok.append(held)
            CHECKS[0] += 1

_run_checks(checks)
""".replace('@MATCH@', MATCH_SOURCE)


_expected: dict[str, str] = {}
_expected_lock = threading.Lock()
_expected_keys: dict[str, threading.Lock] = {}


def mbpp_plus_expected(item: Item, timeout_s: float = 60.0) -> tuple[str | None, str]:
    """(the expected outputs of `item`, wire-encoded in base64; None if the reference failed,
    and why) from running its `canonical_solution` in the sandbox. A success is cached per
    process; a failure is not (the next sample runs the reference again)."""
    g = item.gold
    key = hashlib.sha256(
        (g['task_id'] + '\0' + g['canonical_solution'] + '\0' + g['inputs_wire']).encode()
    ).hexdigest()
    with _expected_lock:
        if key in _expected:
            return _expected[key], ''
        lock = _expected_keys.setdefault(key, threading.Lock())
    with lock:  # One reference run per task even when several threads score it at once.
        if key in _expected:
            return _expected[key], ''
        source = boxes.WIRE_SOURCE + boxes.fill(
            _REFERENCE,
            INPUTS=g['inputs_wire'],
            CODE=g['canonical_solution'],
            ENTRY=g['entry_point'],
            NOT_NONE=g['entry_point'] in MBPP_NOT_NONE,
        )
        run = sandbox.run_python(
            source, timeout_s=timeout_s, file_bytes=256 << 20, report_bytes=256 << 20
        )
        report = run.report if isinstance(run.report, dict) else {}
        if not (run.passed and isinstance(report.get('expected'), str)):
            return None, f'the reference failed: {run.summary()}'
        with _expected_lock:
            _expected[key] = report['expected']
    return _expected[key], ''


def _mbpp_plus_user(prompt: str, entry_point: str) -> str:
    text = prompt.strip()
    if text.startswith('"""') and text.endswith('"""'):
        text = text[3:-3].strip()
    return f'{text}\nThe function should be named {entry_point}.'


@dataclasses.dataclass(frozen=True)
class MBPPPlus(_CodeTask):
    """MBPP+ v0.2.0 (378 problems, EvalPlus): MBPP with many more inputs, graded against the
    reference solution's outputs."""

    timeout_s: float = 20.0

    name: ClassVar[str] = 'mbppplus'
    relpath: ClassVar[str] = 'mbppplus/MbppPlus-v0.2.0.jsonl'
    hub: ClassVar[tuple] = ('evalplus/mbppplus', None, 'test')

    def _item(self, row: dict) -> Item:
        task_id, entry = str(row['task_id']), row['entry_point']
        inputs = {
            'base': mbpp_plus_inputs(task_id, row['base_input']),
            'plus': mbpp_plus_inputs(task_id, row['plus_input']),
        }
        return Item(
            task=self.name,
            id=task_id,
            messages=self._messages(_mbpp_plus_user(row['prompt'], entry)),
            gold={
                'task_id': task_id,
                'entry_point': entry,
                'canonical_solution': row['canonical_solution'],
                'atol': float(row.get('atol') or 0),
                'inputs_wire': base64.b64encode(wire.encode(inputs)).decode(),
                'counts': {k: len(v) for k, v in inputs.items()},
            },
            meta={'entry_point': entry, 'reference': row['canonical_solution']},
        )

    def checks(self, item: Item, expected_b64: str) -> str:
        """The checker's source: `item`'s inputs, the expected outputs and the comparison."""
        g = item.gold
        return boxes.fill(
            _CHECKS,
            INPUTS=g['inputs_wire'],
            EXPECTED=expected_b64,
            ENTRY=g['entry_point'],
            ATOL=g['atol'],
            SET_EQ=g['entry_point'] in MBPP_SET_EQ,
            NOT_NONE=g['entry_point'] in MBPP_NOT_NONE,
        )

    def score(self, item: Item, text: str) -> Score:
        """Runs the code of `text` on the base and plus inputs (see the module docstring)."""
        code = extract_code(text, item.meta.get('entry_point'))
        if not code.strip():
            return Score(False, None, {'status': 'no code', 'base_pass': False, 'plus_pass': False})
        expected, why = mbpp_plus_expected(item)
        if expected is None:
            detail = {'status': 'infra', 'reason': why, 'base_pass': False, 'plus_pass': False}
            return Score(False, code, detail)
        counts = item.gold['counts']
        verdict = boxes.run_pair(
            sanitize(code), self.checks(item, expected), sum(counts.values()), self.timeout_s
        )
        detail = dict(verdict.detail)
        full = {}
        for split, total in counts.items():
            ok = verdict.report.get(split)
            ok = ok if isinstance(ok, list) else []
            detail[f'{split}_passed'] = sum(x is True for x in ok)
            detail[f'{split}_total'] = total
            full[split] = len(ok) == total and all(x is True for x in ok)
        detail['base_pass'] = full['base']
        detail['plus_pass'] = verdict.passed and full['base'] and full['plus']
        return Score(detail['plus_pass'], code, detail)
