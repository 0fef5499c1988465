"""What a run supports, as sentences with their numbers and verdicts, and what it cannot test.

The paper's question is a trade-off: how much block efficiency (and speed) a lossy rule buys
against its matched baseline, for how much distortion of the output law (docs/paper.md,
docs/laws.md §5). `pooled_rows` puts every timing group of a run into one metrics row per
method (the speed sets share batches, `spec_jax.eval.timing`, and are judged together: a
handful of prompts per set has no interval of its own); `findings` reads those rows and
says, per rule and parameter value:

  "minp_verify rho 0.3: ΔBE +0.35 [+0.21, +0.49] (n 30 items: 24 gain, 5 lose, 1 tie, the
   largest item 9% of the sum; the ratio of sums over these prompts' target forwards)
   (above +0.1; Holm p 0.012) for TV 0.110 (outside 0.030) against baseline[min_p=0.3]"

Every verdict comes from the test printed beside it (`spec_jax.eval.stats.verdicts`), and every
line that prints a judged p prints its Holm p: score gaps from McNemar's exact test (one
seed; Tango's score interval beside it) or a t-test over items; ΔBE (estimand: the ratio
of sums over the run's prompts, an inference to prompts like these) from the t-interval of
the linearised ratio, a direction only beyond +-verdicts.MARGIN_BE, with the items that
gain, lose and tie and the largest item's share printed; speedups from the t-interval on
log batch ratios (over the design's units where there are enough); the engine rules'
flattery (`engine_rules.flattery_tests`) in the same family; trends over a rule's grid from
the slope of the per-item linearised values of the printed quantity ("rises" only when the
printed values rise at every step too; a slope not judged is "no slope shown", never
"no trend"). Below `verdicts.MIN_ITEMS` items (or MIN_BATCHES batches) the numbers are
printed with "too few items to judge". The verdicts of a run are one family,
Holm-adjusted (`family`), and the findings say how many comparisons they made. `untestable`
names the paper's claims the run cannot test and why, each with the number that decides it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from spec_jax.eval import engine_rules, metrics, tables, timing
from spec_jax.eval.plan import Method
from spec_jax.eval.stats import paired, verdicts

# docs/paper.md §5.3: the score gaps the paper reports, in percentage points.
PAPER_CHAIN_GAPS = (1.0, 4.0)  # Chain truncation rules against their matched baselines.
# Per-item values a trend is judged from (`pooled_rows` puts them on the lossy rows):
# name -> (numerator, denominator, against the matched baseline).
ITEM_VALUES = dict(d_be=('emitted', 'blocks', True), tv=('tv_sum', 'metered', False))


def pooled_rows(results: Sequence[dict], methods: Sequence[Method]) -> list[dict]:
    """Metrics rows (`metrics.aggregate`) with every task replaced by its timing group
    ('speed_mt_bench' -> 'speed'); item ids are prefixed by their task so that sets with
    the same ids stay distinct samples. Lossy rows also carry 'items': name -> {item:
    value} for the names of ITEM_VALUES (the per-item ΔBE and TV trends are judged from)."""
    pooled = [dict(r, task=timing.task_group(r['task']), item=f'{r["task"]}/{r["item"]}')
              for r in results]  # fmt: skip
    rows = metrics.aggregate(pooled, methods)
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for r in pooled:
        groups[(r['task'], r['method'])].append(r)
    for row in rows:
        matched = tables.matched_name(row)
        if matched is None:
            continue
        mine, base = groups[(row['task'], row['method'])], groups[(row['task'], matched)]
        row['items'] = {
            name: paired.item_values(mine, num, den, base if against else None)
            for name, (num, den, against) in ITEM_VALUES.items()
        }  # fmt: skip
    return rows


def _param_text(row: dict) -> str:
    if tables.num(row.get('param')):
        return f'{row["rule"]} {row["param_name"]} {row["param"]:g}'
    return str(row['method'])


def _families(rows: Sequence[dict]) -> dict[str, list[dict]]:
    """Lossy rows by rule, each family sorted by its parameter."""
    out: dict[str, list[dict]] = {}
    for r in rows:
        if r.get('kind') == 'lossy':
            out.setdefault(str(r['rule']), []).append(r)
    for fam in out.values():
        fam.sort(key=lambda r: r['param'] if tables.num(r.get('param')) else 0.0)
    return out


def _trend_test(key: tuple, fam: list[dict], name: str) -> verdicts.Test | None:
    """The slope over the family's grid of per-item values on the items every member has
    (None without a numeric grid of 3 or more points or without per-item values)."""
    params = [r.get('param') for r in fam]
    values = [(r.get('items') or {}).get(name) for r in fam]
    if len(fam) < 3 or not all(map(tables.num, params)) or not all(values):
        return None
    items = sorted(set.intersection(*(set(v) for v in values)))
    return verdicts.slope_test(key, params, [[v[i] for v in values] for i in items])


def tests(rows: Sequence[dict]) -> list[verdicts.Test]:
    """The run's family of verdicts: per group lossless SD's speedup over AR; per lossy row
    its ΔBE and speedup over its matched baseline (with pairs), its score gap (scored
    tasks); per rule family of 3+ grid points the trends of ΔBE and TV."""
    out = []
    for group in tables.tasks(rows):
        sel = [r for r in rows if r['task'] == group]
        for r in sel:
            m = r['method']
            if r.get('kind') == 'lossless' and tables.num(r.get('speedup')):
                out.append(_speed_test((group, m, 'speedup'), r, 'speedup'))
            if r.get('kind') != 'lossy' or not r.get('pair_n'):
                continue
            n = r.get('pair_n_items') or r.get('pair_n')
            out.append(verdicts.margin_test((group, m, 'd_be'), r.get('d_be'), r.get('d_be_lo'),
                                            r.get('d_be_hi'), n, verdicts.MARGIN_BE))  # fmt: skip
            out += engine_rules.flattery_tests(group, r)
            if tables.num(r.get('speedup_vs_matched')):
                out.append(_speed_test((group, m, 'speedup_vs_matched'), r,
                                       'speedup_vs_matched'))  # fmt: skip
            if r.get('scored') and tables.num(r.get('d_score')):
                p = r['d_score_p'] if tables.num(r.get('d_score_p')) else None
                lo, hi = r.get('d_score_lo'), r.get('d_score_hi')
                out.append(verdicts.Test((group, m, 'd_score'), r['d_score'], p, int(n),
                                         lo=lo, hi=hi))  # fmt: skip
        for rule, fam in _families(sel).items():
            for name in ITEM_VALUES:
                test = _trend_test((group, rule, 'trend', name), fam, name)
                if test is not None:
                    out.append(test)
    return out


def _speed_test(key: tuple, row: dict, field: str) -> verdicts.Test:
    """A speedup's Test: its t-interval's n is the design units it was taken over
    (`paired.ratio_interval`), else the batches."""
    n = row.get(f'{field}_n_units') or row.get(f'{field}_n_batches')
    return verdicts.t_test(key, row.get(field), row.get(f'{field}_lo'), row.get(f'{field}_hi'),
                           n, ref=1.0, log=True, min_n=verdicts.MIN_BATCHES,
                           unit='batches')  # fmt: skip


def family(rows: Sequence[dict]) -> verdicts.Family:
    """The run's verdicts, Holm-adjusted over `tests(rows)`."""
    return verdicts.judge(tests(rows))


