"""Math benchmarks: GSM8K, MATH-500, MATH, AIME 2024 and AIME 2025.

Each task is a frozen dataclass (`GSM8K`, `MATH500`, `MATH`, `AIME24`, `AIME25`; `TASKS` maps
their names to the classes) with two fields: `root`, the data root a config names with
`data_root` ('' = $SPEC_JAX_DATA, else the samples bundled in the package), and `timeout_s`,
the wall-clock limit on scoring one text.

Data. `load('')` reads the release's file under the data root (`gsm8k/test.jsonl`,
`math500/test.jsonl`, `math/test.jsonl`, `aime24/test.jsonl`, `aime25/test.jsonl`; a missing
one is a `DataFileError` naming the file, the `data_root` field and the hub id);
`load(path)` reads a local .jsonl, .json or .parquet file laid out like the release (or a
directory holding `<task>/test.jsonl` or `test.jsonl`); `load('hub')` reads the hub copy
through `datasets`; `load('fast_hsd')` reads the paper's own items (`tasks.fast_hsd`): for
GSM8K all 1,319 test questions, for MATH the paper's MATH, the first 500 rows of
competition_math's *train* split (ids 'train/<row>'; 240 bundled, rows 240.. of a larger
limit from the hub `qwedsacf/competition_math`, offline a `DataFileError`); the other math
tasks have none. The gold answers: GSM8K, the text after '####' with thousands commas
removed; MATH-500, `answer`; MATH, the last brace-balanced \\boxed{} of `solution`; AIME, the
answer as an integer (aime24's answers are zero-padded strings). The aime25 release has three
problems (rows 18, 19, 27) whose `\\f` and `\\t` JSON escapes were decoded into a form feed
and a tab (`\\frac` -> form feed + 'rac'); `load` puts the backslashes back.

Prompts: a system message asking for a step-by-step solution with the final answer in
\\boxed{} (`MATH_SYSTEM_PROMPT`, or `GSM8K_SYSTEM_PROMPT`), then the problem as the user turn.

Scoring (math-verify). The model's answer is the last complete \\boxed{} (or \\fbox{}) of its
text; without one, math-verify's own extraction of the text's last `MAX_TEXT` characters
(MATH, AIME) or, for GSM8K, the last of '#### X' and 'the answer is X' by position, and the
last number only when there is no marker. The extraction (`math_answers`) is linear time. An
answer span over `MAX_SPAN` characters is not parsed (incorrect, detail 'too_long'). math-verify
parses the answer and the gold to sympy and decides equivalence (\\frac{1}{2} = 0.5 = 1/2, sets
in any order, x=5 vs 5, ...). Beside the verdict, detail['strict'] is True when the text is
correct and does not hedge (`math_answers.hedges`: alternatives, more values than the gold
has, a tuple where one value is asked, '18 = 19', distinct final answers), and
detail['hedges'] lists what was found, [{'kind', 'answer'}].

Deadline. math-verify's own timeouts use `signal.alarm`, which works on the main thread only,
so they are turned off and the whole scoring of a text (extraction, math-verify, the strict
score) runs in a worker subprocess of a shared `timeouts.DeadlinePool` that is killed at the
deadline: `score` works on any thread, and a text whose sympy call is stuck in a huge power
or factorial (or in math-verify's parser, which is exponential in bracket nesting: 10 nested
braces take seconds) scores as incorrect and not strict, with detail {'timeout': True} and
nothing extracted, after `timeout_s` seconds instead of hanging the run.
"""

from __future__ import annotations

import dataclasses
import functools
import threading
from typing import Any, ClassVar

from spec_jax.eval.tasks import fast_hsd, timeouts
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.math_answers import (
    MARKERS,
    MAX_SPAN,
    answer_span,
    clip,
    extract_answer,
    final_boxes,
    hedges,
    last_boxed,
    marker_hedges,
    markers,
    normal,
)
from spec_jax.eval.tasks.math_numbers import no_thousands, read_number

__all__ = ['extract_answer', 'last_boxed']  # Re-exported: the extraction lives in math_answers.
from spec_jax.eval.tasks.sources import load_hub, task_rows

MATH_SYSTEM_PROMPT = (
    'You are a helpful math assistant. Solve the problem step by step, explaining your '
    'reasoning, and put your final answer within \\boxed{}.'
)
GSM8K_SYSTEM_PROMPT = (
    'You are a helpful math assistant. Solve the word problem step by step, showing your '
    'calculations, and put the final numerical answer within \\boxed{}.'
)

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_WORKERS = 2

MAX_TEXT = 8000  # math-verify's own extraction (no box) reads the text's last MAX_TEXT chars.
MAX_COMPARED = 8  # More distinct final answers than this are a hedge without comparing them.

# --------------------------------------------------------------------------- judging
# These run in the verifier's worker processes (math-verify is imported there only).


