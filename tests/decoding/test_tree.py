"""EAGLE-3 tree rounds: selection, the head's tree, greedy exactness, laws, stops, compiles.

The head of most tests starts in the target's output space (`e3.init_from_target` on the
target's last tap): it drafts the target's prediction one position early, which the
random tiny targets, whose greedy text repeats tokens, accept often, so paths of several
nodes at scattered tree slots get committed.
"""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import decoding, rules
from spec_jax.decoding import batching, engine, trees
from spec_jax.decoding.drafters import Eagle3Drafter, LMDrafter
from spec_jax.decoding.state import DecodeSettings, prefill, row_limits
from spec_jax.models import eagle3 as e3
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import causal_forward
from spec_jax.rules import base
from spec_jax.sampling import Sampler
from spec_jax.testing import loop_copies, random_params, tiny

V, U = tiny.V, tiny.U
CFG, HEAD, PROMPTS, DEC, USED = tiny.TARGET, tiny.HEAD, tiny.PROMPTS, tiny.DECODE, tiny.DRAFT_IDS
head_params = tiny.head


@pytest.fixture(scope='module')
def models():
    target = tiny.target_params()
    return target, head_params(target)


@pytest.fixture(scope='module')
def soft_models():
    """A peaked (max p ~0.7) target at temperature 1 and its head."""
    target = random_params(CFG, seed=7, embed_scale=8.0)
    return target, head_params(target)


def tree_gen(models, shape, prompts=PROMPTS, dec=DEC, **engine_fields):
    target, head = models
    tree = decoding.Engine(CFG, dec, Eagle3Drafter(HEAD), tree=shape, **engine_fields)
    return decoding.generate(tree, decoding.Params(target, head), prompts)


# ---- selection -----------------------------------------------------------------------------


def random_pool(rng, batch, branch, depth, tie_every=0):
    """A dynamic tree's pool built as the head builds it, from random log-probabilities
    (rounded to multiples of 0.5 when `tie_every`, so scores tie across and within levels)."""
    k = branch
    logp = -rng.exponential(1.0, size=(batch, k))
    scores, parents = [np.sort(logp)[:, ::-1]], [np.full((batch, k), -1)]
    front, front_score, start = np.tile(np.arange(k), (batch, 1)), scores[0], k
    for _ in range(1, depth):
        child = -np.sort(rng.exponential(1.0, size=(batch, k, k)), -1)
        if tie_every:
            child = np.round(child * 2) / 2
        cs = (front_score[:, :, None] + child).reshape(batch, k * k)
        scores.append(cs)
        parents.append(np.repeat(front, k, 1))
        best = np.argsort(-cs, axis=1, kind='stable')[:, :k]
        front, front_score = start + best, np.take_along_axis(cs, best, 1)
        start += k * k
    return np.concatenate(scores, 1).astype(np.float32), np.concatenate(parents, 1)


@pytest.mark.parametrize('tie_every', [0, 1])
def test_selection_is_ancestor_closed_and_matches_a_host_sort(tie_every):
    """The M - 1 best by (score, then pool index) form a tree, with tied scores too (a child
    whose log-probability is 0 ties its parent; equal siblings tie each other); its parents
    precede it and match the pool's pointers; nothing is -1."""
    rng = np.random.default_rng(tie_every)
    score, parent = random_pool(rng, 5, 3, 4, tie_every)
    score[:, 3:6] = score[:, [0]]  # Level-2 children of node 0 tie their parent exactly.
    for num in (1, 6, 13, score.shape[1]):
        chosen, parents = (np.asarray(x) for x in trees.select(score, parent, num))
        assert chosen.min() >= 0 and parents.min() >= 0
        for b in range(score.shape[0]):
            want = sorted(sorted(range(score.shape[1]), key=lambda i: (-score[b, i], i))[:num])
            assert chosen[b].tolist() == want
            for i, pool_i in enumerate(chosen[b], start=1):
                pa = parent[b, pool_i]
                assert parents[b, i] < i
                if pa < 0:
                    assert parents[b, i] == 0
                else:  # Ancestor-closed: the pool parent is a selected node.
                    assert chosen[b, parents[b, i] - 1] == pa


