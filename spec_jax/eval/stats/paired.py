"""Paired statistics of an evaluation: speedups from per-batch ratios against AR, and every
difference between a method and its matched baseline on the samples both have.

Every method meets the same random numbers on the same item, and (with the interleaved
schedule, `spec_jax.eval.timing`) the same machine on the same batch, so comparisons are
made pair by pair, never between pools:

  speedup       per batch the method's tokens/s over AR's on the same rows (the (item,
                seed) keys both have in that batch), combined as the geometric mean of the
                ratios, with a t-interval on their logs from MIN_BATCHES batches on. Logs,
                because a ratio is multiplicative (a batch twice as fast and one half as
                fast cancel), and the geometric mean of method/AR is the reciprocal of that
                of AR/method, so the direction of the ratio cannot change the answer; t,
                because a run has few batches (5-20). Drift that moves a batch's methods
                alike cancels in its ratio; drift linear in time within rounds cancels
                over the group's balanced design (`spec_jax.eval.stats.design`).
                decode_speedup: the same after each batch's prefill call.
  Δ (score, BE, TV)  method minus matched baseline over the shared (item, seed) keys only
                (a partial or mixed run compares the same items), with n, a 95% interval
                and the p-value of the test the verdict is drawn from (`spec_jax.eval.
                verdicts`): for 0/1 scores with one seed McNemar's exact test (the
                two-sided binomial test of the discordant pairs) and the exact interval
                that agrees with it; with several seeds a t-interval over items of each
                item's mean Δ, and the mean and standard deviation over seeds of the
                per-seed Δ; for BE and TV (ratios of sums over items) the t-interval of
                the linearised ratio (each item's influence on it), whose coverage at the
                run's n is checked by simulation (tests/eval/test_findings.py).
  speedup_vs_matched  the method's tokens/s over its matched baseline's, per shared batch,
                as the speedup is (a ratio: the method's speed gain over the baseline).
"""

from __future__ import annotations

import functools
import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import numpy as np
from scipy import stats

from spec_jax.eval.stats import verdicts

# The fields `matched_deltas` gives a lossy row (None on the other rows).
MATCHED_FIELDS = ('pair_n', 'pair_n_items', 'd_score', 'd_score_lo', 'd_score_hi', 'd_score_p',
                  'd_score_test', 'd_score_seed_mean', 'd_score_seed_std', 'd_score_wins',
                  'd_score_losses', 'd_be', 'd_be_lo', 'd_be_hi', 'd_be_spread', 'd_tv',
                  'd_tv_lo', 'd_tv_hi', 'd_tv_spread', 'd_tv_plain', 'd_tv_plain_lo',
                  'd_tv_plain_hi', 'd_tv_plain_spread', 'speedup_vs_matched',
                  'speedup_vs_matched_lo', 'speedup_vs_matched_hi', 'speedup_vs_matched_n_batches',
                  'speedup_vs_matched_n_units')  # fmt: skip
MIN_BATCHES = verdicts.MIN_BATCHES  # An interval from this many batches on (none below).
# Speedup intervals over design units (pairs of batches) from this many units on.
MIN_UNITS = 5


def sample_key(row: dict) -> tuple:
    """What pairs two methods' samples: (item, seed)."""
    return (str(row['item']), row.get('seed', 0))