def _said(fam: verdicts.Family, key: tuple) -> str:
    """' (above 0)' etc. for a key of the family; its Holm p where it was judged."""
    text = fam.verdicts.get(key, verdicts.NO_TEST)
    adj = fam.adjusted.get(key)
    return f' ({text}; Holm p {adj:.3g})' if adj is not None else f' ({text})'


def _monotone(values: Sequence, up: bool) -> bool:
    pts = [v for v in values if tables.num(v)]
    return len(pts) == len(values) and all((b >= a) if up else (b <= a)
                                           for a, b in zip(pts, pts[1:]))  # fmt: skip


def _trend_text(fam: verdicts.Family, key: tuple, name: str, printed: Sequence) -> str:
    """'rises (slope +0.80 [+0.45, +1.19] per unit, n 30 items; Holm p ...)' from the
    family's trend test (the slope of per-item linearised values of the printed quantity,
    `pooled_rows`): 'rises' / 'falls' only when the slope is judged so and the printed
    values move that way at every step ('has a positive slope' otherwise); 'no slope
    shown' when it is not judged (not a finding of no trend)."""
    test = next((t for t in fam.tests if t.key == key), None)
    if test is None:
        return f'{name} has no trend test (fewer than 3 grid points or no per-item values)'
    said = fam.verdicts[key]
    slope = tables.interval(dict(s=test.estimate, s_lo=test.lo, s_hi=test.hi), 's', '+.3g')
    if said in ('above 0', 'below 0'):
        up = said == 'above 0'
        words = ('rises' if up else 'falls') if _monotone(printed, up) else (
            f'has a {"positive" if up else "negative"} slope (the printed values do not '
            f'{"rise" if up else "fall"} at every step)')  # fmt: skip
    elif said.startswith('not'):
        words = 'no slope shown (not a finding of no trend)'
    else:
        words = f': {said}'
    adj = fam.adjusted.get(key)
    p = f'; Holm p {adj:.3g}' if adj is not None else ''
    sep = '' if words.startswith(':') else ' '
    return f'{name}{sep}{words} (slope {slope} per unit, n {test.n} items{p})'


