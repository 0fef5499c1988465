"""Adaptive trees: tiers of node budget chosen each round from an online acceptance estimate
per depth and rank (spec_jax/decoding/adaptive_trees.py)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import decoding, rules
from spec_jax.decoding import adaptive, adaptive_trees, engine, tree_budget
from spec_jax.decoding.adaptive import Adaptive, TierCosts, tree_tiers
from spec_jax.decoding.build import adaptive_config, adaptive_of
from spec_jax.decoding.drafters import Eagle3Drafter
from spec_jax.decoding.host import loop_rows
from spec_jax.decoding.state import DecodeSettings
from spec_jax.decoding.stats import summarize
from spec_jax.decoding.trees import TreeShape
from spec_jax.sampling import Sampler
from spec_jax.testing import random_params, tiny
from tests.decoding.test_speculative import PROMPT, N, assert_follows, token_laws

TREE = TreeShape(8, 4, 2)
SHAPES = tree_tiers(TREE, 'auto')  # 5, 6 and 8 nodes, depth 4, branch 2.
FIXED = TreeShape.fixed((0, 0, 0, 1, 1, 3))


def test_tree_tiers():
    assert [s.nodes for s in SHAPES] == [5, 6, 8] and SHAPES[-1] == TREE
    assert tree_tiers(TREE, '0,3,8') == (TreeShape(3, 2, 2), TREE)
    assert [s.parents for s in tree_tiers(FIXED, '0,3,6')] == [(0, 0, 0), FIXED.parents]
    a = adaptive_of(adaptive_config(tiers='auto'), 'tree', 4, tree=TREE)
    assert a.tiers == (0, 5, 6, 8) and a.trees == SHAPES
    # The relative model: tier M costs 1 + 0.18 (M - 1) + 0.15 levels (4 each here).
    np.testing.assert_allclose(a.costs.base_kn[:, 0], [1.15, 2.32, 2.5, 2.86], rtol=1e-6)
    eng = decoding.Engine(tiny.TARGET, tiny.DECODE, Eagle3Drafter(tiny.HEAD), tree=TREE,
                          adaptive=Adaptive((0, 8), TierCosts.table([1.0, 2.0])))  # fmt: skip
    assert eng.adaptive.trees == (TREE,)  # AR or the engine's tree.
    with pytest.raises(ValueError, match='tiers .0, each tree'):
        decoding.Engine(tiny.TARGET, tiny.DECODE, Eagle3Drafter(tiny.HEAD), tree=TREE,
                        adaptive=Adaptive((0, 4), TierCosts.table([1.0, 2.0])))  # fmt: skip
    with pytest.raises(ValueError, match='give trees within'):
        big = TreeShape(13, 7, 3)
        decoding.Engine(tiny.TARGET, tiny.DECODE, Eagle3Drafter(tiny.HEAD), tree=TREE,
                        adaptive=Adaptive((0, 13, 8), TierCosts.table([1.0, 2.0, 2.0]),
                                          trees=(big, TREE)))  # fmt: skip


def test_expected_tokens_by_hand():
    """Rank probabilities 0.6, 0.2 at every depth. The dynamic (8, 4, 2) keeps the 7 best of
    its pool: 0.6, 0.36, 0.216, 0.2, 0.1296, 0.12, 0.12 (sum 1.7456), so P(N > d) for d = 1..4
    is 0.8, 0.6, 0.216, 0.1296 and E N^2 = 1 + 3(0.8) + 5(0.6) + 7(0.216) + 9(0.1296); the
    static tree (0, 0, 0, 1, 1, 3) reaches 0.6, 0.2, 0.36, 0.12, 0.216 (sum 1.496; by depth
    0.8, 0.48, 0.216); a row with room for 2 tokens counts depth 1 only (1 + 0.8, square
    1 + 2.4). AR: one token."""
    p_dc = jnp.array([[0.6, 0.2]] * 4)
    got = adaptive_trees.tree_tokens((TREE, FIXED), p_dc, jnp.array([9, 2]))
    want_mean = [[1, 2.7456, 2.496], [1, 1.8, 1.8]]
    want_square = [[1, 1 + 2.4 + 3.0 + 1.512 + 1.1664, 1 + 2.4 + 2.4 + 1.512], [1, 3.4, 3.4]]
    np.testing.assert_allclose(got, [want_mean, want_square], rtol=1e-5)


@pytest.mark.parametrize('seed', range(4))
def test_dynamic_tree_tokens_match_the_host_sizer(seed):
    """Against tree_budget.pool (the host's heapq pool) on random profiles: 1 + the sum of
    the M - 1 best path probabilities, for every tier of a (13, 5, 3) tree."""
    rng = np.random.default_rng(seed)
    raw = rng.dirichlet(np.ones(4), size=5)[:, :3]  # Ranks 1-3, summing below 1.
    prof = tree_budget.Acceptance(tuple(tuple(map(float, r)) for r in raw))
    for shape in tree_tiers(TreeShape(13, 5, 3), '0,2,4,7,13'):
        want = 1 + sum(tree_budget.pool(prof, shape.levels_drafted, 3)[: shape.nodes - 1])
        got = adaptive_trees.tree_tokens((shape,), jnp.asarray(raw, jnp.float32), jnp.array([99]))
        got = got[0, 0, 1]
        assert float(got) == pytest.approx(want, rel=1e-5), shape.describe()


COSTS = TierCosts.table([1.0, 1.5, 1.6, 1.9], [0.0, 0.1, 0.12, 0.15])


def choice(p_dc, context=0.0):
    live_b, room_b = jnp.array([True]), jnp.array([99])
    moments = adaptive_trees.tree_tokens(SHAPES, jnp.asarray(p_dc), room_b)
    seconds_k = COSTS.seconds(1, jnp.float32(context))
    return int(adaptive.choose(adaptive.finish_seconds(moments, live_b, room_b, seconds_k)))


def test_tree_choice_against_the_hand_computed_optimum():
    """Tiers AR, 5, 6, 8 nodes costing 1, 1.5, 1.6, 1.9 (+ 0, 0.1, 0.12, 0.15 per context
    token). Ranks (0.6, 0.2): tokens 1, 2.376, 2.5056, 2.7456, per second 1, 1.584, 1.566,
    1.445: 5 nodes. Ranks (0.5, 0.45): 0.5, 0.45, 0.25, 0.225 | 0.225 | 0.2025, 0.125 kept,
    2.425 / 1.5 = 1.617, 2.65 / 1.6 = 1.656, 2.9775 / 1.9 = 1.567: 6 nodes. Ranks (0.1,
    0.05): the 5-node tree's 1.165 tokens in 1.5 lose to AR. A context of 20 (costs 1, 3.5,
    4, 4.9) turns the (0.6, 0.2) choice to AR (0.68, 0.63, 0.56 a second)."""
    assert choice([[0.6, 0.2]] * 4) == 1
    assert choice([[0.5, 0.45]] * 4) == 2
    assert choice([[0.1, 0.05]] * 4) == 0
    assert choice([[0.6, 0.2]] * 4, context=20.0) == 0


def test_rank_counts_and_estimate_by_hand():
    """The static tree (0, 0, 0, 1, 1, 3): kids root [1, 2], node 1 [3, 4], node 3 [5]. Row
    0 accepts node 2 (rank 1) and stops at a leaf; row 1 accepts 1, 3, 5 (rank 0 thrice);
    row 2 rejects both of the root's; row 3 is done (not counted)."""
    kids = jnp.broadcast_to(jnp.asarray(FIXED.tree.children), (4, 6, 2))
    path = jnp.array([[0, 2, 2, 2], [0, 1, 3, 5], [0, 0, 0, 0], [0, 1, 3, 5]])
    got = adaptive_trees.rank_counts(path, jnp.array([1, 3, 0, 3]), kids,
                               jnp.array([True, True, True, False]), 4, 3)  # fmt: skip
    acc = [[1, 1, 0], [1, 0, 0], [1, 0, 0], [0, 0, 0]]
    seen = [[3, 3, 0], [1, 1, 0], [1, 0, 0], [0, 0, 0]]
    np.testing.assert_array_equal(got, [acc, seen])
    # Prior 0.5 (ranks 0.5, 0.25), weight 4: depth 1 (3 + 2) / 8, (1 + 1) / 8; depth 2
    # shrinks toward it: (1 + 2.5) / 5, (0 + 1) / 5.
    p = adaptive_trees.rank_acceptance(jnp.asarray([[[3, 1]] * 2, [[4, 4]] * 2], jnp.float32)
                                 .at[:, 1].set(jnp.array([[1, 0], [1, 1]])), 0.5, 4.0)  # fmt: skip
    np.testing.assert_allclose(p, [[0.625, 0.25], [0.7, 0.2]], rtol=1e-6)


