"""Adaptive draft lengths (decoding/adaptive.py): the tier choice against hand-computed optima,
greedy equality with AR, the target's law by Monte Carlo, one compile for every cost table."""

import dataclasses
import types

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import decoding
from spec_jax.costs import calibration
from spec_jax.decoding import adaptive, engine
from spec_jax.decoding.adaptive import Adaptive, TierCosts
from spec_jax.decoding.build import (
    CHIP_BATCHES,
    adaptive_config,
    adaptive_of,
    chip_tier_costs,
    platform_chip,
)
from spec_jax.decoding.drafters import Eagle3Drafter, LMDrafter
from spec_jax.decoding.host import loop_rows
from spec_jax.decoding.state import DecodeSettings
from spec_jax.decoding.stats import Stats, summarize
from spec_jax.decoding.trees import TreeShape
from spec_jax.sampling import Sampler
from spec_jax.testing import loop_copies, random_params, tiny
from tests.decoding.test_speculative import PROMPT, N, assert_follows, token_laws

TIERS = (0, 1, 2, 4)
COSTS = TierCosts.table([1.0, 1.3, 1.6, 2.4])


# ---- the choice, by hand ---------------------------------------------------------------------
def choice(alpha_a, costs=COSTS, context=0.0, batch=1, room=100):
    """The tier index `adaptive` picks for `batch` live rows of flat per-depth acceptance."""
    alpha_ba = jnp.asarray([alpha_a] * batch, jnp.float32)
    live_b, room_b = jnp.ones(batch, bool), jnp.full(batch, room)
    moments = adaptive.expected_tokens(alpha_ba, TIERS, room_b)
    seconds_k = costs.seconds(batch, jnp.float32(context))
    return int(adaptive.choose(adaptive.finish_seconds(moments, live_b, room_b, seconds_k)))


def test_expected_tokens_by_hand():
    """Acceptance 0.8 at every depth: tier k emits 1 + 0.8 + ... + 0.8^k, its square
    1 + 3(0.8) + 5(0.64) + ...; a row with room for 2 tokens gets at most 1.8 (square
    1 + 2.4) from any tier."""
    got = adaptive.expected_tokens(jnp.full((2, 4), 0.8), TIERS, jnp.array([100, 2]))
    want_mean = [[1, 1.8, 2.44, 3.3616], [1, 1.8, 1.8, 1.8]]
    want_square = [[1, 3.4, 6.6, 6.6 + 7 * 0.512 + 9 * 0.4096], [1, 3.4, 3.4, 3.4]]
    np.testing.assert_allclose(np.asarray(got), [want_mean, want_square], rtol=1e-6)


def simulated_rounds(alpha, k, batch, room, batches, rng):
    """Rounds until every row of a batch emitted `room` tokens, a chain of k drafts at
    acceptance `alpha` a depth, averaged over `batches` simulated batches."""
    left = np.full((batches, batch), room)
    rounds = np.zeros(batches)
    while (left > 0).any():
        rounds += (left > 0).any(1)
        accepted = np.cumprod(rng.random((batches, batch, k)) < alpha, axis=2).sum(2)
        left = np.maximum(left - 1 - accepted, 0)
    return rounds.mean()


@pytest.mark.parametrize('alpha,k', [(0.35, 1), (0.5, 2), (0.8, 4)])
def test_finish_rounds_against_a_simulated_batch(alpha, k):
    """The rounds `finish_seconds` predicts for 64 tokens (unit costs) within 5% of 2,000
    simulated batches (their mean's standard error under 0.2%) at batch 1 and 8. The
    bound has the power to catch the tokens-per-round reading (room / mean tokens): at
    batch 8 it predicts 7-16% fewer rounds than the simulation (47.4 for 51.1 at 0.35)."""
    rng = np.random.default_rng(0)
    for batch in (1, 8):
        room_b = jnp.full(batch, 64)
        moments = adaptive.expected_tokens(jnp.full((batch, k), alpha), (k,), room_b)
        got = float(adaptive.finish_seconds(moments, room_b > 0, room_b, jnp.ones(1))[0])
        want = simulated_rounds(alpha, k, batch, 64, 2000, rng)
        naive = 64 / float(moments[0, 0, 0])
        assert got == pytest.approx(want, rel=0.05), (batch, got, want)
        if batch == 8:
            assert naive < 0.93 * want, (naive, want)


