"""Verdicts a referee would sign: every "above / below / not distinguishable" a report prints
comes from the test printed beside it, from a minimum n on, under one multiplicity control
over the run's family of verdicts (docs/eval.md).

    tests = [verdicts.mcnemar_test(('mbpp', m), wins, losses, n_items),
             verdicts.t_test(('speed', m, 'be'), d, lo, hi, n_items),
             verdicts.t_test(('speed', m, 'speedup'), s, lo, hi, n_batches, ref=1.0, log=True)]
    family = verdicts.judge(tests)       # Holm over the tests that are judged
    family.verdicts[('mbpp', m)]         # 'below 0', 'not distinguishable from 0', ...
    family.note()                        # 'Verdicts: 3 comparisons, Holm ...'

The tests:
  0/1 score gaps (one seed)  McNemar's exact test: the two-sided binomial test of the
        discordant pairs at 1/2 (`mcnemar_p`), beside Tango's unconditional score interval
        of the gap (`score_gap_interval`); a direction needs both (`verdict`).
  ΔBE  a t-interval of the linearised ratio of sums, judged beyond a margin (`margin_test`,
        MARGIN_BE): a mean over few prompts where a few gain much and the rest lose a
        little points the wrong way under a test against 0 (docs/eval.md).
  continuous Δs and log ratios  a t-interval at n - 1 degrees of freedom (paired.py:
        per-item Δs, the linearised ratio of sums, log batch ratios); its p-value is read
        back from the interval (`t_p_value`), so the two agree to rounding. Coverage at the
        run's n is checked by simulation (tests/eval/test_findings.py).
  trends  the slope of per-item Δs over the grid (`slope_test`), a t-interval over items.

Multiplicity: Holm's step-down adjustment (family-wise error at ALPHA under any dependence:
the verdicts of a run share items and batches, so Benjamini-Hochberg's independence or
positive-dependence assumption is not one we can check) over every test of the family that
is judged (n at least its minimum and a p-value). Intervals are printed unadjusted (95%);
a verdict is "above"/"below" only when its Holm-adjusted p is under ALPHA, so an interval
that just excludes 0 may still read "not distinguishable" in a large family: the report
says how many comparisons it made.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np
from scipy import stats

ALPHA = 0.05
# The fewest items (or batches) a verdict is drawn from. Below 10, (a) a t-interval of a
# skewed per-item Δ (BE, TV: ratios of sums over prompts of different lengths) covers less
# than its nominal 95% (simulated: tests/eval/test_findings.py, docs/eval.md), and the
# percentile bootstrap the report used before covered 87% at 6 items; (b) an exact 0/1 test
# can only reach p < 0.05 when 2**(1 - n) < 0.05, i.e. 6 items all discordant one way, and
# under Holm over a family of tens of verdicts not before 10. One threshold for every Δ,
# so that "too few items to judge" means the same thing in every row.
MIN_ITEMS = 10
# Speed ratios are judged per batch: a t-interval on log ratios from 5 batches on
# (paired.py reads it); their noise is close to lognormal, where t covers at small n.
MIN_BATCHES = 5
# ΔBE directions are claimed only beyond +-MARGIN_BE tokens per target forward: against 0,
# the skewed nulls of issue 45 (10% of prompts +0.5, the rest -0.056 or -0.038; 5% +0.6,
# the rest -0.032 or -0.02) read "below 0" in 7-30% of runs at n 10-30 (a sample without
# one of the few gainers looks like a uniform loss); beyond 0.1 in at most 0.03% of 4,000
# per null and n (tests/eval/test_findings.py, docs/eval.md with the power this keeps).
MARGIN_BE = 0.1
TOO_FEW = 'too few items to judge'
NO_TEST = 'no interval'
METHOD = 'Holm'


@dataclass(frozen=True)
class Test:
    """One comparison of a family.

    Attributes:
      key: what the verdict is looked up by.
      estimate: the point estimate (on the scale of `ref`).
      p: the unadjusted two-sided p-value against `ref` (None: no test possible).
      n: the items (or batches) it rests on.
      ref: the value it is judged against (0 for Δs, 1 for ratios).
      min_n: the fewest n it is judged from (MIN_ITEMS or MIN_BATCHES).
      unit: 'items' or 'batches', for the "too few" text.
      lo, hi: its 95% interval where the test has one (None otherwise).
      margin: a direction is claimed only beyond ref +- margin (`margin_test`; 0: beyond
        ref).
    """

    key: Hashable
    estimate: float | None
    p: float | None
    n: int
    ref: float = 0.0
    min_n: int = MIN_ITEMS
    unit: str = 'items'
    lo: float | None = None
    hi: float | None = None
    margin: float = 0.0

    @property
    def judged(self) -> bool:
        return self.p is not None and self.estimate is not None and self.n >= self.min_n


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given (each min(1, running max of
    (m - rank) * p) over the p-values sorted ascending)."""
    m = len(ps)
    order = sorted(range(m), key=lambda i: ps[i])
    out = [1.0] * m
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * ps[i]))
        out[i] = running
    return out