def _parse(text: str, configs: str) -> list:
    from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse  # noqa: PLC0415

    if configs == 'boxed':
        extraction = [LatexExtractionConfig(boxed_match_priority=0)]
    elif configs == 'latex':
        extraction = [LatexExtractionConfig()]
    else:  # Everything math-verify extracts by default.
        extraction = [LatexExtractionConfig(), ExprExtractionConfig()]
    return parse(text, extraction, parsing_timeout=None)


@functools.lru_cache(maxsize=4096)
def _gold(gold: str) -> tuple:
    parsed = _parse(f'${gold}$', 'latex') or _parse(f'\\boxed{{{gold}}}', 'boxed')
    return tuple(parsed) if parsed else (gold,)


def _is_number(value: Any) -> bool:
    return getattr(value, 'is_number', False) is True


def _integer_valued(value: Any) -> bool:
    try:
        return float(value) == round(float(value))
    except (TypeError, ValueError, OverflowError):
        return False


def _shown(value: Any) -> str | None:
    """str(value), None where Python refuses it (an integer over its 4,300-digit limit)."""
    try:
        return str(value)
    except ValueError:
        return None


def _number_prediction(span: str) -> list:
    """math-verify's parse of a GSM8K span that is one expression with a number's value, or
    an equation whose last side is one ('9 \\times 2 = 18'); else []."""
    parsed = _parse(f'\\boxed{{{no_thousands(span)}}}', 'boxed')
    if parsed and type(parsed[0]).__name__ == 'Equality' and _is_number(parsed[0].rhs):
        return [parsed[0].rhs]
    return parsed if parsed and _is_number(parsed[0]) else []


def _prediction(kind: str, gold: str, span: str, method: str) -> tuple[list, Any, list]:
    """(math-verify's parse, extracted, hedges) of one answer span (see `extract_answer`).

    A span that hedges, or whose number a word or sign after it changes ('18 (or 19)',
    '18²'), has no parse. A span that is one number (`read_number`: units, currency and
    thousands allowed, '18 thousand' is 18000) is that number (a percentage on MATH and
    AIME goes to math-verify); any other span is read by math-verify as one expression
    (GSM8K: one with a number's value, or an equation whose last side is one), never as a
    number picked out of it. Without a box or marker (MATH, AIME) math-verify extracts.
    """
    if method == 'boxed':
        found = hedges(span, gold)
    elif method in MARKERS:
        found = marker_hedges(span, gold)
    else:
        found = []
    number = read_number(span if method != 'math_verify' else '', kind != 'number')
    if found or number.changed:
        return [], span, found
    if number.value is not None and (kind == 'number' or '%' not in span):
        shown = number.value if kind == 'number' or number.scaled else span
        return _parse(f'${number.value}$', 'latex'), shown, found
    if kind == 'number':
        return _number_prediction(span), span, found
    if method != 'math_verify':  # The whole span, one expression (not a number picked out).
        return _parse(f'\\boxed{{{span}}}', 'boxed'), span, found
    pred = _parse(span, 'all')
    extracted = pred[-1] if pred and isinstance(pred[-1], str) else None
    return pred, extracted, hedges(extracted, gold) if extracted is not None else []


def _judge(kind: str, gold: str, span: str, method: str) -> tuple[bool, Any, dict, list]:
    """(correct, extracted, detail, hedges) for one answer span (see `extract_answer`): a
    span that hedges is incorrect.

    kind: 'latex' (MATH, MATH-500), 'integer' (AIME) or 'number' (GSM8K).
    """
    from math_verify import verify  # noqa: PLC0415 - optional, in the worker only

    gold_parsed = _gold(gold)
    pred, extracted, found = _prediction(kind, gold, span, method)
    detail = {
        'method': method,
        'gold_parsed': _shown(gold_parsed[0]),
        'pred_parsed': _shown(pred[0]) if pred else None,
    }
    if not pred or found:
        return False, extracted, detail, found
    correct = verify(list(gold_parsed), pred, timeout_seconds=None)
    if correct and kind == 'integer':  # AIME answers are integers: 73.0001 is not 73.
        value = pred[0].rhs if type(pred[0]).__name__ == 'Equality' else pred[0]
        correct = _integer_valued(value)
    return bool(correct), extracted, detail, found


def _same_answer(a: str, b: str) -> bool:
    """Whether two final answers are the same answer (math-verify)."""
    from math_verify import verify  # noqa: PLC0415 - optional, in the worker only

    if len(a) > MAX_SPAN or len(b) > MAX_SPAN:
        return False
    pa, pb = _parse(f'\\boxed{{{a}}}', 'boxed'), _parse(f'\\boxed{{{b}}}', 'boxed')
    return bool(pa and pb and verify(pa, pb, timeout_seconds=None))


