"""The evaluation report's figures: speed-quality Pareto per task, score vs block efficiency,
and measured distortion vs each rule family's own parameter (a panel per family, with the
theory curves beside it).

The figures are drawn with matplotlib's object API on the Agg canvas (no pyplot, so no global
backend state and no figure left open). Each series has a colour fixed by its label (rule
families keep theirs across figures; see `colors_for`), and every function returns a `Drawn`:
series label -> number of points, with each series' colour in `Drawn.colors`, so a caller (the
report, a test) can check what was plotted instead of assuming it.

Input rows are the metrics rows of `spec_jax.eval.metrics` (one dict per task x method; keys
used here: task, method, kind, rule, param, param_name, score, score_lo, score_hi,
block_efficiency, speedup, tv, js, overshoot_mean).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from spec_jax.eval.stats import verdicts

# Rule families -> colour, so a family looks the same in every figure.
FAMILY_COLORS = {
    'ar': '#7f7f7f',
    'lossless': '#1f77b4',
    'baselines': '#2ca02c',
    'lenience': '#ff7f0e',
    'cos': '#d62728',
    'minp_verify': '#9467bd',
    'eta_verify': '#8c564b',
    'speccascade': '#e377c2',
    'typical': '#bcbd22',
    'overshoot_only': '#17becf',
    'overshoot_tail': '#000080',
    'uniform_interp': '#808000',
    'greedy': '#ff1493',
}
# Colours for anything else (tasks, unknown rules), in order; distinct from black and white.
PALETTE = ('#1f77b4', '#ff7f0e', '#2ca02c', '#d62728', '#9467bd', '#8c564b', '#e377c2',
           '#bcbd22', '#17becf', '#000080', '#808000', '#ff1493', '#00ced1', '#7f7f7f')  # fmt: skip
FRONT_COLOR = '#000000'
FRONT_LABEL = 'Pareto front'
# What each figure's bars are (the report prints them under the figure).
BARS = dict(
    pareto="bars: the score's 95% interval (Wilson for one sample an item, else a t-interval "
           'over items); no front below verdicts.MIN_ITEMS items',
    score_vs_be="bars: the score's 95% interval; each point labelled with its method",
    distortion='points: the unweighted mean over tasks; bars: the min to max over tasks '
               '(not an interval); overshoot on a log scale when it spans decades',
    tradeoff='bars: 95% intervals (ΔBE: t over items; speedup: t on log batch ratios, none '
             "below 5 batches); speed panel: filled at TV to the target's own law, hollow "
             'at TV to the matched baseline, squares the matched baselines',
)  # fmt: skip
_FAMILY_ORDER = ('ar', 'lossless', 'baselines')


class Drawn(dict):
    """What a figure drew: series label -> number of points; `colors`: label -> '#rrggbb';
    `panels`: for a figure with a panel per rule family, family -> its x axis's parameter."""

    def __init__(self) -> None:
        super().__init__()
        self.colors: dict[str, str] = {}
        self.panels: dict[str, str] = {}

    def add(self, label: str, points: int, color: str) -> None:
        """Records one series."""
        self[label] = points
        self.colors[label] = color


def colors_for(labels: Iterable[str], fixed: dict[str, str] | None = None) -> dict[str, str]:
    """Colours for `labels`: `fixed` (default FAMILY_COLORS) where it has one, else the next
    PALETTE colour not already taken (cycling once every colour is used)."""
    fixed = FAMILY_COLORS if fixed is None else fixed
    labels = list(dict.fromkeys(labels))
    out = {label: fixed[label] for label in labels if label in fixed}
    free = [c for c in PALETTE if c not in out.values()] or list(PALETTE)
    k = 0
    for label in labels:
        if label not in out:
            out[label] = free[k % len(free)]
            k += 1
    return out


def family(row: dict[str, Any]) -> str:
    """A row's series in the Pareto plot: 'ar', 'lossless', 'baselines' or the lossy rule."""
    kind = row.get('kind')
    if kind in ('ar', 'lossless'):
        return kind
    if kind == 'baseline':
        return 'baselines'
    return str(row.get('rule') or row['method'])


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _ordered_families(rows: Sequence[dict[str, Any]]) -> list[str]:
    seen = list(dict.fromkeys(family(r) for r in rows))
    return [f for f in _FAMILY_ORDER if f in seen] + [f for f in seen if f not in _FAMILY_ORDER]