def _batches(n: int | None) -> str:
    return '1 batch' if n == 1 else f'{n or 0} batches'


def _speed_lines(group: str, sel: list[dict], fam: verdicts.Family) -> list[str]:
    lines = []
    lossless = next((r for r in sel if r.get('kind') == 'lossless'), None)
    if lossless:
        decode = ''
        if tables.num(lossless.get('decode_speedup')):
            decode = (f'; decode-only {tables.interval(lossless, "decode_speedup", ".2f")}x '
                      f'({_batches(lossless.get("decode_speedup_n_batches"))}, described, not '
                      'judged)')  # fmt: skip
        lines.append(
            f'{group}: lossless SD runs at BE {tables.fmt(lossless.get("block_efficiency"))}, '
            f'speedup {tables.interval(lossless, "speedup", ".2f")}x over AR end to end '
            f'({_batches(lossless.get("speedup_n_batches"))})'
            + _said(fam, (group, lossless['method'], 'speedup')) + decode
        )
    for r in sel:
        if r.get('kind') != 'lossy':
            continue
        outside = r.get('outside')
        paid = f'TV {tables.fmt(r.get("tv"), ".3f")}'
        if tables.num(outside) and outside > 0:
            paid += f' (outside {tables.fmt(outside, ".3f")})'
        if tables.num(r.get('tv_plain')):  # Charged against the target too, not only its twin.
            paid += f" (to the target's own law {tables.fmt(r['tv_plain'], '.3f')})"
        if tables.num(r.get('kl_inf_fraction')) and r['kl_inf_fraction'] > 0:
            paid += f', KL infinite at {tables.pct(r["kl_inf_fraction"])}% of positions'
        if not r.get('pair_n'):
            lines.append(f'{group}: {_param_text(r)}: no samples shared with '
                         f'{tables.matched_name(r)} (a partial run): {paid}')  # fmt: skip
            continue
        m = r['method']
        speed = ''
        if tables.num(r.get('speedup_vs_matched')):
            speed = (f'; speedup over it {tables.interval(r, "speedup_vs_matched", ".2f")}x '
                     f'({_batches(r.get("speedup_vs_matched_n_batches"))})'
                     + _said(fam, (group, m, 'speedup_vs_matched')))  # fmt: skip
        lines.append(
            f'{group}: {_param_text(r)}: ΔBE {tables.interval(r, "d_be", "+.3f")} '
            f'({_spread_text(r, "d_be")})'
            f'{_said(fam, (group, m, "d_be"))} for {paid} against {tables.matched_name(r)}'
            + speed
        )
    for rule, members in _families(sel).items():
        if len(members) < 2:
            continue
        name = members[0]['param_name']
        params = ', '.join(f'{r["param"]:g}' for r in members)
        tv = ', '.join(tables.fmt(r.get('tv'), '.3f') for r in members)
        be = ', '.join(tables.fmt(r.get('d_be'), '+.3f') for r in members)
        tv_trend = _trend_text(fam, (group, rule, 'trend', 'tv'), 'TV',
                               [r.get('tv') for r in members])  # fmt: skip
        be_trend = _trend_text(fam, (group, rule, 'trend', 'd_be'), 'ΔBE',
                               [r.get('d_be') for r in members])  # fmt: skip
        lines.append(f'{group}: {rule} over {name} = {params}: TV ({tv}): {tv_trend}; '
                     f'ΔBE ({be}): {be_trend}')  # fmt: skip
        if rule == 'lenience':
            peaks = [(r['param'], r.get('overshoot_max')) for r in members]
            under = all(tables.num(p) and p <= 1.0 / lam + 1e-6 for lam, p in peaks)
            lines.append(
                f'{group}: lenience overshoot max pi/p '
                + ', '.join(f'{tables.fmt(p, ".3g")} (ceiling {1 / lam:.3g})' for lam, p in peaks)
                + (': under its ceiling 1/l' if under else ': NOT under its ceiling 1/l')
            )
        if rule == 'cos':
            peaks = [tables.fmt(r.get('overshoot_max'), '.3g') for r in members]
            lines.append(f'{group}: CoS overshoot max pi/p {", ".join(peaks)} (no ceiling)')
    return lines


