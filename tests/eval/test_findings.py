"""The findings a run prints: each verdict comes from the test printed beside it, from
verdicts.MIN_ITEMS items on, Holm-adjusted over the run's family (whose size it states); a
trend is judged by the slope of per-item linearised values, "rises" only when the printed
values rise too, and a slope not judged is not read as no trend; the ΔBE interval covers its
truth at the main job's n (simulated), and its direction, judged beyond a margin, does not
point the wrong way on skewed nulls; the engine rules' flattery is in the Holm family; no
line of a report built from adversarial rows prints a verdict its own numbers contradict;
the claims the run cannot test are named with the number that decides it."""

import re

import numpy as np
import pytest
from scipy import stats

from spec_jax.eval import engine_rules, findings
from spec_jax.eval.stats import paired, verdicts

MAIN_JOB_N = 30  # The main job's speed sets: 3 x 10 prompts, ΔBE paired over all 30.


def lossy(rule, name, value, **fields):
    row = dict(task='speed', kind='lossy', rule=rule, param=value, param_name=name,
               method=f'{rule}:{name}={value}', pairs=['lossless'], scored=False,
               pair_n=30, pair_n_items=30)  # fmt: skip
    return dict(row, **fields)


LOSSLESS = dict(task='speed', kind='lossless', method='lossless', scored=False,
                block_efficiency=1.4, speedup=1.1, speedup_lo=1.06, speedup_hi=1.14,
                speedup_n_batches=6)  # fmt: skip


def test_verdicts_are_holm_adjusted_over_the_family_and_need_n():
    rows = [
        LOSSLESS,
        lossy('cos', 'lam', 0.2, d_be=0.02, d_be_lo=-0.01, d_be_hi=0.05, tv=0.01),
        # Excludes 0 (p ~0.04) but not the margin 0.1: no direction.
        lossy('cos', 'lam', 0.4, d_be=0.05, d_be_lo=0.002, d_be_hi=0.098, tv=0.03),
        # Clears the margin unadjusted (p ~0.03 against 0.1), not after Holm.
        lossy('cos', 'lam', 0.6, d_be=0.15, d_be_lo=0.105, d_be_hi=0.195, tv=0.06,
              overshoot_max=40.0),
        lossy('cos', 'lam', 0.8, d_be=0.4, d_be_lo=0.3, d_be_hi=0.5, tv=0.08),
        lossy('lenience', 'l', 0.5, d_be=0.1, d_be_lo=0.05, d_be_hi=0.15, tv=0.02,
              pair_n=6, pair_n_items=6, overshoot_max=2.5),
        lossy('lenience', 'l', 0.8, d_be=0.05, tv=0.01, overshoot_max=1.5),  # Over 1/0.8.
        lossy('minp_verify', 'rho', 0.3, pair_n=0, pair_n_items=0, tv=0.2, outside=0.1),
    ]
    fam = findings.family(rows)
    said = fam.verdicts
    assert said[('speed', 'lossless', 'speedup')] == 'above 1'
    assert said[('speed', 'cos:lam=0.2', 'd_be')] == 'not shown beyond 0 ± 0.1'
    assert verdicts.judge_interval(0.002, 0.098, 30) == 'above 0'  # Against 0 it would pass.
    assert said[('speed', 'cos:lam=0.4', 'd_be')] == 'not shown beyond 0 ± 0.1'
    assert fam.tests[3].p < 0.05 < fam.adjusted[('speed', 'cos:lam=0.6', 'd_be')]
    assert said[('speed', 'cos:lam=0.6', 'd_be')] == 'not shown beyond 0 ± 0.1'
    assert said[('speed', 'cos:lam=0.8', 'd_be')] == 'above +0.1'
    assert said[('speed', 'lenience:l=0.5', 'd_be')] == verdicts.TOO_FEW
    assert said[('speed', 'lenience:l=0.8', 'd_be')] == verdicts.NO_TEST
    assert len(fam.tests) == 7 and fam.judged == 5
    text = findings.text(rows, 'chain')
    assert '7 comparisons, 5 judged' in text and 'Holm-adjusted over the 5 judged' in text
    assert 'speedup 1.10 [1.06, 1.14]x over AR end to end (6 batches) (above 1; Holm p' in text
    assert 'lenience l 0.5: ΔBE +0.100 [+0.050, +0.150] (n 6 items) (too few items' in text
    assert 'cos lam 0.4: ΔBE +0.050 [+0.002, +0.098] (n 30 items) (not shown beyond' in text
    assert '1.5 (ceiling 1.25): NOT under its ceiling 1/l' in text
    assert 'minp_verify rho 0.3: no samples shared with lossless (a partial run): TV 0.200' in text