def _yerr(rows: Sequence[dict[str, Any]], key: str = 'score') -> list[list[float]]:
    """Asymmetric error bars [[below...], [above...]] of row[key] from key_lo / key_hi (0
    where a row has none)."""
    below, above = [], []
    for r in rows:
        y, lo, hi = r[key], r.get(f'{key}_lo'), r.get(f'{key}_hi')
        below.append(max(y - lo, 0.0) if _finite(lo) else 0.0)
        above.append(max(hi - y, 0.0) if _finite(hi) else 0.0)
    return [below, above]


def spans_decades(values: Iterable[float], factor: float = 50.0) -> bool:
    """Whether the positive values span more than `factor` (their axis then goes log)."""
    positive = [v for v in values if _finite(v) and v > 0]
    return bool(positive) and max(positive) / min(positive) > factor


def _new_figure(ncols: int = 1, width: float = 7.5) -> tuple[Figure, list[Any]]:
    fig = Figure(figsize=(width * ncols, 5.0), dpi=100)
    FigureCanvasAgg(fig)
    axes = [fig.add_subplot(1, ncols, k + 1) for k in range(ncols)]
    return fig, axes


def _finish(ax: Any, empty: str, fontsize: int = 7) -> None:
    """A grid, and the legend of what the panel drew, or `empty` written across it."""
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=fontsize, loc='best')
    else:
        ax.text(0.5, 0.5, empty, transform=ax.transAxes, ha='center')


def _save(fig: Figure, path: str) -> None:
    fig.tight_layout()
    fig.savefig(path, format='png')


def pareto_front(points: Sequence[tuple[float, float]]) -> list[tuple[float, float]]:
    """The points no other point beats on both coordinates (both maximised), by x ascending."""
    front, best = [], -math.inf
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best:
            front.append((x, y))
            best = y
    return front[::-1]


def pareto(rows: Sequence[dict[str, Any]], task: str, path: str) -> Drawn:
    """Speed-quality Pareto plot of one task, written to `path` (PNG).

    x is the speedup over AR when every scored row of the task has one, else the block
    efficiency; y is the task score with its interval. One series per rule family (ar,
    lossless, baselines, each lossy rule; points labelled with their parameter and joined in
    parameter order), and the Pareto front over all of them (black, dotted).

    Returns:
      Drawn: family -> points, plus FRONT_LABEL -> points on the front.
    """
    sel = [r for r in rows if r.get('task') == task and _finite(r.get('score'))]
    x_key = 'speedup' if sel and all(_finite(r.get('speedup')) for r in sel) else 'block_efficiency'
    sel = [r for r in sel if _finite(r.get(x_key))]
    fig, (ax,) = _new_figure()
    drawn = Drawn()
    families = _ordered_families(sel)
    colors = colors_for(families)
    for fam in families:
        group = [r for r in sel if family(r) == fam]
        group.sort(key=lambda r: (r.get('param') is None, r.get('param') or 0.0))
        xs, ys = [r[x_key] for r in group], [r['score'] for r in group]
        ax.errorbar(xs, ys, yerr=_yerr(group), fmt='o-' if len(group) > 1 else 'o',
                    color=colors[fam], markersize=8, linewidth=1.0, capsize=2,
                    label=fam)  # fmt: skip
        for r in group:
            if r.get('param') is not None:
                ax.annotate(f'{r["param"]:g}', (r[x_key], r['score']), xytext=(5, 4),
                            textcoords='offset points', fontsize=7)  # fmt: skip
        drawn.add(fam, len(group), colors[fam])
    few = [r.get('n_items') for r in sel if (r.get('n_items') or 0) < verdicts.MIN_ITEMS]
    front = [] if few else pareto_front([(r[x_key], r['score']) for r in sel])
    if few:
        ax.text(0.02, 0.02, f'no Pareto front: {min(few)} items, too few to judge '
                f'(fewer than {verdicts.MIN_ITEMS})', transform=ax.transAxes, fontsize=7)
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], linestyle=':', color=FRONT_COLOR,
                linewidth=1.5, label=FRONT_LABEL)  # fmt: skip
        drawn.add(FRONT_LABEL, len(front), FRONT_COLOR)
    elif not sel:
        ax.text(0.5, 0.5, 'no scored rows', transform=ax.transAxes, ha='center')
    batches = min((r.get('speedup_n_batches') or 0 for r in sel), default=0)
    ax.set_xlabel(f'speedup over AR ({batches} batches'
                  + (': no interval)' if batches < verdicts.MIN_BATCHES else ')')
                  if x_key == 'speedup' else 'block efficiency (tokens/forward)')  # fmt: skip
    ax.set_ylabel('score (bars: 95% interval)')
    ax.set_title(f'{task}: speed vs quality')
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, loc='best')
    _save(fig, path)
    return drawn


