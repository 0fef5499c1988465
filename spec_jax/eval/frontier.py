"""Every rule against the distortion frontier, from the meter, and the budgeted rule beside
lenience and CoS (issue 42 item 2; docs/claims.md).

At one position any rule with emitted law pi accepts at most sum(min(p, q)) + TV(pi, p):
its acceptance gain over lossless SD (whose acceptance there is sum min(p, q)) is at most
its TV to the target (`rules.frontier_gap`). The engine meters both sides on the rule's own
drafted positions (`decoding.stats`: the positions `reached` counts, every drafted offset up
to the first rejection), so the claims job reads, per prompt:

  x  the rule's mean TV(pi, p) over its drafted positions: the metered `tv_plain` sum over
     `reached` (the first token and a round's bonus are drawn from the rule's bonus law;
     where that is p, as for every rule here (`bonus_is_target`), they add 0 to the sum)
  y  its acceptance minus lossless SD's on the same positions: (accepted - the metered
     `overlap` sum of sum min(p, q)) / reached

and the gap x - y: a mean of per-position terms whose expectation given the context is
`rules.frontier_gap` >= 0, about 0 on the frontier (lenience, CoS, the ablations,
tv_budget), above 0 for distortion that buys no acceptance (truncation). Its mean over
prompts is printed with a t-interval, described, not judged. The per-prompt points and the
means go to `frontier.png`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Sequence

from spec_jax import rules
from spec_jax.eval import plots, tables
from spec_jax.eval.stats import verdicts
from spec_jax.eval.stats.paired import sample_key, t_interval


def mean_interval(values: Sequence[float]) -> dict:
    """{'mean', 'lo', 'hi', 'n'}: the mean of per-item values and its 95% t-interval
    (`paired.t_interval`; None ends below 2 items)."""
    vals = [float(v) for v in values if v is not None and math.isfinite(v)]
    if not vals:
        return dict(mean=None, lo=None, hi=None, n=0)
    lo, hi = t_interval(vals)
    return dict(mean=sum(vals) / len(vals), lo=lo, hi=hi, n=len(vals))


def t_test(key, values: Sequence[float], ref: float = 0.0) -> tuple[verdicts.Test, dict]:
    """A verdicts.Test of per-item values' mean against `ref`, and its interval dict."""
    m = mean_interval(values)
    return verdicts.t_test(key, m['mean'], m['lo'], m['hi'], m['n'], ref=ref), m


def by_item(results: Sequence[dict], method: str) -> dict[tuple, dict]:
    """(item, seed) -> the method's stats (task-prefixed items: the pooled speed group)."""
    return {(r['task'], *sample_key(r)): r['stats'] for r in results if r['method'] == method}


def bonus_is_target(spec: str) -> bool:
    """Whether the rule's bonus law is p itself (then its bonus positions add 0 TV(pi, p)):
    the rule keeps `rules.Rule.bonus`, the identity (every rule of the claims grid does; a
    rule that overrides it, as `relaxed` and `greedy` do, reads False: not checked)."""
    mine = inspect.unwrap(type(rules.make(spec)).bonus)  # Through the registry's upcasting.
    return mine is inspect.unwrap(rules.Rule.bonus)


def _point(st: dict) -> tuple[float, float] | None:
    """(x, y) of one prompt's stats, None without drafted positions or the overlap meter."""
    reached = st.get('reached')
    if not reached or 'tv_plain_sum' not in st or 'overlap_sum' not in st:
        return None
    return st['tv_plain_sum'] / reached, (st['accepted'] - st['overlap_sum']) / reached


def points(results: Sequence[dict], lossy: Sequence[str]) -> dict[str, dict]:
    """Per lossy method: per-prompt (x, y) on its own drafted positions, the gap's
    interval, and whether x is read exactly (`bonus_is_target`)."""
    out = {}
    for method in lossy:
        xy = [pt for st in by_item(results, method).values() if (pt := _point(st))]
        xs, ys = [x for x, _ in xy], [y for _, y in xy]
        test, gap = t_test(('frontier', method), [x - y for x, y in xy])
        out[method] = dict(x=xs, y=ys, gap=gap, test=test, exact=bonus_is_target(method),
                           x_mean=mean_interval(xs), y_mean=mean_interval(ys))  # fmt: skip
    return out