def _family_with_items(noise, seed=0):
    """Three cos grid points whose per-item ΔBE rises by 0.1 a step, plus noise per item."""
    rng = np.random.default_rng(seed)
    base = rng.normal(0.2, 0.3, MAIN_JOB_N)
    rows = []
    for k, lam in enumerate((0.2, 0.4, 0.6)):
        d_be = {f'i{i}': float(base[i] + 0.1 * k + rng.normal(0, noise))
                for i in range(MAIN_JOB_N)}  # fmt: skip
        tv = {f'i{i}': 0.05 + float(rng.normal(0, 0.01)) for i in range(MAIN_JOB_N)}
        rows.append(lossy('cos', 'lam', lam, d_be=float(np.mean(list(d_be.values()))),
                          tv=0.05, items=dict(d_be=d_be, tv=tv)))  # fmt: skip
    return rows


def test_a_trend_is_judged_by_its_slope_and_worded_by_what_is_printed():
    clear = '\n'.join(findings.findings(_family_with_items(noise=0.02)))
    assert 'ΔBE rises (slope +0.48 [+0.453, +0.507] per unit' in clear and 'n 30 items' in clear
    assert 'TV no slope shown (not a finding of no trend)' in clear
    noisy = '\n'.join(findings.findings(_family_with_items(noise=1.0, seed=3)))
    assert 'ΔBE no slope shown' in noisy and 'cannot be ordered' not in noisy
    # A slope judged positive over printed values that dip (+0.30, +0.20, +0.50): not "rises".
    rows = _family_with_items(noise=0.02)
    for r, shift in zip(rows, (0.1, -0.1, 0.1)):
        r['items']['d_be'] = {i: v + shift for i, v in r['items']['d_be'].items()}
        r['d_be'] = float(np.mean(list(r['items']['d_be'].values())))
    dip = '\n'.join(findings.findings(rows))
    assert 'ΔBE has a positive slope (the printed values do not rise at every step)' in dip


def test_trend_values_are_the_linearised_values_of_what_is_printed():
    """paired.item_values' per-item values average to the printed pooled ratio (and Δ), so
    the slope over the grid is the slope of the printed sequence."""
    rng = np.random.default_rng(2)
    blocks, emitted = rng.integers(5, 40, 12), rng.integers(10, 90, 12)
    base = rng.integers(5, 60, 12)
    rows = [dict(item=str(i), seed=0, stats=dict(blocks=int(b), emitted=int(e)))
            for i, (b, e) in enumerate(zip(blocks, emitted))]  # fmt: skip
    ref = [dict(item=str(i), seed=0, stats=dict(blocks=int(b), emitted=int(e)))
           for i, (b, e) in enumerate(zip(blocks, base))]  # fmt: skip
    values = paired.item_values(rows, 'emitted', 'blocks', ref)
    d_be = (emitted.sum() - base.sum()) / blocks.sum()
    assert np.mean(list(values.values())) == pytest.approx(d_be)
    own = paired.item_values(rows, 'emitted', 'blocks')
    assert np.mean(list(own.values())) == pytest.approx(emitted.sum() / blocks.sum())


def _draw_be(rng, n, rounds=25, gamma=3):
    """n prompts: 4-25 verification rounds each, an acceptance rate per prompt (Beta(2, 3))
    for the baseline and that plus U(0, 0.3) for the method; tokens a round: 1 + the drafts
    accepted before the first rejection (of gamma). Returns (blocks, emitted, emitted_base)."""
    k = rng.integers(4, rounds + 1, n)
    alpha = rng.beta(2, 3, n)
    lifted = np.minimum(alpha + rng.uniform(0, 0.3, n), 0.98)

    def emitted(a):
        run = np.cumprod(rng.random((n, rounds, gamma)) < a[:, None, None], -1).sum(-1) + 1
        return (run * (np.arange(rounds)[None] < k[:, None])).sum(1)

    return k, emitted(lifted), emitted(alpha)


