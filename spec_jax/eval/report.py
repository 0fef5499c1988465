"""The evaluation report: a markdown page, the metrics as CSV, the paper's numbers beside ours,
and the figures of `spec_jax.eval.plots`.

Input: the metrics rows of `spec_jax.eval.metrics`, one dict per task x method (FIELDS; a
speed set has `scored` False and no score). `write_report` writes into one directory:

  report.md             per task the headline table; the matched pairs (each lossy method
                        beside its matched baseline, docs/laws.md §5: the score difference with
                        both intervals, the block-efficiency difference, TV, KL, the mass
                        outside the allowed set and the overshoot); the paper's gaps beside
                        ours (`spec_jax.eval.paper`); links to the figures, each with the
                        series it drew;
  metrics.csv           the rows (`read_metrics_csv` reads them back with their types);
  paper_comparison.csv  every row that has a paper counterpart (written only if one does);
  *.png                 pareto_<task>.png per scored task, score_vs_be.png,
                        distortion_vs_param.png.

`headline(rows)` is the compact table a job prints to the terminal.
"""

from __future__ import annotations

import csv
import json
import math
import os
import re
from collections.abc import Sequence
from typing import Any

from spec_jax.eval import paper, plan, plots

FIELDS = (
    'task',
    'scored',
    'method',
    'kind',
    'rule',
    'param',
    'param_name',
    'pairs',
    'n_items',
    'n_samples',
    'score',
    'score_lo',
    'score_hi',
    'block_efficiency',
    'be_full_gamma',
    'accept_length',
    'acceptance_rate',
    'tokens',
    'decode_seconds',
    'tokens_per_s',
    'speedup',
    'tv',
    'kl',
    'outside',
    'overshoot_mean',
    'overshoot_max',
)
_STR_FIELDS = frozenset({'task', 'method', 'kind', 'rule', 'param_name'})
_INT_FIELDS = frozenset({'n_items', 'n_samples', 'tokens'})
_PAIRS_SEP = ';'  # Method names hold ':', ',', '=' and brackets, never ';'.

PAPER_FIELDS = (
    'task',
    'method',
    'kind',
    'matched',
    'score',
    'matched_score',
    'd_score_pts',
    'be_paper_def',
    'd_be_paper_def',
    'paper_setup',
    'paper_label',
    'paper_method',
    'paper_param',
    'paper_acc',
    'paper_acc_std',
    'paper_be',
    'paper_be_std',
    'paper_ds',
    'paper_matched_method',
    'paper_matched_param',
    'paper_matched_acc',
    'paper_d_acc_pts',
    'paper_d_be',
    'paper_note',
)

# Which of our block efficiencies follows the paper's definition (docs/paper.md §3) per setup.
PAPER_BE_FIELD = {'chain': 'be_full_gamma', 'tree': 'accept_length'}


# --- Formatting -------------------------------------------------------------------------------


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _fmt(x: Any, spec: str = '.2f') -> str:
    """A number for a table: '-' for None or NaN, 'inf' for infinities."""
    if not _num(x) or math.isnan(x):
        return '-'
    if math.isinf(x):
        return 'inf' if x > 0 else '-inf'
    return format(x, spec)


def _pct(x: Any) -> str:
    return _fmt(x * 100.0, '.1f') if _num(x) else '-'


def _signed_pct(x: Any) -> str:
    return _fmt(x * 100.0, '+.1f') if _num(x) else '-'


def _score_text(row: dict[str, Any]) -> str:
    """'51.2 [41.0, 61.0]' (percent), '-' for a row without a score."""
    if not _num(row.get('score')):
        return '-'
    lo, hi = row.get('score_lo'), row.get('score_hi')
    if _num(lo) and _num(hi):
        return f'{_pct(row["score"])} [{_pct(lo)}, {_pct(hi)}]'
    return _pct(row['score'])


def _overshoot_text(row: dict[str, Any]) -> str:
    mean, top = row.get('overshoot_mean'), row.get('overshoot_max')
    if not _num(mean) and not _num(top):
        return '-'
    # '.3g': CoS's ratios reach 1e20 and more (no ceiling: p is tiny where q is not).
    return f'{_fmt(mean, ".3g")} / {_fmt(top, ".3g")}'


def _diff(a: Any, b: Any) -> float | None:
    return a - b if _num(a) and _num(b) else None


def _safe_name(text: str) -> str:
    return re.sub(r'[^\w.-]+', '_', text)


