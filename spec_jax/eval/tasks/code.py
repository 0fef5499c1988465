"""Code benchmarks: HumanEval, MBPP (sanitized) and MBPP+ (EvalPlus), scored in the sandbox.

Each task is a frozen dataclass (`HumanEval`, `MBPP`, `MBPPPlus`; `TASKS` maps their names to
the classes) with fields `root`, the data root a config names with `data_root` ('' =
$SPEC_JAX_DATA, else the samples bundled in the package), and `timeout_s`, the wall-clock
limit on running one sample's tests (`spec_jax.eval.sandbox.run_python`; any thread).

Data. `load('')` reads the release's file under the data root (`humaneval/HumanEval.jsonl.gz`,
`mbpp/sanitized-mbpp.json`, `mbppplus/MbppPlus-v0.2.0.jsonl`; a missing one is a
`DataFileError` naming the file); `load(path)` reads a local .jsonl(.gz), .json or .parquet file
laid out like the release (or a directory holding it as under a data root); `load('hub')`
reads the hub copy through `datasets`. MBPP keeps the test split (task ids 11-510) of the
sanitized set; MBPP+ inputs are deserialised as EvalPlus does (tuples, sets, complex numbers
for the tasks whose JSON cannot carry them).

Prompts: a system message asking for the Python function alone (`CODE_SYSTEM_PROMPT`), then
HumanEval's prompt (signature and docstring) to complete, MBPP's description and tests, or
MBPP+'s description; MBPP and MBPP+ prompts end with "The function should be named X.".

Extraction (`extract_code`): the first fenced block (```python, ```py or a bare ```; the
first one that defines the entry point when there are several; an unclosed fence runs to
the end) if the text has one, else the text itself; then `sanitize` drops top-level calls,
asserts and `if __name__ == '__main__':` blocks (a model's demo code), keeping imports,
definitions and assignments. HumanEval accepts a full function (run after the prompt, whose
imports and helpers it may use) or a body continuing the prompt (indented if it was not).

Scoring (one sandbox run per sample, `correct` = it passed):
- HumanEval: prompt + completion, then `test` and `check(entry_point)`.
- MBPP: `test_imports`, the code, then the `test_list` asserts.
- MBPP+: the expected outputs come from running `canonical_solution` on the base and plus
  inputs in the sandbox, once per task and process (cached); the candidate then runs on
  each input and its outputs are compared as EvalPlus does: ==, or within `atol` (1e-6 when
  the expected value is floats and `atol` is 0) for numbers and sequences of numbers of the
  same type and length; set equality and 'not None' for the tasks EvalPlus special-cases,
  and its oracles for Mbpp/164, 295, 558 and 581. `detail` reports `base_pass` (all base
  inputs) and `plus_pass` (base and plus inputs: the MBPP+ score, = `correct`) with counts.
  Unlike EvalPlus there is no per-input time limit, only the run's `timeout_s`: the base
  results are reported before the plus inputs run, so a timeout in the plus inputs keeps
  them.

`pass_at_k(n, c, k)` is the unbiased estimator 1 - C(n-c, k) / C(n, k); `aggregate` averages
it over items with several samples each.
"""

from __future__ import annotations

import ast
import base64
import dataclasses
import hashlib
import json
import math
import pickle
import re
import textwrap
import threading
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from spec_jax.eval import sandbox
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.sources import load_hub, task_rows

CODE_SYSTEM_PROMPT = (
    'You are a code generation model that writes correct, self-contained Python. Answer with '
    'the Python function definition alone, with the imports it needs: no explanation, no '
    'usage examples and no markdown formatting.'
)

DEFAULT_TIMEOUT_S = 10.0
MBPP_TEST_IDS = range(11, 511)  # The test split of (sanitized) MBPP.

# --------------------------------------------------------------------------- extraction