def test_choice_against_the_hand_computed_optimum():
    """Costs (1, 1.3, 1.6, 2.4) per round for draft lengths (0, 1, 2, 4):
    - acceptance 0.8: tokens (1, 1.8, 2.44, 3.3616), per second (1, 1.385, 1.525, 1.401):
      draft length 2, an interior optimum;
    - acceptance 0.2: tokens (1, 1.2, 1.24, 1.2496), per second (1, 0.923, 0.775, 0.521):
      AR wins;
    - acceptance 0.8 and 2e-4, 4e-4, 8e-4 s per context token on the three speculative tiers:
      at context 1,000 (costs 1, 1.5, 2.0, 3.2; per second 1, 1.2, 1.22, 1.05) still draft
      length 2; at context 4,000 (1, 2.1, 3.2, 5.6; per second 1, 0.857, 0.763, 0.600) AR;
    - a compute-bound batch: costs (1, 2, 3, 5) at batch 8 and the first table at batch 1;
      at batch 8 AR (1, 0.9, 0.81, 0.67), at batch 1 length 2, and batch 4 interpolated
      (4/7 of the way: 1, 1.71, 2.37, 3.90; per second 1, 1.05, 1.03, 0.86) length 1."""
    assert choice([0.8] * 4) == 2
    assert choice([0.2] * 4) == 0
    long = TierCosts.table([1.0, 1.3, 1.6, 2.4], [0.0, 2e-4, 4e-4, 8e-4])
    assert choice([0.8] * 4, long, context=1000) == 2
    assert choice([0.8] * 4, long, context=4000) == 0
    by_batch = TierCosts.table([[1.0, 1.0], [1.3, 2.0], [1.6, 3.0], [2.4, 5.0]], batch_n=(1, 8))
    assert [choice([0.8] * 4, by_batch, batch=b) for b in (1, 4, 8)] == [2, 1, 0]
    # Depth-varying acceptance: 0.95 then 0.3 -> tokens (1, 1.95, 2.235, 2.33): length 1.
    assert choice([0.95, 0.3, 0.3, 0.3]) == 1


def test_a_batch_waits_for_its_slowest_row():
    """Acceptance 0.35, costs (1, 1.3, 1.6, 2.4), 64 tokens a row: one row gains from a
    draft a round (1.35 tokens in 1.3 s: 47.4 rounds, 61.6 s against AR's 64), eight rows
    do not (a round of tier 1 emits 1.35 +- 0.477 a row; the last of 8 rows needs
    47.4 + 1.43 x 2.46 = 50.9 rounds, 66.2 s; tier 2 47.9 rounds, 76.7 s)."""
    assert choice([0.35] * 4, room=64) == 1
    assert choice([0.35] * 4, batch=8, room=64) == 0


def test_acceptance_estimate_by_hand():
    """Counts [[3, 1], [0, 0]] accepted of [[4, 3], [0, 0]] examined, prior 0.5, weight 2:
    pooled depth 1 (3 + 1) / 6 = 2/3, depth 2 (1 + 4/3) / 5 = 7/15; row 0 (3 + 4/3) / 6 and
    (1 + 14/15) / 5; row 1 (nothing seen) the pooled rates."""
    got = adaptive.acceptance(jnp.array([[3, 1], [0, 0]]), jnp.array([[4, 3], [0, 0]]), 0.5, 2.0)
    want = [[(3 + 4 / 3) / 6, (1 + 14 / 15) / 5], [2 / 3, 7 / 15]]
    np.testing.assert_allclose(np.asarray(got), want, rtol=1e-6)


def fake_state(committed, blocks=0, accepted=0, reached=0):
    """What `Adaptive.tier` reads of a DecodeState: one live row, room for 100 tokens."""
    stats = Stats.zeros(1, 4, 8).replace(
        blocks=jnp.array([blocks]), accepted_at_ba=jnp.full((1, 4), accepted),
        reached_at_ba=jnp.full((1, 4), reached))  # fmt: skip
    return types.SimpleNamespace(
        stats=stats, committed_b=jnp.array([committed]), limit_b=jnp.array([200]),
        num_out_b=jnp.array([100]), done_b=jnp.array([False]))  # fmt: skip


def test_tier_from_the_run_and_its_context():
    """`Adaptive.tier` on a state: 40 of 50 examined accepted at each depth (with the prior
    0.8 the estimate is 0.8) gives length 2 at context 1,000 and AR at 4,000; with
    nothing seen it follows the prior (0.2: AR); every 4th round looks one tier up when
    the look pays (`look_pays`: 5% of the time it would save at an acceptance 1.645
    standard errors up against 95% of its price): with nothing seen (0.2 + 1.645 x 0.2 =
    0.53: tier 1 finishes in 85.0 s for AR's 100; the look's price 1.3 (1 - 100 / 108.3) =
    0.1 s: 0.75 > 0.095), not after 10 of 50 accepted at every depth (0.29: tier 1 100.8 s,
    no saving), again after 14 (0.280 AR chosen, tier 1 101.6 s; 0.380: 94.2 s, 0.29 >
    0.019)."""
    long = TierCosts.table([1.0, 1.3, 1.6, 2.4], [0.0, 2e-4, 4e-4, 8e-4])
    run = Adaptive(TIERS, long, prior=0.8, weight=4.0, explore=0)
    assert int(run.tier(fake_state(1000, 9, 40, 50))) == 2
    assert int(run.tier(fake_state(4000, 9, 40, 50))) == 0
    low = Adaptive(TIERS, COSTS, prior=0.2, explore=4)
    assert int(low.tier(fake_state(10, blocks=2))) == 0
    assert int(low.tier(fake_state(10, blocks=3))) == 1  # Round 4: one tier up.
    assert int(low.tier(fake_state(10, blocks=3, accepted=10, reached=50))) == 0
    assert int(low.tier(fake_state(10, blocks=3, accepted=14, reached=50))) == 1


