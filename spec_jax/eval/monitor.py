"""The drift monitor judged (docs/eval.md, "The drift monitor"): what its reading says, and
when it does not read about 1.0, a warning naming the likely cause from what the run can
see.

The monitor (`timing.drift`) times AR on a group's first batch at the group's start and
after its last round, a median of `timing.MONITOR_CALLS` calls at each end: on a quiet
machine whose programs ran once before their first timed call (`spec_jax.eval.warmup`) AR
is as fast on the same rows at the end as at the start, within x`STEADY` either way (a
ratio of two medians of a few calls: no interval). Outside it the likely causes:

  warm-up   the start is slow and its call ran its program cold: its first execution
            (rows of a run from before warm-ups, or warm-ups off) or a compile inside it
  load      a load average, at the start or the end, above the usable cores
  thermal   slower at the end with the load under the cores and a warmed start: a hot CPU
            or a lower clock, which the load average does not show

and where in the group the change came: AR's tokens/s on the group's other batches (other
rows, so a rough guide) set beside the start and the end readings.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from spec_jax.eval import timing

# A quiet machine with warmed programs reads within x STEADY either way (issue 49).
STEADY = 1.10


def ar_calls(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """AR's timed calls per 's<seed>/<group>', the monitor's included, in run order:
    {'method', 'number' (the batch's in its group), 'rate' (tokens/s), 'batch' (the call's
    record)}."""
    calls: dict[tuple[str, str, str], dict] = {}
    for r in rows:
        if (r['method'] != 'ar' and not timing.is_monitor(r['method'])) or r.get(
                'batch_id') is None:  # fmt: skip
            continue
        b = r.get('batch') or {}
        call = calls.setdefault((r['batch_id'], r['method'], b.get('invocation')),
                                dict(tokens=0, seconds=0.0, batch=b))  # fmt: skip
        call['tokens'] += r['num_tokens']
        call['seconds'] += r['seconds']
    out: dict[str, list[dict]] = {}
    for (batch_id, method, _), call in calls.items():
        seed, group, number = batch_id.split('/')[:3]
        if call['seconds'] > 0:
            out.setdefault(f'{seed}/{group}', []).append(dict(
                method=method, number=int(number), rate=call['tokens'] / call['seconds'],
                batch=call['batch'], slot=call['batch'].get('slot', 0)))  # fmt: skip
    return {key: sorted(v, key=lambda c: (c['slot'], c['number'])) for key, v in out.items()}


def where(reading: dict, calls: list[dict]) -> str:
    """Where in the group the speed changed, from AR's other batches beside the ends (those
    that ran their program's first execution or compiled left out)."""
    others = [c['rate'] for c in calls if c['number'] != 0 and not c['batch'].get('cold')
              and not c['batch'].get('compile_s')]  # fmt: skip
    if len(others) < 2:
        return (f'where cannot be told: AR timed {len(others)} other warm batch(es) in the '
                'group')  # fmt: skip
    mid = statistics.median(others)
    off_start = not 1 / STEADY <= reading['start'] / mid <= STEADY
    off_end = not 1 / STEADY <= reading['end'] / mid <= STEADY
    text = (f"AR's {len(others)} other warm batches (other rows) ran at median {mid:.1f} "
            'tokens/s')  # fmt: skip
    if off_start and not off_end:
        return f'the change came at the start, on the first batch alone: {text}, like the end'
    if off_end and not off_start:
        return f'the change came at the end, after the last round: {text}, like the start'
    return (f'the change spread over the group: {text}, from {min(others):.1f} to '
            f'{max(others):.1f}')  # fmt: skip


def causes(reading: dict, starts: Sequence[dict], info: dict) -> list[str]:
    """The likely causes of a reading outside x STEADY, from the start's calls' records
    (`starts`: their warm-up and compile seconds), the load averages and the usable cores
    in `info`."""
    ratio, out = reading['ratio'], []
    records = [c.get('batch') or {} for c in starts]
    cold = [b for b in records if 'warmed' not in b or b.get('cold')]
    compiled = sum(b.get('compile_s', 0) for b in records)
    cores = info.get('usable_cores')
    loads = [x for key in ('load_start', 'load_end') for x in (info.get(key) or ())[:1]]
    if ratio > STEADY and cold:
        out.append(f"warm-up: {len(cold)} of the start's {len(records)} calls ran their "
                   "program's first execution, not warmed "
                   + ('(a run from before warm-ups)' if any('warmed' not in b for b in cold)
                      else '(warm-ups off)'))  # fmt: skip
    elif ratio > STEADY and compiled > 0:
        out.append(f"warm-up: the start's calls compiled {compiled:.1f} s inside their timed "
                   'calls (a program its warm-up did not run)')  # fmt: skip
    if cores and loads and max(loads) > cores:
        out.append(f'load: the 1-minute load average reached {max(loads):.2f} (start, end) '
                   f'on {cores} usable cores')  # fmt: skip
    elif ratio < 1 / STEADY and not out:
        out.append('thermal: slower at the end with the load under the cores and a warmed '
                   'start (a hot CPU or a lower clock does not show in the load average)')
    if not out:
        b = next((b for b in records if b.get('warmed')), records[0] if records else {})
        warm = (f"warmed just before them ({b['warmup_s']:.2f} s)" if b.get('warmed') else
                'its program had run earlier in the run')  # fmt: skip
        out.append('other work between the two load samples (the load average is read at '
                   f"the start and the end only): the start's calls were warm ({warm}) and "
                   'compiled nothing')  # fmt: skip
    return out


def lines(rows: Sequence[dict], info: dict | None = None) -> dict[str, str]:
    """The monitor's header items: `timing.drift_lines` with 'steady' or 'NOT steady' after
    each, and, when a reading is outside x STEADY, 'drift warning': 'WARNING: ...' naming the
    likely causes and where the change came (`info`: the header, `machine.header`)."""
    info, out, warnings = info or {}, {}, []
    readings, calls = timing.drift(rows), ar_calls(rows)
    for key, text in timing.drift_lines(rows).items():
        group = key.split(' ', 1)[1]
        reading = readings[group]
        steady = 1 / STEADY <= reading['ratio'] <= STEADY
        out[key] = text + (f': steady (within x{STEADY:.2f})' if steady else
                           f': NOT steady (outside x{STEADY:.2f}: see the warning)')  # fmt: skip
        if not steady:
            group_calls = calls.get(group, [])
            starts = [c for c in group_calls if c['number'] == 0
                      and c['method'] in ('ar',) + timing.START_MONITORS]  # fmt: skip
            warnings.append(
                f"{group} reads x{reading['ratio']:.3f}; likely "
                + '; or '.join(causes(reading, starts, info))
                + f'; {where(reading, group_calls)}'
            )
    if warnings:
        out['drift warning'] = (
            'WARNING: the drift monitor does not read about 1.0 (a quiet machine with warmed '
            f'programs reads within x{STEADY:.2f}): ' + ' | '.join(warnings)
            + '. Speedups pair each method with AR on the same batch, but a change within a '
            "batch's round still lands on the methods timed after it (a first execution: on "
            'the method that ran the program first)'
        )
    return out
