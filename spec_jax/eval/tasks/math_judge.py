"""Judging a model's math text: the verdict (math-verify) and the strict score, in workers.

Scoring (math-verify). The model's answer span is the last outermost complete \\boxed{} (or
\\fbox{}) of its text, inner box wrappers dropped (\\boxed{19\\boxed{18}} is '19 18', a hedge);
else the last of '#### X' and 'the answer is X' by position, up to its line's or sentence's
end; else, for GSM8K, the last number and, for MATH and AIME, math-verify's own extraction
of the text's last `MAX_TEXT` characters. The extraction (`math_answers`) is linear time. An
answer span over `MAX_SPAN` characters is not parsed (incorrect, detail 'too_long'). A span
is read as one answer (`_prediction`): one number with units, currency or thousands
(`math_numbers.read_number`; '18 thousand' is 18000), else one expression that math-verify
parses to sympy (GSM8K: one with a number's value), never a number picked out of it; a span
that hedges where the gold is one value, or whose number a word or sign changes ('18²',
'18 squared', 'about 18' on GSM8K), is incorrect. math-verify decides equivalence
(\\frac{1}{2} = 0.5 = 1/2, sets in any order, x=5 vs 5, ...). Beside the verdict,
detail['strict'] is True when the text is correct and does not hedge anywhere
(`math_answers.hedges`: alternatives, more values than the gold has, a tuple where one value
is asked, '18 = 19', a second number joined by words, distinct final answers), and
detail['hedges'] lists what was found, [{'kind', 'answer'}]. No step converts a digit run
over Python's 4,300-digit int limit (`math_numbers.MAX_DIGITS`), so no text makes the
scorer raise.

Deadline. math-verify's own timeouts use `signal.alarm`, which works on the main thread only,
so they are turned off and the whole scoring of a text (extraction, math-verify, the strict
score) runs in a worker subprocess of a shared `timeouts.DeadlinePool` that is killed at the
deadline: `score` works on any thread, and a text whose sympy call is stuck in a huge power
or factorial (or in math-verify's parser, which is exponential in bracket nesting: 10 nested
braces take seconds) scores as incorrect and not strict, with detail {'timeout': True} and
nothing extracted, after `timeout_s` seconds instead of hanging the run.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

from spec_jax.eval.tasks import timeouts
from spec_jax.eval.tasks.base import Score
from spec_jax.eval.tasks.math_answers import (
    MARKERS,
    MAX_SPAN,
    answer_span,
    clip,
    extract_answer,
    final_boxes,
    hedges,
    marker_hedges,
    markers,
    normal,
    one_value,
)
from spec_jax.eval.tasks.math_numbers import Reading, no_thousands, read_number

DEFAULT_TIMEOUT_S = 10.0
DEFAULT_WORKERS = 2

MAX_TEXT = 8000  # math-verify's own extraction (no box) reads the text's last MAX_TEXT chars.
MAX_COMPARED = 8  # More distinct final answers than this are a hedge without comparing them.
MAX_MARKERS = 64  # More answer markers than this are a hedge without reading them.

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

    A span that hedges where the gold is one value, or whose number a word or sign after it
    changes ('18 (or 19)', '18²'), has no parse. A span that is one number (`read_number`:
    units, currency and thousands allowed, '18 thousand' is 18000) is that number (a
    percentage on MATH and AIME goes to math-verify); any other span is read by math-verify
    as one expression (GSM8K: one with a number's value, or an equation whose last side is
    one), never as a number picked out of it. Without a box or marker (MATH, AIME)
    math-verify extracts from the text.
    """
    if method == 'boxed':
        found = hedges(span, gold)
    elif method in MARKERS:
        found = marker_hedges(span, gold)
    else:
        found = []
    if method == 'math_verify':
        number = Reading(None, False, False)
    else:
        number = read_number(span, kind != 'number')
    if (found and one_value(gold)) or number.changed:
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
    found = hedges(extracted, gold) if extracted is not None else []
    return ([] if found and one_value(gold) else pred), extracted, found


def _judge(kind: str, gold: str, span: str, method: str) -> tuple[bool, Any, dict, list]:
    """(correct, extracted, detail, hedges) for one answer span (see `extract_answer`): a
    span that hedges where the gold is one value is incorrect.

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
    if not pred:
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
        found_markers = markers(text, MAX_MARKERS)
        if len(found_markers) > MAX_MARKERS:
            found.append(('answers', f'over {MAX_MARKERS} answer markers'))
            found_markers = []
        for _, rest in found_markers:
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