def test_ancestors_of_random_trees():
    rng = np.random.default_rng(0)
    for _ in range(5):
        parents = [0] + [int(rng.integers(0, i)) for i in range(1, 11)]
        shape = trees.TreeShape.fixed(parents)
        got = np.asarray(trees.ancestors(jnp.asarray([parents]), shape.depth))[0]
        np.testing.assert_array_equal(got, trees.static_ancestors(shape))
        for i in range(11):
            path, j = {i}, i
            while j:
                j = parents[j]
                path.add(j)
            assert set(np.flatnonzero(got[i])) == path | {0}


def test_tree_shapes():
    assert trees.TreeShape(60, 6, 10).pool_size == 10 + 5 * 100
    chain = trees.TreeShape.chain(3)
    assert (chain.nodes, chain.depth, chain.branch, chain.levels) == (4, 3, 1, ((1,), (2,)))
    fixed = trees.TreeShape.fixed((0, 0, 0, 1, 1, 3))
    assert (fixed.nodes, fixed.depth, fixed.branch, fixed.levels) == (6, 3, 2, ((1,), (3,)))
    assert trees.TreeShape(1, 3, 2).path_len == 0
    with pytest.raises(ValueError, match='candidate pool of branch=2, depth=2 holds 6'):
        trees.TreeShape(8, 2, 2)
    with pytest.raises(ValueError, match='must satisfy 0 <= parents'):
        trees.TreeShape.fixed((0, 0, 3))
    with pytest.raises(ValueError, match='build it with TreeShape.fixed'):
        trees.TreeShape(5, 2, 2, parents=(0, 0, 0, 1))
    with pytest.raises(ValueError, match="sampled='iid' needs a static tree"):
        trees.TreeShape(5, 2, 2, sampled='iid')
    with pytest.raises(ValueError, match="sampled=True: one of"):
        trees.TreeShape.chain(2, sampled=True)
    assert trees.TreeShape.chain(2, sampled='distinct').mode == 'distinct'


# ---- the head's tree -----------------------------------------------------------------------


def test_the_heads_tree_follows_its_chain_drafts(models):
    """Every node of a dynamic tree is, at its parent's context, the head's r-th best token
    (r its rank among its siblings): the chain drafter's law with the node's ancestors
    forced as drafts (each node sees its ancestors only, at depth positions)."""
    target, head = models
    drafter, shape = Eagle3Drafter(HEAD), trees.TreeShape(nodes=11, depth=4, branch=3)
    prompt = [4, 5, 6, 7, 8, 9]
    bucket, slots, c = 8, 40, len(prompt)
    lengths = jnp.array([c], jnp.int32)
    prompt_bp = jnp.array([prompt + [0] * (bucket - c)], jnp.int32)
    logits_bv, taps, cache = prefill(
        CFG, target, KVCache.init(CFG, 1, slots), prompt_bp, lengths, drafter.tap_layers
    )
    history = jnp.zeros((1, slots), jnp.int32).at[0, :c].set(jnp.array(prompt))
    history = history.at[0, c].set(jnp.argmax(logits_bv[0]))
    state = drafter.init(head, history, lengths, bucket, taps)
    _, tokens, parents, _ = drafter.propose_tree(head, state, lengths, shape)
    tokens, parents = np.asarray(tokens)[0], np.asarray(parents)[0]
    assert len(set(parents[1:])) > 2 and parents.max() > 0  # A real tree: branches, depth.
    m, a = shape.nodes, shape.depth
    paths = []
    for i in range(m):  # Tokens of node i's ancestors (root excluded), then node i.
        path, j = [], i
        while j:
            path.insert(0, int(tokens[j]))
            j = parents[j]
        paths.append(path)
    forced = np.zeros((m, a), np.int32)
    use = np.zeros((m, a), bool)
    for i, path in enumerate(paths[1:], start=1):  # Force the ancestors only.
        forced[i, : len(path) - 1], use[i, : len(path) - 1] = path[:-1], True
    rows = jax.tree.map(lambda x: jnp.tile(x, (m,) + (1,) * (x.ndim - 1)), state)
    _, _, q_mav = drafter.propose(
        head, rows, jnp.tile(history, (m, 1)), jnp.tile(lengths, m),
        jax.random.split(jax.random.PRNGKey(0), m), a, jax.nn.softmax,
        forced=(jnp.asarray(forced), jnp.asarray(use)),
    )  # fmt: skip
    q_mav = np.asarray(q_mav)
    for i in range(1, m):
        pa, depth = parents[i], len(paths[i])
        siblings = [j for j in range(1, m) if parents[j] == pa]
        law = q_mav[i, depth - 1]  # The head's law of the token after the parent's path.
        ranked = np.argsort(-law, kind='stable')
        assert tokens[i] == ranked[siblings.index(i)], f'node {i}'
        assert tokens[i] in USED