def test_the_choice_prices_the_drafters_catch_up():
    """A drafting tier first pays the drafter's lag (`Drafter.lag`) at the catch-up price:
    one row, room 100, acceptance 0.8 at context 1,000 finishes in 100 s by AR and 81.97 s
    by length 2 (100 / 2.44 rounds of 2.0 s), the best; at 0.01 s a token a lag of 1,700
    (+17 s) still drafts, one of 1,900 (+19 s: 100.97 s; length 1 102.3 s) runs AR, and
    so does one of 1,700 when any catch-up costs 2 s besides (+19 s; 1,500: +17 s drafts).
    A look pays it too, and is taken only when it pays: round 4's (length 1 at the
    optimistic 0.53: 85.0 s against AR's 100, as in the test above) at 0.1 s a token is
    taken at a lag of 6 (0.05 x 14.4 s saved > 0.95 x (0.6 + 0.1) s), not at 7 (0.05 x
    14.3 < 0.95 x 0.8), where the rule before it (look while the tier above wins at the
    hopeful reading) looked up to a lag of 149."""
    long = TierCosts.table([1.0, 1.3, 1.6, 2.4], [0.0, 2e-4, 4e-4, 8e-4], catch_up_n=0.01)
    run = Adaptive(TIERS, long, prior=0.8, weight=4.0, explore=0)
    state = fake_state(1000, 9, 40, 50)
    assert int(run.tier(state)) == 2
    assert int(run.tier(state, jnp.array([1700]))) == 2
    assert int(run.tier(state, jnp.array([1900]))) == 0
    based = dataclasses.replace(run, costs=dataclasses.replace(
        long, catch_up_base_n=jnp.array([2.0])))  # fmt: skip
    assert int(based.tier(state, jnp.array([1500]))) == 2
    assert int(based.tier(state, jnp.array([1700]))) == 0
    low = Adaptive(TIERS, TierCosts.table([1.0, 1.3, 1.6, 2.4], catch_up_n=0.1), prior=0.2,
                   explore=4)  # fmt: skip
    due = fake_state(10, blocks=3)
    assert int(low.tier(due)) == 1 and int(low.tier(due, jnp.array([6]))) == 1
    assert int(low.tier(due, jnp.array([7]))) == 0
    hopeful = dataclasses.replace(low, optimism=float('inf'))  # The look whenever it may win.
    assert int(hopeful.tier(due, jnp.array([7]))) == 1


def test_a_job_carries_its_prior_to_its_next_batch():
    """`Adaptive.warmed`: the prior from an earlier batch's depth-1 counts, pooled over its
    rows and shrunk toward the prior as the engine reads them (4 of 6 taken, weight 4 at
    0.7: (4 + 2.8) / 10 = 0.68; tree mode, width 2: the top candidate's rate under the
    geometric prior, 1 - (1/3)^(1/2) = 0.4226, shrunk: 0.5336), unchanged after a batch that
    drafted nothing. It decides the next batch's first round: one row, room 100, context
    10, a 100-token lag at 0.01 s a token: at the 0.7 default a chain of 2 (100 / 2.19
    rounds of 1.6 s: 73.1 s, + 1 s catch-up) beats AR's 100 s; after a batch that took 1 of
    10 ((1 + 2.8) / 14 = 0.271), AR (a chain of 1: 100 / 1.271 x 1.3 + 1 = 103 s)."""
    per_row = dict(accepted_at_position=[[3, 1], [1, 0]], reached_at_position=[[4, 3], [2, 1]])
    cold = Adaptive(TIERS, TierCosts.table([1.0, 1.3, 1.6, 2.4], catch_up_n=0.01), explore=0)
    assert cold.warmed(per_row).prior == pytest.approx(0.68)
    tree = Adaptive((0, 3, 8), COSTS, trees=(TreeShape(3, 2, 2), TreeShape(8, 4, 2)))
    assert tree.warmed(per_row).prior == pytest.approx((6 * (1 - (1 / 3) ** 0.5) + 2.8) / 10)
    assert cold.warmed(dict(accepted_at_position=[[0, 0]], reached_at_position=[[0, 0]])) == cold
    fresh, lag = fake_state(10), jnp.array([100])
    assert int(cold.tier(fresh, lag)) == 2
    low = cold.warmed(dict(accepted_at_position=[[1]], reached_at_position=[[10]]))
    assert low.prior == pytest.approx(3.8 / 14) and int(low.tier(fresh, lag)) == 0


def test_settings_are_checked():
    cfg = tiny.TARGET
    with pytest.raises(ValueError, match='the last one num_draft'):
        decoding.Engine(cfg, tiny.DECODE, LMDrafter(tiny.DRAFT), 3,
                        adaptive=Adaptive(TIERS, COSTS))  # fmt: skip
    with pytest.raises(ValueError, match='one per tier'):
        decoding.Engine(cfg, tiny.DECODE, LMDrafter(tiny.DRAFT), 4,
                        adaptive=Adaptive(TIERS, TierCosts.table([1.0, 2.0])))  # fmt: skip
    c = adaptive_config(tiers='auto')
    got = adaptive_of(c, 'chain', 5)
    assert got.tiers == (0, 1, 2, 4, 5) and np.shape(got.costs.base_kn) == (5, 1)
    c.tiers, c.costs = '0,2', '1,1.5'
    assert adaptive_of(c, 'chain', 2).tiers == (0, 2)
    with pytest.raises(ValueError, match='one number per tier'):
        adaptive_of(adaptive_config(tiers='0,2', costs='1'), 'chain', 2)
    with pytest.raises(ValueError, match="set spec.mode to 'chain' or 'tree'"):
        adaptive_of(c, 'ar', 2)
    tree = TreeShape(8, 4, 2)  # Tree mode's tiers: test_adaptive_tree.py.
    assert adaptive_of(adaptive_config(tiers='0,8'), 'tree', 4, tree=tree).tiers == (0, 8)
    with pytest.raises(ValueError, match='in tree mode'):
        decoding.Engine(cfg, tiny.DECODE, Eagle3Drafter(tiny.HEAD), tree=TreeShape(8, 4, 2),
                        adaptive=Adaptive((0, 2, 4), TierCosts.table([1.0, 1.5, 2.0])))