# ---- the engine --------------------------------------------------------------------------
# One compiled loop for every run (costs, prior, explore are leaves): a retrace fails.
_LOOP = jax.jit(chex.assert_max_traces(engine.decode_loop.__wrapped__, n=1))
LOOP_SHAPES = tree_tiers(TREE, '0,3,8')  # (3, 2, 2): path 2; (8, 4, 2): path 4.
ENGINE = decoding.Engine(tiny.TARGET, tiny.DECODE, Eagle3Drafter(tiny.HEAD), tree=TREE,
                         adaptive=Adaptive((0, 3, 8), TierCosts.table([1.0, 1.0, 1.0]),
                                           trees=LOOP_SHAPES))  # fmt: skip
LONG_PROMPTS = [list(range(1, 13)), [8] * 12, [9, 3] * 6]


@pytest.fixture(scope='module')
def models():
    target = tiny.target_params()
    return target, tiny.head(target)


@pytest.fixture(scope='module')
def greedy_ar(models):
    ar = decoding.Engine(tiny.TARGET, tiny.DECODE)
    return {key: decoding.generate(ar, decoding.Params(models[0]), prompts).tokens
            for key, prompts in (('mixed', tiny.PROMPTS), ('long', LONG_PROMPTS))}  # fmt: skip


def run(models, prompts, costs, **changes):
    settings = dict(prior=0.7, weight=4.0, explore=0, trees=LOOP_SHAPES)
    eng = ENGINE.replace(adaptive=Adaptive((0, 3, 8), costs, **{**settings, **changes}))
    rows = loop_rows(eng, prompts)
    tokens_bo, num_b, stats = _LOOP(eng, *models, *(jnp.asarray(x) for x in rows),
                                    jax.random.PRNGKey(0))  # fmt: skip
    tokens = [list(map(int, t[:n])) for t, n in zip(np.asarray(tokens_bo), np.asarray(num_b))]
    return tokens, summarize(stats)['per_row']