def _strict(kind: str, gold: str, text: str, span: str, method: str, found: list) -> list:
    """The hedges of a text: the verdict span's (`found`), every final box's, every answer
    marker's (GSM8K, or a text answered by a marker), then whether the final answers are one
    answer; as [{'kind', 'answer'}]."""
    found = list(found)
    boxed = final_boxes(text)
    for answer in dict.fromkeys(boxed):
        found += hedges(answer, gold)
    answers = list(boxed)
    if kind == 'number' or method in MARKERS:
        for _, rest in markers(text):
            answer = answer_span(rest)
            hedged = marker_hedges(answer, gold)
            found += hedged
            if not hedged:
                answers.append(read_number(answer, kind != 'number').value or answer)
    if method == 'boxed':
        reference = boxed[-1]
    elif method in MARKERS:
        reference = read_number(span, kind != 'number').value or span
    else:
        reference = answers[-1] if answers else ''
    distinct = {normal(a): a for a in answers}
    distinct.pop(normal(reference), None)
    if len(distinct) > MAX_COMPARED:
        found.append(('answers', f'{len(distinct) + 1} distinct final answers'))
    else:
        for other in distinct.values():
            if not _same_answer(reference, other):
                found.append(('answers', clip(f'{other} | {reference}')))
    return [{'kind': k, 'answer': a} for k, a in dict.fromkeys(found)]


def _score_text(kind: str, gold: str, text: str) -> tuple[bool, str | None, dict]:
    """(correct, extracted, detail) of a model's whole text: extraction, the paper-style
    verdict (`_judge`) and the strict score (detail 'strict', 'hedges'); in a worker."""
    span, method = extract_answer(text, gsm8k=kind == 'number')
    if span is None:
        return False, None, {'method': method, 'strict': False, 'hedges': []}
    if method == 'math_verify':
        span = span[-MAX_TEXT:]
    if len(span) > MAX_SPAN and method != 'math_verify':
        detail = {'method': method, 'too_long': len(span), 'strict': False, 'hedges': []}
        return False, clip(span), detail
    correct, extracted, detail, found = _judge(kind, gold, span, method)
    found = _strict(kind, gold, text, span, method, found)
    detail.update(strict=bool(correct and not found), hedges=found)
    return correct, _shown(extracted) if extracted is not None else None, detail


def _warmup() -> None:
    """Loads math-verify's parsers in a fresh worker (so no deadline pays for it)."""
    _score_text('latex', '\\frac{1}{2}', '\\boxed{0.5}')


_pool: timeouts.DeadlinePool | None = None
_pool_lock = threading.Lock()


def verifier_pool() -> timeouts.DeadlinePool:
    """The worker processes shared by every math task's `score` (started on first use)."""
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = timeouts.DeadlinePool(
                workers=DEFAULT_WORKERS, preload=('math_verify',), warmup=_warmup
            )
        return _pool


def judge(kind: str, gold: str, text: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> Score:
    """Scores a model's `text` against `gold` (see the module docstring); any thread.

    Everything (extraction, math-verify, the strict score) runs in a worker under the
    `timeout_s` deadline; a timeout scores incorrect and not strict, with nothing extracted.
    """
    try:
        correct, extracted, detail = verifier_pool().call(
            _score_text, kind, gold, text, timeout_s=timeout_s
        )
    except timeouts.CallTimeout:
        detail = {'timeout': True, 'timeout_s': timeout_s, 'strict': False, 'hedges': []}
        return Score(False, None, detail)
    except timeouts.WorkerStartError:
        raise
    except timeouts.WorkerError as e:
        last = str(e).strip().splitlines()[-1:] or ['']
        return Score(False, None, {'error': last[0], 'strict': False, 'hedges': []})
    return Score(correct, extracted, detail)


# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class _MathTask:
    """What the math tasks share; a subclass sets the ClassVars and `_gold`/`_problem`."""

    root: str = ''
    timeout_s: float = DEFAULT_TIMEOUT_S

    scored: ClassVar[bool] = True
    name: ClassVar[str]
    relpath: ClassVar[str]  # The release's file under a data root.
    hub: ClassVar[tuple[str, str | None, str]]  # (id, config, split) for `datasets`.
    kind: ClassVar[str] = 'latex'  # How `_judge` reads gold and answer.
    system_prompt: ClassVar[str] = MATH_SYSTEM_PROMPT
    problem_field: ClassVar[str] = 'problem'

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the module docstring), the first `limit` (0 = all)."""
        rows = task_rows(
            source, self.relpath, self.root, self._hub_rows, limit, fast_hsd.loader(self.name)
        )
        if limit:
            rows = rows[:limit]
        return [self._item(i, row) for i, row in enumerate(rows)]

    def score(self, item: Item, text: str) -> Score:
        """Scores the model's text for `item` (math-verify, under `timeout_s`; any thread)."""
        return judge(self.kind, item.gold, text, self.timeout_s)

    def _hub_rows(self) -> list[dict]:
        return load_hub(*self.hub)

    def _item(self, index: int, row: dict) -> Item:
        problem = self._problem(row)
        return Item(
            task=self.name,
            id=self._id(index, row),
            messages=(
                {'role': 'system', 'content': self.system_prompt},
                {'role': 'user', 'content': problem},
            ),
            gold=self._gold(row),
            meta=self._meta(row),
        )

    def _problem(self, row: dict) -> str:
        return row[self.problem_field]

    def _id(self, index: int, row: dict) -> str:
        for key in ('unique_id', 'id', 'idx'):
            if row.get(key) is not None:
                return str(row[key])
        return str(index)

    def _gold(self, row: dict) -> str:
        return str(row['answer']).strip()

    def _meta(self, row: dict) -> dict:
        return {}


