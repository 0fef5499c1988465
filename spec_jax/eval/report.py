"""The evaluation report: a markdown page, the metrics as CSV, the paper's numbers beside ours,
and the figures of `spec_jax.eval.plots`.

Input: the metrics rows of `spec_jax.eval.metrics`, one dict per task x method
(`metrics_csv.FIELDS`; a speed set has `scored` False and no score). `write_report` writes
into one directory:

  report.md             per task the headline table; the matched pairs (each lossy method
                        beside its matched baseline, docs/laws.md §5: the score difference with
                        both intervals, the block-efficiency difference, TV, KL, the mass
                        outside the allowed set and the overshoot); the paper's gaps beside
                        ours (`spec_jax.eval.paper`); "Rules the engines ship" when the run
                        has one (`spec_jax.eval.engine_rules`: each rule against its matched
                        baseline and against lossless SD); links to the figures, each with
                        the series it drew;
  metrics.csv           the rows (`metrics_csv.read_metrics_csv` reads them back typed);
  paper_comparison.csv  every row that has a paper counterpart (written only if one does);
  *.png                 pareto_<task>.png per scored task, score_vs_be.png,
                        distortion_vs_param.png.

`headline(rows)` is the compact table a job prints to the terminal.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Sequence
from typing import Any

from spec_jax.eval import compare, engine_rules, findings, machine, plan, plots, speed, tables
from spec_jax.eval.metrics_csv import PAIR_FIELDS, cell, write_metrics_csv
from spec_jax.eval.stats import verdicts

# --- The terminal table -------------------------------------------------------------------


def headline(rows: Sequence[dict[str, Any]]) -> str:
    """A compact fixed-width table: task, method, score % [interval], block efficiency,
    acceptance rate, speedup, TV and overshoot (mean / max), one line per row."""
    header = ('task', 'method', 'score % [interval]', 'BE', 'accept', 'speedup', 'TV',
              'overshoot')  # fmt: skip
    body = [
        (
            str(r['task']),
            str(r['method']),
            tables.score_text(r),
            tables.fmt(r.get('block_efficiency')),
            tables.fmt(r.get('acceptance_rate'), '.3f'),
            speedup_text(r),
            tables.fmt(r.get('tv'), '.4f'),
            tables.overshoot_text(r),
        )
        for r in rows
    ]
    widths = [max(len(cells[k]) for cells in [header, *body]) for k in range(len(header))]
    lines = ['  '.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
             for cells in [header, *body]]  # fmt: skip
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


# --- The markdown page --------------------------------------------------------------------


def _headline_section(rows: Sequence[dict[str, Any]], mode: str) -> list[str]:
    be_key = compare.PAPER_BE_FIELD[mode]
    lines = ['## Headline', '']
    header = ('method', 'kind', 'score % [interval] (strict: no hedge)',
              'failed: error / timeout / infra', 'BE',
              f'BE ({be_key})', 'DS', 'acceptance', 'per-position acceptance', 'tokens/s',
              'speedup [interval] (batches)', 'decode-only speedup [interval] (batches)',
              'TV', 'JS', 'KL (inf %)', 'outside',
              'overshoot mean / max (inf %)')  # fmt: skip
    for task in tables.tasks(rows):
        sel = [r for r in rows if r['task'] == task]
        what = 'scored' if sel[0].get('scored') else 'speed set, not scored'
        lines += [f'### {task}', '', f'{_counts(sel)} ({what}).', '']
        strict = any(tables.num(r.get('strict_score')) for r in sel)  # Math: hedge-free.
        body = [
            (
                f'`{r["method"]}`',
                str(r.get('kind', '')),
                tables.score_text(r) + seed_text(r)
                + (f' (strict {tables.pct(r.get("strict_score"))})' if strict else ''),
                tables.failures_text(r),
                tables.fmt(r.get('block_efficiency')),
                tables.fmt(r.get(be_key)),
                tables.fmt(r.get('ds'), '.1f'),
                tables.fmt(r.get('acceptance_rate'), '.3f'),
                tables.fmt(r.get('position_acceptance'), '.3f'),
                tables.fmt(r.get('tokens_per_s'), '.1f'),
                speedup_text(r),
                speedup_text(r, 'decode_speedup'),
                tables.fmt(r.get('tv'), '.4f'),
                tables.fmt(r.get('js'), '.4f'),
                tables.kl_text(r),
                tables.fmt(r.get('outside'), '.4f'),
                tables.overshoot_text(r),
            )
            for r in sel
        ]
        lines += tables.table(header, body) + ['']
    return lines


def _counts(sel: Sequence[dict[str, Any]]) -> str:
    """'6 items, 6 samples per method' from every row of a task (a partial run's methods
    can differ: then the range and 'methods differ')."""
    parts = []
    for key, what in (('n_items', 'items'), ('n_samples', 'samples per method')):
        values = sorted({r[key] for r in sel if tables.num(r.get(key))})
        if not values:
            parts.append(f'? {what}')
        elif len(values) == 1:
            parts.append(f'{values[0]} {what}')
        else:
            parts.append(f'{values[0]}-{values[-1]} {what} (methods differ: a partial run)')
    return ', '.join(parts)


def seed_text(row: dict[str, Any]) -> str:
    """' ± 3.1 sd over 3 seeds' (points: the standard deviation over seeds of each seed's
    score) where the row has several seeds, else ''."""
    if not tables.num(row.get('score_seed_std')) or (row.get('n_seeds') or 0) < 2:
        return ''
    return f' ± {tables.pct(row["score_seed_std"])} sd over {row["n_seeds"]} seeds'


def _seeds_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    """avg@k and pass@k over seeds (AIME's metrics, docs/paper.md §2) of the scored rows
    whose items have k >= 2 samples each; nothing when none has."""
    sel = [r for r in rows if tables.num(r.get('pass_at_k'))]
    if not sel:
        return []
    body = [(r['task'], f'`{r["method"]}`', str(r['seeds_k']), tables.pct(r['avg_at_k']),
             tables.pct(r['pass_at_k'])) for r in sel]  # fmt: skip
    return [
        '## Over seeds',
        '',
        "avg@k: each item's mean correct over its first k samples (seeds), averaged over "
        "items; pass@k: the unbiased estimate that one of k samples is correct (1 - C(n - c, "
        'k) / C(n, k)), averaged over items; in percent.',
        '',
        *tables.table(('task', 'method', 'k', 'avg@k %', 'pass@k %'), body),
        '',
    ]


def _failures_section(rows: Sequence[dict[str, Any]], shown: int = 10) -> list[str]:
    """The samples whose scoring failed (`spec_jax.eval.outcomes`), per task and method;
    nothing when none did."""
    sel = [r for r in rows if r.get('failed_samples')]
    if not sel:
        return []
    lines = [
        '## Scoring failures',
        '',
        'Samples whose scorer raised, timed out or hit an infrastructure error: each counts '
        'as a wrong answer in the score (as in the paper\'s harness) and is listed here '
        '(item@seed: kind).',
        '',
    ]
    for r in sel:
        listed = r['failed_samples']
        more = f' and {len(listed) - shown} more' if len(listed) > shown else ''
        lines.append(f'- {r["task"]} `{r["method"]}` ({tables.failures_text(r)} error / timeout '
                     f'/ infra): ' + ', '.join(listed[:shown]) + more)  # fmt: skip
    return lines + ['']


def speedup_text(row: dict[str, Any], key: str = 'speedup') -> str:
    """'1.42 [1.20, 1.68] (7)': the speedup (`key`: 'speedup' end to end, or
    'decode_speedup'), its interval (from 5 batches on) and the batches it pairs with AR;
    the group when the task shares batches ('(7, speed)'); '1.31 (1 batch: no interval)'
    below 5 batches."""
    text = tables.interval(row, key, '.2f')
    n = row.get(f'{key}_n_batches', row.get('speedup_n_batches'))
    if text == '-' or n is None:
        return text
    batches = f'{n} batch' + ('' if n == 1 else 'es')
    if not tables.num(row.get(f'{key}_lo')):
        batches += ': no interval'
    else:
        batches = str(n)
    group = row.get('speedup_group')
    return text + (f' ({batches}, {group})' if group and group != row.get('task')
                   else f' ({batches})')  # fmt: skip


def matched_pairs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each lossy row beside its matched baseline on the same task: {'task', 'method',
    'matched', 'row', 'matched_row' (None when the run lacks it), 'paired', 'n', and the Δs
    'd_score' (with 'd_score_p'), 'd_be', 'd_tv', 'speedup_vs_matched', each with '_lo' /
    '_hi'}.

    With the paired fields of `spec_jax.eval.metrics` (`spec_jax.eval.stats.paired`), every Δ is
    over the (item, seed) keys both methods ran ('paired' True, 'n' their number); rows
    without them (a metrics.csv of an older run) fall back to the difference of the pooled
    values ('paired' False, 'n' None, no intervals).
    """
    index = tables.by_method(rows)
    out = []
    for r in rows:
        name = tables.matched_name(r)
        if name is None:
            continue
        base = index.get((r['task'], name))
        pair = {'task': r['task'], 'method': r['method'], 'matched': name, 'row': r,
                'matched_row': base, 'paired': r.get('pair_n') is not None,
                'n': r.get('pair_n')}  # fmt: skip
        if pair['paired']:
            pair.update({k: r.get(k) for k in PAIR_FIELDS})
        else:
            pair.update(dict.fromkeys(PAIR_FIELDS))
            pair['d_score'] = tables.diff(r.get('score'), (base or {}).get('score'))
            pair['d_be'] = tables.diff(
                r.get('block_efficiency'), (base or {}).get('block_efficiency')
            )
        out.append(pair)
    return out


def _not_judged(pair: dict[str, Any]) -> str:
    """' (not judged: n 6 < 10)' for a paired score gap on fewer than verdicts.MIN_ITEMS
    items, else ''."""
    n = pair['row'].get('pair_n_items') or pair.get('n')
    if not pair['paired'] or not tables.num(pair.get('d_score')) or n is None:
        return ''
    return f' (not judged: n {n} < {verdicts.MIN_ITEMS})' if n < verdicts.MIN_ITEMS else ''


def _holm(fam: verdicts.Family | None, p: dict[str, Any]) -> str:
    """', Holm p 0.31' for a score gap the run's family judged (`findings.family` of the
    pooled rows: a scored task is its own timing group), else ''."""
    adj = (fam.adjusted if fam else {}).get((p['task'], p['method'], 'd_score'))
    return f', Holm p {adj:.3g}' if adj is not None else ''


def _pairs_section(
    rows: Sequence[dict[str, Any]], fam: verdicts.Family | None = None
) -> list[str]:  # fmt: skip
    pairs = matched_pairs(rows)
    lines = [
        '## Matched pairs',
        '',
        'Each lossy method beside its matched baseline (the same truncation sampled and '
        'verified losslessly, or lossless SD for rules that truncate nothing; docs/laws.md §5). '
        'Δ = method minus matched baseline over the (item, seed) samples both ran (n; '
        '"pooled": the difference of pooled values, no pairing known), with 95% intervals '
        "(score in percentage points: McNemar's exact test beside Tango's score interval "
        'of the gap for one seed, a t-interval over items for several, with the Holm p of '
        "the findings' family; ΔBE and ΔTV: the t-interval over items of the linearised "
        "ratio of sums); speedup vs matched: tokens/s over the baseline's on the same "
        'batches (geometric mean, t-interval from 5 batches on, over design units from 5 '
        'units on). '
        "TV, KL, outside and overshoot are the lossy method's distortion against the "
        'baseline law. Intervals here are per comparison; the verdicts (above / below / not '
        'distinguishable, or too few items to judge) are in the findings, Holm-adjusted over '
        'the run.',
        '',
    ]
    header = ('task', 'method', 'matched', 'n', 'score % [interval]',
              'matched score % [interval]', 'Δscore [interval] (p)', 'ΔBE [interval]',
              'ΔTV [interval]', 'speedup vs matched [interval]', 'TV', 'JS', 'KL (inf %)',
              'outside', 'overshoot mean / max (inf %)')  # fmt: skip
    body = [
        (
            p['task'],
            f'`{p["method"]}`',
            f'`{p["matched"]}`' + ('' if p['matched_row'] else ' (not in this run)'),
            str(p['n']) if p['paired'] else 'pooled',
            tables.score_text(p['row']),
            tables.score_text(p['matched_row'] or {}),
            tables.interval(p, 'd_score', '+.1f', 100.0)
            + (f' ({p.get("d_score_test") or "test"} p {p["d_score_p"]:.3g}{_holm(fam, p)})'
               if tables.num(p['d_score_p']) else '')
            + _not_judged(p)
            + (f' ± {tables.pct(p["row"]["d_score_seed_std"])} sd over seeds'
               if tables.num(p['row'].get('d_score_seed_std')) else ''),  # fmt: skip
            tables.interval(p, 'd_be'),
            tables.interval(p, 'd_tv', '+.4f'),
            tables.interval(p, 'speedup_vs_matched', '.2f'),
            tables.fmt(p['row'].get('tv'), '.4f'),
            tables.fmt(p['row'].get('js'), '.4f'),
            tables.kl_text(p['row']),
            tables.fmt(p['row'].get('outside'), '.4f'),
            tables.overshoot_text(p['row']),
        )
        for p in pairs
    ]
    if not body:
        return lines + ['No lossy methods in this run.', '']
    return lines + tables.table(header, body) + ['']


def _series_text(drawn: plots.Drawn) -> str:
    return ', '.join(f'{label} ({n})' for label, n in drawn.items()) or 'nothing'


def _tradeoff_section(
    pooled: list[dict], mode: str, out_dir: str, paths: dict[str, str]
) -> list[str]:
    """'## Trade-off': the findings (`spec_jax.eval.findings`) and, per task group with a
    lossy rule, ΔBE and speedup against TV (`plots.tradeoff`); adds the figures to `paths`."""
    lines = ['## Trade-off', '',
             'What the lossy rules buy (block efficiency against the matched baseline, speed '
             'over AR) for the distortion they pay (TV to the matched baseline), the task '
             'groups pooled (the speed sets share batches and are judged together).',
             '']  # fmt: skip
    lines += findings.text(pooled, mode).splitlines() + ['']
    for group in tables.tasks(pooled):
        if not any(r['task'] == group and r.get('kind') == 'lossy' for r in pooled):
            continue
        name = f'tradeoff_{tables.safe_name(group)}'
        paths[name] = os.path.join(out_dir, name + '.png')
        drawn = plots.tradeoff(pooled, group, paths[name])
        lines += [f'![{group}: trade-off]({name}.png)', '', f'Series: {_series_text(drawn)}; '
                  f'{plots.BARS["tradeoff"]}.', '']  # fmt: skip
    return lines


def write_report(
    rows: list[dict],
    out_dir: str,
    *,
    mode: str = 'chain',
    title: str = '',
    theory: dict | None = None,
    header: dict | None = None,
    pooled: list[dict] | None = None,
) -> dict[str, str]:
    """Writes the report of one evaluation run into `out_dir`.

    Args:
      rows: metrics rows (metrics_csv.FIELDS), one per task x method.
      out_dir: the directory (created if needed).
      mode: the run's speculative mode, 'chain' or 'tree': the matched-baseline convention and
        the paper setup to compare with (docs/paper.md §5.2 chain, §5.1 tree).
      title: the page title.
      theory: theory distortion curves for the distortion figure,
        {rule_name: {'param': [...], 'tv': [...], 'label': str}}
        (`spec_jax.rules.theory.parameter_curve`).
      header: the run's machine, versions, config fingerprint and load
        (`spec_jax.eval.machine.header`), written at the page's top.
      pooled: the rows pooled by timing group (`spec_jax.eval.findings.pooled_rows`): the
        page then opens with the trade-off, the findings and a figure per group
        (`plots.tradeoff`).

    Returns:
      name -> path of each file written: 'report', 'metrics_csv', 'paper_csv' (only when a
      row has a paper counterpart), 'pareto_<task>' per scored task, 'score_vs_be',
      'distortion' (the PNGs only when they have something to draw), 'tradeoff_<group>'
      per group of `pooled` with a lossy rule.

    Raises:
      ValueError: an unknown mode.
    """
    if mode not in compare.PAPER_BE_FIELD:
        raise ValueError(f'mode {mode!r} is not one of {sorted(compare.PAPER_BE_FIELD)}')
    os.makedirs(out_dir, exist_ok=True)
    paths = {'report': os.path.join(out_dir, 'report.md')}
    paths['metrics_csv'] = write_metrics_csv(rows, os.path.join(out_dir, 'metrics.csv'))

    comparison = compare.paper_comparison(rows, mode)
    if comparison:
        paths['paper_csv'] = os.path.join(out_dir, 'paper_comparison.csv')
        with open(paths['paper_csv'], 'w', newline='') as f:
            writer = csv.writer(f)
            writer.writerow(compare.PAPER_FIELDS)
            for c in comparison:
                writer.writerow([cell(c[k]) for k in compare.PAPER_FIELDS])

    figures: list[tuple[str, str, plots.Drawn]] = []  # (name, caption, what it drew)

    def figure(name: str, file: str, caption: str, draw) -> None:
        paths[name] = os.path.join(out_dir, file)
        figures.append((name, caption, draw(paths[name])))

    scored = [r for r in rows if r.get('scored') and tables.num(r.get('score'))]
    for task in tables.tasks(scored):
        name = f'pareto_{tables.safe_name(task)}'
        figure(name, name + '.png', f'{task}: speed vs quality',
               lambda path, task=task: plots.pareto(rows, task, path))  # fmt: skip
    if scored:
        figure('score_vs_be', 'score_vs_be.png', 'score vs block efficiency',
               lambda path: plots.score_vs_be(rows, path))  # fmt: skip
    if theory or any(r.get('kind') == 'lossy' and tables.num(r.get('param')) for r in rows):
        figure('distortion', 'distortion_vs_param.png', 'distortion vs parameter',
               lambda path: plots.distortion_vs_param(rows, path, theory))  # fmt: skip

    lead = _tradeoff_section(pooled, mode, out_dir, paths) if pooled else []
    methods = list(dict.fromkeys(r['method'] for r in rows))
    lines = [
        f'# {title or "Evaluation report"}',
        '',
        f'Mode: {mode} (matched baselines: {plan.CONVENTIONS[mode]}). '
        f'{len(tables.tasks(rows))} tasks, {len(methods)} methods.',
        '',
        'BE = block efficiency, tokens per target forward including the bonus token (1.0 for '
        "AR), beside the paper's BE; DS is the paper's decoding speed (chain: gamma x full "
        'blocks / s, a full block one whose draft no stop token or limit cut; tree: tokens/s); '
        'acceptance is accepted / drafted, per-position acceptance accepted / reached '
        '(comparable between chain and tree); scores are percentages with their intervals, '
        'failed scorings counted as wrong; speedup is the geometric mean over batches of '
        "tokens/s over AR's on the same rows (every method decodes each batch, in a "
        'balanced order relabelled at random per pair of batches from the run seed and the '
        'group: stats.design), with its 95% t-interval from 5 batches on (over the '
        "design's pairs from 5 pairs on) and the "
        'batches counted; TV, JS (Jensen-Shannon, nats, at most ln 2), KL (KL(p_A || pi)), outside '
        '(mass outside the allowed set) and overshoot (max pi/p) are metered against the '
        'matched baseline law; KL and the overshoot are means over the positions where they '
        'are finite, with the share of positions where they are infinite beside them.',
        '',
    ]
    if header:
        lines[2:2] = ['## Run', '', *machine.header_lines(header)]
    lines += lead
    lines += _headline_section(rows, mode)
    lines += _seeds_section(rows) + _failures_section(rows)
    lines += _pairs_section(rows, findings.family(pooled) if pooled else None)
    lines += engine_rules.section(pooled or rows)  # The speed sets pooled, as the trade-off.
    lines += speed.section(pooled or rows)  # SPEED-Bench's figures, TV and matched beside.
    gaps = compare.method_gaps(rows, mode)
    if comparison or gaps:
        lines += compare.paper_section(comparison, mode)
    if gaps:
        lines += compare.method_gaps_section(gaps, mode)
    if figures:
        lines += ['## Figures', '']
        for name, caption, drawn in figures:
            file = os.path.basename(paths[name])
            bars = plots.BARS['pareto' if name.startswith('pareto_') else name]
            lines += [f'### {caption}', '', f'![{caption}]({file})', '',
                      f'Series: {_series_text(drawn)}; {bars}.', '']  # fmt: skip
        if theory:
            labels = [plots.theory_label(rule, curve) for rule, curve in theory.items()]
            lines += ['Dashed in the distortion figure: ' + '; '.join(labels) + '. These '
                      "closed forms are evaluated on synthetic random (p, q) pairs, not on this "
                      "run's distributions: compare their shape with the measured points, not "
                      'their level.', '']  # fmt: skip
    lines += [
        'Files: [metrics.csv](metrics.csv)'
        + (', [paper_comparison.csv](paper_comparison.csv)' if comparison else '')
        + '.',
        '',
    ]
    with open(paths['report'], 'w') as f:
        f.write('\n'.join(lines))
    return paths