@pytest.fixture(scope='module')
def be_truth():
    """The population ΔBE of `_draw_be` (ratio of sums over 100000 prompts; its own error
    ~0.001, against interval half-widths of 0.1-0.2)."""
    k, a, c = _draw_be(np.random.default_rng(0), 100_000)
    return (a.sum() - c.sum()) / k.sum()


@pytest.mark.parametrize('n', [verdicts.MIN_ITEMS, MAIN_JOB_N])
def test_the_be_interval_covers_its_truth_at_the_runs_n(n, be_truth):
    """paired.ratio_delta's 95% ΔBE interval over 400 simulated runs covers the population
    ΔBE (`be_truth`) at least 92% of the time. Bound: at a true 95% the count
    falls under 92% with probability ~0.3% (sd 1.1 points); the percentile bootstrap it
    replaces (87% at n 6) or a z interval at n 10 (~91%) would fail. Measured: 94.7% at
    n 10, 94.9% at n 30 (1000 runs)."""
    rng = np.random.default_rng(1)
    stat = lambda name: lambda r: float(r['stats'][name])  # noqa: E731
    covered = 0
    for _ in range(400):
        k, a, c = _draw_be(rng, n)
        pairs = {(str(i), 0): (dict(stats=dict(e=a[i], b=k[i])), dict(stats=dict(e=c[i], b=k[i])))
                 for i in range(n)}  # fmt: skip
        _, lo, hi, _ = paired.ratio_delta(pairs, stat('e'), stat('b'))
        covered += lo <= be_truth <= hi
    assert covered / 400 >= 0.92


def test_claims_out_of_reach_are_named_with_their_numbers():
    ar = dict(task='mbpp', kind='ar', method='ar', scored=True, score=0.1, score_lo=0.028,
              score_hi=0.302, n_samples=20)  # fmt: skip
    wide = findings.untestable([ar], 'chain')
    assert any('±13.7 points' in line and 'near floor' in line for line in wide)
    assert any('tree verification' in line for line in wide)
    narrow = dict(ar, score=0.5, score_lo=0.495, score_hi=0.505)
    assert not any('task-score gaps' in line for line in findings.untestable([narrow], 'tree'))
    assert not any('tree verification' in line for line in findings.untestable([narrow], 'tree'))
    assert any('no scored task' in line for line in findings.untestable([], 'chain'))
    six = dict(lossy('cos', 'lam', 0.4, pair_n=6, pair_n_items=6), task='mbpp', scored=True)
    (line,) = [x for x in findings.untestable([ar, six], 'chain') if 'score verdicts' in x]
    assert line.startswith('score verdicts on mbpp: 6 paired items, fewer than the 10')


def test_the_flattery_is_judged_in_the_run_family():
    """The flattery of a rule matched with a truncated target joins the findings' Holm
    family (its lines print the family's verdict and Holm p); the report's engine section
    prints the numbers without verdict words; below MIN_ITEMS items it is not judged."""
    row = lossy('mars', 'theta', 0.8, method='mars:theta=0.8', pairs=['baseline[mars=0.8]'],
                d_be=0.1, d_be_lo=0.05, d_be_hi=0.15, sd_d_be=0.4, sd_d_be_lo=0.3,
                sd_d_be_hi=0.5, flattery_be=0.3, flattery_be_lo=0.2, flattery_be_hi=0.4,
                speedup_vs_matched=1.1, speedup_vs_matched_lo=1.0, speedup_vs_matched_hi=1.2,
                speedup_vs_matched_n_batches=5, flattery_speedup=1.3, flattery_speedup_lo=1.2,
                flattery_speedup_hi=1.4)  # fmt: skip
    fam = findings.family([LOSSLESS, row])
    assert fam.verdicts[('speed', 'mars:theta=0.8', 'flattery_be')] == 'above 0'
    assert fam.verdicts[('speed', 'mars:theta=0.8', 'flattery_speedup')] == 'above 1'
    (line,) = engine_rules.finding_lines('speed', [row], fam)
    assert re.search(r'BE \(flatters it; Holm p [0-9.e-]+\) and x1.30 \[1.20, 1.40\] speed '
                     r'\(flatters it; Holm p', line), line
    (bare,) = engine_rules.finding_lines('speed', [row])
    assert 'flatters' not in bare and 'Holm' not in bare
    few = findings.family([dict(row, pair_n_items=4, pair_n=4)])
    assert few.verdicts[('speed', 'mars:theta=0.8', 'flattery_be')] == verdicts.TOO_FEW