def test_the_relative_model_prices_a_buffering_head_by_its_windows():
    """The relative model (units of an AR step), by hand at verify 0.2, draft 0.1: a draft
    LM's AR tier pays nothing and its catch-up 0.003 a token; a head that buffers until it
    drafts pays nothing a step either, and drafting at a lag of L ceil(L / 16) windows of 2
    draft calls, priced 0.2 + 0.2 L / 16 (an upper reading by at most a window); a drafter
    that follows every step a draft call."""
    c = adaptive_config(tiers='0,1,2')
    c.verify, c.draft, c.catch_up = 0.2, 0.1, 0.003
    lm, head, other = (adaptive_of(c, 'chain', 2, drafter=d).costs
                       for d in ('lm', 'eagle3', 'dflash'))  # fmt: skip
    for costs in (lm, head):
        np.testing.assert_allclose(np.asarray(costs.base_kn)[:, 0], [1.0, 1.3, 1.6], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(other.base_kn)[:, 0], [1.1, 1.3, 1.6], rtol=1e-6)
    assert float(lm.catch_up(1, jnp.int32(100))) == pytest.approx(0.3)
    np.testing.assert_allclose([float(head.catch_up(1, jnp.int32(lag))) for lag in (0, 1, 16, 40)],
                               [0.0, 0.2125, 0.4, 0.7], rtol=1e-6)  # fmt: skip


def test_chip_costs():
    """'chip:h200' reads the calibrated model (spec_jax.costs): a round costs more with
    each tier (more tokens verified, more draft calls; AR's step alone: the draft LM follows
    for free) and with each batch size; an uncalibrated chip and an unpriced drafter are refused."""
    c = adaptive_config(tiers='0,1,2', costs='chip:h200')
    got = adaptive_of(c, 'chain', 2, lambda chip, tiers: chip_tier_costs(
        chip, tiers, tiny.TARGET, LMDrafter(tiny.DRAFT), 'lm', 64))  # fmt: skip
    base = np.asarray(got.costs.base_kn)
    assert base.shape == (3, len(CHIP_BATCHES))
    assert (np.diff(base, axis=0) > 0).all() and (np.diff(base, axis=1) > 0).all()
    # A draft LM's catch-up: a 16-wide forward (`LMDrafter.catch_up`), then a token's share
    # of its widest prefill chunk a token.
    catch_up, least = (np.asarray(v) for v in (got.costs.catch_up_n, got.costs.catch_up_base_n))
    assert (catch_up > 0).all() and (np.diff(catch_up) > 0).all() and (least > catch_up).all()
    lm = calibration.for_chip('h200', tiny.TARGET, draft=tiny.DRAFT)
    np.testing.assert_allclose(least, [lm.feed_s(b, 16, 64) for b in CHIP_BATCHES], rtol=1e-6)
    # An EAGLE-3 head as the adaptive engine runs it (`deferred()`: 16-wide windows over up
    # to 256 buffered positions): AR's step alone (it runs nothing until it drafts), and a
    # catch-up at lag L of ceil(L / 16) windows of its layer (no logits), priced a window
    # plus a 16th of one a token; the tiers above it its chains.
    head = chip_tier_costs('h200', (0, 1), tiny.TARGET, Eagle3Drafter(tiny.HEAD), 'eagle3', 64)
    m = calibration.for_chip('h200', tiny.TARGET, head=tiny.HEAD)
    share = [m.follow_s(b, 64, 16) / 16 for b in CHIP_BATCHES]
    assert all(s < m.follow_s(b, 64) for s, b in zip(share, CHIP_BATCHES))
    ar = [m.round_s(calibration.Tier('ar'), b, 64) for b in CHIP_BATCHES]
    np.testing.assert_allclose(np.asarray(head.base_kn)[0], ar, rtol=1e-6)
    np.testing.assert_allclose(np.asarray(head.catch_up_n), share, rtol=1e-6)
    np.testing.assert_allclose([float(head.catch_up(b, jnp.int32(lag))) for b, lag in
                                ((1, 1), (8, 12), (8, 16), (8, 0))],
                               [17 * share[0], 28 * share[3], 32 * share[3], 0.0], rtol=1e-5)
    # One that runs a window whenever 16 are buffered: a 16th of it a step, and at lag L
    # the window less L 16ths of it (the AR tier paid those).
    full = chip_tier_costs('h200', (0, 1), tiny.TARGET,
                           Eagle3Drafter(tiny.HEAD, follow_every=16), 'eagle3', 64)
    np.testing.assert_allclose(np.asarray(full.base_kn)[0], np.add(ar, share), rtol=1e-6)
    np.testing.assert_allclose([float(full.catch_up(b, jnp.int32(lag))) for b, lag in
                                ((1, 1), (8, 12), (8, 16), (8, 0))],
                               [15 * share[0], 4 * share[3], 0.0, 0.0], rtol=1e-5, atol=1e-12)
    np.testing.assert_allclose(np.asarray(head.base_kn)[1], [
        m.round_s(calibration.Tier.chain(1, 'eagle3'), b, 64) for b in CHIP_BATCHES], rtol=1e-6)
    with pytest.raises(ValueError, match='uncalibrated'):
        chip_tier_costs('v5e', (0, 1), tiny.TARGET, LMDrafter(tiny.DRAFT), 'lm', 64)
    with pytest.raises(ValueError, match="prices drafters 'lm' and 'eagle3'"):
        chip_tier_costs('h200', (0, 1), tiny.TARGET, None, 'ngram', 64)


