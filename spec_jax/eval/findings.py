"""What a run supports, as sentences with their numbers, and what it cannot test.

The paper's question is a trade-off: how much block efficiency (and speed) a lossy rule buys
against its matched baseline, for how much distortion of the output law (docs/paper.md,
docs/laws.md §5). `pooled_rows` puts every timing group of a run into one metrics row per
method (the speed sets share batches, `spec_jax.eval.timing`, and are judged together: a
handful of prompts per set has no interval of its own); `findings` reads those rows and
says, per rule and parameter value:

  "minp_verify rho 0.3: BE +0.05 [+0.01, +0.09] for TV 0.110 (outside 0.030) against
   baseline[min_p=0.3] (speed, n 20)"

with a paired 95% interval (`spec_jax.eval.paired`) and whether it excludes zero; per rule
family how BE and TV move with the parameter; the overshoot beside lenience's ceiling 1/l;
per scored task the score gaps and how wide their intervals are. `untestable` names the
paper's claims the run cannot test and why (a target at floor, chain mode only, one draft),
each with the number that decides it. Only what the numbers show is said: a trend is called
monotone only when every step goes the same way, a gap is called real only when its
interval excludes zero.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spec_jax.eval import engine_rules, metrics, tables, timing
from spec_jax.eval.plan import Method

# docs/paper.md §5.3: the score gaps the paper reports, in percentage points.
PAPER_CHAIN_GAPS = (1.0, 4.0)  # Chain truncation rules against their matched baselines.


def pooled_rows(results: Sequence[dict], methods: Sequence[Method]) -> list[dict]:
    """Metrics rows (`metrics.aggregate`) with every task replaced by its timing group
    ('speed_mt_bench' -> 'speed'); item ids are prefixed by their task so that sets with
    the same ids stay distinct samples."""
    pooled = [dict(r, task=timing.task_group(r['task']), item=f'{r["task"]}/{r["item"]}')
              for r in results]  # fmt: skip
    return metrics.aggregate(pooled, methods)


def _verdict(row: dict, key: str, ref: float = 0.0) -> str:
    """Whether row[key]'s interval excludes `ref`."""
    lo, hi = row.get(f'{key}_lo'), row.get(f'{key}_hi')
    if not (tables.num(lo) and tables.num(hi)):
        return ' (no interval: too few samples or batches)'
    if lo > ref:
        return f' (above {ref:g})'
    if hi < ref:
        return f' (below {ref:g})'
    return f' (not distinguishable from {ref:g})'


def _param_text(row: dict) -> str:
    if tables.num(row.get('param')):
        return f'{row["rule"]} {row["param_name"]} {row["param"]:g}'
    return str(row['method'])


def _trend(values: Sequence[Any], tol: float = 1e-2) -> str:
    """'rises', 'falls', 'stays flat' or 'is not monotone' over a sequence: every step the
    same way, steps within `tol` of the largest magnitude counting as flat."""
    vals = [v for v in values if tables.num(v)]
    if len(vals) < 2 or len(vals) < len(values):
        return 'cannot be judged'
    scale = tol * max(max(abs(v) for v in vals), 1e-12)
    steps = [0 if abs(b - a) <= scale else b - a for a, b in zip(vals, vals[1:])]
    if all(s == 0 for s in steps):
        return 'stays flat'
    if all(s > 0 for s in steps):
        return 'rises'
    if all(s < 0 for s in steps):
        return 'falls'
    return 'is not monotone'