# ---- greedy exactness ----------------------------------------------------------------------

SHAPES = [
    trees.TreeShape(nodes=8, depth=4, branch=2),
    trees.TreeShape(nodes=1, depth=2, branch=2),  # M = 1: every round an AR step.
    trees.TreeShape(nodes=13, depth=7, branch=3),  # Deeper than the output lets it go.
    trees.TreeShape.chain(3),
    trees.TreeShape.fixed((0, 0, 0, 1, 1, 3)),
    # T 0: the first child is the argmax, its siblings have q = 0 and are skipped.
    trees.TreeShape.fixed((0, 0, 0, 1, 1, 3), sampled='distinct'),
]


@pytest.fixture(scope='module')
def greedy_ar(models):
    target, _ = models
    return decoding.generate(decoding.Engine(CFG, DEC), decoding.Params(target), PROMPTS).tokens


@pytest.mark.parametrize(
    'shape',
    [pytest.param(SHAPES[0], marks=pytest.mark.gpu), *SHAPES[1:]],
    ids=lambda s: s.describe(),
)
def test_greedy_tree_equals_greedy_ar(models, greedy_ar, shape):
    result = tree_gen(models, shape)
    assert result.tokens == greedy_ar
    stats = result.stats
    assert stats['blocks'] > 0
    if shape.nodes > 1:
        assert stats['block_efficiency'] > 1.5  # Paths of several nodes were committed.
        assert max(stats['per_row']['block_accepted'][1]) >= 2
    rows = stats['per_row']
    assert sum(rows['emitted']) == sum(rows['blocks']) + sum(rows['accepted'])
    assert len(stats['acceptance_at_position']) == shape.path_len  # Per depth.
    if shape.sampled:  # Siblings with q = 0 are skipped, not counted.
        return
    assert stats['accept_length'] == pytest.approx(sum(rows['accepted']) / sum(rows['blocks']))


def test_greedy_tree_batch_one(models, greedy_ar):
    assert tree_gen(models, SHAPES[0], [PROMPTS[0]]).tokens == [greedy_ar[0]]


def test_rows_stop_mid_path(models):
    """A stop token inside an accepted path ends the row there. A row's noise depends on its
    seed and sample id only, so with a stop token each row is the free run's cut just after
    its first stop token; some rows met theirs mid-path (the round emitted more)."""
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8], [7], [9, 9, 1]] * 8
    shape, sampler, stop = trees.TreeShape(8, 4, 2), Sampler(temperature=0.7), 11
    free = tree_gen(models, shape, prompts, sampler=sampler)
    dec = DecodeSettings(max_new_tokens=20, prompt_bucket=8, new_tokens_bucket=8,
                         stop_tokens=(stop,))  # fmt: skip
    got = tree_gen(models, shape, prompts, dec, sampler=sampler)
    for row, free_row in zip(got.tokens, free.tokens, strict=True):
        assert row == (free_row[: free_row.index(stop) + 1] if stop in free_row else free_row)
    emitted = got.stats['per_row']['emitted']
    # Rows the stop token cut: they end in it, short of the limit, and their last round
    # emitted more than was kept (limit cuts are not counted).
    cut = [e + 1 > len(row) and row[-1] == stop and len(row) < dec.max_new_tokens
           for e, row in zip(emitted, got.tokens)]  # fmt: skip
    assert sum(cut) >= 5, cut


