"""The adaptive bench (spec_jax/jobs/bench_adaptive.py): its ratios and goals from
constructed timings, and its :tiny config end to end on one small workload each."""

import os
import re
import types

import pytest

from spec_jax import decoding
from spec_jax.decoding.adaptive import Adaptive, TierCosts
from spec_jax.decoding.drafters import LMDrafter
from spec_jax.jobs import bench, bench_adaptive, bench_chain, timing
from spec_jax.jobs.runtime import load_config
from spec_jax.testing import tiny

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')


def times_of(rates: dict[str, list[float]]) -> dict:
    """`interleaved_runs`-shaped timings: each round 100 tokens at the given tokens/s."""
    return {n: [(100 / r, 100, []) for r in rs] for n, rs in rates.items()}


def test_compare_sets_adaptive_against_the_best_fixed_tier_round_by_round():
    rates = {'ar': [50, 60, 55], 'gamma 1': [60, 66, 63], 'gamma 2': [40, 80, 45],
             'adaptive': [58, 72, 60], 'adaptive measured': [63, 66, 70]}  # fmt: skip
    row = bench_adaptive.compare(times_of(rates), 3)
    assert row['tokens_per_s'] == pytest.approx({'ar': 55, 'gamma 1': 63, 'gamma 2': 45,
                                                 'adaptive': 60, 'adaptive measured': 66})
    assert row['best_fixed'] == 'gamma 1'  # By median, not by its best round.
    a = row['adaptive']['adaptive']
    assert a['over_best'] == pytest.approx(58 / 60)  # Median of 58/60, 72/66, 60/63.
    assert a['over_best_range'] == pytest.approx((60 / 63, 72 / 66))
    assert a['over_ar'] == pytest.approx(58 / 50) and a['over_ar_range'][0] > 1
    assert row['adaptive']['adaptive measured']['over_each']['gamma 1'] == pytest.approx(1.05)
    text = bench_adaptive.line(1, 'speed', row)
    assert 'adaptive / best fixed (gamma 1) 0.967 [0.952-1.091]' in text
    assert 'adaptive measured / best fixed (gamma 1) 1.050 [1.000-1.111]' in text
    assert 'median and range of 3 per-round ratios: no interval' in text


def test_measured_round_costs_rise_with_the_tier():
    """A tier measured below the one under it takes that one's seconds (noise: a longer
    chain does everything a shorter one does); rising ones are kept as measured."""
    assert bench_adaptive.monotone([37.9, 54.0, 38.2, 48.4]) == [37.9, 54.0, 54.0, 54.0]
    assert bench_adaptive.monotone([22.7, 29.2, 35.5, 45.8]) == [22.7, 29.2, 35.5, 45.8]


def test_goals_say_met_or_not_for_each_workload_and_the_mix():
    good = bench_adaptive.compare(times_of(
        {'ar': [50, 50], 'gamma 1': [60, 60], 'adaptive': [59, 61]}), 2)  # fmt: skip
    slow = bench_adaptive.compare(times_of(
        {'ar': [50, 50], 'gamma 1': [60, 60], 'adaptive': [45, 48]}), 2)  # fmt: skip
    split = bench_adaptive.compare(times_of(
        {'ar': [50, 50], 'gamma 1': [60, 60], 'adaptive': [57, 63]}), 2)  # fmt: skip
    met = bench_adaptive.goals({(1, 'speed'): good, (1, 'mbpp'): slow, (1, 'mixed'): slow,
                                (8, 'long'): split})  # fmt: skip
    assert ('batch 1 speed, adaptive: >= 0.97x the best fixed tier: met (median 1.000, rounds '
            '0.983-1.017)') in met  # fmt: skip
    assert ('batch 1 mbpp, adaptive: >= 0.97x the best fixed tier: NOT met (median 0.775, '
            'rounds 0.750-0.800)') in met  # fmt: skip
    assert ('batch 8 long, adaptive: >= 0.97x the best fixed tier: too few to judge: its 2 '
            'rounds on both sides (median 1.000, rounds 0.950-1.050)') in met  # fmt: skip
    assert ('batch 1 mixed, adaptive: above every fixed tier (AR too): NOT met (not above '
            'ar, gamma 1 in any round)') in met  # fmt: skip
    assert ('batch 1 mbpp, adaptive: never below AR (every round): NOT met (below AR in '
            'every round) (rounds 0.900-0.960)') in met  # fmt: skip
    assert ('batch 1 speed, adaptive: never below AR (every round): met (rounds 1.180-'
            '1.220)') in met  # fmt: skip
    straddle = bench_adaptive.compare(times_of(
        {'ar': [50, 50], 'gamma 1': [60, 60], 'adaptive': [45, 55]}), 2)  # fmt: skip
    assert ('batch 8 mbpp, adaptive: never below AR (every round): too few to judge: its 2 '
            'rounds on both sides (rounds 0.900-1.100)') in bench_adaptive.goals(
        {(8, 'mbpp'): straddle})  # fmt: skip
    met = bench_adaptive.goals({(8, 'mixed'): split, (1, 'mixed'): bench_adaptive.compare(
        times_of({'ar': [50, 50], 'gamma 1': [60, 60], 'adaptive': [61, 62]}), 2)})  # fmt: skip
    assert ('batch 8 mixed, adaptive: above every fixed tier (AR too): too few to judge: its '
            '2 rounds on both sides of gamma 1') in met  # fmt: skip
    assert 'batch 1 mixed, adaptive: above every fixed tier (AR too): met' in met