def test_cpu_curve_chooses_ar(models, greedy_ar):
    """costs='auto' on this CPU reads 'chip:cpu' (the curve fitted from this machine's bench,
    spec_jax/assets/costs/cpu_2026-12-07.json). At tiny shapes, batch 1, 64 slots, tiers
    (0, 1, 3) with the draft LM it prices a round at 0.0073, 0.871, 0.874 ms: the chain
    round's engine work (0.86 ms, timed) dwarfs the tiny forwards. Even at acceptance 0.99
    (tokens 1, 1.99, 3.94) that is 137, 2.3, 4.5 tokens a ms: AR, by hand and in the engine
    (prior 0.99, weight 50, no exploration: nothing drafted, AR's tokens)."""
    lm = LMDrafter(tiny.DRAFT)
    price = lambda chip, tiers: chip_tier_costs(chip, tiers, tiny.TARGET, lm, 'lm', 64)  # noqa: E731
    assert platform_chip() == 'cpu'
    auto = adaptive_of(adaptive_config(tiers='0,1,3', costs='auto'), 'chain', 3, price)
    named = adaptive_of(adaptive_config(tiers='0,1,3', costs='chip:cpu'), 'chain', 3, price)
    np.testing.assert_array_equal(np.asarray(auto.costs.base_kn), np.asarray(named.costs.base_kn))
    ms = np.asarray(auto.costs.seconds(1, jnp.float32(0))) * 1e3
    np.testing.assert_allclose(ms, [0.0073, 0.871, 0.874], rtol=0.01)
    tokens = np.array([1.0, 1.99, 1 + 0.99 + 0.99**2 + 0.99**3])
    assert int(np.argmax(tokens / ms)) == 0
    eng = decoding.Engine(tiny.TARGET, tiny.DECODE, lm, 3, adaptive=Adaptive(
        (0, 1, 3), auto.costs, prior=0.99, weight=50.0, explore=0))  # fmt: skip
    result = decoding.generate(eng, decoding.Params(*models), tiny.PROMPTS)
    assert result.tokens == greedy_ar['mixed']
    assert result.stats['per_row']['drafted'] == [0, 0, 0]


def test_draft_lm_catches_up_over_the_rounds_it_followed(models):
    """A draft LM that followed AR rounds (`follow`: nothing fed) and then proposes drafts
    what one fed the whole text in its prefill drafts (q within float rounding, the same
    tokens): rows 0, 7 and 23 tokens behind, catch-up forwards of 5 (0, 2 and 5 of them),
    the slots past each row's text holding stale tokens. Without the catch-up the lagging
    rows' q differ (the check can fail)."""
    _, draft_params = models
    bucket, slots, a = 8, 48, 3
    history = np.random.default_rng(0).integers(1, tiny.V, (3, slots)).astype(np.int32)
    prompt_len = jnp.array([3, 8, 5], jnp.int32)
    committed = prompt_len + jnp.array([1, 8, 24], jnp.int32)  # Gaps C - 1 - P: 0, 7, 23.
    history, key = jnp.asarray(history), jax.random.split(jax.random.key(1), 3)
    lagging = LMDrafter(tiny.DRAFT, catch_up=5)
    state = lagging.init(draft_params, history, prompt_len, bucket)
    state = lagging.follow(draft_params, state, history, prompt_len, committed, None)
    _, x_ba, q_bav = lagging.propose(draft_params, state, history, committed, key, a,
                                     jax.nn.softmax)  # fmt: skip
    fed = LMDrafter(tiny.DRAFT)  # Prefill over every committed token: no gap to catch up.
    ref = fed.init(draft_params, history, committed, int(committed.max()) + 1)
    _, want_x, want_q = fed.propose(draft_params, ref, history, committed, key, a, jax.nn.softmax)
    np.testing.assert_allclose(np.asarray(q_bav), np.asarray(want_q), atol=2e-6)
    np.testing.assert_array_equal(np.asarray(x_ba), np.asarray(want_x))
    stale = state.set_lengths(committed - 1)  # As if no tokens were missed.
    q_stale = lagging.propose(draft_params, stale, history, committed, key, a, jax.nn.softmax)[2]
    gap_b = np.abs(np.asarray(q_stale) - np.asarray(want_q)).max(axis=(1, 2))
    assert gap_b[0] < 2e-6 and (gap_b[1:] > 1e-3).all(), gap_b


@pytest.mark.parametrize('window, capacity, lag',
                         [(4, 0, 2), (2, 8, 6), (2, 16, [9, 14, 11])])  # fmt: skip