def _tasks(rows: Sequence[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(r['task'] for r in rows))


def _by_method(rows: Sequence[dict[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(r['task'], r['method']): r for r in rows}


def _matched(row: dict[str, Any]) -> str | None:
    """A lossy row's matched baseline name (its first pair), None for other kinds."""
    if row.get('kind') != 'lossy' or not row.get('pairs'):
        return None
    return row['pairs'][0]


def _table(header: Sequence[str], body: Sequence[Sequence[str]]) -> list[str]:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + '---|' * len(header)]
    lines += ['| ' + ' | '.join(cells) + ' |' for cells in body]
    return lines


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
            _score_text(r),
            _fmt(r.get('block_efficiency')),
            _fmt(r.get('acceptance_rate'), '.3f'),
            _fmt(r.get('speedup')),
            _fmt(r.get('tv'), '.4f'),
            _overshoot_text(r),
        )
        for r in rows
    ]
    widths = [max(len(cells[k]) for cells in [header, *body]) for k in range(len(header))]
    lines = ['  '.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()
             for cells in [header, *body]]  # fmt: skip
    lines.insert(1, '  '.join('-' * w for w in widths))
    return '\n'.join(lines)


# --- CSV --------------------------------------------------------------------------------------


def _cell(value: Any, key: str = '') -> str:
    if value is None:
        return ''
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, tuple)):  # Method names; other lists (numbers) as JSON.
        return _PAIRS_SEP.join(str(v) for v in value) if key == 'pairs' else json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _fieldnames(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> list[str]:
    extra = [k for r in rows for k in r if k not in fields]
    return list(fields) + list(dict.fromkeys(extra))


def write_metrics_csv(rows: Sequence[dict[str, Any]], path: str) -> str:
    """Writes the rows as CSV (FIELDS first, then any other keys): None is an empty cell,
    `pairs` is ';'-joined, floats are written exactly (repr). Returns `path`."""
    names = _fieldnames(rows, FIELDS)
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(names)
        for r in rows:
            writer.writerow([_cell(r.get(k), k) for k in names])
    return path


def _parse(key: str, text: str) -> Any:
    if key == 'pairs':
        return [p for p in text.split(_PAIRS_SEP) if p]
    if text == '':
        return None
    if key in _STR_FIELDS:
        return text
    if text.startswith('['):
        return json.loads(text)
    if key == 'scored' or text in ('True', 'False'):
        return text == 'True'
    try:
        number = float(text)
    except ValueError:
        return text
    if key in _INT_FIELDS or (key not in FIELDS and re.fullmatch(r'-?\d+', text)):
        return int(number)
    return number


def read_metrics_csv(path: str) -> list[dict[str, Any]]:
    """Reads `write_metrics_csv`'s file back into rows with their types (bool, int, float,
    None, the `pairs` list)."""
    with open(path, newline='') as f:
        return [{k: _parse(k, v) for k, v in r.items()} for r in csv.DictReader(f)]


# --- The paper beside ours ----------------------------------------------------------------


def paper_comparison(rows: Sequence[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """Every row with a paper counterpart in the `mode` setup ('chain' | 'tree'): our score,
    our gap to the matched baseline (percentage points), our block efficiency in the paper's
    definition (PAPER_BE_FIELD) and its gap, the paper's row and the paper's gap (PAPER_FIELDS;
    gaps are None for lossless and baseline rows, which are the references)."""
    index = _by_method(rows)
    be_key = PAPER_BE_FIELD[mode]
    out = []
    for r in rows:
        row = paper.paper_row(mode, r['task'], r['method'])
        if row is None:
            continue
        matched_name = _matched(r)
        matched = index.get((r['task'], matched_name)) if matched_name else None
        gap = paper.paper_gap(mode, r['task'], r['method'])
        d_score = _diff(r.get('score'), (matched or {}).get('score'))
        out.append(
            {
                'task': r['task'],
                'method': r['method'],
                'kind': r.get('kind'),
                'matched': matched_name,
                'score': r.get('score'),
                'matched_score': (matched or {}).get('score'),
                'd_score_pts': None if d_score is None else d_score * 100.0,
                'be_paper_def': r.get(be_key),
                'd_be_paper_def': _diff(r.get(be_key), (matched or {}).get(be_key)),
                'paper_setup': mode,
                'paper_label': row['label'],
                'paper_method': row['method'],
                'paper_param': row['param'],
                'paper_acc': row['acc'],
                'paper_acc_std': row['acc_std'],
                'paper_be': row['be'],
                'paper_be_std': row['be_std'],
                'paper_ds': row['ds'],
                'paper_matched_method': gap['matched']['method'] if gap else None,
                'paper_matched_param': gap['matched']['param'] if gap else None,
                'paper_matched_acc': gap['matched']['acc'] if gap else None,
                'paper_d_acc_pts': gap['d_acc'] if gap else None,
                'paper_d_be': gap['d_be'] if gap else None,
                'paper_note': row['note'],
            }
        )
    return out


def method_gaps(rows: Sequence[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """For each lossy method the paper also ran (whatever the tasks): our score gap to its
    matched baseline on each of our scored tasks and the paper's accuracy gap on each of
    its tasks, so a run on other tasks (the README's) still sets the paper beside ours."""
    index = _by_method(rows)
    columns = {column: task for task, column in paper.TASK_COLUMNS.items()}
    out = []
    for method in dict.fromkeys(r['method'] for r in rows if r.get('kind') == 'lossy'):
        if paper.paper_method(mode, method) is None:
            continue
        ours = {}
        for r in rows:
            if r['method'] == method and r.get('scored'):
                matched = index.get((r['task'], _matched(r)))
                d = _diff(r.get('score'), (matched or {}).get('score'))
                ours[r['task']] = None if d is None else 100.0 * d
        theirs = {}
        for column in paper.TASKS:
            gap = paper.paper_gap(mode, columns[column], method)
            theirs[column] = gap['d_acc'] if gap else None
        out.append(dict(method=method, ours=ours, paper=theirs))
    return out


def _method_gaps_section(gaps: list[dict[str, Any]], mode: str) -> list[str]:
    tasks = list(dict.fromkeys(t for g in gaps for t in g['ours']))
    header = ('method', *(f'ours Δ {t}' for t in tasks), *(f'paper Δ {c}' for c in paper.TASKS))
    body = [
        (f'`{g["method"]}`', *(_fmt(g['ours'].get(t), '+.1f') for t in tasks),
         *(_fmt(g['paper'][c], '+.1f') for c in paper.TASKS))
        for g in gaps
    ]  # fmt: skip
    return [
        '### Gaps by method',
        '',
        f'Score gap to the matched baseline in points: ours on our tasks, the paper '
        f'({paper.SETUPS[mode]["label"]}) on its tasks.',
        '',
        *_table(header, body),
        '',
    ]


def _paper_name(method: str, param: float | None) -> str:
    return method if param is None else f'{method} {param:g}'


def _paper_section(comparison: list[dict[str, Any]], mode: str) -> list[str]:
    info = paper.SETUPS[mode]
    lines = [
        '## The paper beside ours',
        '',
        f'Paper: **{info["label"]}** ({info["section"]}, {info["runs"]}); its BE is '
        f'{info["be_definition"]}, and ours below follows that definition '
        f'(`{PAPER_BE_FIELD[mode]}`). Gaps are method minus its matched baseline, in '
        'percentage points for scores.',
        '',
        'Compare the direction and size of the gaps, not absolute scores: ours is a '
        "135M-parameter model on the bundled samples, the paper's a far larger target on the "
        'full benchmarks.',
        '',
    ]
    gaps = [c for c in comparison if c['paper_d_acc_pts'] is not None]
    body = [
        (
            c['task'],
            f'`{c["method"]}`',
            f'{_paper_name(c["paper_method"], c["paper_param"])} vs '
            f'{_paper_name(c["paper_matched_method"], c["paper_matched_param"])}',
            _fmt(c['d_score_pts'], '+.1f'),
            _fmt(c['paper_d_acc_pts'], '+.1f'),
            _fmt(c['d_be_paper_def'], '+.2f'),
            _fmt(c['paper_d_be'], '+.2f'),
            _pct(c['score']),
            _fmt(c['paper_acc'], '.1f'),
        )
        for c in gaps
    ]
    header = ('task', 'method', 'paper rows', 'ours Δscore', 'paper Δacc', 'ours ΔBE',
              'paper ΔBE', 'ours score %', 'paper acc %')  # fmt: skip
    lines += _table(header, body) if body else [
        "None of this run's tasks is one of the paper's (MATH, MBPP+, INCLUDE, BFCL "
        'parallel_multiple): the gaps by method follow.'
    ]
    notes = sorted({f'{_paper_name(c["paper_method"], c["paper_param"])} ({c["task"]}): '
                    f'{c["paper_note"]}' for c in comparison if c['paper_note']})  # fmt: skip
    if notes:
        lines += [''] + [f'- Note: {n}' for n in notes]
    refs = [c for c in comparison if c['paper_d_acc_pts'] is None]
    if refs:
        lines += ['', 'References (the lossless and baseline rows) are in `paper_comparison.csv`.']
    return lines + ['']


# --- The markdown page --------------------------------------------------------------------


def _headline_section(rows: Sequence[dict[str, Any]], mode: str) -> list[str]:
    be_key = PAPER_BE_FIELD[mode]
    lines = ['## Headline', '']
    header = ('method', 'kind', 'score % [interval]', 'BE', f'BE ({be_key})', 'acceptance',
              'tokens/s', 'speedup', 'TV', 'KL', 'outside', 'overshoot mean / max')  # fmt: skip
    for task in _tasks(rows):
        sel = [r for r in rows if r['task'] == task]
        first = sel[0]
        what = 'scored' if first.get('scored') else 'speed set, not scored'
        lines += [f'### {task}', '',
                  f'{first.get("n_items", "?")} items, {first.get("n_samples", "?")} samples '
                  f'per method ({what}).', '']  # fmt: skip
        body = [
            (
                f'`{r["method"]}`',
                str(r.get('kind', '')),
                _score_text(r),
                _fmt(r.get('block_efficiency')),
                _fmt(r.get(be_key)),
                _fmt(r.get('acceptance_rate'), '.3f'),
                _fmt(r.get('tokens_per_s'), '.1f'),
                _fmt(r.get('speedup')),
                _fmt(r.get('tv'), '.4f'),
                _fmt(r.get('kl'), '.4f'),
                _fmt(r.get('outside'), '.4f'),
                _overshoot_text(r),
            )
            for r in sel
        ]
        lines += _table(header, body) + ['']
    return lines


def matched_pairs(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each lossy row beside its matched baseline on the same task: {'task', 'method',
    'matched', 'row', 'matched_row' (None when the run lacks it), 'd_score', 'd_be'}."""
    index = _by_method(rows)
    out = []
    for r in rows:
        name = _matched(r)
        if name is None:
            continue
        base = index.get((r['task'], name))
        out.append(
            {
                'task': r['task'],
                'method': r['method'],
                'matched': name,
                'row': r,
                'matched_row': base,
                'd_score': _diff(r.get('score'), (base or {}).get('score')),
                'd_be': _diff(r.get('block_efficiency'), (base or {}).get('block_efficiency')),
            }
        )
    return out


def _pairs_section(rows: Sequence[dict[str, Any]]) -> list[str]:
    pairs = matched_pairs(rows)
    lines = [
        '## Matched pairs',
        '',
        'Each lossy method beside its matched baseline (the same truncation sampled and '
        'verified losslessly, or lossless SD for rules that truncate nothing; docs/laws.md §5). '
        'Δ = method minus matched baseline (score in percentage points); TV, KL, outside '
        "and overshoot are the lossy method's distortion against the baseline law.",
        '',
    ]
    header = ('task', 'method', 'matched', 'score % [interval]', 'matched score % [interval]',
              'Δscore', 'ΔBE', 'TV', 'KL', 'outside', 'overshoot mean / max')  # fmt: skip
    body = [
        (
            p['task'],
            f'`{p["method"]}`',
            f'`{p["matched"]}`' + ('' if p['matched_row'] else ' (not in this run)'),
            _score_text(p['row']),
            _score_text(p['matched_row'] or {}),
            _signed_pct(p['d_score']),
            _fmt(p['d_be'], '+.2f'),
            _fmt(p['row'].get('tv'), '.4f'),
            _fmt(p['row'].get('kl'), '.4f'),
            _fmt(p['row'].get('outside'), '.4f'),
            _overshoot_text(p['row']),
        )
        for p in pairs
    ]
    return lines + (_table(header, body) if body else ['No lossy methods in this run.']) + ['']


def _series_text(drawn: plots.Drawn) -> str:
    return ', '.join(f'{label} ({n})' for label, n in drawn.items()) or 'nothing'


def write_report(
    rows: list[dict],
    out_dir: str,
    *,
    mode: str = 'chain',
    title: str = '',
    theory: dict | None = None,
) -> dict[str, str]:
    """Writes the report of one evaluation run into `out_dir`.

    Args:
      rows: metrics rows (FIELDS), one per task x method.
      out_dir: the directory (created if needed).
      mode: the run's speculative mode, 'chain' or 'tree': the matched-baseline convention and
        the paper setup to compare with (docs/paper.md §5.2 chain, §5.1 tree).
      title: the page title.
      theory: theory distortion curves for the distortion figure,
        {rule_name: {'param': [...], 'tv': [...], 'label': str}}
        (`spec_jax.rules.theory.parameter_curve`).

    Returns:
      name -> path of each file written: 'report', 'metrics_csv', 'paper_csv' (only when a
      row has a paper counterpart), 'pareto_<task>' per scored task, 'score_vs_be',
      'distortion' (the PNGs only when they have something to draw).

    Raises:
      ValueError: an unknown mode.
    """
    if mode not in PAPER_BE_FIELD:
        raise ValueError(f'mode {mode!r} is not one of {sorted(PAPER_BE_FIELD)}')
    os.makedirs(out_dir, exist_ok=True)
    paths = {'report': os.path.join(out_dir, 'report.md')}
    paths['metrics_csv'] = write_metrics_csv(rows, os.path.join(out_dir, 'metrics.csv'))

    comparison = paper_comparison(rows, mode)
    if comparison:
        paths['paper_csv'] = os.path.join(out_dir, 'paper_comparison.csv')
        with open(paths['paper_csv'], 'w', newline='') as f:
            writer = csv.writer(f)
            writer.writerow(PAPER_FIELDS)
            for c in comparison:
                writer.writerow([_cell(c[k]) for k in PAPER_FIELDS])

    figures: list[tuple[str, str, plots.Drawn]] = []  # (name, caption, what it drew)

    def figure(name: str, file: str, caption: str, draw) -> None:
        paths[name] = os.path.join(out_dir, file)
        figures.append((name, caption, draw(paths[name])))

    scored = [r for r in rows if r.get('scored') and _num(r.get('score'))]
    for task in _tasks(scored):
        name = f'pareto_{_safe_name(task)}'
        figure(name, name + '.png', f'{task}: speed vs quality',
               lambda path, task=task: plots.pareto(rows, task, path))  # fmt: skip
    if scored:
        figure('score_vs_be', 'score_vs_be.png', 'score vs block efficiency',
               lambda path: plots.score_vs_be(rows, path))  # fmt: skip
    if theory or any(r.get('kind') == 'lossy' and _num(r.get('param')) for r in rows):
        figure('distortion', 'distortion_vs_param.png', 'distortion vs parameter',
               lambda path: plots.distortion_vs_param(rows, path, theory))  # fmt: skip

    methods = list(dict.fromkeys(r['method'] for r in rows))
    lines = [
        f'# {title or "Evaluation report"}',
        '',
        f'Mode: {mode} (matched baselines: {plan.CONVENTIONS[mode]}). '
        f'{len(_tasks(rows))} tasks, {len(methods)} methods.',
        '',
        'BE = block efficiency, tokens per target forward including the bonus token (1.0 for '
        'AR); scores are percentages with their intervals; speedup is tokens/s over AR on the '
        'same task in the same run; TV, KL (KL(p_A || pi)), outside (mass outside the allowed '
        'set) and overshoot (max pi/p) are metered against the matched baseline law.',
        '',
    ]
    lines += _headline_section(rows, mode)
    lines += _pairs_section(rows)
    gaps = method_gaps(rows, mode)
    if comparison or gaps:
        lines += _paper_section(comparison, mode)
    if gaps:
        lines += _method_gaps_section(gaps, mode)
    if figures:
        lines += ['## Figures', '']
        for name, caption, drawn in figures:
            file = os.path.basename(paths[name])
            lines += [f'### {caption}', '', f'![{caption}]({file})', '',
                      f'Series: {_series_text(drawn)}.', '']  # fmt: skip
        if theory:
            labels = [plots.theory_label(rule, curve) for rule, curve in theory.items()]
            lines += ['Dashed in the distortion figure: ' + '; '.join(labels) + '.', '']
    lines += [
        'Files: [metrics.csv](metrics.csv)'
        + (', [paper_comparison.csv](paper_comparison.csv)' if comparison else '')
        + '.',
        '',
    ]
    with open(paths['report'], 'w') as f:
        f.write('\n'.join(lines))
    return paths