def _spread_text(r: dict, name: str) -> str:
    """'n 30 items: 18 gain, 10 lose, 2 tie, the largest item 24% of the sum; ratio of sums
    over these prompts' target forwards' for a ratio Δ (`paired.spread`)."""
    n = r.get('pair_n_items') or r.get('pair_n')
    sp = r.get(f'{name}_spread') or {}
    if not sp:
        return f'n {n} items'
    share = f', the largest item {100 * sp["share"]:.0f}% of the sum' if sp.get('share') else ''
    return (f'n {n} items: {sp["gain"]} gain, {sp["lose"]} lose, {sp["tie"]} tie{share}; '
            "the ratio of sums over these prompts' target forwards")


def _score_text(r: dict, fam: verdicts.Family, key: tuple) -> str:
    """A score gap with its interval (McNemar: Tango's score interval; several seeds: t),
    its test's p and, where judged, its Holm p."""
    test = r.get('d_score_test')
    p = f', {test or "test"} p {r["d_score_p"]:.3g}' if tables.num(r.get('d_score_p')) else ''
    adj = fam.adjusted.get(key)
    p += f', Holm p {adj:.3g}' if adj is not None else ''
    return (f'{_param_text(r)} {tables.interval(r, "d_score", "+.1f", 100.0)} points '
            f'(n {r.get("pair_n_items") or r.get("pair_n")}{p})')  # fmt: skip


def _score_lines(task: str, sel: list[dict], fam: verdicts.Family) -> list[str]:
    """AR's score; the lossy methods whose gap the family judges above or below 0, one line
    each; those not distinguishable and those with too few items, one line per kind with
    every gap and its test."""
    ar = next((r for r in sel if r.get('kind') == 'ar'), {})
    lines = [f'{task}: AR scores {tables.score_text(ar)}% (n {ar.get("n_samples")})']
    quiet: dict[str, list[dict]] = defaultdict(list)
    for r in (r for r in sel if r.get('kind') == 'lossy'):
        key = (task, r['method'], 'd_score')
        said = fam.verdicts.get(key, verdicts.NO_TEST)
        if said.startswith(('above', 'below')):
            lines.append(f'{task}: score gap against {tables.matched_name(r)}: '
                         f'{_score_text(r, fam, key)} ({said})')  # fmt: skip
        else:
            quiet[said].append(r)
    for said, group in quiet.items():
        lines.append(f'{task}: score gaps against the matched baselines, {said}'
                     + (f' (n < {verdicts.MIN_ITEMS})' if said == verdicts.TOO_FEW else '')
                     + ': ' + '; '.join(_score_text(r, fam, (task, r['method'], 'd_score'))
                                        for r in group))  # fmt: skip
    return lines


