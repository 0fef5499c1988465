"""The claims job's output (`spec_jax.jobs.claims`): the summary printed before the claim
lines and `claims.md` (the lines, the frontier table and figure, the budgeted rule, the
floors at q = p), from what `eval.claims.evaluate` returns (docs/claims.md)."""

from __future__ import annotations

from spec_jax.eval import frontier, tables
from spec_jax.eval.frontier import fmt_ci


def summary_lines(out: dict) -> list[str]:
    """The frontier's gap per rule, the budget set beside lenience and the family's
    composition, printed before the claim lines."""
    gaps = '; '.join(f'{m} {fmt_ci(v["gap"], "+.4f")} (n {v["gap"]["n"]})'
                     for m, v in out['frontier'].items())  # fmt: skip
    lines = [f'frontier gap per drafted position (TV(pi, p) - (acceptance - sum min(p, q)) on '
             f"the rule's own drafted positions; mean over prompts, described): {gaps}"]
    if out['budget']:
        lines.append(
            f'tv_budget nearest lenience in mean TV: {out["budget"]["nearest"]} '
            '(claims.md: its BE, mean and worst per-offset TV beside lenience, CoS)'
        )
    return lines + [f'verdicts: {out["composition"]}; {out["family"]}']


def markdown(out: dict, title: str, wall_s: float) -> str:
    """claims.md: the lines, the frontier table and figure, the budgeted rule, the floors."""
    lines = [
        f'# Claims: {title}',
        '',
        f'Wall clock {wall_s:.0f} s. Verdicts: {out["composition"]}. {out["family"]}.',
        '',
        *[f'- {line}' for line in out['lines']],
        '',
        '## The distortion frontier',
        '',
        "Per drafted position of the rule's own decoding: its metered TV(pi, p) against its "
        'acceptance minus sum min(p, q) there (lossless SD\'s acceptance at the same '
        'position; `spec_jax.eval.frontier`); gap = TV - gain, never below 0 in expectation '
        '(`rules.frontier_gap`), about 0 on the frontier. Per-prompt means, then their mean '
        'with its 95% t-interval over prompts (described, not judged).',
        '',
        *frontier.frontier_table(out['frontier']),
        '',
        '![frontier](frontier.png)',
        '',
        '## The budgeted rule at equal mean TV',
        '',
    ]
    budget = out['budget']
    if budget:
        lines += [
            f'tv_budget nearest lenience in mean TV: `{budget["nearest"]}`. The meter '
            'keeps sums per block offset, not a per-position maximum: "worst" is the '
            'largest per-offset mean.',
            '',
            *budget['table'],
            '',
        ]
    else:
        lines += [
            "Not run: no `tv_budget` in this run's grid (the full config runs it where "
            '`spec_jax.rules` has it).',
            '',
        ]
    lines += ['## Floors at q = p (by construction)', '', *tables.table(
        ('rule', 'form', 'n', 'metered TV', 'derived floor', 'metered - derived'),
        [[f['rule'], f['form'], str(f['measured_ci']['n']), fmt_ci(f['measured_ci'], '.4f'),
          fmt_ci(f['derived_ci'], '.4f'), fmt_ci(f['gap_ci'], '+.4f')]
         for f in out['floors']]), '']  # fmt: skip
    return '\n'.join(lines)