def test_a_buffering_head_drafts_what_a_following_head_drafts(models, window, capacity, lag):
    """An EAGLE-3 head that buffers AR steps (the adaptive engine's kind) and one that runs
    over every step draft the same after 6 steps (q within float rounding, the same
    tokens), rows at different positions: with 4-wide windows and room for 4, the buffer
    ran once when full and once before the proposal (lag 2); with 2-wide windows and room
    for 8 (the lazy head: `deferred()` has 16 and 512; the prompt bucket of 8 does not fit
    below 8), never before the proposal, which ran 3 windows over the 6 (lag 6); with room
    for 16 the prompts too (lengths 3, 8, 5: lags 9, 14, 11, 7 windows, rows' last
    positions in different windows). Without that last run the buffering head's q differ
    (the check can fail)."""
    head_params = tiny.head(models[0])
    bucket, slots, a, batch = 8, 48, 3, 3
    rng = np.random.default_rng(3)
    history = jnp.asarray(rng.integers(1, tiny.V, (batch, slots)), jnp.int32)
    taps_shape = (batch, bucket, len(tiny.HEAD.taps), tiny.HEAD.target_width)
    taps = jnp.asarray(rng.normal(size=(7, *taps_shape)), jnp.float32)  # Any taps will do.
    prompt_len, key = jnp.array([3, 8, 5], jnp.int32), jax.random.split(jax.random.key(4), 3)
    every, buffering = Eagle3Drafter(tiny.HEAD), Eagle3Drafter(tiny.HEAD).deferred()
    assert buffering.follow_every == 16 and buffering.deferred() is buffering
    assert buffering.capacity == 512
    buffering = dataclasses.replace(buffering, follow_every=window, capacity=capacity)
    states = [d.init(head_params, history, prompt_len, bucket, taps[0]) for d in (every,
                                                                                 buffering)]
    committed = prompt_len
    for step in range(1, 7):
        start, committed = committed, committed + 1
        states = [d.follow(head_params, st, history, start, committed, taps[step][:, :1])
                  for d, st in zip((every, buffering), states)]  # fmt: skip
    np.testing.assert_array_equal(np.asarray(buffering.lag(states[1], committed)), lag)
    np.testing.assert_array_equal(np.asarray(every.lag(states[0], committed)), 0)
    (_, want_x, want_q), (_, x_ba, q_bav) = (
        d.propose(head_params, st, history, committed, key, a, jax.nn.softmax)
        for d, st in zip((every, buffering), states))  # fmt: skip
    np.testing.assert_allclose(np.asarray(q_bav), np.asarray(want_q), atol=2e-6)
    np.testing.assert_array_equal(np.asarray(x_ba), np.asarray(want_x))
    skipped = states[1].replace(buffered_b=jnp.zeros(batch, jnp.int32))  # Nothing buffered.
    q_skip = buffering.propose(head_params, skipped, history, committed, key, a,
                               jax.nn.softmax)[2]  # fmt: skip
    assert np.abs(np.asarray(q_skip) - np.asarray(want_q)).max() > 1e-3


def test_a_deferred_draft_lm_prefills_at_its_first_proposal(models):
    """`deferred()` (the adaptive engine's): `init` feeds nothing (lag C - 1), the first
    proposal catches up from slot 0, chunks of 11 while the widest gap is 11 or more, then
    of 5, then 3 (gaps 3, 15, 28: every loop runs), and drafts what a prefilled draft
    drafts (q within float rounding, the same tokens)."""
    _, draft_params = models
    bucket, slots, a = 8, 48, 3
    history = np.random.default_rng(1).integers(1, tiny.V, (3, slots)).astype(np.int32)
    prompt_len = jnp.array([3, 8, 5], jnp.int32)
    committed = prompt_len + jnp.array([1, 8, 24], jnp.int32)
    history, key = jnp.asarray(history), jax.random.split(jax.random.key(2), 3)
    lazy = LMDrafter(tiny.DRAFT, catch_up=3, prefill_chunks=(11, 5))
    assert lazy.deferred() is lazy and LMDrafter(tiny.DRAFT).deferred().prefill_chunks
    state = lazy.init(draft_params, history, prompt_len, bucket)
    np.testing.assert_array_equal(np.asarray(state.lengths), 0)
    np.testing.assert_array_equal(np.asarray(lazy.lag(state, committed)), committed - 1)
    _, x_ba, q_bav = lazy.propose(draft_params, state, history, committed, key, a,
                                  jax.nn.softmax)  # fmt: skip
    fed = LMDrafter(tiny.DRAFT)
    ref = fed.init(draft_params, history, committed, int(committed.max()) + 1)
    np.testing.assert_array_equal(np.asarray(fed.lag(ref, committed)), 0)
    _, want_x, want_q = fed.propose(draft_params, ref, history, committed, key, a, jax.nn.softmax)
    np.testing.assert_allclose(np.asarray(q_bav), np.asarray(want_q), atol=2e-6)
    np.testing.assert_array_equal(np.asarray(x_ba), np.asarray(want_x))
    with pytest.raises(ValueError, match='descending distinct widths above catch_up'):
        LMDrafter(tiny.DRAFT, catch_up=16, prefill_chunks=(64, 16))


# ---- the engine ------------------------------------------------------------------------------
# One compiled loop for every run below: costs, prior, weight, explore and the sampler are
# leaves of the engine pytree (a second trace fails the test that causes it).
_LOOP = jax.jit(chex.assert_max_traces(engine.decode_loop.__wrapped__, n=1))
LOOP_TIERS = (0, 1, 3)
ENGINE = decoding.Engine(tiny.TARGET, tiny.DECODE, LMDrafter(tiny.DRAFT), 3,
                         adaptive=Adaptive(LOOP_TIERS, TierCosts.relative(LOOP_TIERS)))