def test_the_priced_line_says_a_catch_up_it_did_not_measure():
    """A drafter whose catch-up the bench does not measure (None) gets its price alone: a
    buffering head's (a window less a token's share of it), or none for one that follows
    every round; the measured pricing keeps the priced base either way."""
    def engines(catch_up, base=None):
        costs = TierCosts.table([0.02, 0.03], catch_up_n=catch_up, catch_up_base_n=base)
        return {bench_adaptive.ADAPTIVE: types.SimpleNamespace(
            adaptive=types.SimpleNamespace(costs=costs))}  # fmt: skip

    line = bench_adaptive.priced_line(engines(-0.0004, 0.0064), 1, (0, 1), [0.022, 0.031], None)
    assert line.endswith("of AR's step 1.00 / 1.41 measured, 1.00 / 1.50 priced; the drafter's "
                         'catch-up priced 0.320 of an AR step a catch-up -0.0200 a token, not '
                         'measured (the measured pricing keeps it)')
    line = bench_adaptive.priced_line(engines(None), 1, (0, 1), [0.022, 0.031], None)
    assert line.endswith('the drafter follows every round (no catch-up)')
    line = bench_adaptive.priced_line(engines(0.0004, 0.002), 1, (0, 1), [0.022, 0.031], 0.0002)
    assert line.endswith("the draft's catch-up 200.0 us a token, of an AR step 0.0091 measured; "
                         'priced 0.100 of an AR step a catch-up +0.0200 a token')
    sized = Adaptive((0, 1), TierCosts.table([0.02, 0.03], catch_up_n=0.0004,
                                             catch_up_base_n=0.002))  # fmt: skip
    fake = {bench_adaptive.ADAPTIVE: types.SimpleNamespace(adaptive=sized,
                                                           replace=lambda adaptive: adaptive)}
    for measured, want in ((None, 0.0004), (0.0001, 0.0001)):  # Kept where not measured.
        got = bench_adaptive.with_measured(fake, [0.022, 0.031], measured)
        table = got[f'{bench_adaptive.ADAPTIVE} measured'].costs
        assert float(table.catch_up(1, 10)) == pytest.approx(0.002 + 10 * want)
        assert float(table.seconds(1, 0.0)[1]) == pytest.approx(0.031)


def test_a_round_carries_the_adaptive_prior_from_group_to_group():
    """`bench_chain.carried`: an adaptive engine's next group starts from the prior the last
    one saw (1 of 4 taken at depth 1, shrunk toward 0.7 by 4 rounds: 3.8 / 8); any other
    engine is the same engine."""
    seen = types.SimpleNamespace(stats=dict(per_row=dict(
        accepted_at_position=[[1, 0]], reached_at_position=[[4, 1]])))  # fmt: skip
    eng = decoding.Engine(tiny.TARGET, tiny.DECODE, LMDrafter(tiny.DRAFT), 2,
                          adaptive=Adaptive((0, 1, 2), TierCosts.table([1.0, 1.3, 1.6])))
    assert eng.adaptive.prior == 0.7
    assert bench_chain.carried(eng, seen).adaptive.prior == pytest.approx(3.8 / 8)
    ar = decoding.Engine(tiny.TARGET, tiny.DECODE)
    assert bench_chain.carried(ar, seen) is ar