def findings(rows: Sequence[dict], fam: verdicts.Family | None = None) -> list[str]:
    """Sentences with their numbers and verdicts for `pooled_rows`' rows: speed and BE
    against distortion per group, score gaps per scored task (`fam`: the run's family,
    `family(rows)` unless given)."""
    fam = fam if fam is not None else family(rows)
    out = []
    groups = tables.tasks(rows)  # The speed groups lead: the trade-off needs no score.
    for group in sorted(groups, key=lambda g: any(r.get('scored') for r in rows
                                                  if r['task'] == g)):  # fmt: skip
        sel = [r for r in rows if r['task'] == group]
        out += _speed_lines(group, sel, fam)
        out += engine_rules.finding_lines(group, sel, fam)  # Against lossless SD: flattery.
        if sel and sel[0].get('scored'):
            out += _score_lines(group, sel, fam)
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
    few = sorted({(r['task'], r.get('pair_n_items') or 0) for r in scored
                  if r.get('kind') == 'lossy'})  # fmt: skip
    few = [(task, n) for task, n in few if 0 < n < verdicts.MIN_ITEMS]
    for task, n in few:
        out.append(
            f'score verdicts on {task}: {n} paired items, fewer than the {verdicts.MIN_ITEMS} a '
            'verdict needs (spec_jax.eval.stats.verdicts.MIN_ITEMS); its score gaps are printed '
            'and not judged'
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
    lossless = [r for r in rows if r.get('kind') == 'lossless' and tables.num(r.get('speedup'))]
    if any(r['speedup'] < 1.5 for r in lossless):
        out.append(
            "speedups of the paper's size (2-3x on GPUs): two causes cap them here: verifying T "
            'tokens costs 1.2-2.3 one-token steps on a 2-core CPU (measured in '
            'docs/performance.md, not in this run), and the prefill, which no rule shortens'
            + _prefill_shares(rows, lossless)
        )
    return out


def _prefill_shares(rows: Sequence[dict], lossless: Sequence[dict]) -> str:
    """' (measured: <group>: lossless SD 1.21x end to end, 1.52x after the prefill, which
    takes 41% of AR's seconds; ...)' from the rows' decode speedups and prefill shares."""
    ar = {r['task']: r for r in rows if r.get('kind') == 'ar'}
    parts = [f"{r['task']}: lossless SD {r['speedup']:.2f}x end to end, "
             f"{r['decode_speedup']:.2f}x after the prefill, which takes "
             f"{100 * ar[r['task']]['prefill_share']:.0f}% of AR's seconds"
             for r in lossless if tables.num(r.get('decode_speedup'))
             and tables.num(ar.get(r['task'], {}).get('prefill_share'))]  # fmt: skip
    return f' (measured: {"; ".join(parts)})' if parts else ''


def text(rows: Sequence[dict], mode: str) -> str:
    """The findings block a job prints: what the run supports, then what it cannot test."""
    fam = family(rows)
    lines = ['Findings (95% intervals; Δ against the matched baseline on shared samples; '
             f'verdicts: {fam.note()}):']  # fmt: skip
    lines += [f'- {line}' for line in findings(rows, fam)]
    lines += ['', "The paper's claims this run cannot test:"]
    lines += [f'- {line}' for line in untestable(rows, mode)]
    return '\n'.join(lines)