# Tier k costs 1 + 0.1 k per context token: at prior 0.7 and tiny.PROMPTS' mean context 4.33
# (costs 1, 1.43, 2.30; per second 1, 1.19, 1.10) length 1 wins, and at a mean context above
# 10 no length can pay even if every draft passes ((k + 1) / cost < 1).
LONG = TierCosts.table([1.0, 1.0, 1.0], [0.0, 0.1, 0.3])
# Prompts in tiny.PROMPTS' bucket (16), 12 tokens each: a mean context of 12 from round 1.
LONG_PROMPTS = [list(range(1, 13)), [8] * 12, [9, 3] * 6]


@pytest.fixture(scope='module')
def models():
    return tiny.target_params(), tiny.draft_params()


@pytest.fixture(scope='module')
def greedy_ar(models):
    dec = tiny.DECODE
    return {
        key: decoding.generate(decoding.Engine(tiny.TARGET, dec), decoding.Params(models[0]),
                               prompts).tokens  # fmt: skip
        for key, prompts in (('mixed', tiny.PROMPTS), ('long', LONG_PROMPTS))
    }  # fmt: skip


def run(models, prompts, engine_=ENGINE, seed=0, **changes):
    """The compiled loop on `prompts`: (token lists, summarized stats)."""
    settings = dict(costs=ENGINE.adaptive.costs, prior=0.7, weight=4.0, explore=16)
    eng = engine_.replace(adaptive=Adaptive(LOOP_TIERS, **{**settings, **changes}))
    rows = loop_rows(eng, prompts)
    args = (*(jnp.asarray(x) for x in rows), jax.random.PRNGKey(seed))
    tokens_bo, num_b, stats = _LOOP(eng, *models, *args)
    tokens = [list(map(int, t[:n])) for t, n in zip(np.asarray(tokens_bo), np.asarray(num_b))]
    return tokens, summarize(stats)


def test_greedy_adaptive_equals_greedy_ar(models, greedy_ar):
    """Rows of different prompt lengths that diverge; the relative costs mix tiers: some
    round drafted (drafted > 0) and some round drafted fewer than 3 (drafted < 3 rounds)."""
    tokens, stats = run(models, tiny.PROMPTS)
    assert tokens == greedy_ar['mixed']
    rows = stats['per_row']
    assert sum(rows['drafted']) > 0
    assert any(d < 3 * b for d, b in zip(rows['drafted'], rows['blocks']))
    # The prior and the weight are leaves too: a confident prior, same loop, same tokens.
    assert run(models, tiny.PROMPTS, prior=0.99, weight=50.0)[0] == greedy_ar['mixed']


def test_greedy_adaptive_with_a_buffering_head_equals_greedy_ar(greedy_ar):
    """An EAGLE-3 head buffering its prompt and AR steps (32 at most, run over in 2-wide
    windows, as many as cover the row that lags most: prompts of 3, 9 and 1 tokens) in an
    adaptive chain mixing AR and drafting rounds (AR priced to win, a drafting round every
    third by exploration): AR's tokens, and the same drafts accepted as a head that runs
    over each step (buffer of 1): the buffered positions' entries are the ones the
    per-step windows write."""
    target = tiny.target_params()
    runs = []
    for every, capacity in ((1, 0), (2, 32)):
        eng = decoding.Engine(tiny.TARGET, tiny.DECODE,
                              Eagle3Drafter(tiny.HEAD, follow_every=every, capacity=capacity), 3,
                              adaptive=Adaptive(LOOP_TIERS, TierCosts.table([1.0, 1.9, 3.5]),
                                                prior=0.3, explore=3, optimism=float('inf')))
        runs.append(decoding.generate(eng, decoding.Params(target, tiny.head(target)),
                                      tiny.PROMPTS))  # fmt: skip
    for res in runs:
        rows = res.stats['per_row']
        assert res.tokens == greedy_ar['mixed']
        assert 0 < sum(rows['drafted']) and all(d < b for d, b in zip(rows['drafted'],
                                                                      rows['blocks']))
    assert runs[0].stats['per_row']['accepted'] == runs[1].stats['per_row']['accepted']


def test_ar_wins_then_the_engine_runs_ar_steps(models, greedy_ar):
    """Drafting costs 10x an AR step: every round is AR's (nothing drafted, one token a
    round after the prefill's), the tokens are AR's."""
    tokens, stats = run(models, tiny.PROMPTS, costs=TierCosts.table([1.0, 10.0, 10.0]),
                        explore=0)  # fmt: skip
    assert tokens == greedy_ar['mixed']
    assert stats['per_row']['drafted'] == [0, 0, 0]
    assert stats['per_row']['blocks'] == [len(t) - 1 for t in tokens]