def plot(pts: dict[str, dict], path: str) -> None:
    """Per-prompt points (faint) and each rule's mean with its intervals, beside the
    frontier y = x (acceptance gain = TV to the target)."""
    fig, (ax,) = plots._new_figure()
    colors = plots.colors_for(list(pts))
    top = max([max(v['x'], default=0.0) for v in pts.values()] + [0.05])
    ax.plot([0, top], [0, top], 'k--', lw=1, label='frontier: gain = TV(pi, p)')
    for method, v in pts.items():
        ax.scatter(v['x'], v['y'], s=8, alpha=0.3, color=colors[method])
        mx, my = v['x_mean'], v['y_mean']
        if mx['mean'] is None:
            continue
        err = [[mx['mean'] - (mx['lo'] or mx['mean'])], [(mx['hi'] or mx['mean']) - mx['mean']]]
        yerr = [[my['mean'] - (my['lo'] or my['mean'])], [(my['hi'] or my['mean']) - my['mean']]]
        ax.errorbar(mx['mean'], my['mean'], xerr=err, yerr=yerr, fmt='o', color=colors[method],
                    label=method, capsize=2)  # fmt: skip
    ax.set_xlabel('TV(pi, p) per drafted position (metered)')
    ax.set_ylabel('acceptance - sum min(p, q) (same positions)')
    ax.set_title('Every rule under the distortion frontier (per prompt; means with 95% CI)')
    plots._finish(ax, 'no lossy rule with metered drafted positions')
    plots._save(fig, path)


def frontier_table(pts: dict[str, dict]) -> list[str]:
    body = []
    for method, v in pts.items():
        body.append([f'`{method}`', str(v['gap']['n']), fmt_ci(v['x_mean'], '.4f'),
                     fmt_ci(v['y_mean'], '+.4f'), fmt_ci(v['gap'], '+.4f'),
                     'yes' if v['exact'] else 'not checked (own bonus law)'])  # fmt: skip
    header = ('rule', 'n prompts', 'TV(pi, p) drafted', 'acceptance - sum min(p, q)',
              'gap to frontier', 'x exact')  # fmt: skip
    return tables.table(header, body)


def fmt_ci(m: dict, spec: str) -> str:
    """'0.123 [0.100, 0.150]' of a mean_interval dict ('-' without a mean)."""
    return tables.interval(dict(v=m.get('mean'), v_lo=m.get('lo'), v_hi=m.get('hi')), 'v', spec)


def budget_rows(rows: Sequence[dict]) -> dict:
    """The budgeted rule beside lenience and CoS at equal mean TV: each tv_budget setting's
    BE, mean TV and the worst per-offset mean TV, and the budget whose mean TV is nearest
    lenience's ({} without tv_budget rows)."""
    mine = [r for r in rows if r.get('rule') == 'tv_budget']
    if not mine:
        return {}
    others = [r for r in rows if r.get('rule') in ('lenience', 'cos')]
    ref = next((r for r in others if r.get('rule') == 'lenience'), None)
    nearest = None
    if ref is not None and tables.num(ref.get('tv')):
        nearest = min(mine, key=lambda r: abs((r.get('tv') or 0.0) - ref['tv']))['method']
    table = []
    for r in others + mine:
        worst = max((t for t in (r.get('tv_at_offset') or []) if t is not None), default=None)
        table.append(
            [
                f'`{r["method"]}`' + (' (nearest)' if r['method'] == nearest else ''),
                tables.fmt(r.get('block_efficiency'), '.3f'),
                tables.interval(r, 'sd_d_be', '+.3f'),
                tables.fmt(r.get('tv'), '.4f'),
                tables.fmt(worst, '.4f'),
                tables.fmt(r.get('overshoot_max'), '.3g'),
            ]
        )
    header = ('rule', 'BE', 'ΔBE vs lossless SD', 'mean TV', 'worst offset mean TV',
              'max overshoot')  # fmt: skip
    return dict(nearest=nearest, table=tables.table(header, table))