def score_vs_be(rows: Sequence[dict[str, Any]], path: str) -> Drawn:
    """Task score vs block efficiency, one series per scored task, written to `path` (PNG).

    Returns:
      Drawn: task -> points.
    """
    sel = [r for r in rows if _finite(r.get('score')) and _finite(r.get('block_efficiency'))]
    tasks = list(dict.fromkeys(r['task'] for r in sel))
    colors = colors_for(tasks, fixed={})
    fig, (ax,) = _new_figure()
    drawn = Drawn()
    for task in tasks:
        group = [r for r in sel if r['task'] == task]
        ax.errorbar([r['block_efficiency'] for r in group], [r['score'] for r in group],
                    yerr=_yerr(group), fmt='o', color=colors[task], markersize=8, capsize=2,
                    label=task)  # fmt: skip
        for r in group:
            ax.annotate(str(r['method']), (r['block_efficiency'], r['score']), fontsize=5,
                        xytext=(4, 3), textcoords='offset points')  # fmt: skip
        drawn.add(task, len(group), colors[task])
    if not drawn:
        ax.text(0.5, 0.5, 'no scored rows', transform=ax.transAxes, ha='center')
    ax.set_xlabel('block efficiency (tokens per target forward)')
    ax.set_ylabel('score (bars: 95% interval)')
    ax.set_title('score vs block efficiency')
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=8, loc='best')
    _save(fig, path)
    return drawn


def _by_param(group: Sequence[dict[str, Any]], key: str) -> tuple[list[float], ...]:
    """Per parameter value: (params, mean, mean - min, max - mean) of the finite `key`s."""
    values: dict[float, list[float]] = {}
    for r in group:
        if _finite(r.get(key)):
            values.setdefault(float(r['param']), []).append(float(r[key]))
    params = sorted(values)
    means = [sum(values[p]) / len(values[p]) for p in params]
    # Clamped: the mean of equal values can round a hair past them.
    below = [max(m - min(values[p]), 0.0) for p, m in zip(params, means)]
    above = [max(max(values[p]) - m, 0.0) for p, m in zip(params, means)]
    return params, means, below, above


def theory_label(rule: str, curve: dict[str, Any]) -> str:
    """The legend label (and `Drawn` key) of a theory curve."""
    return f'{rule}: {curve.get("label", "theory")}'


def overshoot_label(rule: str) -> str:
    """The legend label (and `Drawn` key) of a rule's overshoot series."""
    return f'{rule} (overshoot)'


def js_label(rule: str) -> str:
    """The legend label (and `Drawn` key) of a rule's Jensen-Shannon series."""
    return f'{rule} (JS)'


def _panel_families(
    sel: Sequence[dict[str, Any]], theory: dict[str, dict[str, Any]]
) -> list[tuple[str, str]]:
    """(family, its parameter's name) per panel: measured families first, then any theory
    curve's rule without measured rows."""
    out: dict[str, str] = {}
    for r in sel:
        out.setdefault(family(r), str(r.get('param_name') or 'parameter'))
    for rule, curve in theory.items():
        out.setdefault(rule, str(curve.get('param_name') or 'parameter'))
    return list(out.items())