# ---- laws ----------------------------------------------------------------------------------
# N rows of one prompt are independent samples. With a law over V = 31 tokens,
# E[TV(empirical, law)] <= 0.5 * sqrt(V / N) = 0.031 at N = 8000; we allow 0.045 (fixed
# seeds), and a law must differ by more than 2 * 0.045 for the test to tell it apart.
N, TV_BOUND = 8000, 0.045
PROMPT = [3, 1, 4, 1, 5]
MC_SHAPE = trees.TreeShape(nodes=6, depth=3, branch=2)
SAMPLER = Sampler(temperature=1.0)


def tv(a, b):
    return 0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum(-1)


def next_probs(target, contexts):
    logits, _ = causal_forward(CFG, target, jnp.asarray(contexts))
    return np.asarray(SAMPLER.probs(logits[:, -1]), np.float64)


@jax.jit
def heads_trees(target, head, prompt_bp, prompt_len_b, pending_b):
    """The tree each row's first round drafts after prompt + pending token."""
    drafter = Eagle3Drafter(HEAD)
    b, bucket = prompt_bp.shape
    cache = KVCache.init(CFG, b, 32)
    _, taps, cache = prefill(CFG, target, cache, prompt_bp, prompt_len_b, drafter.tap_layers)
    history = jnp.zeros((b, 32), jnp.int32).at[:, :bucket].set(prompt_bp)
    history = history.at[jnp.arange(b), prompt_len_b].set(pending_b)
    state = drafter.init(head, history, prompt_len_b, bucket, taps)
    _, tokens_bm, parents_bm, _ = drafter.propose_tree(head, state, prompt_len_b, MC_SHAPE)
    kids_bmc = rules.children_from_parents(parents_bm, MC_SHAPE.branch)
    sibs_bmc = jnp.take_along_axis(tokens_bm[:, None], jnp.maximum(kids_bmc, 0), -1)
    return jnp.where(kids_bmc >= 0, sibs_bmc, -1), kids_bmc


def trees_after(models, contexts):
    """(children's tokens [C, M, branch], children's node indices [C, M, branch]; -1 padded)
    of the tree a round drafts whose root is each context's last token."""
    target, head = models
    prompts = [c[:-1] for c in contexts]
    prompt_bp = jnp.array([p + [0] * (8 - len(p)) for p in prompts], jnp.int32)
    lengths = jnp.array([len(p) for p in prompts], jnp.int32)
    out = heads_trees(target, head, prompt_bp, lengths, jnp.array([c[-1] for c in contexts]))
    return tuple(np.asarray(x) for x in out)


def node_law(rule, p, sibs, zero_residual=True, gate_on_residual=True):
    """The law at a node (rule.induced_tree_node), or a mistaken one: the final token drawn
    from p instead of p with the rejected siblings zeroed, or the gate read on p instead of
    the residual. p [..., V], sibs [..., C]."""
    p, sibs = jnp.asarray(p, jnp.float32), jnp.asarray(sibs)
    state, reach, law = base.node_state(p), jnp.ones(p.shape[:-1]), jnp.zeros_like(p)
    zeroed = jnp.zeros(p.shape, bool)
    vocab = jnp.arange(V)
    for j in range(sibs.shape[-1]):
        c, valid = sibs[..., j], base.sibling_valid(sibs, j)
        pc = base.gather(p, c)
        gate_state = state if gate_on_residual else base.node_state(p)
        g = jnp.where(valid, rule.tree_gate(pc, c, gate_state), 0.0)
        law = law + (reach * g)[..., None] * (vocab == c[..., None])
        state = base.node_reject(state, pc, valid)
        zeroed = zeroed | (valid[..., None] & (vocab == c[..., None]))
        reach = reach * (1.0 - g)
    residual = base.normalize_or(jnp.where(zeroed, 0.0, p), p) if zero_residual else p
    return np.asarray(law + reach[..., None] * rule.tree_final(residual), np.float64)