def _families(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """Lossy rows by rule, each family sorted by its parameter."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get('kind') == 'lossy':
            out.setdefault(str(r['rule']), []).append(r)
    for fam in out.values():
        fam.sort(key=lambda r: r['param'] if tables.num(r.get('param')) else 0.0)
    return out


def _speed_lines(group: str, sel: list[dict]) -> list[str]:
    lines = []
    lossless = next((r for r in sel if r.get('kind') == 'lossless'), None)
    if lossless:
        lines.append(
            f'{group}: lossless SD runs at BE {tables.fmt(lossless.get("block_efficiency"))}, '
            f'speedup {tables.interval(lossless, "speedup", ".2f")}x over AR '
            f'({lossless.get("speedup_n_batches") or 0} batches)'
            + _verdict(lossless, 'speedup', 1.0)
        )
    for r in sel:
        if r.get('kind') != 'lossy':
            continue
        outside = r.get('outside')
        paid = f'TV {tables.fmt(r.get("tv"), ".3f")}'
        if tables.num(outside) and outside > 0:
            paid += f' (outside {tables.fmt(outside, ".3f")})'
        if tables.num(r.get('kl_inf_fraction')) and r['kl_inf_fraction'] > 0:
            paid += f', KL infinite at {tables.pct(r["kl_inf_fraction"])}% of positions'
        if not r.get('pair_n'):
            lines.append(f'{group}: {_param_text(r)}: no samples shared with '
                         f'{tables.matched_name(r)} (a partial run): {paid}')  # fmt: skip
            continue
        lines.append(
            f'{group}: {_param_text(r)}: BE {tables.interval(r, "d_be", "+.3f")}'
            f'{_verdict(r, "d_be")} for '
            f'{paid} against {tables.matched_name(r)} (n {r.get("pair_n")})'
            + (f'; speedup over it {tables.interval(r, "speedup_vs_matched", ".2f")}x'
               if tables.num(r.get('speedup_vs_matched')) else '')
        )
    for rule, fam in _families(sel).items():
        if len(fam) < 2:
            continue
        name = fam[0]['param_name']
        params = ', '.join(f'{r["param"]:g}' for r in fam)
        tv = [r.get('tv') for r in fam]
        be = [r.get('d_be') for r in fam]
        lines.append(
            f'{group}: {rule} over {name} = {params}: TV {_trend(tv)} '
            f'({", ".join(tables.fmt(v, ".3f") for v in tv)}), ΔBE {_trend(be)} '
            f'({", ".join(tables.fmt(v, "+.3f") for v in be)})'
        )
        if rule == 'lenience':
            peaks = [(r['param'], r.get('overshoot_max')) for r in fam]
            under = all(tables.num(p) and p <= 1.0 / lam + 1e-6 for lam, p in peaks)
            lines.append(
                f'{group}: lenience overshoot max pi/p '
                + ', '.join(f'{tables.fmt(p, ".3g")} (ceiling {1 / lam:.3g})' for lam, p in peaks)
                + (': under its ceiling 1/l' if under else ': NOT under its ceiling 1/l')
            )
        if rule == 'cos':
            peaks = [tables.fmt(r.get('overshoot_max'), '.3g') for r in fam]
            lines.append(f'{group}: CoS overshoot max pi/p {", ".join(peaks)} (no ceiling)')
    return lines


def _score_lines(task: str, sel: list[dict]) -> list[str]:
    """AR's score, then the lossy methods whose paired score gap excludes zero; the others
    in one line with the range of their intervals."""
    ar = next((r for r in sel if r.get('kind') == 'ar'), {})
    lines = [f'{task}: AR scores {tables.score_text(ar)}% (n {ar.get("n_samples")})']
    quiet = []
    for r in (r for r in sel if r.get('kind') == 'lossy'):
        verdict = _verdict(r, 'd_score')
        if 'not distinguishable' in verdict or 'no interval' in verdict:
            quiet.append(r)
            continue
        p = f', McNemar p {r["d_score_p"]:.3g}' if tables.num(r.get('d_score_p')) else ''
        lines.append(
            f'{task}: {_param_text(r)}: score {tables.interval(r, "d_score", "+.1f", 100.0)} '
            f'points against '
            f'{tables.matched_name(r)} (n {r.get("pair_n")}{p}){verdict}'
        )
    if quiet:
        gaps = [100.0 * r['d_score'] for r in quiet if tables.num(r.get('d_score'))]
        span = f' (Δ {min(gaps):+.1f} to {max(gaps):+.1f} points)' if gaps else ''
        lines.append(
            f'{task}: {len(quiet)} of the lossy methods have score gaps not distinguishable '
            f'from 0 against their matched baselines{span}, n {quiet[0].get("pair_n")}'
        )
    return lines


def findings(rows: Sequence[dict]) -> list[str]:
    """Sentences with their numbers for `pooled_rows`' rows: speed and BE against
    distortion per group, score gaps per scored task."""
    out = []
    groups = tables.tasks(rows)  # The speed groups lead: the trade-off needs no score.
    for group in sorted(groups, key=lambda g: any(r.get('scored') for r in rows
                                                  if r['task'] == g)):  # fmt: skip
        sel = [r for r in rows if r['task'] == group]
        out += _speed_lines(group, sel)
        out += engine_rules.finding_lines(group, sel)  # Against lossless SD: the flattery.
        if sel and sel[0].get('scored'):
            out += _score_lines(group, sel)
    return out


def _half_width(rows: Sequence[dict]) -> float | None:
    """The widest half-width (points) of AR's score interval on a scored task: a paired
    gap much smaller than the spread of the score itself needs more items than the run has
    (a paired interval of all-zero scores is [0, 0] and shows nothing)."""
    widths = [(r['score_hi'] - r['score_lo']) * 50.0 for r in rows if r.get('kind') == 'ar'
              and tables.num(r.get('score_lo')) and tables.num(r.get('score_hi'))]  # fmt: skip
    return max(widths) if widths else None


def untestable(rows: Sequence[dict], mode: str) -> list[str]:
    """The paper's claims this run cannot test, each with the number that decides it."""
    out = []
    scored = [r for r in rows if r.get('scored')]
    half = _half_width(scored)
    ar_scores = [r['score'] for r in scored if r.get('kind') == 'ar' and tables.num(r['score'])]
    lo, hi = PAPER_CHAIN_GAPS
    if not scored:
        out.append('task-score gaps (docs/paper.md §5.3): no scored task in this run')
    elif half is None or half > lo:
        spread = f'±{half:.1f} points' if half is not None else 'no interval'
        floor = ', '.join(f'{100 * s:.1f}%' for s in ar_scores)
        out.append(
            f'task-score gaps of {lo:g}-{hi:g} points for chain truncation rules against their '
            f"matched baselines (docs/paper.md §5.3): AR's score here is {floor} with an "
            f'interval of {spread}, so a gap that size cannot be seen with these items'
            + (' (and the target is near floor)' if ar_scores and max(ar_scores) < 0.2 else '')
        )
    if mode == 'chain':
        out.append(
            'amplification of truncation distortion by tree verification (docs/laws.md §3.3): '
            'this run is chain mode (trees: configs/experiments/llama31_8b_eagle3.py, or the '
            "chain vs tree meter on the shipped head with mode='tree')"
        )
    out.append(
        'truncation distortion that does not vanish as the draft improves: this run has one '
        'draft; configs/experiments/smollm2_135m_distortion.py:perfect meters the target as '
        'its own draft'
    )
    speedups = [r.get('speedup') for r in rows if r.get('kind') == 'lossless']
    if any(tables.num(s) and s < 1.5 for s in speedups):
        out.append(
            "speedups of the paper's size (2-3x on GPUs): on this CPU verifying T tokens costs "
            '1.2-2.3 one-token steps, so speedups are capped near 1.4x (docs/performance.md)'
        )
    return out


def text(rows: Sequence[dict], mode: str) -> str:
    """The findings block a job prints: what the run supports, then what it cannot test."""
    lines = ['Findings (95% intervals; Δ against the matched baseline on shared samples):']
    lines += [f'- {line}' for line in findings(rows)]
    lines += ['', "The paper's claims this run cannot test:"]
    lines += [f'- {line}' for line in untestable(rows, mode)]
    return '\n'.join(lines)