def distortion_vs_param(
    rows: Sequence[dict[str, Any]], path: str, theory: dict[str, dict[str, Any]] | None = None
) -> Drawn:
    """Measured distortion of each lossy rule family vs its own parameter, written to `path`.

    One column of panels per rule family, each with its parameter on its x axis (lenience's
    l, CoS's lambda, min-p's rho and eta's eta are different parameters, so no axis is
    shared). Top: TV(pi, matched baseline) per parameter value (the mean over tasks; bars
    span the tasks' min to max), the Jensen-Shannon divergence beside it (dotted; finite where
    KL is not) and the family's `theory` curve dashed; bottom: the mean overshoot max pi/p
    (log scale when it spans more than a factor of 50).

    Args:
      rows: metrics rows; lossy rows with a parameter and a finite tv / js / overshoot_mean
        count.
      path: the PNG to write.
      theory: {rule_name: {'param': [...], 'tv': [...], 'label': str, 'param_name': str}}
        (`spec_jax.rules.theory.parameter_curve`), or None.

    Returns:
      Drawn: rule -> TV points, js_label(rule) -> JS points, overshoot_label(rule) ->
      overshoot points, theory_label(rule, curve) -> theory points; `panels`: rule -> the
      parameter on its panels' x axis.
    """
    theory = theory or {}
    sel = [r for r in rows if r.get('kind') == 'lossy' and _finite(r.get('param'))]
    panels = _panel_families(sel, theory) or [('', 'parameter')]
    colors = colors_for([rule for rule, _ in panels if rule])
    ncols = len(panels)
    fig = Figure(figsize=(4.5 * ncols + 1.0, 8.0), dpi=100)
    FigureCanvasAgg(fig)
    drawn = Drawn()
    for k, (rule, param_name) in enumerate(panels):
        ax_tv = fig.add_subplot(2, ncols, k + 1)
        ax_over = fig.add_subplot(2, ncols, ncols + k + 1, sharex=ax_tv)  # One parameter axis.
        if rule:
            drawn.panels[rule] = param_name
        group = [r for r in sel if family(r) == rule]
        color = colors.get(rule, FRONT_COLOR)
        for key, label, style in (('tv', rule, 'o-'), ('js', js_label(rule), 'd:')):
            params, means, below, above = _by_param(group, key)
            if params:
                ax_tv.errorbar(params, means, yerr=[below, above], fmt=style, color=color,
                               markersize=7, linewidth=1.2, capsize=2, label=label)  # fmt: skip
                drawn.add(label, len(params), color)
        curve = theory.get(rule)
        if curve:
            pts = [(float(x), float(y)) for x, y in zip(curve['param'], curve['tv'])
                   if _finite(y)]  # fmt: skip
            if pts:
                label = theory_label(rule, curve)
                ax_tv.plot([p[0] for p in pts], [p[1] for p in pts], linestyle='--',
                           linewidth=2.0, color=color, label=label)  # fmt: skip
                drawn.add(label, len(pts), color)
        params, means, below, above = _by_param(group, 'overshoot_mean')
        if params:
            label = overshoot_label(rule)
            ax_over.errorbar(params, means, yerr=[below, above], fmt='s-', color=color,
                             markersize=7, linewidth=1.2, capsize=2, label=label)  # fmt: skip
            drawn.add(label, len(params), color)
            ends = [m + a for m, a in zip(means, above)] + [m - b for m, b in zip(means, below)]
            if spans_decades([*means, *ends]):  # CoS: to 1e23.
                ax_over.set_yscale('log')
        ax_tv.set_ylim(bottom=0.0)
        ax_tv.set_title(f'{rule or "no lossy rule"}: distortion')
        ax_tv.set_ylabel('TV / JS (nats) to the matched baseline\n(mean over tasks; bars: '
                         'min-max over tasks)')
        ax_over.set_ylabel('mean overshoot max pi/p\n(mean over tasks; bars: min-max)')
        for ax in (ax_tv, ax_over):
            ax.set_xlabel(f'{rule} parameter {param_name}' if rule else 'parameter')
            _finish(ax, 'not metered', fontsize=6)
    _save(fig, path)
    return drawn


def _plain_tv(row: dict[str, Any]) -> float | None:
    """TV to the target's own law (plain lossless SD's); None on results that predate it."""
    return row['tv_plain'] if _finite(row.get('tv_plain')) else None