def tree_token_laws(models, rule, **mistake):
    """Exact laws of generated tokens 1-3 [3, V] under tree rounds of MC_SHAPE.

    Token 1 is the prefill draw (the bonus law: p). Round 1's root is t1: token 2 follows
    the node law at that root. Token 3: if t2 is one of the root's children it was accepted
    (a rejected sibling is zeroed from the final law), so token 3 follows the node law at
    that child of round 1's tree; otherwise round 2 starts at t2 and token 3 follows the
    node law at its root."""
    target, _ = models
    p1 = next_probs(target, [PROMPT])[0]
    ctx1 = [PROMPT + [t] for t in range(V)]
    sibs1, kids1 = trees_after(models, ctx1)  # [t1, M, C]
    p2 = next_probs(target, ctx1)  # [t1, V]
    law2 = node_law(rule, p2, sibs1[:, 0], **mistake)  # [t1, V]
    ctx2 = [c + [t] for c in ctx1 for t in range(V)]
    sibs2 = trees_after(models, ctx2)[0][:, 0].reshape(V, V, -1)  # Round 2's root [t1, t2, C].
    p3 = next_probs(target, ctx2).reshape(V, V, V)
    sib_at = sibs2.copy()
    for t1 in range(V):
        for j, t2 in enumerate(sibs1[t1, 0]):
            if t2 >= 0:  # t2 was the root's child j, accepted: its node's children.
                sib_at[t1, t2] = sibs1[t1, kids1[t1, 0, j]]
    law3 = node_law(rule, p3, sib_at, **mistake)  # [t1, t2, V]
    p1 = np.asarray(rule.bonus(jnp.asarray(p1, jnp.float32)), np.float64)
    joint12 = p1[:, None] * law2
    return np.stack([p1, joint12.sum(0), (joint12[..., None] * law3).sum((0, 1))])


def sample_tokens(models, rule, baseline=False, seed=0):
    dec = DecodeSettings(max_new_tokens=3, prompt_bucket=8, new_tokens_bucket=8)
    target, head = models
    tree = decoding.Engine(CFG, dec, Eagle3Drafter(HEAD), rule=rule, baseline=baseline,
                           sampler=SAMPLER, tree=MC_SHAPE)  # fmt: skip
    result = decoding.generate(tree, decoding.Params(target, head), [PROMPT] * N, seed=seed)
    assert result.stats['block_efficiency'] > 1.15  # Rounds accept children.
    return np.array(result.tokens)


def empirical(tokens):
    return np.bincount(tokens, minlength=V) / len(tokens)


def root_choices(models, rule, tokens=None, **mistake):
    """How token 2 was emitted: the root's j-th child (j < branch) or anything else (the
    final draw), as the exact law [branch + 1] and, given sampled tokens [N, 3], as the
    empirical one."""
    target, _ = models
    p1 = np.asarray(rule.bonus(jnp.asarray(next_probs(target, [PROMPT])[0], jnp.float32)))
    ctx1 = [PROMPT + [t] for t in range(V)]
    sibs = trees_after(models, ctx1)[0][:, 0]  # [t1, C]
    law2 = node_law(rule, next_probs(target, ctx1), sibs, **mistake)
    exact = np.zeros(MC_SHAPE.branch + 1)
    for j in range(MC_SHAPE.branch):
        exact[j] = (p1 * np.where(sibs[:, j] >= 0, law2[np.arange(V), sibs[:, j]], 0)).sum()
    exact[-1] = 1.0 - exact[:-1].sum()
    if tokens is None:
        return exact
    rank = (sibs[tokens[:, 0]] == tokens[:, 1:2]).argmax(1)
    child = (sibs[tokens[:, 0]] == tokens[:, 1:2]).any(1)
    return exact, np.bincount(np.where(child, rank, MC_SHAPE.branch), minlength=len(exact)) / N