def ratio_interval(ratios: Sequence[float], units: Sequence | None = None) -> dict:
    """{'mean', 'lo', 'hi', 'n', 'n_units'} of positive per-batch ratios: the geometric mean
    and its 95% t-interval on the log ratios (None below MIN_BATCHES batches).

    With `units` (each batch's design unit, `spec_jax.eval.stats.design.unit`) and at least
    MIN_UNITS of them, the logs are averaged within each unit first and the mean and
    interval are those of the unit means ('n_units' their count, the t's n): a design's
    units are its independent random draws, while a pair's two batches share one (a load
    periodic in rounds makes them move together, so a t over batches would be too narrow:
    docs/eval.md, timing). Fewer units: over batches ('n_units' None)."""
    keep = [i for i, r in enumerate(ratios) if r > 0 and math.isfinite(r)]
    logs = np.log(np.asarray([ratios[i] for i in keep], float))
    n = len(logs)
    out = dict(mean=None, lo=None, hi=None, n=n, n_units=None)
    if not n:
        return out
    labels = [units[i] for i in keep] if units is not None else [None]
    if None not in labels and len(set(labels)) >= MIN_UNITS:
        groups: dict = defaultdict(list)
        for label, v in zip(labels, logs):
            groups[label].append(v)
        logs = np.asarray([np.mean(v) for _, v in sorted(groups.items())])
        out['n_units'] = len(logs)
    centre = float(logs.mean())
    out['mean'] = math.exp(centre)
    if n >= MIN_BATCHES:
        half = _t975(len(logs) - 1) * float(logs.std(ddof=1)) / math.sqrt(len(logs))
        out['lo'], out['hi'] = math.exp(centre - half), math.exp(centre + half)
    return out


@functools.cache
def _t975(df: int) -> float:
    """Student's t quantile 0.975 at `df` degrees of freedom (cached: scipy's is slow)."""
    return float(stats.t.ppf(0.975, df))


def _batches(rows: Sequence[dict]) -> dict[str, dict[tuple, tuple]]:
    """batch id -> {(task, item, seed): (tokens, seconds, decode tokens, decode seconds)} of
    rows that carry a batch id (the task too: the speed sets share batches, and their item
    ids repeat). Decode: the tokens after the first (prefill draws it) over the row's
    seconds less its share of its batch's prefill call (None without a recorded prefill)."""
    out: dict[str, dict] = defaultdict(dict)
    for r in rows:
        if r.get('batch_id') is not None:
            key = (str(r.get('task')), *sample_key(r))
            b = r.get('batch') or {}
            prefill, total = b.get('prefill_s'), b.get('seconds')
            decode = (r['num_tokens'] - 1, r['seconds'] * (1.0 - prefill / total)
                      if prefill is not None and total else None)  # fmt: skip
            out[r['batch_id']][key] = (r['num_tokens'], r['seconds'], *decode)
    return out


def batch_units(rows: Sequence[dict]) -> dict[str, tuple | None]:
    """batch id -> its design unit ('s<seed>/<group>', unit) from the rows' batch records
    (None where a record has no 'unit': results written before it)."""
    out = {}
    for r in rows:
        if r.get('batch_id') is not None:
            u = (r.get('batch') or {}).get('unit')
            out[r['batch_id']] = None if u is None else (r['batch_id'].rsplit('/', 2)[0], u)
    return out


def unit_ratios(
    rows: Sequence[dict], reference: Sequence[dict], decode: bool = False
) -> tuple[list[float], list]:  # fmt: skip
    """`batch_ratios` and each ratio's design unit (`batch_units`), for `ratio_interval`."""
    units, ids = batch_units(rows), []
    ratios = batch_ratios(rows, reference, decode, ids)
    return ratios, [units.get(b) for b in ids]


def batch_ratios(
    rows: Sequence[dict], reference: Sequence[dict], decode: bool = False,
    ids: list | None = None,
) -> list[float]:  # fmt: skip
    """Per batch both ran, the tokens/s of `rows` over that of `reference` on the keys both
    have in it (batches in id order; those with no tokens or no seconds are left out);
    with `decode`, of the tokens after each row's first over the seconds after the
    prefill call (batches without a recorded prefill left out). `ids`, when given, is
    filled with the batch id of each ratio."""
    mine, ref = _batches(rows), _batches(reference)
    fields = (2, 3) if decode else (0, 1)
    out = []
    for batch in sorted(set(mine) & set(ref)):
        keys = sorted(mine[batch].keys() & ref[batch].keys())  # Sums in one order: exact.
        sides = [[[side[batch][k][i] for k in keys] for i in fields] for side in (mine, ref)]
        if any(v is None for side in sides for col in side for v in col):
            continue
        (a, a_s), (b, b_s) = [[sum(col) for col in side] for side in sides]
        if a and a_s and b and b_s:
            out.append((a / a_s) / (b / b_s))
            if ids is not None:
                ids.append(batch)
    return out