# The skewed nulls of issue 45, with population ΔBE 0 (the rest lose frac x gain / (1 -
# frac)), and with the issue's own rest values (-0.038, -0.02: population ΔBE +0.016 and
# +0.011, so "below" is the wrong way there).
SKEWED = {'10% +0.5, rest -0.0556': (0.1, 0.5, 0.5 * 0.1 / 0.9),
          '5% +0.6, rest -0.0316': (0.05, 0.6, 0.6 * 0.05 / 0.95),
          '10% +0.5, rest -0.038': (0.1, 0.5, 0.038), '5% +0.6, rest -0.02': (0.05, 0.6, 0.02)}


def _skewed_runs(rng, runs, n, frac, gain, rest, sigma=0.05):
    """[runs, n] blocks and emitted of the method and the baseline: 4-25 blocks a prompt, a
    baseline BE uniform in [1.5, 3.5], the method's that plus gain (with probability
    frac) or minus rest, plus N(0, sigma) per prompt."""
    k = rng.integers(4, 26, (runs, n)).astype(float)
    be = rng.uniform(1.5, 3.5, (runs, n))
    delta = np.where(rng.random((runs, n)) < frac, gain, -rest) + rng.normal(0, sigma, (runs, n))
    return k, (be + delta) * k, be * k


def _be_verdicts(k, a, c):
    """(below, above) per run as findings judge ΔBE alone (one test: Holm is the test):
    `paired.ratio_delta`'s t-interval, a direction only beyond verdicts.MARGIN_BE."""
    n = k.shape[1]
    big_k, big_a, big_c = k.sum(1, keepdims=True), a.sum(1, keepdims=True), c.sum(1, keepdims=True)
    lin = (big_a - big_c) / big_k + n * ((a - big_a / big_k * k) - (c - big_c / big_k * k)) / big_k
    half = stats.t.ppf(0.975, n - 1) * lin.std(1, ddof=1) / np.sqrt(n)
    m = lin.mean(1)
    return m + half < -verdicts.MARGIN_BE, m - half > verdicts.MARGIN_BE, (m, m - half, m + half)


def test_the_vectorised_be_verdict_is_the_findings_one():
    rng = np.random.default_rng(7)
    k, a, c = _skewed_runs(rng, 40, 16, 0.1, 0.5, 0.2)
    below, above, (m, lo, hi) = _be_verdicts(k, a, c)
    stat = lambda name: lambda r: float(r['stats'][name])  # noqa: E731
    for run in range(40):
        pairs = {(str(i), 0): (dict(stats=dict(e=a[run, i], b=k[run, i])),
                               dict(stats=dict(e=c[run, i], b=k[run, i]))) for i in range(16)}
        d, d_lo, d_hi, _ = paired.ratio_delta(pairs, stat('e'), stat('b'))
        assert (d, d_lo, d_hi) == pytest.approx((m[run], lo[run], hi[run]), abs=1e-9)
        test = verdicts.margin_test('k', d, d_lo, d_hi, 16, verdicts.MARGIN_BE)
        said = verdicts.verdict(test)
        assert said.startswith('below') == below[run] and said.startswith('above') == above[run]