def test_headroom_is_each_workload_by_its_best_fixed_tier_over_the_best_one():
    # Speed prefers gamma 1 (100 against 50 tokens/s), long AR (100 against 50): chosen per
    # workload, 200 tokens in 2 s a round; either tier alone 200 in 3 s. MBPP: no preference.
    times = {'speed': times_of({'ar': [50, 50], 'gamma 1': [100, 100]}),
             'long': times_of({'ar': [100, 100], 'gamma 1': [50, 50]})}  # fmt: skip
    rows = {w: bench_adaptive.compare(t, 2) for w, t in times.items()}
    mixed = {n: bench_adaptive.summed([t[n] for t in times.values()]) for n in ('ar', 'gamma 1')}
    assert mixed['ar'][0][:2] == pytest.approx((3.0, 200))
    room = bench_adaptive.headroom(times, rows, mixed, 'ar')
    assert room['tiers'] == {'speed': 'gamma 1', 'long': 'ar'}
    assert room['over_best'] == pytest.approx(1.5)
    times['mbpp'] = times_of({'ar': [80, 80], 'gamma 1': [80, 80]})  # Adds 1.25 s either way.
    rows['mbpp'] = bench_adaptive.compare(times['mbpp'], 2)
    mixed = {n: bench_adaptive.summed([t[n] for t in times.values()]) for n in ('ar', 'gamma 1')}
    room = bench_adaptive.headroom(times, rows, mixed, 'ar')
    assert room['over_best'] == pytest.approx((300 / 3.25) / (300 / 4.25))


def test_the_tiny_bench_runs_every_workload_and_reports_the_goals(tmp_path, capsys):
    c = load_config(os.path.join(CONFIGS, 'bench_adaptive.py'), 'tiny')
    c.tiers, c.batches, c.sets, c.mbpp_prompts = '0,2', (1,), ('mt_bench',), 1
    c.prompt_bucket = c.max_prompt_len  # One prompt bucket: each engine's programs once.
    report = bench.run(c, str(tmp_path))['adaptive']
    out = capsys.readouterr().out
    assert f'timing: {timing.WARMED}; then 1 interleaved round(s)' in out
    assert set(report['rows']) == {'1/speed', '1/mbpp', '1/long', '1/mixed'}
    assert 'batch 1 mixed: each workload by its best fixed tier ({' in out
    assert 0.999 <= report['rows']['1/mixed']['headroom']['over_best'] < 2.0
    assert 'batch 1 speed: measured seconds a round of tiers (0, 2): ' in out
    # Beside the measurement, the relative model's prices ('' costs) for a draft LM, whose AR
    # tier makes no draft call: 1 + verify 2 + draft 2 AR steps, catch-up in AR steps.
    b = decoding.adaptive_config()
    priced = f'1.00 / {1 + 2 * b.verify + 2 * b.draft:.2f} priced'
    assert re.search(rf"of AR's step 1\.00 / \d+\.\d\d measured, {priced}; the draft's "
                     rf'catch-up \d+\.\d us a token, of an AR step \d\.\d{{4}} measured; '
                     rf'priced 0.000 of an AR step a catch-up \+{b.catch_up:.4f} a token', out)
    for row in report['rows'].values():
        assert set(row['tokens_per_s']) == {'ar', 'gamma 2', 'adaptive', 'adaptive measured'}
        assert all(v > 0 for v in row['tokens_per_s'].values())
        assert all(0 <= a['mean_draft'] <= 2 for a in row['adaptive'].values())
    assert len(report['goals']) == 16  # Two goals per workload and adaptive engine.
    assert os.path.exists(os.path.join(tmp_path, 'bench_adaptive.json'))
    c.workloads = ('long',)  # A selection: no mixed workload of one.
    assert set(bench.run(c)['adaptive']['rows']) == {'1/long'}
    c.workloads = ('long', 'code')
    with pytest.raises(ValueError, match=r"workloads=\('long', 'code'\); give distinct names"):
        bench.run(c)
    c.workloads, c.tiers = ('long',), '1,2'
    with pytest.raises(ValueError, match=r"tiers='1,2' must start at 0 \(AR\) and rise"):
        bench.run(c)
