"""The adaptive prior per depth (decoding/adaptive_prior.py, drafters/measured.py): the
anchors by hand, the choice a profile changes, a batch's counts carried in the prior's shape,
the measured file read depth by depth."""

import json
import math
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.decoding import adaptive, adaptive_prior, adaptive_trees
from spec_jax.decoding.adaptive import Adaptive, TierCosts
from spec_jax.decoding.drafters import measured
from spec_jax.decoding.stats import Stats
from spec_jax.decoding.trees import TreeShape

# The shipped draft LM behind lookup 2 (its acceptance.json: 343/1114, 147/343, 101/147,
# 82/101).
MEASURED = (343 / 1114, 147 / 343, 101 / 147, 82 / 101)


def logit(p):
    return math.log(p / (1 - p))


def sigmoid(x):
    return 1 / (1 + math.exp(-x))


def test_anchors_by_hand():
    """Nothing seen: the pooled rates are the profile (each anchor the depth above shifted
    by the profile's step lands on the profile). Depth 1 seen 9 of 10, weight 4, profile
    (0.3, 0.45): pooled_1 = (9 + 1.2) / 14, pooled_2 = its anchor sigmoid(logit pooled_1 +
    logit 0.45 - logit 0.3), depth 3 (past the profile) the depth above unshifted. A rate
    (one number) is the old rule: each depth toward the depth above."""
    none = jnp.zeros((1, 3), jnp.int32)
    got = adaptive.acceptance(none, none, np.float32([0.3, 0.45]), 4.0)
    np.testing.assert_allclose(np.asarray(got)[0], [0.3, 0.45, 0.45], rtol=1e-5)
    acc, seen = jnp.array([[9, 0, 0]]), jnp.array([[10, 0, 0]])
    got = np.asarray(adaptive.acceptance(acc, seen, np.float32([0.3, 0.45]), 4.0))[0]
    first = (9 + 4 * 0.3) / 14
    second = sigmoid(logit(first) + logit(0.45) - logit(0.3))
    np.testing.assert_allclose(got, [(9 + 4 * first) / 14, second, second], rtol=1e-5)
    flat = np.asarray(adaptive.acceptance(acc, seen, 0.3, 4.0))[0]
    np.testing.assert_allclose(flat, [(9 + 4 * first) / 14, first, first], rtol=1e-5)
    same = adaptive.acceptance(acc, seen, np.float32([0.3, 0.3, 0.3]), 4.0)
    np.testing.assert_array_equal(np.asarray(same)[0], flat)  # A flat profile: no shift.


def fake_state(depths=4):
    """What `Adaptive.tier` reads of a DecodeState: one live row, room 100, nothing seen."""
    return types.SimpleNamespace(
        stats=Stats.zeros(1, depths, 8), committed_b=jnp.array([10]), limit_b=jnp.array([200]),
        num_out_b=jnp.array([100]), done_b=jnp.array([False]))  # fmt: skip


def test_the_measured_profile_values_the_longer_chain():
    """Tiers (0, 1, 2, 4) at 1, 1.25, 1.35, 1.45 AR steps, one row, room 100 (finish = 100 /
    tokens x seconds). The measured depth-1 rate alone (0.308 at every depth): tokens 1,
    1.308, 1.403, 1.441; finish 100, 95.6, 96.2, 100.6: a chain of 1. The measured profile:
    tokens 1, 1.308, 1.440, 1.605; finish 100, 95.6, 93.7, 90.4: the chain of 4. The choice
    runs under jit with the profile a traced leaf."""
    costs = TierCosts.table([1.0, 1.25, 1.35, 1.45])
    reach = np.cumprod(MEASURED)
    assert 1 + reach.sum() == pytest.approx(1.605, abs=1e-3)
    flat = Adaptive((0, 1, 2, 4), costs, prior=MEASURED[0], explore=0)
    assert int(flat.tier(fake_state())) == 1
    shaped = Adaptive((0, 1, 2, 4), costs, prior=np.float32(MEASURED), explore=0)
    assert int(jax.jit(lambda a: a.tier(fake_state()))(shaped)) == 3