@pytest.mark.parametrize(
    'name,guards',
    [
        ('lossless', {'residual'}),
        ('lenience:l=0.5', {'residual', 'distinct'}),
        ('minp_verify:rho=0.3', {'residual'}),
        ('minp_verify:rho=0.1', {'distinct'}),
        ('eta_verify:eta=0.1', {'distinct'}),
    ],
)
def test_tree_tokens_follow_the_node_law(soft_models, name, guards):
    """Tokens 1-3 follow the node laws on the visited contexts (lossless: the target's).

    Power. The gates and residuals themselves are checked against each rule's law on
    `verify_node` (tests/rules/test_tree.py); here the engine's parts are: the tree the
    head drafts, the target row each node reads, the path committed, the round's final
    draw. How token 2 was emitted (the root's j-th child, or the final draw) is a law on
    branch + 1 outcomes whose frequencies must lie within 5 binomial sigmas of the exact
    ones (a false alarm < 6e-7 each). 'residual': drawing the final token from p instead
    of p with the rejected children zeroed moves that law by more than 10 sigmas, so the
    mistake passes with probability < P(Z > 5). 'distinct': the rule's token laws differ
    from the target's by more than 2 * TV_BOUND (a rule verified losslessly by mistake
    fails). Where a parameter has little of one (min-p at rho 0.3 barely distorts this
    model; eta's gate passes the top child two times in three, so its residual's share is
    small) another parameter of the same compiled loop shows the other."""
    rule = rules.make(name)
    models = soft_models
    tokens = sample_tokens(models, rule)
    laws = tree_token_laws(models, rule)
    for k in range(3):
        assert tv(empirical(tokens[:, k]), laws[k]) < TV_BOUND, f'token {k + 1}'
    exact, got = root_choices(models, rule, tokens)
    sigma = np.sqrt(exact * (1 - exact) / N)
    assert (np.abs(got - exact) < 5 * sigma).all(), (got, exact)
    if 'residual' in guards:
        wrong = root_choices(models, rule, zero_residual=False)
        assert (np.abs(wrong - exact) / sigma).max() > 10, (wrong, exact)
    if 'distinct' in guards:
        target_laws = tree_token_laws(models, rules.Lossless())
        assert max(tv(laws[1:], target_laws[1:])) > 2 * TV_BOUND


@pytest.mark.parametrize('sampled', ['iid', 'distinct'])
def test_sampled_tree_is_lossless(soft_models, sampled):
    """Sampled siblings, i.i.d. (SpecInfer: min(1, P(c)/q(c)), residual norm((P - q)_+))
    or without replacement (q_j: q without the earlier siblings): tokens 1-3 follow the
    target (the bound of the node-law test). The node rules' own laws, and the power
    against verifying distinct draws as i.i.d. ones, are checked on `verify_node`
    (tests/rules/test_laws.py); here the engine's parts: the head's draws, the q row of
    each node handed to the verifier, the commit. Only the lossless rule has a
    sampled-sibling form."""
    target, head = soft_models
    shape = trees.TreeShape.fixed((0, 0, 0, 1, 1, 2), sampled=sampled)
    dec = DecodeSettings(max_new_tokens=3, prompt_bucket=8, new_tokens_bucket=8)
    tree = decoding.Engine(CFG, dec, Eagle3Drafter(HEAD), sampler=SAMPLER, tree=shape)
    result = decoding.generate(tree, decoding.Params(target, head), [PROMPT] * N, seed=3)
    assert result.stats['block_efficiency'] > 1.15
    tokens = np.array(result.tokens)
    laws = truncated_laws(target, lambda p: p)
    for k in range(3):
        assert tv(empirical(tokens[:, k]), laws[k]) < TV_BOUND, f'token {k + 1}'
    with pytest.raises(ValueError, match=f"rule 'lenience' has no {sampled}-sibling"):
        decoding.generate(tree.replace(rule=rules.make('lenience', l=0.5)),
                          decoding.Params(target, head), [PROMPT])  # fmt: skip


def truncated_laws(target, transform):
    """Tokens 1-3 of plain sampling from the truncated target p_A."""
    laws, chance, tails = [], np.ones(1), [[]]
    for _ in range(3):
        p = np.asarray(transform(jnp.asarray(next_probs(target, [PROMPT + t for t in tails]))))
        joint = chance[:, None] * p
        laws.append(joint.sum(0))
        chance, tails = joint.reshape(-1), [t + [x] for t in tails for x in range(V)]
    return np.stack(laws)


