"""Metrics against hand-computed values on a constructed run: block efficiency with and
without the bonus token (and the paper's full-gamma variant), acceptance rate, tokens/s and
speedup over AR from batch timings, pooled TV / KL / outside / overshoot, intervals."""

from __future__ import annotations

import math

import pytest
from scipy import stats

from spec_jax.eval import metrics, plan


def row(method, item, correct, stats, seconds, seed=0, task='gsm8k', tokens=10):
    """A result line; `seconds` is the row's share of its batch's decode time."""
    return dict(method=method, task=task, item=item, seed=seed, correct=correct,
                num_tokens=tokens, stats=stats, seconds=seconds)  # fmt: skip


def meter(n, tv, kl, outside, over_sum, over_max, kl_inf=0, over_inf=0):
    """Metered sums (KL and overshoot over finite positions) and the infinite counts."""
    return dict(metered=n, tv_sum=tv, kl_sum=kl, outside_sum=outside, overshoot_sum=over_sum,
                max_overshoot=over_max, kl_inf=kl_inf, overshoot_inf=over_inf)  # fmt: skip


def counters(blocks, drafted, accepted, full_blocks, full_accepted):
    return dict(blocks=blocks, drafted=drafted, accepted=accepted, emitted=accepted + blocks,
                full_blocks=full_blocks, full_accepted=full_accepted)  # fmt: skip


@pytest.fixture(scope='module')
def table():
    methods = plan.plan(['minp_verify:rho=0.3'], 'chain')
    b_ar, b_lossy1, b_lossy2 = 0.5, 0.5, 0.25  # Four AR rows share 2 s; two batches of two.
    ar = [row('ar', str(i), c, dict(counters(10, 0, 0, 10, 0), **meter(11, 0, 0, 0, 11, 1)),
              b_ar, tokens=10) for i, c in enumerate([True, False, True, True])]  # fmt: skip
    lossy = [
        # Two rows in a batch of 1.0 s, two in one of 0.5 s.
        row('minp_verify:rho=0.3', '0', True,
            dict(counters(4, 12, 6, 3, 5), **meter(11, 1.1, 0.5, 0.4, 22.0, 5.0)), b_lossy1),
        row('minp_verify:rho=0.3', '1', False,
            dict(counters(6, 18, 4, 6, 4), **meter(11, 0.0, 0.0, 0.0, 11.0, 1.0)), b_lossy1),
        row('minp_verify:rho=0.3', '2', False,
            dict(counters(5, 15, 5, 5, 5), **meter(11, 2.2, 1.0, 0.6, 33.0, 9.0)), b_lossy2),
        row('minp_verify:rho=0.3', '3', True,
            dict(counters(5, 14, 5, 4, 5),
                 **meter(11, 1.1, 0.3, 0.2, 11.0, 2.0, kl_inf=2, over_inf=1)), b_lossy2),
    ]  # fmt: skip
    return {r['method']: r for r in metrics.aggregate(ar + lossy, methods)}


def test_block_efficiency_variants_and_acceptance(table):
    m = table['minp_verify:rho=0.3']
    blocks, accepted, drafted = 4 + 6 + 5 + 5, 6 + 4 + 5 + 5, 12 + 18 + 15 + 14
    assert m['block_efficiency'] == pytest.approx((accepted + blocks) / blocks)  # Bonus in.
    assert m['accept_length'] == pytest.approx(accepted / blocks)  # EAGLE BE: no +1.
    full, full_acc = 3 + 6 + 5 + 4, 5 + 4 + 5 + 5
    assert m['be_full_gamma'] == pytest.approx((full_acc + full) / full)  # Paper's chain BE.
    assert m['acceptance_rate'] == pytest.approx(accepted / drafted)
    a = table['ar']
    assert a['block_efficiency'] == 1.0 and a['acceptance_rate'] is None


def test_speed_from_batches(table):
    m, a = table['minp_verify:rho=0.3'], table['ar']
    assert m['decode_seconds'] == pytest.approx(1.5) and m['tokens'] == 40
    assert a['decode_seconds'] == pytest.approx(2.0)
    assert m['tokens_per_s'] == pytest.approx(40 / 1.5)
    assert m['speedup'] == pytest.approx((40 / 1.5) / (40 / 2.0))
    assert a['speedup'] == pytest.approx(1.0)


def test_pooled_distortion(table):
    m = table['minp_verify:rho=0.3']
    assert m['tv'] == pytest.approx(4.4 / 44)
    # Two positions' KL and one overshoot were infinite: means over the finite others.
    assert m['kl'] == pytest.approx(1.8 / 42) and m['kl_inf_fraction'] == pytest.approx(2 / 44)
    assert m['outside'] == pytest.approx(1.2 / 44)
    assert m['overshoot_mean'] == pytest.approx(77.0 / 43)
    assert m['overshoot_inf_fraction'] == pytest.approx(1 / 44)
    assert m['overshoot_max'] == 9.0
    assert m['kind'] == 'lossy' and m['param'] == 0.3 and m['param_name'] == 'rho'
    assert m['pairs'] == ['baseline[min_p=0.3]']