def test_a_batch_carries_its_counts_in_the_priors_shape():
    """`Adaptive.warmed` through `adaptive_prior.learned`: profile (0.3, 0.4), weight 2, a
    batch that took 6 of 10 at depth 1 and 1 of 2 at depth 2: depth 1 (6 + 0.6) / 12 = 0.55,
    depth 2 (1 + 2 h) / 4, h = sigmoid(logit 0.55 + logit 0.4 - logit 0.3); the same shape
    and dtype (the compiled loop is reused). A rate stays a rate; tree counts (width 2) are
    read as the top candidate's, 1 - (1 - 0.6)^(1/2), before the shrink; a depth never
    reached keeps its anchor."""
    per_row = dict(accepted_at_position=[[6, 1]], reached_at_position=[[10, 2]])
    shaped = Adaptive((0, 1, 2), TierCosts.table([1.0, 1.3, 1.6]), np.float32([0.3, 0.4]),
                      weight=2.0)  # fmt: skip
    got = shaped.warmed(per_row).prior
    h = sigmoid(logit(0.55) + logit(0.4) - logit(0.3))
    np.testing.assert_allclose(got, [0.55, (1 + 2 * h) / 4], rtol=1e-5)
    assert got.shape == (2,) and got.dtype == np.float32
    flat = Adaptive((0, 1, 2), TierCosts.table([1.0, 1.3, 1.6]), 0.3, weight=2.0)
    flat = flat.warmed(per_row)
    assert isinstance(flat.prior, float) and flat.prior == pytest.approx(0.55)
    top = 1 - 0.4**0.5
    tree = Adaptive((0, 3, 8), TierCosts.table([1.0, 1.3, 1.6]), np.float32([0.3, 0.4, 0.5]),
                    weight=2.0, trees=(TreeShape(3, 2, 2), TreeShape(8, 4, 2)))  # fmt: skip
    got = tree.warmed(dict(accepted_at_position=[[6]], reached_at_position=[[10]])).prior
    first = (10 * top + 0.6) / 12
    second = sigmoid(logit(first) + logit(0.4) - logit(0.3))
    third = sigmoid(logit(second) + logit(0.5) - logit(0.4))
    np.testing.assert_allclose(got, [first, second, third], rtol=1e-5)


def test_tree_ranks_anchor_on_the_profile():
    """Nothing seen, profile (0.4, 0.6), two ranks: depth 1 the geometric (0.4, 0.24); depth
    2 each rank shifted by logit 0.6 - logit 0.4 (log 2.25): (0.6, sigmoid(logit 0.24 + log
    2.25)) = (0.6, 0.4154), over 1 in total, so scaled to sum 1."""
    counts = jnp.zeros((2, 2, 2))
    got = np.asarray(adaptive_trees.rank_acceptance(counts, np.float32([0.4, 0.6]), 4.0))
    second = np.array([0.6, sigmoid(logit(0.24) + math.log(2.25))])
    np.testing.assert_allclose(got, [[0.4, 0.24], second / second.sum()], rtol=1e-5)


def test_a_profile_is_checked():
    for bad in ([], [0.3, 1.0], [[0.3]], [0.0]):
        with pytest.raises(ValueError, match='give an acceptance rate in'):
            adaptive_prior.profile(bad)


def test_a_measured_file_gives_a_profile(tmp_path):
    """Depths reached in at least `MIN_REACHED` rounds, from depth 1 down to the first that
    is not; a count above its reached refused."""
    counts = dict(depth_1=0.3, accepted_at_position=[30, 12, 9, 5],
                  reached_at_position=[100, 30, 20, 9])
    card = dict(kind='lm', target='embedded', by_lookup={'0': counts},
                measured=dict(sets=['qa'], start=5, prompts=5, chain=4))
    (tmp_path / measured.FILE).write_text(json.dumps(card))
    rates, _ = measured.prior(str(tmp_path), 'lm', 0)
    assert rates == (0.3, 0.4, 0.45)  # Depth 4 reached 9 times: left to the engine.
    counts['accepted_at_position'] = [30, 31, 9, 5]
    (tmp_path / measured.FILE).write_text(json.dumps(card))
    with pytest.raises(measured.MeasuredPriorError, match='31 accepted of 30 reached'):
        measured.prior(str(tmp_path), 'lm', 0)