@pytest.mark.parametrize('n', [10, 16, 30])
def test_be_directions_hold_their_error_on_skewed_nulls_and_keep_power(n):
    """On each skewed null (SKEWED) a directional ΔBE verdict in at most 5% of 4,000 runs
    per side (the issue's bound; binomial sd at 5%: 0.34 points). Measured: none, on every
    null and n but 0.03% at n 10 (a t-test against 0 says "below" in 7-30% of these runs,
    docs/eval.md). The power kept on ordinary laws
    (per-prompt Δ normal, sd 0.3), beyond the margin / against 0: ΔBE +0.2: 15/43% (n 10),
    23/66% (16), 38/91% (30); +0.3: 44/75%, 63/92%, 90/100%; +0.5: 94/99%, 99/100%, 100%.
    Asserted: at least 90% at +0.5 (n >= 10), 85% at +0.3 (n 30)."""
    rng = np.random.default_rng(45)
    for name, law in SKEWED.items():
        below, above, (_, lo, hi) = _be_verdicts(*_skewed_runs(rng, 4000, n, *law))
        print(f'n {n} {name}: below {below.mean():.4f}, above {above.mean():.4f} (a t-test '
              f'against 0: below {(hi < 0).mean():.3f}, above {(lo > 0).mean():.3f})')
        assert below.mean() <= 0.05 and above.mean() <= 0.05
    for mu in (0.2, 0.3, 0.5):
        k, a, c = _skewed_runs(rng, 4000, n, 0.0, 0.0, -mu, sigma=0.3)
        _, above, (m, lo, _) = _be_verdicts(k, a, c)
        print(f'n {n} ΔBE {mu:+.1f}: power {above.mean():.3f} beyond the margin, '
              f'{(lo > 0).mean():.3f} against 0')
        if mu == 0.5 or (mu == 0.3 and n == 30):
            assert above.mean() >= (0.9 if mu == 0.5 else 0.85)


NUMBER = r'[+-]?\d+(?:\.\d+)?(?:e[+-]?\d+)?'
INTERVAL = re.compile(rf'(x?)({NUMBER}) \[({NUMBER}), ({NUMBER})\]')
DIRECTION = re.compile(rf'\((above|below) ({NUMBER})|\((flatters it|understates it)')
QUIET = re.compile(r'\((not distinguishable|not shown beyond)')
HOLM = re.compile(rf'Holm p ({NUMBER})')


def contradictions(line: str) -> list[str]:
    """What in one printed line contradicts its own verdicts: a direction whose interval
    (the nearest printed before it) does not clear its reference or whose Holm p is not
    under 0.05; a non-direction beside a Holm p under 0.05 and an interval that clears it
    (without saying the two disagree); a test's p without its Holm p; "rises" / "falls"
    over printed values that do not."""
    out = []
    marks = list(INTERVAL.finditer(line))
    quiet_line = re.search(r'score gaps against the matched baselines, not', line)
    for k, mark in enumerate(marks):
        seg = line[mark.end(): marks[k + 1].start() if k + 1 < len(marks) else len(line)]
        lo, hi = float(mark.group(3)), float(mark.group(4))
        holm = [float(p) for p in HOLM.findall(seg)]
        ref = 1.0 if mark.group(1) or seg.startswith('x') else 0.0
        d = DIRECTION.search(seg)
        if re.search(r'(McNemar|\bt) p ', seg) and 'too few' not in line and not holm:
            out.append(f'a p without its Holm p: {seg}')
        if d:
            words, at = d.group(1) or d.group(3), d.group(2)
            bound = float(at) if at is not None else ref
            up = words in ('above', 'flatters it')
            if not (lo > bound if up else hi < bound):
                out.append(f'{words} {bound} beside [{lo}, {hi}]')
            if not holm or holm[0] >= verdicts.ALPHA:
                out.append(f'{words} without a Holm p under 0.05: {seg}')
        elif (QUIET.search(seg) or quiet_line) and holm and holm[0] < verdicts.ALPHA:
            margin = verdicts.MARGIN_BE if 'not shown beyond' in seg else 0.0
            if (lo > ref + margin or hi < ref - margin) and 'interval holds' not in seg:
                out.append(f'not judged with Holm p {holm[0]} and [{lo}, {hi}]')
    for values, name, verb in re.findall(r'(?:TV|ΔBE) \(([^)]*)\): (TV|ΔBE) (rises|falls)', line):
        seq = [float(v) for v in values.split(', ')]
        if any((b < a) if verb == 'rises' else (b > a) for a, b in zip(seq, seq[1:])):
            out.append(f'{name} {verb} over {seq}')
    return out