def tradeoff(rows: Sequence[dict[str, Any]], group: str, path: str) -> Drawn:
    """What a lossy rule buys against what it costs, for one task group, written to `path`.

    Left: ΔBE against the matched baseline (paired, with its interval) vs TV to the
    matched baseline; right: the speedup over AR (per-batch, with its interval) vs TV to
    the target's own law (filled; TV to the matched baseline where a row lacks it), each
    point also hollow at its TV to the matched baseline (joined by a grey line: a truncation
    is charged its distortion of the target, not only against a baseline that shares it),
    and the matched baselines themselves (squares) at their TV to the target. One series
    per rule family through its parameter values (each point labelled with its value);
    lossless SD is the point at TV 0 on the right.

    Args:
      rows: metrics rows with the paired fields (`spec_jax.eval.findings.pooled_rows`).
      group: the task or timing group to draw ('speed').
      path: the PNG to write.

    Returns:
      Drawn: '<rule> ΔBE' and '<rule> speedup' -> points, 'lossless' -> 1 if drawn,
      'baselines' -> the matched baselines drawn.
    """
    sel = [r for r in rows if r['task'] == group]
    lossy = [r for r in sel if r.get('kind') == 'lossy' and _finite(r.get('tv'))]
    rules = list(dict.fromkeys(family(r) for r in lossy))
    colors = colors_for(['lossless', 'baselines', *rules])
    fig, (ax_be, ax_speed) = _new_figure(ncols=2, width=6.0)
    drawn = Drawn()
    for rule in rules:
        fam = sorted((r for r in lossy if family(r) == rule),
                     key=lambda r: r['param'] if _finite(r.get('param')) else 0.0)  # fmt: skip
        for ax, key, suffix in ((ax_be, 'd_be', 'ΔBE'), (ax_speed, 'speedup', 'speedup')):
            pts = [r for r in fam if _finite(r.get(key))]
            if not pts:
                continue
            label = f'{rule} {suffix}'
            speed = key == 'speedup'
            xs = [(_plain_tv(r) if speed and _plain_tv(r) is not None else r['tv']) for r in pts]
            ax.errorbar(xs, [r[key] for r in pts], yerr=_yerr(pts, key), fmt='o-',
                        color=colors[rule], markersize=7, linewidth=1.2, capsize=3,
                        label=rule)  # fmt: skip
            if speed:
                for x, r in zip(xs, pts):
                    ax.plot([r['tv'], x], [r[key]] * 2, color='#bbbbbb', linewidth=0.8)
                ax.plot([r['tv'] for r in pts], [r[key] for r in pts], 'o', markersize=7,
                        markerfacecolor='none', markeredgecolor=colors[rule])  # fmt: skip
            for x, r in zip(xs, pts):
                if _finite(r.get('param')):
                    ax.annotate(f'{r["param"]:g}', (x, r[key]), fontsize=7,
                                textcoords='offset points', xytext=(4, 4))  # fmt: skip
            drawn.add(label, len(pts), colors[rule])
    matched = {name for r in lossy for name in (r.get('pairs') or [])[:1]}
    bases = [r for r in sel if r.get('kind') == 'baseline' and r['method'] in matched
             and _finite(r.get('speedup')) and _plain_tv(r) is not None]  # fmt: skip
    if bases:
        ax_speed.errorbar([_plain_tv(r) for r in bases], [r['speedup'] for r in bases],
                          yerr=_yerr(bases, 'speedup'), fmt='s', color=colors['baselines'],
                          markersize=7, capsize=3, label='matched baselines')  # fmt: skip
        drawn.add('baselines', len(bases), colors['baselines'])
    lossless = next((r for r in sel if r.get('kind') == 'lossless'), None)
    if lossless and _finite(lossless.get('speedup')):
        ax_speed.errorbar([0.0], [lossless['speedup']], yerr=_yerr([lossless], 'speedup'),
                          fmt='D', color=colors['lossless'], markersize=8, capsize=3,
                          label='lossless')  # fmt: skip
        drawn.add('lossless', 1, colors['lossless'])
    ax_be.axhline(0.0, color='#888888', linewidth=0.8)
    ax_speed.axhline(1.0, color='#888888', linewidth=0.8)
    ax_be.set_ylabel('ΔBE vs matched baseline (bars: 95% interval)')
    ax_speed.set_ylabel('speedup over AR (bars: 95% interval, none below 5 batches)')
    ax_be.set_xlabel('TV to the matched baseline (distortion paid)')
    ax_speed.set_xlabel("TV to the target's own law (filled; hollow: to the matched baseline)")
    for ax, title in ((ax_be, 'block efficiency bought'), (ax_speed, 'speed bought')):
        ax.set_title(f'{group}: {title}')
        _finish(ax, 'no lossy rule metered')
    _save(fig, path)
    return drawn
