"""The paper beside ours: each of our rows with a counterpart among the paper's numbers
(`spec_jax.eval.paper`; docs/paper.md §5), our gaps to the matched baselines beside the
paper's, as CSV rows and as the report's markdown section."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from spec_jax.eval import paper, tables
from spec_jax.eval.stats import verdicts

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


def score_gap(row: dict[str, Any], matched: dict[str, Any] | None) -> float | None:
    """A lossy row's score gap to its matched baseline: the paired Δ over the (item, seed)
    samples both ran (`spec_jax.eval.stats.paired`, field 'd_score') when the row has it, else
    (rows without pairing, e.g. an older metrics.csv) the difference of pooled scores."""
    if row.get('pair_n') is not None:
        return row.get('d_score')
    return tables.diff(row.get('score'), (matched or {}).get('score'))


def paper_comparison(rows: Sequence[dict[str, Any]], mode: str) -> list[dict[str, Any]]:
    """Every row with a paper counterpart in the `mode` setup ('chain' | 'tree'): our score,
    our gap to the matched baseline (percentage points), our block efficiency in the paper's
    definition (PAPER_BE_FIELD) and its gap, the paper's row and the paper's gap (PAPER_FIELDS;
    gaps are None for lossless and baseline rows, which are the references)."""
    index = tables.by_method(rows)
    be_key = PAPER_BE_FIELD[mode]
    out = []
    for r in rows:
        row = paper.paper_row(mode, r['task'], r['method'])
        if row is None:
            continue
        matched_name = tables.matched_name(r)
        matched = index.get((r['task'], matched_name)) if matched_name else None
        gap = paper.paper_gap(mode, r['task'], r['method'])
        d_score = score_gap(r, matched)
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
                'd_be_paper_def': tables.diff(r.get(be_key), (matched or {}).get(be_key)),
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
    its tasks, so a run on other tasks (the README's) still sets the paper beside ours;
    'ours_text' per task: the gap with its interval and n ('-33.3 [-80.0, +10.0] (n 6)')."""
    index = tables.by_method(rows)
    columns = {column: task for task, column in paper.TASK_COLUMNS.items()}
    out = []
    for method in dict.fromkeys(r['method'] for r in rows if r.get('kind') == 'lossy'):
        if paper.paper_method(mode, method) is None:
            continue
        ours, text = {}, {}
        for r in rows:
            if r['method'] == method and r.get('scored'):
                matched = index.get((r['task'], tables.matched_name(r)))
                d = score_gap(r, matched)
                ours[r['task']] = None if d is None else 100.0 * d
                n = r.get('pair_n_items') or r.get('pair_n')
                text[r['task']] = (f'{tables.interval(r, "d_score", "+.1f", 100.0)} (n {n})'
                                   if d is not None and n
                                   else tables.fmt(ours[r['task']], '+.1f'))  # fmt: skip
        theirs = {}
        for column in paper.TASKS:
            gap = paper.paper_gap(mode, columns[column], method)
            theirs[column] = gap['d_acc'] if gap else None
        out.append(dict(method=method, ours=ours, ours_text=text, paper=theirs))
    return out


def method_gaps_section(gaps: list[dict[str, Any]], mode: str) -> list[str]:
    tasks = list(dict.fromkeys(t for g in gaps for t in g['ours']))
    header = ('method', *(f'ours Δ {t}' for t in tasks), *(f'paper Δ {c}' for c in paper.TASKS))
    body = [
        (f'`{g["method"]}`',
         *(g.get('ours_text', {}).get(t) or tables.fmt(g['ours'].get(t), '+.1f') for t in tasks),
         *(tables.fmt(g['paper'][c], '+.1f') for c in paper.TASKS))
        for g in gaps
    ]  # fmt: skip
    return [
        '### Gaps by method',
        '',
        f'Score gap to the matched baseline in points: ours on our tasks with its 95% '
        f'interval and the items it pairs (n; verdicts in the findings, none below '
        f'{verdicts.MIN_ITEMS} items), the paper ({paper.SETUPS[mode]["label"]}) on its tasks.',
        '',
        *tables.table(header, body),
        '',
    ]


def _paper_name(method: str, param: float | None) -> str:
    return method if param is None else f'{method} {param:g}'


def paper_section(comparison: list[dict[str, Any]], mode: str) -> list[str]:
    info = paper.SETUPS[mode]
    lines = [
        '## The paper beside ours',
        '',
        f'Paper: **{info["label"]}** ({info["section"]}, {info["runs"]}); its BE is '
        f'{info["be_definition"]}, and ours below follows that definition '
        f'(`{PAPER_BE_FIELD[mode]}`). Gaps are method minus its matched baseline, in '
        'percentage points for scores.',
        '',
        'Compare the direction and size of the gaps, not absolute scores: unless this run '
        "is one of the paper's setups on the full benchmarks, its target, draft and items "
        "differ from the paper's (the README's run: a 135M-parameter target on the bundled "
        'samples).',
        '',
    ]
    gaps = [c for c in comparison if c['paper_d_acc_pts'] is not None]
    body = [
        (
            c['task'],
            f'`{c["method"]}`',
            f'{_paper_name(c["paper_method"], c["paper_param"])} vs '
            f'{_paper_name(c["paper_matched_method"], c["paper_matched_param"])}',
            tables.fmt(c['d_score_pts'], '+.1f'),
            tables.fmt(c['paper_d_acc_pts'], '+.1f'),
            tables.fmt(c['d_be_paper_def'], '+.2f'),
            tables.fmt(c['paper_d_be'], '+.2f'),
            tables.pct(c['score']),
            tables.fmt(c['paper_acc'], '.1f'),
        )
        for c in gaps
    ]
    header = ('task', 'method', 'paper rows', 'ours Δscore', 'paper Δacc', 'ours ΔBE',
              'paper ΔBE', 'ours score %', 'paper acc %')  # fmt: skip
    lines += (
        tables.table(header, body)
        if body
        else [
            "None of this run's tasks is one of the paper's (MATH, MBPP+, INCLUDE, BFCL "
            'parallel_multiple): the gaps by method follow.'
        ]
    )
    notes = sorted({f'{_paper_name(c["paper_method"], c["paper_param"])} ({c["task"]}): '
                    f'{c["paper_note"]}' for c in comparison if c['paper_note']})  # fmt: skip
    if notes:
        lines += [''] + [f'- Note: {n}' for n in notes]
    refs = [c for c in comparison if c['paper_d_acc_pts'] is None]
    if refs:
        lines += ['', 'References (the lossless and baseline rows) are in `paper_comparison.csv`.']
    return lines + ['']
