"""Answers in a model's math text: boxes, GSM8K markers, and the hedges a strict score refuses.

Every function here is linear in the text's length (one scan of its braces, regexes without
nested repetition), so a hostile text (10,000 nested `\\boxed{`, 100k unbalanced braces, a
megabyte of digits) costs milliseconds; `math.judge` runs them inside its deadline anyway.

The verdict's extraction (the paper's order, docs/paper.md §2): `extract_answer` takes the
last outermost complete box (`final_boxes`: \\boxed{19\\boxed{18}} reads '19 18', two numbers,
not the inner box), else the last answer marker by position ('####' or 'the answer is',
whichever comes later; its span ends at the line's or sentence's end), else for GSM8K the
last number. `math_numbers.read_number` reads a span as one number or none.

The strict score (`hedges`): a text that offers several answers where one is asked fails
it, whatever the verdict says. A hedge is one of
  'alternatives'  'or', '\\lor', '\\vee' in an answer whose gold has none;
  'values'        more top-level values (split at ',', ';', 'and', 'or', '\\\\') than the gold
                  has, or '\\pm' / '\\mp' where the gold has none;
  'tuple'         a bracketed list ((a, b), [a, b], \\{a, b\\}) where the gold is one value;
  'equation'      a side of a top-level '=' other than the last that is a bare number and is
                  not the number on the last side ('18 = 19'; '2 + 3 = 5' and 'x = 5' pass);
  'second_number' a number after words, an arrow or bare space that follow a different
                  number, where the gold is one value ('18 (or 19)', '18, or possibly 19',
                  '18 vs 19', '18 → 19', '18 \\text{ (possibly 19)}', '19 18');
  'too_long'      a span over MAX_SPAN characters (not parsed);
  'answers'       several final answers (boxes; for GSM8K, or a text a marker answers, also
                  '####' and 'the answer is' followed by a number) that are not the same
                  answer; `math_judge` decides sameness with math-verify, so \\boxed{1/2}
                  then \\boxed{0.5} is one answer.
A fraction ('18/19'), an interval, tuple or set where the gold is one, and one answer
repeated in several boxes are not hedges.
"""

from __future__ import annotations

import re
from fractions import Fraction

from spec_jax.eval.tasks.math_numbers import (
    MAX_DIGITS,
    TEXT_CMD,
    no_thousands,
    second_number,
)

MAX_SPAN = 1000  # Longer answer spans are not parsed (no gold is this long; sympy would stall).

_BOXED = re.compile(r'\\(?:boxed|fbox)(?![A-Za-z])')
_BRACE = re.compile(r'[{}]')
_SPACES = re.compile(r' *')
_TOKEN = re.compile(r'[^\s$]+')
# A number; its minus sign only where it cannot be a subtraction ('20-18' holds 20 and 18).
NUMBER = re.compile(r'(?:(?<![\w)}])-)?(?:\d+(?:\.\d+)?|\.\d+)')
_MARKER = re.compile(r'####\s*|answer\s+is\s*:?\s*', re.IGNORECASE)
_SENTENCE_END = re.compile(r'[.!?](?=\s|$)')
MARKERS = ('####', 'answer is')  # `extract_answer`'s methods for a marker's span.


# --------------------------------------------------------------------------- boxes


def _brace_pairs(text: str) -> dict[int, int]:
    """Position of each '{' -> its matching '}' (braces after a backslash are skipped)."""
    pairs, stack = {}, []
    for m in _BRACE.finditer(text):
        k = m.start()
        if k and text[k - 1] == '\\':
            continue
        if text[k] == '{':
            stack.append(k)
        elif stack:
            pairs[stack.pop()] = k
    return pairs