def test_greedy_adaptive_tree_equals_greedy_ar(models, greedy_ar):
    """Batch 3, rows that diverge, one compiled loop (the retrace guard): costs that make
    each tier win in turn run it every round (drafted: 0, 2 or 4 a round), and the relative
    model mixes the trees as the estimate moves; the tokens are AR's every time. A long
    context (1 + 0.3 per token for the trees, prompts of 12) never drafts."""
    for costs, per_round in (([1.0, 9.0, 9.0], 0), ([2.0, 1.0, 9.0], 2), ([9.0, 9.0, 1.0], 4)):
        tokens, rows = run(models, tiny.PROMPTS, TierCosts.table(costs))
        assert tokens == greedy_ar['mixed'], costs
        assert rows['drafted'] == [per_round * b for b in rows['blocks']], costs
    rel = TierCosts.relative((0, 3, 8), 0.02, 0.02, trees=LOOP_SHAPES)  # 1.02, 1.08, 1.22.
    tokens, rows = run(models, tiny.PROMPTS, rel, prior=0.2)
    assert tokens == greedy_ar['mixed']
    # Prior 0.2: the 3-node tree first (1.36 tokens a row / 1.08 = 1.26 against 8 nodes'
    # ~1.50 / 1.22 = 1.23 and AR's 0.98), then, as the head's acceptance shows (~0.7 at
    # rank 1), the 8-node one (~2.9 / 1.22 against ~2.2 / 1.08).
    assert any(d % 4 for d in rows['drafted'])
    assert any(d > 2 * b for d, b in zip(rows['drafted'], rows['blocks']))
    long = TierCosts.table([1.0, 1.0, 1.0], [0.0, 0.3, 0.3])
    tokens, rows = run(models, LONG_PROMPTS, long)
    assert tokens == greedy_ar['long'] and rows['drafted'] == [0, 0, 0]