def speedup(rows: Sequence[dict], ar_rows: Sequence[dict]) -> dict:
    """The metrics row's speedup fields of a method's rows against AR's ('speedup',
    'speedup_lo', 'speedup_hi', 'speedup_n_batches', 'speedup_basis'): per-batch ratios
    when the rows carry batch ids, else (results written before batch ids) the pooled
    tokens/s ratio, without an interval; and the same of the decode alone ('decode_speedup',
    '_lo', '_hi', '_n_batches': tokens after the first over the seconds after the prefill
    call, `batch_ratios(decode=True)`; None where no batch recorded its prefill)."""
    out = dict.fromkeys(('decode_speedup', 'decode_speedup_lo', 'decode_speedup_hi',
                         'decode_speedup_n_batches'))  # fmt: skip
    if any(r.get('batch_id') is not None for r in rows):
        est = ratio_interval(*unit_ratios(rows, ar_rows))
        out.update(speedup=est['mean'], speedup_lo=est['lo'], speedup_hi=est['hi'],
                   speedup_n_batches=est['n'], speedup_n_units=est['n_units'],
                   speedup_basis='units' if est['n_units'] else 'batches')  # fmt: skip
        dec = ratio_interval(*unit_ratios(rows, ar_rows, decode=True))
        if dec['n']:
            out.update(decode_speedup=dec['mean'], decode_speedup_lo=dec['lo'],
                       decode_speedup_hi=dec['hi'], decode_speedup_n_batches=dec['n'])  # fmt: skip
        return out

    def tps(group):
        seconds = sum(r['seconds'] for r in group)
        return sum(r['num_tokens'] for r in group) / seconds if seconds else None

    a, b = tps(rows), tps(ar_rows)
    return dict(out, speedup=a / b if a and b else None, speedup_lo=None, speedup_hi=None,
                speedup_n_batches=None, speedup_n_units=None, speedup_basis='pooled')  # fmt: skip


def _shared(rows: Sequence[dict], base: Sequence[dict]) -> dict[tuple, tuple[dict, dict]]:
    ours = {sample_key(r): r for r in rows}
    theirs = {sample_key(r): r for r in base}
    return {k: (ours[k], theirs[k]) for k in sorted(ours.keys() & theirs.keys())}


def t_interval(values: Sequence[float]) -> tuple[float | None, float | None]:
    """The 95% t-interval (at n - 1 degrees of freedom) of the mean of per-item values
    (None, None below 2 items)."""
    x = np.asarray(values, float)
    if len(x) < 2:
        return None, None
    half = float(stats.t.ppf(0.975, len(x) - 1)) * float(x.std(ddof=1)) / math.sqrt(len(x))
    return float(x.mean() - half), float(x.mean() + half)


def _item_sums(
    pairs: dict[tuple, tuple[dict, dict]], num: Callable[[dict], float],
    den: Callable[[dict], float],
) -> dict[str, np.ndarray]:  # fmt: skip
    """item -> (num, den of ours, num, den of the baseline's) summed over its shared seeds."""
    items: dict[str, np.ndarray] = defaultdict(lambda: np.zeros(4))
    for (item, _), (a, b) in pairs.items():
        items[item] += (num(a), den(a), num(b), den(b))
    return dict(items)


def linearised(sums: np.ndarray, paired_base: bool = True) -> np.ndarray | None:
    """Per item (rows of `sums`: num, den of ours, num, den of the baseline's) its
    linearised value of the pooled ratio Δ = sum(num) / sum(den) - sum(num') / sum(den'):
    Δ + n (a_i - R1 b_i) / sum(b) - n (c_i - R2 d_i) / sum(d), whose mean over the items is
    the printed Δ exactly and whose spread is the delta method's (the baseline's columns
    ignored without `paired_base`: the ratio itself). None without a denominator."""
    total = sums.sum(0)
    if not total[1] or (paired_base and not total[3]):
        return None
    n = len(sums)
    r1 = total[0] / total[1]
    out = r1 + n * (sums[:, 0] - r1 * sums[:, 1]) / total[1]
    if paired_base:
        r2 = total[2] / total[3]
        out = out - r2 - n * (sums[:, 2] - r2 * sums[:, 3]) / total[3]
    return out