def boxes(text: str) -> list[tuple[int, int, int]]:
    """Every complete box of `text` as (start, content start, content end), in order.

    A box is \\boxed{...} or \\fbox{...} with its braces matched (spaces may precede the
    brace), or '\\boxed 5' (a space, then a token up to white space or '$', its trailing
    '.,;' dropped). An unclosed box (a truncated generation) is not complete.
    """
    pairs = _brace_pairs(text)
    found = []
    for m in _BOXED.finditer(text):
        j = _SPACES.match(text, m.end()).end()
        if j < len(text) and text[j] == '{':
            if j in pairs:
                found.append((m.start(), j + 1, pairs[j]))
        elif j > m.end():
            token = _TOKEN.match(text, j)
            if token:
                end = token.end()
                while end > j and text[end - 1] in '.,;':
                    end -= 1
                found.append((m.start(), j, end))
    return found


def _content(text: str, box: tuple[int, int, int]) -> str:
    content = text[box[1] : box[2]]
    return content.strip() if text[box[1] - 1 : box[1]] == '{' else content


def last_boxed(text: str) -> str | None:
    """The content of the complete box that starts last in `text` (stripped), None if none.

    In \\boxed{\\boxed{5}} that is the inner box; an unclosed last box gives way to the box
    before it. One scan of the text's braces: linear time. (MATH's gold; a model's answer is
    the last of `final_boxes`.)
    """
    found = boxes(text)
    return _content(text, max(found)) if found else None


def final_boxes(text: str) -> list[str]:
    """The content of each outermost complete box, inner box wrappers dropped (a space where
    each was, so \\boxed{19\\boxed{18}} gives '19 18', two numbers, not 1918), in order
    (\\boxed{x = \\boxed{5}} gives 'x =  5')."""
    found = boxes(text)
    out, i = [], 0
    while i < len(found):
        start, lo, hi = found[i]
        i += 1
        cuts = []
        while i < len(found) and found[i][0] < hi:  # Boxes inside this one.
            s, clo, chi = found[i]
            cuts.append((s, clo))
            if text[clo - 1] == '{':
                cuts.append((chi, chi + 1))
            i += 1
        pieces, at = [], lo
        for a, b in sorted(cuts):
            if a >= at:
                pieces.append(text[at:a])
                at = b
        pieces.append(text[at:hi])
        out.append(' '.join(pieces).strip())
    return out


# --------------------------------------------------------------------------- GSM8K markers


def _rest(text: str, marker: re.Match, after: re.Match | None) -> str:
    """What follows `marker` up to its line's end or the next marker (`after`), at most
    MAX_SPAN + 1 characters (so each marker costs O(MAX_SPAN) however long the text)."""
    start = marker.end()
    stop = min(start + MAX_SPAN + 1, after.start() if after else len(text))
    line = text.find('\n', start, stop)
    return text[start : line if line >= 0 else stop]


def markers(text: str, most: int | None = None) -> list[tuple[int, str]]:
    """(position, `_rest`) of each '####' and 'answer is' that a number follows there (the
    first `most` + 1 of them when `most` is given)."""
    found, spans = [], _MARKER.finditer(text)
    m = next(spans, None)
    while m is not None and (most is None or len(found) <= most):
        after = next(spans, None)
        rest = _rest(text, m, after)
        if NUMBER.search(rest):
            found.append((m.start(), rest))
        m = after
    return found


def last_marker(text: str) -> tuple[int, str] | None:
    """The last of `markers(text)`, found from the end; None if none."""
    spans = list(_MARKER.finditer(text))
    for i in range(len(spans) - 1, -1, -1):
        rest = _rest(text, spans[i], spans[i + 1] if i + 1 < len(spans) else None)
        if NUMBER.search(rest):
            return spans[i].start(), rest
    return None


def answer_span(rest: str) -> str:
    """A marker's answer span: `rest` up to its first sentence end ('.', '!' or '?' before
    white space or the end; '18.5' is one number), stripped."""
    end = _SENTENCE_END.search(rest)
    return (rest[: end.start()] if end else rest).strip()