def test_adaptive_tree_lossless_keeps_the_target_law():
    """Lossless at temperature 1, N = 4000 rows of one prompt, 3 tokens: TV bound 0.06 per
    token (E[TV] <= 0.5 sqrt(31 / 4000) = 0.044; test_speculative's harness). Tiers AR,
    (3, 2, 2), (6, 3, 2) costing 1, 1.2, 1.8 at prior 0.9 (ranks 0.9, 0.09): with room for
    2 tokens only depth 1 counts (1.9 tokens +- 0.3 for the 3-node tree, which keeps a depth-2
    node, 1.99 +- 0.1 for the 6-node one), and the last of 4000 rows needs 1.64 and 1.19
    rounds, so round 1 runs the 3-node tree (1.96 s against 2.13 and AR's 2); this peaked
    target accepts little, so the rows left after it run AR's step (blocks 1 or 2, drafted
    2). Tokens 1-3 follow the
    target's law whichever tier emitted them. Power: the node law is checked per rule in
    tests/decoding/test_tree.py; here the switch between a tree round and AR's step that
    keeps the head up (a tier's state mix-up: the wrong path committed, the head's
    scratch or window read across tiers) would move a token's law."""
    target = random_params(tiny.TARGET, seed=7, embed_scale=8.0)
    draft = random_params(tiny.DRAFT, seed=8, embed_scale=8.0)
    sampler = Sampler(temperature=1.0)
    dec = DecodeSettings(max_new_tokens=3, prompt_bucket=8, new_tokens_bucket=8)
    tree = TreeShape(6, 3, 2)
    shapes = tree_tiers(tree, '0,3,6')
    eng = decoding.Engine(tiny.TARGET, dec, Eagle3Drafter(tiny.HEAD), sampler=sampler, tree=tree,
                          adaptive=Adaptive((0, 3, 6), TierCosts.table([1.0, 1.2, 1.8]), 0.9,
                                            explore=0, trees=shapes))  # fmt: skip
    result = decoding.generate(eng, decoding.Params(target, tiny.head(target)), [PROMPT] * N,
                               seed=5)  # fmt: skip
    rows = result.stats['per_row']
    assert set(rows['drafted']) == {2} and set(rows['blocks']) == {1, 2}  # 3 nodes, then AR.
    laws = token_laws(target, draft, sampler, lambda p, q: p)
    assert_follows(np.array(result.tokens), laws)


def test_tv_budget_cap_holds_at_every_tier(models):
    """tv_budget (eps 0.05) on the tree tiers at temperature 1, metered: the cap is per
    position (each node law within eps of p whatever tree holds it), so the mean TV metered
    at every block offset, over rounds of the 3- and the 8-node tree (every second round
    explores the tier above the choice), is at most eps; and
    above 0 (the rule moves mass here: a lossless round by mistake would meter 0)."""
    soft = random_params(tiny.TARGET, seed=7, embed_scale=8.0)
    costs = TierCosts.table([3.0, 1.0, 1.2])  # Trees only: AR costs a tree round's three.
    eng = ENGINE.replace(rule=rules.make('tv_budget', eps=0.05), sampler=Sampler(temperature=1.0),
                         meter_distortion=True,
                         adaptive=Adaptive((0, 3, 8), costs, 0.2, explore=2, optimism=float('inf'),
                                           trees=LOOP_SHAPES))  # fmt: skip
    rows = loop_rows(eng, tiny.PROMPTS)
    _, _, stats = engine.decode_loop(eng, soft, tiny.head(soft), *(jnp.asarray(x) for x in rows),
                                     jax.random.PRNGKey(1))  # fmt: skip
    per_row = summarize(stats)['per_row']
    pairs = list(zip(per_row['drafted'], per_row['blocks']))
    assert any(d % 4 for d, _ in pairs) and any(d > 2 * b for d, b in pairs), pairs  # Both ran.
    tv_t, n_t = np.asarray(stats.tv_at_bt).sum(0), np.asarray(stats.metered_at_bt).sum(0)
    assert (tv_t[n_t > 0] / n_t[n_t > 0] <= 0.05 + 1e-6).all(), (tv_t, n_t)
    assert float(np.asarray(stats.tv).sum()) > 0