def test_score_interval_wilson(table):
    a = table['ar']  # 3 of 4: Wilson's 95% interval by hand.
    z, n, p = metrics.Z95, 4, 0.75
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert a['score'] == 0.75
    assert (a['score_lo'], a['score_hi']) == pytest.approx((centre - half, centre + half))
    assert (a['score_lo'], a['score_hi']) == pytest.approx((0.3006, 0.9544), abs=1e-4)


def test_score_interval_over_seeds():
    # 8 items over two seeds, means 1, 0.5, 0 and five 0.5: the t-interval at n - 1 = 7
    # (n is small; z would give a narrower one).
    means = [1, 0.5, 0, 0.5, 0.5, 0.5, 0.5, 0.5]
    mean, lo, hi = metrics.score_interval([[1, 1], [1, 0], [0, 0]] + [[0, 1]] * 5)
    half = stats.t.ppf(0.975, 7) * stats.tstd(means) / math.sqrt(8)
    assert mean == 0.5 and (lo, hi) == pytest.approx((0.5 - half, 0.5 + half))
    assert metrics.wilson(0, 5)[0] == 0.0 and metrics.wilson(5, 5)[1] == 1.0


def test_unscored_tasks_and_method_info():
    methods = plan.plan(['cos:lam=0.4'], 'chain')
    rows = [row(m.name, '0', None, counters(2, 2, 1, 2, 1), 1.0, task='speed_qa')
            for m in methods]  # fmt: skip
    out = metrics.aggregate(rows, methods)
    assert all(r['score'] is None and not r['scored'] for r in out)
    assert all(r['tv'] is None for r in out)  # Not metered.
    info = {r['method']: (r['kind'], r['rule'], r['param']) for r in out}
    assert info == {'ar': ('ar', 'lossless', None), 'lossless': ('lossless', 'lossless', None),
                    'cos:lam=0.4': ('lossy', 'cos', 0.4)}  # fmt: skip


def test_tv_per_block_offset():
    """TV at each offset of a round pools over rows: sums over counts, None where no round
    emitted (offset 2 here: both rounds were rejected before it)."""
    methods = plan.plan(['minp_verify:rho=0.3'], 'chain')
    stats = [dict(counters(1, 2, 0, 1, 0), **meter(2, 0.5, 0, 0, 2, 1),
                  tv_at_offset=tv, metered_at_offset=n)
             for tv, n in [([0.2, 0.0, 0.0], [1, 0, 0]), ([0.3, 0.6, 0.0], [2, 1, 0])]]  # fmt: skip
    rows = [row('minp_verify:rho=0.3', str(i), True, s, 1.0) for i, s in enumerate(stats)]
    (out,) = metrics.aggregate(rows, methods)
    assert out['tv_at_offset'] == pytest.approx([0.5 / 3, 0.6, None])


def test_decode_speedup_from_batch_records():
    """Two batches of two rows: AR 2 s a batch (prefill 0.8 s), the method 1 s (the same
    0.8 s prefill); 10 tokens a row, the first drawn by the prefill. End to end 2x, decode
    alone (18 tokens over 1.2 s against over 0.2 s) 6x, as the batch records say; a row
    of the method missing from one batch pairs that batch on the shared row alone."""
    methods = plan.plan(['minp_verify:rho=0.3'], 'chain')
    rows = []
    for method, seconds in (('ar', 2.0), ('minp_verify:rho=0.3', 1.0)):
        for batch in range(2):
            record = dict(seconds=seconds, prefill_s=0.8)
            rows += [dict(row(method, f'{batch}.{k}', True, counters(9, 0, 0, 9, 0),
                              seconds / 2), batch_id=f's0/gsm8k/{batch}', batch=record)
                     for k in range(2)]  # fmt: skip
    by = {r['method']: r for r in metrics.aggregate(rows, methods)}
    m, a = by['minp_verify:rho=0.3'], by['ar']
    assert m['speedup'] == pytest.approx(2.0) and m['decode_speedup'] == pytest.approx(6.0)
    assert a['decode_speedup'] == pytest.approx(1.0) and m['decode_speedup_n_batches'] == 2
    assert m['prefill_share'] == pytest.approx(0.8) and a['prefill_share'] == pytest.approx(0.4)
    one = [r for r in rows if (r['method'], r['item']) != ('minp_verify:rho=0.3', '1.1')]
    m = {r['method']: r for r in metrics.aggregate(one, methods)}['minp_verify:rho=0.3']
    assert m['decode_speedup'] == pytest.approx(6.0) and m['decode_speedup_n_batches'] == 2
    old = [dict(r, batch={}) for r in rows]  # Records without a prefill: no decode speedup.
    m = {r['method']: r for r in metrics.aggregate(old, methods)}['minp_verify:rho=0.3']
    assert m['decode_speedup'] is None and m['speedup'] == pytest.approx(2.0)