_FENCE = re.compile(r'^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)', re.S | re.M)
_PYTHON_TAGS = ('python', 'py', 'python3', 'py3', '')
_CODE_LINE = re.compile(r'^(?:def |async def |class |import |from |@)')


def _defines(code: str, name: str) -> bool:
    return re.search(rf'^\s*(?:async\s+)?def\s+{re.escape(name)}\s*\(', code, re.M) is not None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def _trim_prose(text: str) -> str:
    """An unfenced text without the prose around its code: from the first line that starts a
    definition or import, and without trailing unindented lines that do not parse."""
    if _parses(text):
        return text
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_LINE.match(line)), None)
    if start is None:
        return text
    lines = lines[start:]
    for end in range(len(lines), 0, -1):
        code = '\n'.join(lines[:end])
        if _parses(code):
            return code
        if end < len(lines) - 50:
            break
    return '\n'.join(lines)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of a model's text (see the module docstring); leading indentation is kept
    (a HumanEval body)."""
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    if blocks:
        python = [body for tag, body in blocks if tag in _PYTHON_TAGS] or [b for _, b in blocks]
        if entry_point:
            python = [b for b in python if _defines(b, entry_point)] or python
        code = python[0]
    else:
        code = _trim_prose(text)
    return code.strip('\n').rstrip()


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == '__name__'
        and any(isinstance(c, ast.Constant) and c.value == '__main__' for c in test.comparators)
    )


def sanitize(code: str) -> str:
    """`code` without top-level expression statements other than docstrings (calls, prints),
    asserts and `if __name__ == '__main__':` blocks; unchanged if it does not parse."""
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return code
    lines = code.splitlines()
    keep = []
    for node in tree.body:
        if isinstance(node, ast.Assert) or _is_main_guard(node):
            continue
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])
        keep.append('\n'.join(lines[first - 1 : node.end_lineno]))
    return '\n'.join(keep)


def _compiles(code: str) -> bool:
    try:
        compile(code, '<solution>', 'exec', dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def humaneval_solution(prompt: str, code: str, entry_point: str) -> str:
    """The program text of a HumanEval completion: the prompt then a full function (which
    replaces the prompt's stub), or the prompt continued by a body (indented by 4 spaces if
    its first line was not)."""
    if _defines(code, entry_point) and _parses(code):
        return f'{prompt}\n{sanitize(code)}\n'
    indented = textwrap.indent(textwrap.dedent(code), '    ')
    first = next((line for line in code.splitlines() if line.strip()), '')
    for body in (code, indented) if first[:1].isspace() else (indented, code):
        if _compiles(prompt + body):
            return f'{prompt}{body}\n'
    return f'{prompt}{code}\n'


# --------------------------------------------------------------------------- pass@k


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from `n` samples of which `c` are correct:
    1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f'need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}')
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def aggregate(
    samples: Mapping[str, Sequence[Score | bool]], ks: Sequence[int] = (1,), key: str = ''
) -> dict:
    """pass@k averaged over items, from several scored samples per item.

    Args:
      samples: item id -> the Scores (or bools) of its samples.
      ks: the k of pass@k; a k above some item's sample count is left out.
      key: a `Score.detail` field to count instead of `correct` (e.g. 'base_pass').

    Returns:
      {'items', 'samples', 'pass@k' for each k kept, 'per_item': {id: [n, c]}}.
    """

    def ok(s: Score | bool) -> bool:
        if isinstance(s, Score):
            return bool(s.detail.get(key)) if key else s.correct
        return bool(s)

    counts = {item: (len(v), sum(ok(s) for s in v)) for item, v in samples.items()}
    out: dict[str, Any] = {'items': len(counts), 'samples': sum(n for n, _ in counts.values())}
    smallest = min((n for n, _ in counts.values()), default=0)
    for k in ks:
        if counts and k <= smallest:
            values = [pass_at_k(n, c, k) for n, c in counts.values()]
            out[f'pass@{k}'] = sum(values) / len(values)
    out['per_item'] = {item: [n, c] for item, (n, c) in counts.items()}
    return out


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class _CodeTask:
    """What the code tasks share; a subclass sets the ClassVars, `_item` and `program`."""

    root: str = ''
    timeout_s: float = DEFAULT_TIMEOUT_S

    name: ClassVar[str]
    relpath: ClassVar[str]  # The release's file under a data root.
    hub: ClassVar[tuple[str, str | None, str]]  # (id, config, split) for `datasets`.

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the module docstring), the first `limit` (0 = all)."""
        rows = task_rows(source, self.relpath, self.root, lambda: load_hub(*self.hub), limit)
        rows = self._select(rows)
        if limit:
            rows = rows[:limit]
        return [self._item(row) for row in rows]

    def score(self, item: Item, text: str) -> Score:
        """Runs the code of `text` against `item`'s tests in the sandbox (any thread)."""
        code = extract_code(text, item.meta.get('entry_point'))
        if not code.strip():
            return Score(False, None, {'status': 'no code'})
        result = sandbox.run_python(self.program(item, code), timeout_s=self.timeout_s)
        return Score(result.passed, code, result.summary())

    def program(self, item: Item, code: str) -> str:
        """The source that passes in the sandbox iff `code` passes `item`'s tests."""
        raise NotImplementedError

    def _select(self, rows: list[dict]) -> list[dict]:
        return rows

    def _item(self, row: dict) -> Item:
        raise NotImplementedError

    def _messages(self, user: str) -> tuple[dict, ...]:
        return (
            {'role': 'system', 'content': CODE_SYSTEM_PROMPT},
            {'role': 'user', 'content': user},
        )