def mcnemar_p(wins: int, losses: int) -> float:
    """McNemar's exact two-sided p-value: the binomial test of `wins` of the discordant
    pairs at 1/2 (1.0 with none)."""
    if wins < 0 or losses < 0:
        raise ValueError(f'wins and losses must be >= 0, got {wins}, {losses}')
    if not wins + losses:
        return 1.0
    return float(stats.binomtest(int(wins), int(wins + losses), 0.5).pvalue)


def _tango_z(wins, losses, n: int, d):
    """Tango's score statistic for the paired difference d = p(win) - p(loss), at the
    restricted maximum-likelihood p(loss) (the root of 2n p^2 - B p - losses d (1 - d)),
    with a half-unit continuity correction on the numerator (arrays broadcast)."""
    big_b = wins + losses + (wins - losses - 2 * n) * d
    p_loss = (big_b + np.sqrt(np.maximum(big_b**2 + 8 * n * losses * d * (1 - d), 0))) / (4 * n)
    var = n * np.maximum(2 * p_loss + d - d * d, 0.0)
    num = wins - losses - n * d
    num = np.sign(num) * np.maximum(np.abs(num) - 0.5, 0.0)
    with np.errstate(divide='ignore', invalid='ignore'):
        return np.where(var > 0, num / np.sqrt(var), np.where(num == 0, 0.0, np.sign(num) * np.inf))


def score_gap_interval(wins, losses, n: int, level: float = 0.95):
    """The 95% interval of a paired 0/1 score gap (wins - losses) / n over n items: Tango's
    unconditional score interval (Tango 1998, Stat Med 17:891) with a half-unit continuity
    correction, by bisection on its statistic (60 halvings: exact to 1e-18). Unconditional:
    it does not condition on the discordant count, unlike the Clopper-Pearson interval of
    the wins' share carried to the gap (which covered 0.34-0.80 on small one-sided
    effects). Exact coverage at least 0.95 on the grid p(win), p(loss) in {0, .01, .03, .05,
    .1, .15, .2, .3} at n 30, 100, 378 (tests/eval/test_paired.py enumerates it); without
    the correction 0.930 at n 30, and Agresti-Min's 0.890 at n 378. `wins` and `losses`
    may be arrays (one interval per element).

    Raises:
      ValueError: counts below 0 or above n.
    """
    w, lo_ = np.asarray(wins, float), np.asarray(losses, float)
    if n < 1 or (w < 0).any() or (lo_ < 0).any() or (w + lo_ > n).any():
        raise ValueError(f'need 0 <= wins + losses <= n and n >= 1, got {wins}, {losses}, {n}')
    z = float(stats.norm.ppf(0.5 + level / 2.0))
    est = (w - lo_) / n
    a, b = np.full_like(est, -1.0), est.copy()  # Lower end in (a, b]: a outside, b inside.
    c, d = est.copy(), np.full_like(est, 1.0)  # Upper end in [c, d): c inside, d outside.
    for _ in range(60):
        m = (a + b) / 2
        out = _tango_z(w, lo_, n, m) > z
        a, b = np.where(out, m, a), np.where(out, b, m)
        m = (c + d) / 2
        out = _tango_z(w, lo_, n, m) < -z
        c, d = np.where(out, c, m), np.where(out, m, d)
    if np.ndim(wins) == 0 and np.ndim(losses) == 0:
        return float(b), float(c)
    return b, c


