"""Speed figures in the field's shape (SPEED-Bench, arXiv 2604.09557; vLLM's per-request
acceptance schema), with what none of them reports beside them: the distortion paid and the
matched baseline's figures. The evaluation's metrics and report and the benches share them.

From per-request records (`requests_of_rows`: the evaluation's result lines;
`requests_of_result`: a `decoding.generate` result):

  acceptance_length     tokens per target forward, the bonus counted (vLLM's mean
                        acceptance length; the evaluation's block_efficiency): pooled over
                        the requests' rounds
  position_acceptance_at  at each drafted position k, P(accepted at k | accepted up to
                        k - 1): accepted / reached there, pooled (`position_rounds`: the
                        rounds that reached k)
  ttft_s                time to first token: the prefill call's seconds (the first token is
                        drawn there; a request of a static batch gets it when its batch
                        does), mean over calls
  tpot_s                time per output token: a request's seconds after its prefill call
                        over its tokens after the first (a request waits for its batch: its
                        seconds are the call's), mean over requests with >= 2 tokens; its
                        interval over calls (each call's mean: one call's requests share
                        its clock), `tpot_requests` the requests
  tv                    (metered runs) mean TV(pi, p_A) over the emitted positions, p_A the
                        matched baseline's law (`rules.Metered`)

Each mean has `_half` (95% Student's t half-width over requests, or over calls for TTFT and
TPOT, from their own values) and `_n`; with n < 2 `_half` is None and its text says "too few
to judge". Rounds of one request are not independent, so no interval counts rounds.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from scipy import stats

from spec_jax.eval import tables

TOO_FEW = 'too few to judge'


def requests_of_rows(group: Sequence[dict]) -> list[dict]:
    """Per-request records from the evaluation's result lines of one method (`runner`)."""
    out = []
    for r in group:
        st, batch = r.get('stats') or {}, r.get('batch') or {}
        out.append(dict(
            emitted=st.get('emitted', 0), blocks=st.get('blocks', 0),
            accepted_at=st.get('accepted_at_position'), reached_at=st.get('reached_at_position'),
            tokens=r.get('num_tokens', 0), call=r.get('batch_id'),
            seconds=batch.get('seconds'), prefill_s=batch.get('prefill_s'),
            metered=st.get('metered', 0), tv_sum=st.get('tv_sum'),
        ))  # fmt: skip
    return out


def requests_of_result(result: Any, call: Any, rows: int | None = None) -> list[dict]:
    """Per-request records of one `decoding.generate` result (its first `rows` rows: the rest
    are padding); `call` names the call (its TTFT counts once)."""
    per_row = result.stats['per_row']
    n = len(result.tokens) if rows is None else rows
    metered = per_row.get('metered', [0] * n)
    return [dict(
        emitted=per_row['emitted'][b], blocks=per_row['blocks'][b],
        accepted_at=per_row['accepted_at_position'][b],
        reached_at=per_row['reached_at_position'][b], tokens=len(result.tokens[b]),
        call=call, seconds=result.seconds, prefill_s=result.prefill_seconds,
        metered=metered[b], tv_sum=per_row['tv_sum'][b] if 'tv_sum' in per_row else None,
    ) for b in range(n)]  # fmt: skip


def interval(values: Sequence[float]) -> tuple[float | None, float | None, int]:
    """(mean, 95% t half-width or None when n < 2, n) of independent values."""
    n = len(values)
    if not n:
        return None, None, 0
    mean = sum(values) / n
    if n < 2:
        return mean, None, n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n), n


def fields(requests: Sequence[dict], spec: bool = True) -> dict:
    """The speed fields (module docstring) of one method's requests; `spec` False (AR: a
    forward per token) leaves the acceptance fields None."""
    out = {}
    pooled = [r for r in requests if r['blocks']]
    blocks = sum(r['blocks'] for r in pooled)
    length = sum(r['emitted'] for r in pooled) / blocks if spec and blocks else None
    _, half, n = interval([r['emitted'] / r['blocks'] for r in pooled] if spec else [])
    out.update(acceptance_length=length, acceptance_length_half=half, acceptance_length_n=n)
    at = [r for r in pooled if r['reached_at'] is not None] if spec else []
    width = max((len(r['reached_at']) for r in at), default=0)
    acc, rounds, halves = [], [], []
    for k in range(width):
        here = [r for r in at if k < len(r['reached_at']) and r['reached_at'][k]]
        reached = sum(r['reached_at'][k] for r in here)
        acc.append(sum(r['accepted_at'][k] for r in here) / reached if reached else None)
        rounds.append(reached)
        halves.append(interval([r['accepted_at'][k] / r['reached_at'][k] for r in here])[1])
    out.update(position_acceptance_at=acc or None, position_acceptance_half=halves or None,
               position_rounds=rounds or None, position_requests=len(at) if at else None)
    calls = {r['call']: r for r in requests if r['seconds'] is not None
             and r['prefill_s'] is not None}  # fmt: skip
    ttft, ttft_half, ttft_n = interval([r['prefill_s'] for r in calls.values()])
    out.update(ttft_s=ttft, ttft_half=ttft_half, ttft_n=ttft_n)
    tpot: dict[Any, list[float]] = {}
    for r in requests:
        if r['tokens'] >= 2 and r['seconds'] is not None and r['prefill_s'] is not None:
            tpot.setdefault(r['call'], []).append(
                (r['seconds'] - r['prefill_s']) / (r['tokens'] - 1))
    each = [t for ts in tpot.values() for t in ts]
    _, half, n = interval([sum(ts) / len(ts) for ts in tpot.values()])
    out.update(tpot_s=sum(each) / len(each) if each else None, tpot_half=half, tpot_n=n,
               tpot_requests=len(each))  # fmt: skip
    metered = [r for r in requests if r.get('metered') and r.get('tv_sum') is not None]
    positions = sum(r['metered'] for r in metered)
    out.update(
        tv=sum(r['tv_sum'] for r in metered) / positions if positions else None,
        tv_half=interval([r['tv_sum'] / r['metered'] for r in metered])[1],
        tv_n=len(metered), tv_positions=positions,
    )  # fmt: skip
    return out