@pytest.mark.parametrize('name', ['minp_verify:rho=0.1', 'eta_verify:eta=0.1'])
def test_tree_matched_baseline_is_the_truncated_target(soft_models, name):
    """The tree convention: the target truncated, the draft tree not, lossless
    verification: tokens 1-3 follow truncation sampling of the target, which differs from
    the lossy rule's law."""
    rule = rules.make(name)
    tokens = sample_tokens(soft_models, rule, baseline=True, seed=1)
    laws = truncated_laws(soft_models[0], rules.matched_baseline(rule).transform)
    for k in range(3):
        assert tv(empirical(tokens[:, k]), laws[k]) < TV_BOUND, f'token {k + 1}'
    assert max(tv(laws[1:], tree_token_laws(soft_models, rule)[1:])) > 2 * TV_BOUND


# ---- statistics, compiles, copies, errors -------------------------------------------------


def test_tree_statistics_and_metering(soft_models):
    """Per-depth acceptance can only fall with depth (a node is reached through its
    parent); every emitted position is metered; lossless and the baseline emit their
    reference law (TV 0), min-p's tree rule does not. The largest overshoot max pi/p is the
    one computed here: 1 for lossless (pi = p), max 1/p(A) over the metered positions for
    the baseline (pi = p_A). Those positions include the tokens a limit cut from the last
    round: a run with a longer limit (the same loop and noise) holds them."""
    target, _ = soft_models
    dec = DecodeSettings(max_new_tokens=20, prompt_bucket=8, new_tokens_bucket=8)
    shape, prompts, limit = trees.TreeShape(8, 4, 2), PROMPTS * 4, 12
    overshoot = {}
    for name, baseline in [('lossless', False), ('minp_verify:rho=0.3', True),
                           ('minp_verify:rho=0.3', False)]:  # fmt: skip
        run = decoding.Engine(CFG, dec, Eagle3Drafter(HEAD), rule=rules.make(name),
                              baseline=baseline, sampler=SAMPLER, meter_distortion=True,
                              tree=shape)  # fmt: skip
        result = decoding.generate(run, decoding.Params(*soft_models), prompts,
                                   max_new_tokens=limit)  # fmt: skip
        stats, rows = result.stats, result.stats['per_row']
        assert sum(rows['metered']) == sum(rows['emitted']) + len(prompts)
        assert sum(rows['emitted']) == sum(rows['blocks']) + sum(rows['accepted'])
        assert stats['accept_length'] > 0.2
        if name == 'lossless' or baseline:
            assert stats['mean_tv'] < 1e-5, name
        else:
            assert stats['mean_tv'] > 0.02
        overshoot[(name, baseline)] = stats['max_overshoot']
        if not baseline or name == 'lossless':
            continue
        longer = decoding.generate(run, decoding.Params(*soft_models), prompts).tokens
        width = len(prompts[1]) + len(longer[0])
        seqs, where = np.zeros((len(prompts), width), np.int32), []
        for r, (prompt, tail, short) in enumerate(zip(prompts, longer, result.tokens)):
            assert tail[:limit] == short  # The same noise: the longer run extends it.
            assert rows['metered'][r] <= len(tail)
            seqs[r, : len(prompt) + len(tail)] = prompt + tail
            where += [(r, len(prompt) - 1 + k) for k in range(rows['metered'][r])]
        logits, _ = causal_forward(CFG, target, jnp.asarray(seqs))  # Causal: padding unread.
        p = np.asarray(SAMPLER.probs(logits), np.float64)[tuple(np.array(where).T)]
        kept = np.asarray(rules.matched_baseline(rules.make(name)).allowed(jnp.asarray(p)))
        want = (1.0 / np.where(kept, p, 0.0).sum(-1)).max()
        assert want > 1.05  # A bound that reads 1 could not tell the baseline from pi = p.
        assert stats['max_overshoot'] == pytest.approx(want, rel=1e-4)
    assert overshoot[('lossless', False)] == pytest.approx(1.0, abs=1e-4)
    assert overshoot[('minp_verify:rho=0.3', False)] > 1.05


def _loop_args(prompts, limit, seed=0):
    batch = batching.pack_prompts(prompts, prompt_bucket=8, max_prompt_len=64)
    return (jnp.asarray(batch.tokens), jnp.asarray(batch.lengths),
            jnp.asarray(row_limits(limit, len(prompts), 20)),
            jnp.arange(len(prompts), dtype=jnp.int32), jax.random.PRNGKey(seed))  # fmt: skip


