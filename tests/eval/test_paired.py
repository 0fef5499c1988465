"""Paired statistics on constructed runs: a partial run whose pooled scores mislead (the
baseline on 100 items, the method on 40) reports its Δs over the 40 shared items, with n and
intervals, in the metrics rows and the report's matched pairs; McNemar's exact p beside the
score gap's unconditional interval (Tango's score interval), whose exact coverage is
enumerated over the multinomial; per-seed mean and std; Wilson's interval where the items
have no spread; speedup intervals over the design's units."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import optimize, stats
from scipy.special import gammaln

from spec_jax.eval import compare, findings, metrics, plan, report
from spec_jax.eval.stats import paired, verdicts

LOSSY, BASE = 'minp_verify:rho=0.3', 'baseline[min_p=0.3]'


def sample(method, item, correct, emitted, seconds, seed=0, task='gsm8k', tokens=10):
    """One result line: 10 target forwards, `emitted` tokens, metered TV 0.1 per position
    for the lossy method (0 for the others), in batches of 4 items."""
    tv = 0.1 if method == LOSSY else 0.0
    return dict(
        method=method, task=task, item=str(item), seed=seed, correct=correct, num_tokens=tokens,
        seconds=seconds, batch_id=f's{seed}/{task}/{item // 4}',
        stats=dict(blocks=10, emitted=emitted, drafted=10, accepted=emitted - 10, metered=10,
                   tv_sum=10 * tv, full_blocks=0, full_accepted=0),
    )  # fmt: skip


@pytest.fixture(scope='module')
def partial_run():
    """The baseline on 100 items: right on 0-27 of the 40 the method ran and on 2 of the 60
    others (30%); the method on items 0-39, right on 0-23 (60%). Pooled: +30 points; on the
    40 shared items: 60% against 70%, -10 points (4 discordant pairs, all the baseline's)."""
    methods = plan.plan([LOSSY], 'chain')
    rows = [sample('ar', i, i < 20, 10, 3.0) for i in range(100)]
    rows += [sample(BASE, i, i < 28 or i in (40, 41), 15 if i < 40 else 30, 2.0)
             for i in range(100)]  # fmt: skip
    rows += [sample(LOSSY, i, i < 24, 20, 1.0) for i in range(40)]
    return methods, metrics.aggregate(rows, methods)


def test_the_partial_run_pairs_its_deltas_on_the_shared_items(partial_run, tmp_path):
    _, rows = partial_run
    by = {r['method']: r for r in rows}
    lossy, base = by[LOSSY], by[BASE]
    assert lossy['score'] - base['score'] == pytest.approx(0.30)  # The pooled figure misleads.
    assert lossy['pair_n'] == lossy['pair_n_items'] == 40
    assert lossy['d_score'] == pytest.approx(-0.10)
    # McNemar: 0 wins, 4 losses, p 0.125; the score interval holds 0 too, far from +30, and
    # reaches below the estimate (the conditional interval stopped at it: [-10.0, +2.0]).
    assert lossy['d_score_p'] == pytest.approx(stats.binomtest(0, 4, 0.5).pvalue)  # 0.125.
    assert lossy['d_score_test'] == 'McNemar'
    assert (lossy['d_score_wins'], lossy['d_score_losses']) == (0, 4)
    assert lossy['d_score_lo'] < -0.10 < 0.0 < lossy['d_score_hi'] < 0.05
    fam = findings.family(rows)
    assert fam.verdicts[('gsm8k', LOSSY, 'd_score')] == 'not distinguishable from 0'
    assert 'not distinguishable from 0' in findings.text(rows, 'chain')
    # BE on the shared items: 2.0 against 1.5 (pooled, the baseline's other items say 2.4).
    assert lossy['d_be'] == pytest.approx(0.5) and base['block_efficiency'] == pytest.approx(2.4)
    assert lossy['d_be_lo'] == pytest.approx(0.5) and lossy['d_be_hi'] == pytest.approx(0.5)
    assert lossy['d_tv'] == pytest.approx(0.1)
    # Tokens/s over the baseline's on the 10 shared batches: 2x in each.
    assert lossy['speedup_vs_matched'] == pytest.approx(2.0)
    assert lossy['speedup_vs_matched_n_batches'] == 10
    assert (lossy['speedup_vs_matched_lo'], lossy['speedup_vs_matched_hi']) == pytest.approx(
        (2.0, 2.0)
    )
    # The report's matched pairs and the paper's gaps say the same.
    (pair,) = report.matched_pairs(rows)
    assert pair['paired'] and pair['n'] == 40 and pair['d_score'] == pytest.approx(-0.10)
    gaps = {g['method']: g for g in compare.method_gaps(rows, 'chain')}
    assert gaps[LOSSY]['ours']['gsm8k'] == pytest.approx(-10.0)
    report.write_report(rows, str(tmp_path))
    md = (tmp_path / 'report.md').read_text()
    (line,) = [x for x in md.splitlines() if x.startswith(f'| gsm8k | `{LOSSY}` | `{BASE}` |')]
    cells = [c.strip() for c in line.split('|')]
    assert cells[4] == '40'
    lo, hi = 100 * lossy['d_score_lo'], 100 * lossy['d_score_hi']
    assert cells[7] == f'-10.0 [{lo:+.1f}, {hi:+.1f}] (McNemar p 0.125)'
    assert cells[8] == '+0.50 [+0.50, +0.50]' and cells[10] == '2.00 [2.00, 2.00]'


GRID = (0.0, 0.01, 0.03, 0.05, 0.1, 0.15, 0.2, 0.3)


def _coverage(n: int) -> dict[tuple[float, float], float]:
    """The exact coverage of `verdicts.score_gap_interval` at n items for every (p(win),
    p(loss)) of GRID: the multinomial probability of every (wins, losses) whose interval
    holds p(win) - p(loss), summed (all (n + 1)(n + 2) / 2 outcomes, vectorised)."""
    wins, losses = np.meshgrid(np.arange(n + 1), np.arange(n + 1), indexing='ij')
    keep = wins + losses <= n
    wins, losses = wins[keep].astype(float), losses[keep].astype(float)
    lo, hi = verdicts.score_gap_interval(wins, losses, n)
    base = gammaln(n + 1) - gammaln(wins + 1) - gammaln(losses + 1) - gammaln(n - wins - losses + 1)
    out = {}
    for pw in GRID:
        for pl in GRID:
            with np.errstate(divide='ignore', invalid='ignore'):
                logp = (base + np.where(wins > 0, wins * np.log(pw or 1.0), 0.0)
                        + np.where(losses > 0, losses * np.log(pl or 1.0), 0.0)
                        + (n - wins - losses) * np.log(1.0 - pw - pl))  # fmt: skip
            prob = np.exp(logp) * ((wins == 0) | (pw > 0)) * ((losses == 0) | (pl > 0))
            d = pw - pl
            out[pw, pl] = float(prob[(lo <= d + 1e-12) & (d - 1e-12 <= hi)].sum())
    return out


@pytest.mark.parametrize('n', [30, 100, 378])
def test_the_score_gap_interval_covers_exactly_on_the_grid(n):
    """Exact coverage (enumerated, not simulated) of the score gap's 95% interval on the
    grid p(win), p(loss) in GRID (64 laws): at least 0.93 at every point (the issue's bound
    from n 30 on). Measured minimum: 0.964 at n 30, 0.958 at n 100, 0.954 at n 378 (Tango's
    interval without the continuity correction: 0.930, 0.933, 0.947; Agresti-Min's: 0.917,
    0.932, 0.890). Also: it reaches past the estimate when every discordant pair goes one
    way, and is not [0, 0] without discordant pairs."""
    cover = _coverage(n)
    worst = min(cover, key=cover.get)
    print(f'n {n}: worst exact coverage {cover[worst]:.4f} at p(win), p(loss) = {worst}, '
          f'mean {np.mean(list(cover.values())):.4f}')
    assert cover[worst] >= 0.93, (worst, cover[worst])
    lo, hi = verdicts.score_gap_interval(0, 10, n)
    assert lo < -10 / n and hi > -10 / n
    lo, hi = verdicts.score_gap_interval(0, 0, n)
    assert lo < 0 < hi


def test_the_score_gap_interval_is_tangos_score_interval():
    """The interval's ends are where Tango's statistic (continuity-corrected) is +-1.96:
    checked against scipy's root finder on the closed form, and symmetric in wins and
    losses."""
    z = stats.norm.ppf(0.975)
    for wins, losses, n in ((3, 9, 30), (0, 6, 100), (12, 1, 378)):
        lo, hi = verdicts.score_gap_interval(wins, losses, n)

        def stat(d, w=wins, c=losses, n=n):
            b = w + c + (w - c - 2 * n) * d
            p = (b + math.sqrt(b * b + 8 * n * c * d * (1 - d))) / (4 * n)
            num = w - c - n * d
            return math.copysign(max(abs(num) - 0.5, 0.0), num) / math.sqrt(n * (2 * p + d - d * d))

        est = (wins - losses) / n
        assert lo == pytest.approx(optimize.brentq(lambda d: stat(d) - z, -0.999999, est))
        assert hi == pytest.approx(optimize.brentq(lambda d: stat(d) + z, est, 0.999999))
        assert verdicts.score_gap_interval(losses, wins, n) == pytest.approx((-hi, -lo))


def test_three_items_are_too_few_to_judge():
    """Three items, all wins: +100 points, McNemar p 0.25, and no verdict."""
    methods = plan.plan([LOSSY], 'chain')
    rows = [sample(BASE, i, False, 15, 2.0) for i in range(3)]
    rows += [sample(LOSSY, i, True, 20, 1.0) for i in range(3)]
    rows = metrics.aggregate(rows, methods)
    lossy = next(r for r in rows if r['method'] == LOSSY)
    assert lossy['d_score'] == 1.0 and lossy['d_score_p'] == pytest.approx(0.25)
    assert findings.family(rows).verdicts[('gsm8k', LOSSY, 'd_score')] == verdicts.TOO_FEW
    (line,) = [x for x in findings.findings(rows) if 'score gaps' in x]
    assert 'too few items to judge (n < 10)' in line and '+100.0' in line and 'p 0.25' in line


def test_several_seeds_mean_and_std(tmp_path):
    """Two seeds on 10 items: seed 0 the method wins 2 more items (+20 points), seed 1 it
    loses 1 (-10): per-seed Δ mean +5, std sqrt(((20 - 5)**2 + (-10 - 5)**2) / 1) points."""
    methods = plan.plan([LOSSY], 'chain')
    rows = []
    for seed, extra in ((0, 2), (1, -1)):
        rows += [sample(BASE, i, i < 5, 15, 2.0, seed=seed) for i in range(10)]
        rows += [sample(LOSSY, i, i < 5 + extra, 20, 1.0, seed=seed) for i in range(10)]
    lossy = next(r for r in metrics.aggregate(rows, methods) if r['method'] == LOSSY)
    assert lossy['pair_n'] == 20 and lossy['pair_n_items'] == 10
    assert lossy['d_score'] == pytest.approx(0.05)
    assert lossy['d_score_seed_mean'] == pytest.approx(0.05)
    assert lossy['d_score_seed_std'] == pytest.approx(math.sqrt(0.15**2 + 0.15**2))
    # McNemar is for one sample per item: with two seeds a t-test over the items' mean Δs.
    item_means = [0.0] * 5 + [0.5] * 2 + [0.0] * 3  # Items 5, 6: won at seed 0 only.
    item_means[4] = -0.5  # Item 4: lost at seed 1 only.
    assert lossy['d_score_test'] == 't'
    assert lossy['d_score_p'] == pytest.approx(stats.ttest_1samp(item_means, 0.0).pvalue)
    assert lossy['n_seeds'] == 2
    assert lossy['score_seed_std'] == pytest.approx(math.sqrt(0.15**2 * 2))  # 0.7 and 0.4.
    # The report shows the spread over seeds beside the score and the score gap.
    report.write_report(metrics.aggregate(rows, methods), str(tmp_path))
    md = (tmp_path / 'report.md').read_text()
    assert '55.0 [23.7, 86.3] ± 21.2 sd over 2 seeds' in md  # Score: 70% and 40%.
    assert '+5.0 [-15.3, +25.3] (t p 0.591) ± 21.2 sd over seeds' in md  # Δ: +20 and -10.


def test_wilson_on_pooled_samples_without_item_spread():
    # Every item right at one seed of two: item means all 0.5, no spread to take an
    # interval from; the 3 of 6 pooled samples give Wilson's.
    mean, lo, hi = metrics.score_interval([[1, 0], [0, 1], [1, 0]])
    assert mean == 0.5 and (lo, hi) == pytest.approx(metrics.wilson(3, 6))
    assert metrics.score_interval([[0, 0], [0, 0]])[1:] == pytest.approx(metrics.wilson(0, 4))


def test_ratio_interval():
    est = paired.ratio_interval([2.0, 0.5, 1.0, 4.0])
    assert est['mean'] == pytest.approx(math.sqrt(2.0)) and est['lo'] is None and est['n'] == 4
    ratios = [1.1, 0.9, 1.3, 1.2, 0.8, 1.0]
    est, inverse = paired.ratio_interval(ratios), paired.ratio_interval([1 / r for r in ratios])
    logs = [math.log(r) for r in ratios]
    m = sum(logs) / 6
    sd = math.sqrt(sum((x - m) ** 2 for x in logs) / 5)
    half = stats.t.ppf(0.975, 5) * sd / math.sqrt(6)
    assert (est['lo'], est['hi']) == pytest.approx((math.exp(m - half), math.exp(m + half)))
    # The direction of the ratio cannot change the answer.
    assert est['mean'] * inverse['mean'] == pytest.approx(1.0)
    assert est['lo'] * inverse['hi'] == pytest.approx(1.0)


def test_ratio_interval_over_design_units():
    """From paired.MIN_UNITS units on, the interval is the t-interval of the unit means of
    the log ratios (n - 1 = units - 1 degrees of freedom); below, over batches."""
    ratios = [1.1, 0.9, 1.3, 1.2, 0.8, 1.0, 1.05, 0.95, 1.15, 1.25, 0.85]
    units = [0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4]  # A triple, then pairs: 11 batches, 5 units.
    est = paired.ratio_interval(ratios, units)
    means = [np.mean(np.log(ratios[:3]))] + [np.mean(np.log(ratios[k:k + 2]))
                                             for k in range(3, 11, 2)]  # fmt: skip
    half = stats.t.ppf(0.975, 4) * np.std(means, ddof=1) / math.sqrt(5)
    assert est['n'] == 11 and est['n_units'] == 5
    assert est['mean'] == pytest.approx(math.exp(np.mean(means)))
    assert (est['lo'], est['hi']) == pytest.approx((math.exp(np.mean(means) - half),
                                                    math.exp(np.mean(means) + half)))  # fmt: skip
    few = paired.ratio_interval(ratios[:7], units[:7])  # 3 units: over the 7 batches.
    assert few['n_units'] is None and few['lo'] is not None
    assert paired.ratio_interval(ratios, [None] * 11)['n_units'] is None  # Older records.