def extract_answer(text: str, gsm8k: bool = False) -> tuple[str | None, str]:
    """The answer span of a model's text and how it was found.

    Returns (span, method): method 'boxed' (span = the last outermost box's content, inner
    box wrappers dropped: `final_boxes`); then '####' or 'answer is', whichever marker comes
    last in the text (span = `answer_span` of what follows it on its line, up to another
    marker); then, for GSM8K, 'last number', otherwise 'math_verify' (span = the whole text,
    for math-verify's own extraction). (None, 'none') when a GSM8K text has no number at all.
    """
    boxed = final_boxes(text)
    if boxed:
        return boxed[-1], 'boxed'
    found = last_marker(text)
    if found:
        position, rest = found
        return answer_span(rest), '####' if text.startswith('####', position) else 'answer is'
    if not gsm8k:
        return text, 'math_verify'
    numbers = NUMBER.findall(no_thousands(text))
    if numbers:
        return numbers[-1], 'last number'
    return None, 'none'


_LEAD_SEP = r'\s*(?:,|;|=|\bor\b|\band\b|\\lor\b|\\vee\b|\\text\{\s*(?:or|and)\s*\})\s*'
_LEAD_NUM = r'(?:\\\$|\$)?\s*(' + NUMBER.pattern + r')\$?'
_LEADING = re.compile(r'\s*' + _LEAD_NUM + r'((?:' + _LEAD_SEP + _LEAD_NUM + r')*)')
_LEAD_PART = re.compile('(' + _LEAD_SEP + ')' + _LEAD_NUM)


def _leading_list(rest: str) -> list[tuple[str, str]]:
    """The hedge of a span that starts with a list of numbers ('18 or 19', '18, 19',
    '18 = 19'): [(kind, the list clipped)], [] if one number or none leads it."""
    m = _LEADING.match(no_thousands(rest))
    if not m:
        return []
    values, seps = [m.group(1)], []
    for part in _LEAD_PART.finditer(m.group(2)):
        seps.append(part.group(1).strip())
        values.append(part.group(2))
    distinct = {_number(v) if _number(v) is not None else v for v in values}
    if len(distinct) < 2:
        return []
    kind = 'equation' if '=' in seps else 'alternatives'
    return [(kind, clip(m.group(0)))]


# --------------------------------------------------------------------------- hedges

_SIZING = (
    r'\\(?:left|right|[bB]ig{1,2}[lr]?|middle|displaystyle|textstyle|!|,|;|:)(?![A-Za-z])'
)
_TOKENS = re.compile(
    '|'.join([
        r'(?P<size>' + _SIZING + ')',
        r'(?P<text>' + TEXT_CMD + ')',
        r'(?P<open>\\\{|\\langle(?![A-Za-z])|[(\[{])',
        r'(?P<close>\\\}|\\rangle(?![A-Za-z])|[)\]}])',
        r'(?P<alt>\\lor(?![A-Za-z])|\\vee(?![A-Za-z])|(?<![A-Za-z])or(?![A-Za-z]))',
        r'(?P<sep>\\\\|[,;]|(?<![A-Za-z])and(?![A-Za-z]))',
        r'(?P<pm>\\(?:pm|mp)(?![A-Za-z]))',
        r'(?P<eq>=)',
        r'(?P<cmd>\\[A-Za-z]+)',
        r'(?P<word>[A-Za-z]+)',
        r'(?P<other>\s+|[^\\{}()\[\],;=A-Za-z\s]+|\\.)',
    ]),
    re.S,
)
_FUNCTIONS = frozenset(
    r'\gcd \lcm \max \min \sin \cos \tan \cot \sec \csc \log \ln \exp \det \binom'.split()
)
_BARE = re.compile(r'-?(?:\d+(?:\.\d+)?|\.\d+)|-?\\[dt]?frac\{\d+\}\{\d+\}')


def clip(s: str, n: int = 120) -> str:
    return s if len(s) <= n else s[: n - 3] + '...'


def _number(s: str):
    """The value of a bare number ('18', '-0.5', '\\frac{1}{2}'), else None (also for one with
    over `MAX_DIGITS` digits, which Python's int conversion may refuse)."""
    s = normal(s)
    if len(s) > MAX_DIGITS + 12 or not _BARE.fullmatch(s):
        return None
    if 'frac' in s:
        sign = -1 if s.startswith('-') else 1
        a, b = re.findall(r'\d+', s)
        return sign * Fraction(int(a), int(b)) if int(b) else None
    return Fraction(s)


