"""Table cells and row lookups shared by the report's sections (markdown and CSV)."""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any


def num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def fmt(x: Any, spec: str = '.2f') -> str:
    """A number for a table: '-' for None or NaN, 'inf' for infinities."""
    if not num(x) or math.isnan(x):
        return '-'
    if math.isinf(x):
        return 'inf' if x > 0 else '-inf'
    return format(x, spec)


def interval(row: dict, key: str, spec: str = '+.2f', scale: float = 1.0) -> str:
    """'-3.1 [-8.0, +1.9]': row[key] scaled, then its interval (row[key_lo], row[key_hi])
    when it has one; '-' without a value."""
    value, lo, hi = row.get(key), row.get(f'{key}_lo'), row.get(f'{key}_hi')
    if not num(value):
        return '-'
    text = fmt(value * scale, spec)
    if num(lo) and num(hi):
        text += f' [{fmt(lo * scale, spec)}, {fmt(hi * scale, spec)}]'
    return text


def pct(x: Any) -> str:
    return fmt(x * 100.0, '.1f') if num(x) else '-'


def signed_pct(x: Any) -> str:
    return fmt(x * 100.0, '+.1f') if num(x) else '-'


def score_text(row: dict[str, Any]) -> str:
    """'51.2 [41.0, 61.0]' (percent), '-' for a row without a score."""
    if not num(row.get('score')):
        return '-'
    lo, hi = row.get('score_lo'), row.get('score_hi')
    if num(lo) and num(hi):
        return f'{pct(row["score"])} [{pct(lo)}, {pct(hi)}]'
    return pct(row['score'])


def inf_note(fraction: Any) -> str:
    """' (inf 81.0%)' for a divergence infinite at that fraction of the metered positions
    ('' for none): its finite mean alone would hide them."""
    if not num(fraction) or fraction <= 0:
        return ''
    return f' (inf {fmt(fraction * 100.0, ".1f")}%)'


def kl_text(row: dict[str, Any]) -> str:
    """'0.0123 (inf 81.0%)': KL's mean over the finite positions, then the fraction of
    positions where it is infinite; 'inf (inf 100%)' when it is infinite everywhere."""
    kl, frac = row.get('kl'), row.get('kl_inf_fraction')
    if num(kl):
        return fmt(kl, '.4f') + inf_note(frac)
    return 'inf (inf 100%)' if num(frac) and frac > 0 else '-'


def overshoot_text(row: dict[str, Any]) -> str:
    """'mean / max (inf x%)' of the overshoot over its finite positions, and the fraction
    where it is infinite."""
    mean, top = row.get('overshoot_mean'), row.get('overshoot_max')
    if not num(mean) and not num(top):
        return '-'
    # '.3g': CoS's ratios reach 1e20 and more (no ceiling: p is tiny where q is not).
    return f'{fmt(mean, ".3g")} / {fmt(top, ".3g")}' + inf_note(row.get('overshoot_inf_fraction'))


def failures_text(row: dict[str, Any]) -> str:
    """'1 / 2 / 0': the samples whose scorer raised / timed out / hit an infrastructure
    error (`spec_jax.eval.outcomes`), '-' for a row without the counts."""
    counts = [row.get(k) for k in ('n_scorer_errors', 'n_timeouts', 'n_infra_errors')]
    if not all(num(c) for c in counts):
        return '-'
    return ' / '.join(str(int(c)) for c in counts)


def diff(a: Any, b: Any) -> float | None:
    return a - b if num(a) and num(b) else None


def safe_name(text: str) -> str:
    return re.sub(r'[^\w.-]+', '_', text)


def tasks(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r['task'] for r in rows))


def by_method(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r['task'], r['method']): r for r in rows}


def matched_name(row: dict[str, Any]) -> str | None:
    """A lossy row's matched baseline name (its first pair), None for other kinds."""
    if row.get('kind') != 'lossy' or not row.get('pairs'):
        return None
    return row['pairs'][0]


def table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(cells) + ' |' for cells in body]
    return lines