@dataclasses.dataclass(frozen=True)
class GSM8K(_MathTask):
    """GSM8K test (1,319 grade-school word problems); gold = the number after '####'."""

    name: ClassVar[str] = 'gsm8k'
    relpath: ClassVar[str] = 'gsm8k/test.jsonl'
    hub: ClassVar[tuple] = ('openai/gsm8k', 'main', 'test')
    kind: ClassVar[str] = 'number'
    system_prompt: ClassVar[str] = GSM8K_SYSTEM_PROMPT
    problem_field: ClassVar[str] = 'question'

    def _gold(self, row: dict) -> str:
        return row['answer'].split('####')[-1].strip().replace(',', '')


@dataclasses.dataclass(frozen=True)
class MATH500(_MathTask):
    """MATH-500 (the PRM800K test split of MATH); gold = `answer`."""

    name: ClassVar[str] = 'math500'
    relpath: ClassVar[str] = 'math500/test.jsonl'
    hub: ClassVar[tuple] = ('HuggingFaceH4/MATH-500', None, 'test')

    def _meta(self, row: dict) -> dict:
        return {'subject': row.get('subject'), 'level': row.get('level')}


MATH_SUBJECTS = (
    'algebra',
    'counting_and_probability',
    'geometry',
    'intermediate_algebra',
    'number_theory',
    'prealgebra',
    'precalculus',
)


@dataclasses.dataclass(frozen=True)
class MATH(_MathTask):
    """The MATH test set (5,000 problems); gold = the last \\boxed{} of `solution`.

    The hub copy (one config per subject) has no row ids: its ids are '<subject>/<row>'.
    """

    name: ClassVar[str] = 'math'
    relpath: ClassVar[str] = 'math/test.jsonl'
    hub: ClassVar[tuple] = ('EleutherAI/hendrycks_math', None, 'test')

    def _hub_rows(self) -> list[dict]:
        rows = []
        for subject in MATH_SUBJECTS:
            part = load_hub(self.hub[0], subject, self.hub[2])
            rows += [{**row, 'id': f'{subject}/{i}'} for i, row in enumerate(part)]
        return rows

    def _gold(self, row: dict) -> str:
        gold = last_boxed(row['solution'])
        if gold is None:
            raise ValueError(
                f'MATH row {row.get("idx", row.get("id"))}: no \\boxed{{}} in solution'
            )
        return gold

    def _meta(self, row: dict) -> dict:
        return {'subject': row.get('type'), 'level': row.get('level')}


@dataclasses.dataclass(frozen=True)
class AIME24(_MathTask):
    """AIME 2024 (I and II, 30 problems); gold = the integer answer ('025' -> '25')."""

    name: ClassVar[str] = 'aime24'
    relpath: ClassVar[str] = 'aime24/test.jsonl'
    hub: ClassVar[tuple] = ('HuggingFaceH4/aime_2024', None, 'train')
    kind: ClassVar[str] = 'integer'

    def _gold(self, row: dict) -> str:
        return str(int(str(row['answer']).strip()))

    def _meta(self, row: dict) -> dict:
        return {'url': row['url']} if row.get('url') else {}


def repair_escapes(problem: str) -> str:
    """Undoes JSON-escape damage: a form feed back to '\\f', a tab back to '\\t'."""
    return problem.replace('\x0c', '\\f').replace('\x09', '\\t')


@dataclasses.dataclass(frozen=True)
class AIME25(AIME24):
    """AIME 2025 (I and II, 30 problems); problems with escape damage are repaired."""

    name: ClassVar[str] = 'aime25'
    relpath: ClassVar[str] = 'aime25/test.jsonl'
    hub: ClassVar[tuple] = ('math-ai/aime25', None, 'test')

    def _problem(self, row: dict) -> str:
        return repair_escapes(row['problem'])


TASKS = {task.name: task for task in (GSM8K, MATH500, MATH, AIME24, AIME25)}