def normal(s: str) -> str:
    """`s` without spacing, sizing, dollars, degrees, percent signs and thousands commas."""
    s = re.sub(_SIZING + r'|\\ |\s+|\\?\$|\\%|%|\^\{?\\circ\}?', '', no_thousands(s))
    return s.rstrip('.')


class _Shape:
    """What `hedges` compares between an answer and the gold (one linear token scan)."""

    def __init__(self, s: str):
        self.values = 1  # Top-level values.
        self.alternatives = False
        self.pm = False
        self.tuple = False  # A top-level bracketed list that is not a function's arguments.
        self.sides: list[str] = []  # The top-level '=' sides.
        stack: list[bool] = []  # Per open bracket: opaque (True) or a text command's braces.
        depth = 0
        group_list = group_call = False
        prev, prev_kind, side_start = '', '', 0
        seen = pending = False  # A value seen; a top-level separator after it.
        for m in _TOKENS.finditer(s):
            kind, tok = m.lastgroup, m.group()
            if kind == 'size' or (kind == 'other' and not tok.strip()):
                continue
            if kind == 'text':
                stack.append(False)
                continue
            if kind in ('alt', 'sep'):
                self.alternatives |= kind == 'alt'
                if depth == 0:
                    pending = pending or seen
                elif depth == 1 and tok in (',', ';'):
                    group_list = True
            elif kind == 'close':
                if stack and stack.pop():
                    depth -= 1
                    if depth == 0 and group_list and not group_call:
                        self.tuple = True
            else:
                if pending:
                    self.values += 1
                seen, pending = True, False
                if kind == 'open':
                    if depth == 0 and tok != '{':
                        group_list = False
                        group_call = prev_kind == 'word' or prev in _FUNCTIONS
                    stack.append(True)
                    depth += 1
                elif kind == 'pm' and depth == 0:
                    self.pm = True
                elif kind == 'eq' and depth == 0:
                    self.sides.append(s[side_start : m.start()])
                    side_start = m.end()
                    seen = False
            prev, prev_kind = tok, kind
        if self.sides:
            self.sides.append(s[side_start:])


def _one_value(shape: _Shape) -> bool:
    return shape.values == 1 and not (shape.alternatives or shape.tuple or shape.pm)


def one_value(gold: str) -> bool:
    """Whether `gold` is one value (no list, tuple, alternatives or '\\pm')."""
    return _one_value(_Shape(no_thousands(gold)))


def hedges(answer: str, gold: str) -> list[tuple[str, str]]:
    """The hedges (kind, the answer clipped) of one answer span against its gold; a span over
    `MAX_SPAN` characters is one hedge, 'too_long' (it is not parsed)."""
    if len(answer) > MAX_SPAN:
        return [('too_long', clip(answer))]
    a, g = _Shape(no_thousands(answer)), _Shape(no_thousands(gold))
    found = []
    if a.alternatives and not g.alternatives:
        found.append('alternatives')
    if a.values > g.values or (a.pm and not g.pm):
        found.append('values')
    if a.tuple and not g.tuple and g.values == 1:
        found.append('tuple')
    if second_number(answer) and _one_value(g) and not second_number(gold):
        found.append('second_number')
    if a.sides:
        last = _number(a.sides[-1])
        for side in a.sides[:-1]:
            value = _number(side)
            if value is not None and value != last:
                found.append('equation')
                break
    return [(kind, clip(answer)) for kind in found]


def marker_hedges(span: str, gold: str) -> list[tuple[str, str]]:
    """The hedges of a marker's answer span (`answer_span`) against its gold: a leading list
    of numbers ('alternatives' / 'equation': '18 or 19', '18, 19', '18 = 19') and a second
    number joined by words ('second_number': '18 (maybe 19)'), each where the gold has none;
    'too_long' over `MAX_SPAN` characters."""
    if len(span) > MAX_SPAN:
        return [('too_long', clip(span))]
    if not one_value(gold):
        return []
    found = _leading_list(span)
    if second_number(span) and not second_number(gold):
        found.append(('second_number', clip(span)))
    return found