@dataclasses.dataclass(frozen=True)
class HumanEval(_CodeTask):
    """HumanEval (164 problems): complete a function from its signature and docstring."""

    name: ClassVar[str] = 'humaneval'
    relpath: ClassVar[str] = 'humaneval/HumanEval.jsonl.gz'
    hub: ClassVar[tuple] = ('openai/openai_humaneval', None, 'test')

    def _item(self, row: dict) -> Item:
        prompt = row['prompt']
        user = (
            'Complete the following Python function. Reply with the whole function, '
            f'signature included.\n\n{prompt}'
        )
        return Item(
            task=self.name,
            id=str(row['task_id']),
            messages=self._messages(user),
            gold={'prompt': prompt, 'test': row['test'], 'entry_point': row['entry_point']},
            meta={'entry_point': row['entry_point'], 'reference': row['canonical_solution']},
        )

    def program(self, item: Item, code: str) -> str:
        g = item.gold
        solution = humaneval_solution(g['prompt'], code, g['entry_point'])
        return f'{solution}\n\n{g["test"]}\n\ncheck({g["entry_point"]})\n'


def _mbpp_entry_point(row: dict) -> str:
    """The function the tests call: a function of `code` named in the first test."""
    names = re.findall(r'^\s*def\s+(\w+)\s*\(', row.get('code', ''), re.M)
    tests = '\n'.join(row['test_list'])
    for name in names:
        if re.search(rf'\b{re.escape(name)}\s*\(', tests):
            return name
    called = re.findall(r'(\w+)\s*\(', row['test_list'][0])
    skip = {'set', 'sorted', 'list', 'tuple', 'abs', 'round', 'isclose', 'math', 'str', 'len'}
    return next((c for c in called if c not in skip), names[0] if names else '')