def spread(own: Sequence[float], lin: Sequence[float]) -> dict:
    """What a Δ over items rests on: 'gain' / 'lose' / 'tie' (items whose own Δ is above,
    below or at 0) and 'share': the largest item's share of the sum of |linearised values|
    (1.0: one item carries it all)."""
    own, lin = np.asarray(own, float), np.abs(np.asarray(lin, float))
    return dict(gain=int((own > 0).sum()), lose=int((own < 0).sum()), tie=int((own == 0).sum()),
                share=float(lin.max() / lin.sum()) if lin.sum() > 0 else None)  # fmt: skip


def ratio_delta(
    pairs: dict[tuple, tuple[dict, dict]], num: Callable[[dict], float],
    den: Callable[[dict], float],
) -> tuple[float | None, float | None, float | None, dict | None]:  # fmt: skip
    """(Δ, lo, hi, spread) of a pooled ratio sum(num) / sum(den), ours minus the
    baseline's, over the shared pairs (None where a side has no denominator): the estimand
    is the ratio of sums over these items' target forwards; the interval is the
    t-interval over items of their linearised values (`linearised`); `spread` says how
    many items gain, lose or tie (each item's own ratio Δ) and the largest item's share."""
    items = _item_sums(pairs, num, den)
    if not items:
        return None, None, None, None
    sums = np.stack(list(items.values()))  # n x 4
    lin = linearised(sums)
    if lin is None:
        return None, None, None, None
    with np.errstate(divide='ignore', invalid='ignore'):
        own = np.where((sums[:, 1] > 0) & (sums[:, 3] > 0),
                       sums[:, 0] / sums[:, 1] - sums[:, 2] / sums[:, 3], np.nan)  # fmt: skip
    lo, hi = t_interval(lin)
    return float(lin.mean()), lo, hi, spread(own[np.isfinite(own)], lin)


def item_values(
    rows: Sequence[dict], num: str, den: str, base: Sequence[dict] | None = None
) -> dict[str, float]:  # fmt: skip
    """item -> its linearised value (`linearised`) of the pooled ratio sum(num) / sum(den)
    over the rows' (item, seed) samples, minus the same of `base` on the shared keys when
    given: the values a trend over a grid is judged from, whose mean is the printed ratio
    (or Δ) itself, so the slope is the slope of what is printed. Samples without the stats
    are left out."""
    pairs = _shared(rows, base) if base is not None else {sample_key(r): (r, r) for r in rows}
    pairs = {k: v for k, v in pairs.items()
             if all(f in r['stats'] for r in v for f in (num, den))}  # fmt: skip
    items = _item_sums(pairs, _stat(num), _stat(den))
    if not items:
        return {}
    lin = linearised(np.stack(list(items.values())), paired_base=base is not None)
    return {} if lin is None else {item: float(v) for item, v in zip(items, lin)}