def t_p_value(
    estimate: float, lo: float, hi: float, n: int, ref: float = 0.0, level: float = 0.95
) -> float | None:
    """The two-sided p-value against `ref` of a symmetric t-interval [lo, hi] around
    `estimate` at n - 1 degrees of freedom (None without one). Exactly below ALPHA when
    the 1 - ALPHA interval excludes `ref`."""
    if n < 2 or not all(map(math.isfinite, (estimate, lo, hi))):
        return None
    half = (hi - lo) / 2.0
    if half <= 0:
        return 0.0 if estimate != ref else 1.0
    se = half / float(stats.t.ppf(0.5 + level / 2.0, n - 1))
    return float(2.0 * stats.t.sf(abs(estimate - ref) / se, n - 1))


def t_test(
    key: Hashable, estimate: float | None, lo: float | None, hi: float | None, n: int | None,
    ref: float = 0.0, log: bool = False, min_n: int = MIN_ITEMS, unit: str = 'items',
) -> Test:  # fmt: skip
    """A Test from a t-interval: on the log scale when `log` (a ratio judged against 1)."""
    n = int(n or 0)
    vals = (estimate, lo, hi)
    p = None
    if all(isinstance(v, (int, float)) for v in vals):
        if log and all(v > 0 for v in vals) and ref > 0:
            p = t_p_value(*(math.log(v) for v in vals), n, math.log(ref))
        elif not log:
            p = t_p_value(estimate, lo, hi, n, ref)
    return Test(key, estimate, p, n, ref, min_n, unit, lo, hi)


def mcnemar_test(key: Hashable, wins: int, losses: int, n: int) -> Test:
    """A Test of a 0/1 score gap over n items by McNemar's exact test, with the score
    interval of the gap (`score_gap_interval`)."""
    if not n:
        return Test(key, None, None, 0)
    lo, hi = score_gap_interval(wins, losses, n)
    return Test(key, (wins - losses) / n, mcnemar_p(wins, losses), n, lo=lo, hi=hi)


def margin_test(
    key: Hashable, estimate: float | None, lo: float | None, hi: float | None, n: int | None,
    margin: float,
) -> Test:  # fmt: skip
    """A Test of whether a Δ lies beyond +-`margin` (H0: |Δ| <= margin), from its t-interval:
    the p-value against the margin on the estimate's side (1 inside the margin). Its
    verdict reads 'above +m' / 'below -m' / 'not shown beyond +-m'."""
    n = int(n or 0)
    vals = (estimate, lo, hi)
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in vals):
        return Test(key, estimate, None, n, margin=margin, lo=lo, hi=hi)
    ref = margin if estimate > 0 else -margin
    p = t_p_value(estimate, lo, hi, n, ref) if abs(estimate) > margin else 1.0
    return Test(key, estimate, p, n, margin=margin, lo=lo, hi=hi)


def slope_test(key: Hashable, xs: Sequence[float], ys_by_item: np.ndarray) -> Test:
    """Whether per-item values rise or fall over a grid: each item's least-squares slope
    over `xs`, a t-test over items of the mean slope (items x points; rows with a NaN are
    left out). Estimate: the mean slope per unit of x, with its 95% t-interval."""
    y = np.asarray(ys_by_item, float)
    x = np.asarray(xs, float)
    if y.ndim != 2 or y.shape[1] != len(x) or len(x) < 2:
        raise ValueError(f'need items x {len(x)} values with 2+ grid points, got {y.shape}')
    y = y[np.isfinite(y).all(1)]
    xc = x - x.mean()
    slopes = (y - y.mean(1, keepdims=True)) @ xc / float(xc @ xc)
    n = len(slopes)
    if n < 2:
        return Test(key, float(slopes.mean()) if n else None, None, n)
    mean, sd = float(slopes.mean()), float(slopes.std(ddof=1))
    tiny = 1e-9 * max(float(np.abs(y).max()), 1e-300) / max(float(np.abs(xc).max()), 1e-300)
    if sd <= tiny:  # Every item's slope the same (rounding aside): exact, p 0 or 1.
        mean = 0.0 if abs(mean) <= tiny else mean
        return Test(key, mean, 0.0 if mean else 1.0, n, lo=mean, hi=mean)
    se = sd / math.sqrt(n)
    half = float(stats.t.ppf(0.975, n - 1)) * se
    p = float(2 * stats.t.sf(abs(mean) / se, n - 1))
    return Test(key, mean, p, n, lo=mean - half, hi=mean + half)