def test_a_run_that_never_drafts_never_prefills_the_draft(models, greedy_ar):
    """The adaptive engine defers the draft LM's prefill: where AR wins every round the
    draft's cache is never fed (lengths 0 at the end), where a round drafts it was."""
    eng = ENGINE.replace(adaptive=dataclasses.replace(
        ENGINE.adaptive, costs=TierCosts.table([1.0, 10.0, 10.0]), explore=0))  # fmt: skip
    args = (*(jnp.asarray(x) for x in loop_rows(eng, tiny.PROMPTS)), jax.random.key(0))
    state = engine.prefill_call(eng, *models, *args)
    np.testing.assert_array_equal(np.asarray(state.draft.lengths), 0)
    tokens_bo, num_b, _, state = engine.rounds_call(eng, *models, state)
    np.testing.assert_array_equal(np.asarray(state.draft.lengths), 0)
    tokens = [list(map(int, t[:n])) for t, n in zip(np.asarray(tokens_bo), np.asarray(num_b))]
    assert tokens == greedy_ar['mixed']
    drafting = eng.replace(adaptive=ENGINE.adaptive)  # Relative costs: some rounds draft.
    state = engine.rounds_call(drafting, *models, engine.prefill_call(drafting, *models, *args))[3]
    assert (np.asarray(state.draft.lengths) > 0).all()


def test_long_context_turns_speculation_off(models, greedy_ar):
    """`LONG`: tiny.PROMPTS start drafting; prompts of 12 tokens (mean context above 10
    from the first round) never draft; both give AR's tokens."""
    short, s_stats = run(models, tiny.PROMPTS, costs=LONG, explore=0)
    long, l_stats = run(models, LONG_PROMPTS, costs=LONG, explore=0)
    assert short == greedy_ar['mixed'] and long == greedy_ar['long']
    assert sum(s_stats['per_row']['drafted']) > 0
    assert l_stats['per_row']['drafted'] == [0, 0, 0]


def test_sampled_rows_through_the_same_loop(models):
    """Temperature 1 (a leaf) through the same compiled loop: seeded, every row its limit."""
    sampled = ENGINE.replace(sampler=Sampler(temperature=1.0))
    a, _ = run(models, tiny.PROMPTS, sampled, seed=3)
    assert a == run(models, tiny.PROMPTS, sampled, seed=3)[0]
    assert [len(t) for t in a] == [tiny.DECODE.max_new_tokens] * 3


def test_adaptive_loop_copies_neither_cache(models):
    """The tiers' rounds (`engine.switch_rounds`) update the target's cache and the draft
    LM's or the EAGLE-3 head's in place: no per-round copy of a cache layer's keys or values
    (the draft's layer is the smaller). At batch 2: a cache of one row (batch 1, one KV
    head: this draft) is copied in every draft step, by the fixed chain too (XLA:CPU
    duplicates the write for the attention's squeezed read); the shipped drafts have 2 or
    more KV heads. The head's chain once returned its cache from before its steps, which
    XLA copied every drafting round (this check failed on it)."""
    prompts_bp = jnp.asarray([[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 0, 0, 0, 0, 0, 0]], jnp.int32)
    args = (prompts_bp, jnp.array([3, 2], jnp.int32), jnp.array([20, 20], jnp.int32),
            jnp.arange(2, dtype=jnp.int32), jax.random.key(0))  # fmt: skip
    hlo = engine.decode_loop.lower(ENGINE, *models, *args).compile().as_text()
    draft = tiny.DRAFT
    assert loop_copies(hlo, draft.num_kv_heads * ENGINE.slots(8) * draft.head_dim // 2) == []
    head = ENGINE.replace(drafter=Eagle3Drafter(tiny.HEAD))
    hlo = engine.decode_loop.lower(head, models[0], tiny.head(models[0]), *args).compile()
    small = tiny.HEAD.num_kv_heads * head.slots(8) * tiny.HEAD.head_dim // 2
    assert loop_copies(hlo.as_text(), small) == []


# ---- laws ------------------------------------------------------------------------------------
def test_adaptive_lossless_keeps_the_target_law():
    """Lossless SD with tiers (0, 1), costs (1, 1.2), prior 0.1, explore 2 whenever due
    (optimism inf), at T 1, N = 4000 rows of one prompt, 4 tokens (test_speculative's
    harness: TV bound 0.06 per token, where E[TV] <= 0.044 at N 4000). Round 1 is AR's step
    (at 0.1 the last of 4000 rows saves no round by drafting), round 2 explores one tier
    up and drafts 1 (at acceptance 1 it would finish in one round, 1.2 s for AR's 2):
    token 2 comes from an AR round the draft only followed (it catches up when round 2
    drafts), token 3 from a draft, a replacement after a rejection, or the bonus; rows that
    rejected finish with an AR round (room 1: a draft cannot help). Tokens 1-3 follow the
    target's law."""
    target = random_params(tiny.TARGET, seed=7, embed_scale=8.0)
    draft = random_params(tiny.DRAFT, seed=8, embed_scale=8.0)
    sampler = Sampler(temperature=1.0)
    dec = DecodeSettings(max_new_tokens=4, prompt_bucket=8, new_tokens_bucket=8)
    eng = decoding.Engine(tiny.TARGET, dec, LMDrafter(tiny.DRAFT), 1, sampler=sampler,
                          adaptive=Adaptive((0, 1), TierCosts.table([1.0, 1.2]), 0.1, explore=2,
                                            optimism=float('inf')))
    result = decoding.generate(eng, decoding.Params(target, draft), [PROMPT] * N, seed=5)
    rows = result.stats['per_row']
    assert set(rows['drafted']) == {1} and set(rows['blocks']) == {2, 3}  # AR, 1, AR.
    assert 0.1 < result.stats['acceptance_rate'] < 0.9  # Drafts accepted and rejected.
    laws = token_laws(target, draft, sampler, lambda p, q: p)
    assert_follows(np.array(result.tokens), laws)