def score_delta(pairs: dict[tuple, tuple[dict, dict]]) -> dict:
    """The score Δ over the shared pairs of scored rows: each item's mean Δ over its shared
    seeds, then the mean over items ('d_score'). With one seed, McNemar's exact test
    ('d_score_test' 'McNemar', 'd_score_p') and the exact interval that agrees with it
    (`verdicts.mcnemar_interval`); with several, the t-interval over items and its p
    ('d_score_test' 't'), and the mean and standard deviation over seeds of each seed's Δ
    ('d_score_seed_mean', 'd_score_seed_std')."""
    out = dict(d_score=None, d_score_lo=None, d_score_hi=None, d_score_p=None,
               d_score_test=None, d_score_seed_mean=None, d_score_seed_std=None,
               d_score_wins=None, d_score_losses=None)  # fmt: skip
    by_item: dict[str, list[float]] = defaultdict(list)
    by_seed: dict[int, list[float]] = defaultdict(list)
    for (item, seed), (a, b) in pairs.items():
        diff = float(bool(a.get('correct'))) - float(bool(b.get('correct')))
        by_item[item].append(diff)
        by_seed[seed].append(diff)
    if not by_item:
        return out
    x = np.asarray([sum(v) / len(v) for v in by_item.values()])
    out['d_score'] = float(x.mean())
    if len(by_seed) == 1:  # McNemar: the discordant pairs, under H0 each way with p 1/2.
        wins, losses = int((x > 0).sum()), int((x < 0).sum())
        out['d_score_test'] = 'McNemar'
        out['d_score_p'] = verdicts.mcnemar_p(wins, losses)
        out['d_score_lo'], out['d_score_hi'] = verdicts.score_gap_interval(wins, losses, len(x))
        out['d_score_wins'], out['d_score_losses'] = wins, losses
    else:
        out['d_score_test'] = 't'
        out['d_score_lo'], out['d_score_hi'] = t_interval(x)
        if out['d_score_lo'] is not None:
            out['d_score_p'] = verdicts.t_p_value(out['d_score'], out['d_score_lo'],
                                                  out['d_score_hi'], len(x))  # fmt: skip
        per_seed = [sum(v) / len(v) for v in by_seed.values()]
        out['d_score_seed_mean'] = float(np.mean(per_seed))
        out['d_score_seed_std'] = float(np.std(per_seed, ddof=1))
    return out


def _stat(name: str) -> Callable[[dict], float]:
    return lambda r: float(r['stats'].get(name, 0.0))


def matched_deltas(
    rows: Sequence[dict], base: Sequence[dict], timed: tuple[Sequence[dict], Sequence[dict]]
    | None = None,
) -> dict:  # fmt: skip
    """A lossy method's paired fields against its matched baseline's rows (one task):
    'pair_n' (shared (item, seed) keys), 'pair_n_items', the score Δ (`score_delta`),
    'd_be' (block efficiency, emitted over target forwards), 'd_tv' (metered TV against the
    matched baseline's law) and 'd_tv_plain' (metered TV against the processed target, plain
    lossless SD's law; None on results that predate it), each with '_lo' / '_hi', and
    'speedup_vs_matched' with '_lo', '_hi', '_n_batches' over the batches of `timed` (the
    method's and the baseline's rows of the task group; default `rows` and `base`)."""
    pairs = _shared(rows, base)
    out = dict(pair_n=len(pairs), pair_n_items=len({item for item, _ in pairs}))
    scored = bool(pairs) and all(
        a.get('correct') is not None and b.get('correct') is not None for a, b in pairs.values()
    )
    out.update(score_delta(pairs) if scored else score_delta({}))
    for name, num, den in (('be', 'emitted', 'blocks'), ('tv', 'tv_sum', 'metered'),
                           ('tv_plain', 'tv_plain_sum', 'metered')):  # fmt: skip
        has = all(den in r['stats'] and num in r['stats'] for pair in pairs.values() for r in pair)
        d, lo, hi, sp = ratio_delta(pairs, _stat(num), _stat(den)) if has else (None,) * 4
        out.update({f'd_{name}': d, f'd_{name}_lo': lo, f'd_{name}_hi': hi,
                    f'd_{name}_spread': sp})  # fmt: skip
    est = ratio_interval(*unit_ratios(*(timed or (rows, base))))
    out.update(speedup_vs_matched=est['mean'], speedup_vs_matched_lo=est['lo'],
               speedup_vs_matched_hi=est['hi'], speedup_vs_matched_n_batches=est['n'],
               speedup_vs_matched_n_units=est['n_units'])  # fmt: skip
    return out


def seed_spread(rows: Sequence[dict]) -> dict:
    """'n_seeds' and, with several, 'score_seed_std': the standard deviation over seeds of
    each seed's score (the paper's mean +- std over its 3 runs); None with one seed or
    unscored rows."""
    by_seed: dict[int, list[float]] = defaultdict(list)
    for r in rows:
        by_seed[r.get('seed', 0)].append(float(bool(r.get('correct'))))
    scored = all(r.get('correct') is not None for r in rows)
    means = [sum(v) / len(v) for v in by_seed.values()]
    std = float(np.std(means, ddof=1)) if scored and len(means) > 1 else None
    return dict(n_seeds=len(by_seed), score_seed_std=std)