def _adversarial_rows():
    """Rows built to trap a careless report: score gaps whose McNemar p and interval
    disagree, or that clear 0 only before Holm; ΔBEs inside the margin with intervals that
    exclude 0, beyond it, or below it; a ΔBE grid with a judged slope and a dip; a flattery
    that clears 0 only unadjusted; speedups near 1."""
    rows = [dict(LOSSLESS, speedup=1.03, speedup_lo=1.001, speedup_hi=1.06, speedup_n_batches=5)]
    rng = np.random.default_rng(4)
    for k, (lam, d_be) in enumerate(((0.2, 0.3), (0.4, 0.2), (0.6, 0.5))):
        items = {f'i{i}': d_be + float(rng.normal(0, 0.05)) + 0.05 * k for i in range(30)}
        rows.append(lossy('cos', 'lam', lam, d_be=d_be, d_be_lo=d_be - 0.04,
                          d_be_hi=d_be + 0.04, tv=0.01 * (k + 1),
                          items=dict(d_be=items, tv={i: 0.01 * (k + 1) for i in items}),
                          d_be_spread=dict(gain=28, lose=2, tie=0, share=0.05)))  # fmt: skip
    rows.append(lossy('lenience', 'l', 0.5, d_be=0.05, d_be_lo=0.01, d_be_hi=0.09, tv=0.02))
    rows.append(lossy('lenience', 'l', 0.7, d_be=-0.3, d_be_lo=-0.4, d_be_hi=-0.2, tv=0.02))
    rows.append(lossy('mars', 'theta', 0.8, method='mars:theta=0.8', pairs=['b[mars]'],
                      d_be=0.02, d_be_lo=-0.1, d_be_hi=0.14, sd_d_be=0.1, sd_d_be_lo=0.0,
                      sd_d_be_hi=0.2, flattery_be=0.08, flattery_be_lo=0.001,
                      flattery_be_hi=0.159, flattery_speedup=1.02, flattery_speedup_lo=0.99,
                      flattery_speedup_hi=1.05, speedup_vs_matched=1.0,
                      speedup_vs_matched_lo=0.95, speedup_vs_matched_hi=1.05,
                      speedup_vs_matched_n_batches=5))  # fmt: skip
    for method, (wins, losses, n) in {'cos:lam=0.2': (0, 6, 100), 'cos:lam=0.4': (0, 5, 10),
                                      'cos:lam=0.6': (1, 8, 378), 'lenience:l=0.5': (0, 12, 100),
                                      'lenience:l=0.7': (9, 0, 30)}.items():  # fmt: skip
        pairs = {(f'i{i}', 0): (dict(correct=i < wins), dict(correct=wins <= i < wins + losses))
                 for i in range(n)}  # fmt: skip
        row = next(r for r in rows if r['method'] == method)
        rows.append(dict(row, task='mbpp', scored=True, pair_n=n, pair_n_items=n,
                         **paired.score_delta(pairs)))  # fmt: skip
    return rows


def test_no_line_prints_a_verdict_its_own_numbers_contradict():
    """Over the findings of adversarial rows (and the report's engine section), no line
    contradicts itself (`contradictions`); the checker itself catches each kind of
    contradiction on constructed lines."""
    rows = _adversarial_rows()
    lines = findings.text(rows, 'chain').splitlines() + engine_rules.section(rows)
    assert any('score gap' in x for x in lines) and any('rises' in x or 'slope' in x
                                                        for x in lines)  # fmt: skip
    bad = {line: c for line in lines if (c := contradictions(line))}
    assert not bad, bad
    assert contradictions('g: a: ΔBE +0.05 [+0.01, +0.09] (n 30 items) (above +0.1; Holm p 0.01)')
    assert contradictions('g: a: ΔBE +0.50 [+0.30, +0.70] (n 30 items) (above +0.1; Holm p 0.2)')
    assert contradictions('mbpp: score gaps against the matched baselines, not distinguishable '
                          'from 0: a -7.0 [-8.9, -0.3] points (n 100, McNemar p 0.0391)')
    assert contradictions('g: cos over lam = 1, 2, 3: ΔBE (+0.558, +0.300, +0.042): ΔBE rises')
    assert contradictions('g: x adds +0.08 [-0.01, +0.16] BE (flatters it; Holm p 0.01)')