@dataclasses.dataclass(frozen=True)
class MBPP(_CodeTask):
    """Sanitized MBPP, test split (257 problems; task ids 11-510): code that passes asserts."""

    name: ClassVar[str] = 'mbpp'
    relpath: ClassVar[str] = 'mbpp/sanitized-mbpp.json'
    hub: ClassVar[tuple] = ('google-research-datasets/mbpp', 'sanitized', 'test')

    def _select(self, rows: list[dict]) -> list[dict]:
        return [row for row in rows if int(row['task_id']) in MBPP_TEST_IDS]

    def _item(self, row: dict) -> Item:
        entry = _mbpp_entry_point(row)
        tests = '\n'.join(row['test_list'])
        user = (
            f'{row["prompt"]}\nYour code should pass these tests:\n\n{tests}\n\n'
            f'The function should be named {entry}.'
        )
        return Item(
            task=self.name,
            id=str(row['task_id']),
            messages=self._messages(user),
            gold={
                'test_imports': list(row.get('test_imports') or []),
                'test_list': list(row['test_list']),
            },
            meta={'entry_point': entry, 'reference': row.get('code', '')},
        )

    def program(self, item: Item, code: str) -> str:
        imports = '\n'.join(item.gold['test_imports'])
        tests = '\n'.join(item.gold['test_list'])
        return f'{imports}\n{sanitize(code)}\n\n{tests}\n'


# --------------------------------------------------------------------------- MBPP+

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
"""


def _fill(template: str, **values: Any) -> str:
    for key, value in values.items():
        template = template.replace(f'@{key}@', repr(value))
    return template


_expected: dict[str, tuple[str | None, str]] = {}
_expected_lock = threading.Lock()
_expected_keys: dict[str, threading.Lock] = {}


def mbpp_plus_expected(item: Item, timeout_s: float = 60.0) -> tuple[str | None, str]:
    """(the pickled expected outputs of `item`, base64; None if the reference failed, and why)
    from running its `canonical_solution` in the sandbox; cached per process."""
    g = item.gold
    key = hashlib.sha256(
        (g['task_id'] + '\0' + g['canonical_solution'] + '\0' + g['inputs_b64']).encode()
    ).hexdigest()
    with _expected_lock:
        if key in _expected:
            return _expected[key]
        lock = _expected_keys.setdefault(key, threading.Lock())
    with lock:  # One reference run per task even when several threads score it at once.
        if key not in _expected:
            source = _fill(
                _REFERENCE,
                INPUTS=g['inputs_b64'],
                CODE=g['canonical_solution'],
                ENTRY=g['entry_point'],
                NOT_NONE=g['entry_point'] in MBPP_NOT_NONE,
            )
            run = sandbox.run_python(
                source, timeout_s=timeout_s, file_bytes=256 << 20, report_bytes=256 << 20
            )
            report = run.report if isinstance(run.report, dict) else {}
            if run.passed and isinstance(report.get('expected'), str):
                value: tuple[str | None, str] = (report['expected'], '')
            else:
                value = (None, f'the reference failed: {run.summary()}')
            with _expected_lock:
                _expected[key] = value
    return _expected[key]


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
                'inputs_b64': base64.b64encode(pickle.dumps(inputs)).decode(),
                'counts': {k: len(v) for k, v in inputs.items()},
            },
            meta={'entry_point': entry, 'reference': row['canonical_solution']},
        )

    def program(self, item: Item, code: str, expected_b64: str = '') -> str:
        g = item.gold
        return _fill(
            _CANDIDATE,
            INPUTS=g['inputs_b64'],
            EXPECTED=expected_b64,
            CODE=sanitize(code),
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
            return Score(False, code, {'error': why, 'base_pass': False, 'plus_pass': False})
        run = sandbox.run_python(self.program(item, code, expected), timeout_s=self.timeout_s)
        report = run.report if isinstance(run.report, dict) else {}
        detail = run.summary()
        full = {}
        for split, total in item.gold['counts'].items():
            ok = report.get(split)
            ok = ok if isinstance(ok, list) else []
            detail[f'{split}_passed'], detail[f'{split}_total'] = sum(map(bool, ok)), total
            full[split] = len(ok) == total and all(ok)
        detail['base_pass'] = full['base']
        detail['plus_pass'] = run.passed and full['base'] and full['plus']
        return Score(detail['plus_pass'], code, detail)


TASKS = {task.name: task for task in (HumanEval, MBPP, MBPPPlus)}