def verdict(test: Test, p_adjusted: float | None = None) -> str:
    """'above 0' / 'below 0' / 'not distinguishable from 0' (adjusted p against ALPHA; the
    unadjusted p when none is given), or TOO_FEW / NO_TEST. A direction needs its printed
    interval (where it has one) to clear the reference (or the margin) on that side too,
    so no line reads "below 0" beside an interval that holds 0. With a margin m: 'above
    +m' / 'below -m' / 'not shown beyond +-m'. Non-rejection never reads as equality."""
    if test.n < test.min_n:
        return TOO_FEW if test.unit == 'items' else f'too few {test.unit} to judge'
    if test.p is None or test.estimate is None:
        return NO_TEST
    p = test.p if p_adjusted is None else p_adjusted
    up = test.estimate > test.ref
    bound = test.ref + (test.margin if up else -test.margin)
    clears = test.lo is None or test.hi is None or (test.lo > bound if up else test.hi < bound)
    if p < ALPHA and test.estimate != test.ref and clears:
        if test.margin:
            return f'{"above" if up else "below"} {bound:+g}'
        return f'{"above" if up else "below"} {test.ref:g}'
    split = f' (p under {ALPHA:g} but the interval holds it)' if p < ALPHA else ''
    if test.margin:
        return f'not shown beyond {test.ref:g} ± {test.margin:g}{split}'
    return f'not distinguishable from {test.ref:g}{split}'


def judge_interval(
    lo: float | None, hi: float | None, n: int | None, ref: float = 0.0,
    min_n: int = MIN_ITEMS, unit: str = 'items',
) -> str:  # fmt: skip
    """One interval's verdict against `ref`, unadjusted: TOO_FEW below `min_n`, NO_TEST
    without an interval, else above / below / not distinguishable."""
    if int(n or 0) < min_n:
        return verdict(Test(None, 0.0, None, int(n or 0), ref, min_n, unit))
    if not all(isinstance(v, (int, float)) and math.isfinite(v) for v in (lo, hi)):
        return NO_TEST
    if lo > ref:
        return f'above {ref:g}'
    if hi < ref:
        return f'below {ref:g}'
    return f'not distinguishable from {ref:g}'


@dataclass(frozen=True)
class Family:
    """A run's verdicts under Holm: `verdicts` and `adjusted` (p) by key, `tests`."""

    tests: tuple[Test, ...]
    verdicts: dict = field(default_factory=dict)
    adjusted: dict = field(default_factory=dict)

    @property
    def judged(self) -> int:
        return sum(t.judged for t in self.tests)

    def note(self) -> str:
        """What the family is: how many comparisons, how many judged, the adjustment."""
        few = sum(t.n < t.min_n for t in self.tests)
        return (
            f'{len(self.tests)} comparisons, {self.judged} judged (the others: {few} with too '
            f'few items or batches, n < {MIN_ITEMS} items or < {MIN_BATCHES} batches, '
            f'{len(self.tests) - self.judged - few} without a test); verdicts {METHOD}-'
            f'adjusted over the {self.judged} judged at {ALPHA:g} family-wise, intervals '
            f'unadjusted 95%'
        )


def judge(tests: Sequence[Test]) -> Family:
    """Holm over the judged tests of a family; every test gets its verdict by key."""
    keys = [t.key for t in tests]
    if len(set(keys)) != len(keys):
        raise ValueError(f'duplicate keys in a family: {sorted(map(str, keys))}')
    judged = [t for t in tests if t.judged]
    adj = dict(zip((t.key for t in judged), holm([t.p for t in judged])))
    out = {t.key: verdict(t, adj.get(t.key, t.p)) for t in tests}
    return Family(tuple(tests), out, adj)