def text(mean: float | None, half: float | None, n: int | None, spec: str = '.2f',
         scale: float = 1.0) -> str:  # fmt: skip
    """'1.23 ± 0.05 (n 12)', '1.23 (n 1: too few to judge)', or '-' without a value."""
    if not tables.num(mean):
        return '-'
    if half is None:
        return f'{format(mean * scale, spec)} (n {n}: {TOO_FEW})'
    return f'{format(mean * scale, spec)} ± {format(half * scale, spec)} (n {n})'


def positions_text(row: dict) -> str:
    """'0.91/0.80/0.62 (± <= 0.06; rounds 40/31/20; n 8 requests)': P(accept at k |
    accepted up to k - 1) at each drafted position ('-' where none was reached), the widest
    95% half-width over them, the rounds that reached each."""
    acc = row.get('position_acceptance_at')
    if not acc:
        return '-'
    halves = [h for h in row.get('position_acceptance_half') or [] if tables.num(h)]
    rounds = '/'.join(str(n) for n in row.get('position_rounds') or [])
    n = row.get('position_requests')
    spread = f'± <= {max(halves):.2f}' if halves and (n or 0) >= 2 else TOO_FEW
    return f'{"/".join(tables.fmt(a) for a in acc)} ({spread}; rounds {rounds}; n {n} requests)'


HEADER = ('method', 'kind', 'acceptance length (bonus counted)',
          'P(accept at k given accepted before k), k = 1, 2, ...', 'TTFT ms (n calls)',
          'TPOT ms (n calls)', 'TV vs p_A (n requests)',
          'matched baseline: acceptance length / TPOT ms')  # fmt: skip


def cells(row: dict, rows: Sequence[dict]) -> tuple[str, ...]:
    """One method's cells under `HEADER`; a lossy row's matched baseline is looked up by name
    (`row['pairs'][0]`) among `rows` of the same task."""
    base_name = tables.matched_name(row)
    base = next((r for r in rows if r['method'] == base_name
                 and r.get('task') == row.get('task')), None)  # fmt: skip
    if base_name is None:
        matched = '-'
    elif base is None:
        matched = f'{base_name}: not in this run'
    else:
        matched = (f'{base_name}: {tables.fmt(base.get("acceptance_length"))} / '
                   f'{tables.fmt(_ms(base.get("tpot_s")))}')  # fmt: skip
    tv = '-' if row.get('kind') in ('ar', 'lossless') else text(
        row.get('tv'), row.get('tv_half'), row.get('tv_n'), '.4f')  # fmt: skip
    if row.get('kind') == 'lossless':
        tv = '0 (lossless)'
    elif row.get('kind') == 'baseline' and not tables.num(row.get('tv')):
        tv = '0 (emits p_A)'
    return (
        f'`{row["method"]}`', str(row.get('kind', '')),
        text(row.get('acceptance_length'), row.get('acceptance_length_half'),
             row.get('acceptance_length_n')),
        positions_text(row),
        text(row.get('ttft_s'), row.get('ttft_half'), row.get('ttft_n'), '.1f', 1e3),
        text(row.get('tpot_s'), row.get('tpot_half'), row.get('tpot_n'), '.2f', 1e3),
        tv, matched,
    )  # fmt: skip


def _ms(seconds: float | None) -> float | None:
    return seconds * 1e3 if tables.num(seconds) else None


def section(rows: Sequence[dict]) -> list[str]:
    """The report's speed table (markdown), one per task (or task group), when a row has
    the speed fields; nothing otherwise (an older metrics.csv)."""
    if not any(tables.num(r.get('tpot_s')) for r in rows):
        return []
    lines = [
        '## Speed in the field\'s terms', '',
        'SPEED-Bench\'s and vLLM\'s per-request figures (spec_jax/eval/speed.py), measured: '
        'acceptance length (tokens per target forward, the bonus counted), per-position '
        'conditional acceptance, time to first token (the prefill call) and time per output '
        'token (seconds after prefill / tokens after the first), each mean ± its 95% t '
        'half-width over requests (TTFT: over calls); beside them what those reports leave '
        'out: the distortion paid (TV against the matched baseline\'s law p_A, metered) and '
        'the matched baseline\'s own figures on the same prompts.', '',
    ]  # fmt: skip
    for task in tables.tasks(rows):
        sel = [r for r in rows if r['task'] == task]
        lines += [f'### {task}', ''] + tables.table(HEADER, [cells(r, sel) for r in sel]) + ['']
    return lines


def terminal(rows: Sequence[dict]) -> str:
    """`HEADER`'s table as fixed-width text (the benches' output)."""
    body = [cells(r, rows) for r in rows]
    widths = [max(len(c[k]) for c in [HEADER, *body]) for k in range(len(HEADER))]
    lines = ['  '.join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in [HEADER, *body]]
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)