def test_one_compile_for_a_sweep_and_its_baseline(soft_models):
    """Lenience at 5 values of l, then its matched baseline, then new temperatures and
    prompts: one compiled tree loop. The traced flag takes effect: the baseline (lossless
    verification of the untruncated target) emits exactly what lenience at l = 1 (EAGLE's
    gate P(c)) does, not what l = 0.5 at the same temperature does."""
    target, head = soft_models
    traced = jax.jit(chex.assert_max_traces(engine.decode_loop.__wrapped__, n=1))
    tree = decoding.Engine(CFG, DEC, Eagle3Drafter(HEAD), tree=trees.TreeShape(8, 4, 2))
    accepted, tokens = {}, {}
    for value, baseline, temperature in [(0.05, False, 1.0), (0.5, False, 1.0), (0.6, False, 0.7),
                                         (1.0, False, 1.0), (0.5, True, 1.0), (0.5, False, 0.0)]:
        run = tree.replace(rule=rules.make('lenience', l=value), baseline=baseline,
                           sampler=Sampler(temperature=temperature))  # fmt: skip
        out = traced(run, target, head, *_loop_args([[3, 1, 4], [1, 5]], 20, seed=2))
        accepted[(value, baseline)] = int(out[2].accepted.sum())
        tokens[(value, baseline, temperature)] = np.asarray(out[0]).tolist()
    assert accepted[(0.05, False)] > accepted[(1.0, False)] + 5  # The traced l took effect.
    assert tokens[(0.5, True, 1.0)] == tokens[(1.0, False, 1.0)]
    assert tokens[(0.5, True, 1.0)] != tokens[(0.5, False, 1.0)]


def test_tree_loop_copies_neither_cache_nor_weights(models):
    target, head = models
    run = decoding.Engine(CFG, DEC, Eagle3Drafter(HEAD), tree=trees.TreeShape(8, 4, 2))
    hlo = engine.decode_loop.lower(run, target, head, *_loop_args([[1, 2, 3]], 20)).compile()
    slots = run.slots(8)
    assert loop_copies(hlo.as_text(), CFG.num_kv_heads * slots * CFG.head_dim // 2) == []


def test_bad_trees_fail_before_compiling(models):
    target, head = models
    params = decoding.Params(target, head)
    shape = trees.TreeShape(8, 4, 2)

    def run(drafter, **fields):
        tree = decoding.Engine(CFG, fields.pop('dec', DEC), drafter, tree=shape, **fields)
        decoding.generate(tree, params, PROMPTS)

    with pytest.raises(ValueError, match='expects target width 40'):
        other = ModelConfig.tiny(vocab_size=V, width=40)
        run(Eagle3Drafter(e3.Eagle3Config.for_target(other, U, taps=(0, 1, 2))))
    with pytest.raises(ValueError, match='tap layers'):
        run(Eagle3Drafter(e3.Eagle3Config.for_target(CFG, U, taps=(1, 2, 5))))
    with pytest.raises(ValueError, match='vocab'):
        wide = ModelConfig.tiny(vocab_size=V + 6)
        run(Eagle3Drafter(e3.Eagle3Config.for_target(wide, U, taps=(0, 1, 2))))
    with pytest.raises(ValueError, match='drafts chains only'):
        run(LMDrafter(CFG))
    with pytest.raises(ValueError, match="rule 'cos' has no tree form; the rules with one"):
        run(Eagle3Drafter(HEAD), rule=rules.make('cos', lam=0.5))
    short = ModelConfig.tiny(vocab_size=V, max_position=40)  # 8 + 24 + room 8 = 40 fits...
    decoding.generate(
        decoding.Engine(short, DEC, Eagle3Drafter(HEAD), tree=shape), params, PROMPTS[:1]
    )
    tree = decoding.Engine(short, DEC, Eagle3Drafter(HEAD), tree=trees.TreeShape(9, 4, 2))
    with pytest.raises(ValueError, match=r'tree room .* needs 41 positions but the target'):
        decoding.generate(tree, params, PROMPTS[:1])  # ...41 do not.

