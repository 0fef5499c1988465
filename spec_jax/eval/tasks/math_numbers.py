"""One number in a math answer span: a span read as one number, and numbers joined by words.

`read_number` reads '#### $1,800 dollars', '18 thousand' (18000) or '\\text{18 eggs}' as a
number and '#### 18 (or 19)', 'about 18', '18²' as none; `second_number` finds a second
number joined to the first by words or an arrow ('18, or possibly 19', '18 → 19'). Both are
one scan of a tokenizing regex without nested repetition: linear in the span's length.
Digit runs over `MAX_DIGITS` are no number (Python's int() refuses over 4,300 digits).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import NamedTuple

MAX_DIGITS = 1000  # A longer digit run is no number.

_THOUSANDS = re.compile(r'(?<=\d)(?:,|\{,\}|\\,)(?=\d{3}(?!\d))')
TEXT_CMD = r'\\(?:text|textrm|textnormal|textbf|textit|mbox|mathrm|mathbf|mathit)\s*\{'
_ARROW = (
    r'→|⇒|⟶|⟹|↦|->|=>|~>|\\(?:to|rightarrow|Rightarrow|longrightarrow|Longrightarrow'
    r'|implies|mapsto|leadsto)(?![A-Za-z])'
)
_READ = re.compile(
    '|'.join([
        r'(?P<num>\d+(?:\.\d+)?|\.\d+)',
        r"(?P<word>[A-Za-z]+(?:['’][A-Za-z]+)?)",
        r'(?P<pct>\\?%)',
        r'(?P<brace>' + TEXT_CMD + r'|[{}])',
        r'(?P<wrap>\s+|\*\*|\\\$|\$|\\[()\[\]]|\\[,;:! ]|:)',
        r'(?P<arrow>' + _ARROW + ')',
        r'(?P<cmd>\\[A-Za-z]+)',
        r'(?P<other>.)',
    ]),
    re.S,
)
SCALES = {'hundred': 100, 'thousand': 1000, 'million': 10**6, 'billion': 10**9,
          'trillion': 10**12, 'dozen': 12, 'k': 1000}  # fmt: skip
# After a number, these change its value in ways not read here: the span is no number.
VALUE_WORDS = frozenset(
    'hundreds thousands millions billions trillions dozens squared cubed half halves thirds '
    'fourths fifths tenths hundredths thousandths times bn mn mil lakh lakhs crore crores '
    'grand'.split()
)
# Words that are no unit: a span holding one is no number ('18 or so', 'about 18').
NOT_UNITS = frozenset(
    'or and vs versus to maybe possibly perhaps probably approximately approx about roughly '
    'around nearly almost than plus minus over point not either'.split()
)
_SUPERSCRIPTS = frozenset('⁰¹²³⁴⁵⁶⁷⁸⁹')
# Words that join numbers inside one expression ('3 mod 5').
_EXPRESSION_WORDS = frozenset('mod sin cos tan cot sec csc log ln exp sqrt pi gcd lcm'.split())


def no_thousands(s: str) -> str:
    """`s` without thousands separators ('70,000', '70{,}000', '70\\\\,000' -> '70000'; '1, 2'
    is kept)."""
    return _THOUSANDS.sub('', s)


class Reading(NamedTuple):
    """`read_number`'s reading of a span."""

    value: str | None  # The number, scaled; None when the span is not one number.
    scaled: bool  # A scale word was applied ('18 thousand').
    changed: bool  # A number is followed by a word or sign that changes its value.


def read_number(span: str, variables: bool = False) -> Reading:
    """`span` read as one number; with `variables` (MATH, AIME) a single letter is a
    variable ('2k'), which makes the span no number, else (GSM8K) a unit ('18 m'; 'k' scales).

    value: the number when the span is one number and nothing else but a currency sign or
    minus before it, thousands separators, a percent sign, unit words ('18 eggs/day'; a
    `NOT_UNITS` word is none), markup ('**', '$', '\\\\text{}', parentheses) and punctuation;
    a `SCALES` word after it scales it ('18 thousand' -> '18000'); otherwise None (never a
    number picked out of the span).
    changed: a number in the span is followed by a `VALUE_WORDS` word, a superscript or a
    scale word the reading cannot apply ('18 squared', '18²', '2 \\\\text{ thousand} + 5'): the
    span, whatever it is, is not that number.
    """
    sign, number, scale = 1, None, Fraction(1)
    clean, changed, scaled, prev = True, False, False, ''  # prev: the last token's kind.
    for m in _READ.finditer(no_thousands(span)):
        kind, tok = m.lastgroup, m.group()
        if kind in ('wrap', 'brace') or tok in '()':
            continue
        word = tok.lower() if kind == 'word' else ''
        after_number = prev in ('num', 'scale', 'pct')
        if kind == 'num':
            clean = clean and number is None and prev in ('', 'sign') and len(tok) <= MAX_DIGITS
            number = tok if number is None else number
        elif tok == '-' and prev == '':
            sign, kind = -1, 'sign'
        elif variables and len(word) == 1:
            clean = False
        elif word in SCALES and after_number:
            scale, scaled, kind = scale * SCALES[word], True, 'scale'
        elif word in SCALES or word in VALUE_WORDS or tok in _SUPERSCRIPTS:
            changed, clean = changed or after_number, False
        elif kind == 'word':
            clean = clean and number is not None and word not in NOT_UNITS
        elif kind == 'pct':
            clean = clean and prev == 'num'
        elif not (tok in '.,;!?/' or (tok == '-' and prev != 'sign')):
            clean = False
        prev = kind
    if not clean or number is None:
        return Reading(None, False, changed or scaled)
    if scale == 1:
        return Reading(('-' if sign < 0 else '') + number, False, False)
    return Reading(str(sign * Fraction(number) * scale), True, False)


def second_number(span: str) -> bool:
    """Whether `span` holds a number after words, an arrow or bare white space that follow a
    different number ('18 (or 19)', '18, or possibly 19', '18 vs 19', '18 → 19', '19 18',
    '18 \\\\text{ (possibly 19)}'); numbers joined by operators are one expression, and an
    exponent or subscript is part of what it follows ('9 \\\\times 2 = 18', '5\\\\text{ cm}^2')."""
    last = None  # The value of the last number.
    joined = spaced = exponent = after_number = False
    for m in _READ.finditer(no_thousands(span)):
        kind, tok = m.lastgroup, m.group()
        if kind == 'wrap':
            spaced = spaced or after_number
            continue
        if exponent and (kind == 'brace' or tok == '-'):
            continue
        is_number = kind == 'num' and not exponent
        if is_number:
            value = Fraction(tok) if len(tok) <= MAX_DIGITS else tok
            if last is not None and (joined or spaced) and value != last:
                return True
            last, joined = value, False
        elif kind == 'arrow' or (
            kind == 'word' and len(tok) > 1 and tok.lower() not in _EXPRESSION_WORDS
        ):
            joined = last is not None
        exponent, after_number, spaced = tok in ('^', '_'), is_number, False
    return False
