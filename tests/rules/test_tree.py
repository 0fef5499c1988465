"""Tree verification: the node law against an independent enumeration, the whole-tree walk.

The node-law tests compare `rules.verify_node` (Monte Carlo) and `rule.induced_tree_node`
(closed form) with `test_laws.node_law_enumerated`, a numpy walk over the ordered siblings
written from docs/laws.md (§2.2, §3.3, §4.2) that shares no code with the library's
`tree_gate`. The Monte Carlo bound is the Bretagnolle-Huber-Carol radius of
`test_laws.tv_radius` (delta = 1e-8 per comparison).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

from . import _cases
from .test_laws import node_law_enumerated, parse_spec, tv, tv_radius

V = 5
N = 60_000


def _tree_inputs(tree, n, seed, sampled=''):
    """Random per-node targets (shared by all rows) and node tokens [n, M]; `sampled`: ''
    (each node's children its parent's top-q tokens), 'iid' or 'distinct' draws from q."""
    rng = np.random.default_rng(seed)
    m = tree.num_nodes
    p_mv = rng.dirichlet(np.full(V, 0.7), size=m).astype(np.float32)
    q_mv = rng.dirichlet(np.full(V, 0.7), size=m).astype(np.float32)
    target = jnp.broadcast_to(jnp.asarray(p_mv), (n, m, V))
    draft = jnp.broadcast_to(jnp.asarray(q_mv), (n, m, V))
    if sampled == 'iid':
        # Children of node i are drawn i.i.d. from q at node i.
        parents = jnp.asarray(tree.parents)
        logits = jnp.log(jnp.asarray(q_mv))[parents]  # [M, V]
        tokens = jax.random.categorical(jax.random.PRNGKey(seed), logits, shape=(n, m))
    elif sampled:
        # Without replacement, by the Gumbel-top-k trick, in numpy (not the library's).
        tokens = np.zeros((n, m), np.int64)
        gumbel = np.random.default_rng(seed + 1).gumbel(size=(n, m, V))
        for parent in range(m):
            kids = tree.children[parent]
            kids = kids[kids >= 0]
            order = np.argsort(-(np.log(q_mv[parent]) + gumbel[:, parent]), axis=-1)
            tokens[:, kids] = order[:, : len(kids)]
        tokens = jnp.asarray(tokens)
    else:
        # Deterministic siblings: descending q at the parent.
        tokens = np.zeros(m, np.int32)
        for parent in range(m):
            kids = tree.children[parent]
            kids = kids[kids >= 0]
            order = np.argsort(-q_mv[parent], kind='stable')
            tokens[kids] = order[: len(kids)]
        tokens = jnp.broadcast_to(jnp.asarray(tokens), (n, m))
    return p_mv, target, draft, tokens.astype(jnp.int32)


@pytest.mark.parametrize('sampled', ['', 'iid', 'distinct'])
def test_lossless_tree_reproduces_p_on_two_positions(sampled):
    tree = rules.Tree.full(branching=2, depth=2)
    p_mv, target, draft, tokens = _tree_inputs(tree, N, seed=3, sampled=sampled)
    out = rules.verify_tree(
        rules.make('lossless'),
        jax.random.PRNGKey(7),
        tree,
        tokens,
        target,
        draft if sampled else None,
        draws=sampled or 'iid',
    )
    toks = np.asarray(out.tokens)
    # First emitted token ~ p at the root.
    emp = _cases.empirical(toks[:, 0], V)
    assert tv(emp, p_mv[0]) <= tv_radius(N, V)  # r(60k) = 0.0135 (V = 5, delta = 1e-8).
    # Given the first accepted node c, the second emitted token ~ p at node c.
    path = np.asarray(out.path)
    for node in (1, 2):
        rows = (np.asarray(out.num_accepted) >= 1) & (path[:, 1] == node)
        assert rows.sum() > 2000
        emp = _cases.empirical(toks[rows, 1], V)
        assert tv(emp, p_mv[node]) <= tv_radius(int(rows.sum()), V)


def test_tree_outputs_are_static_and_consistent():
    tree = rules.Tree(parents=(0, 0, 0, 1, 1, 3, 2))
    assert tree.max_depth == 3
    np.testing.assert_array_equal(tree.depth, [0, 1, 1, 2, 2, 3, 2])
    n = 512
    p_mv, target, _, tokens = _tree_inputs(tree, n, seed=2)
    out = rules.verify_tree(
        rules.make('lenience', l=0.5), jax.random.PRNGKey(0), tree, tokens, target, pad_id=-7
    )
    d1 = tree.max_depth + 1
    assert out.path.shape == (n, d1) and out.tokens.shape == (n, d1)
    path, toks, n_acc = map(np.asarray, (out.path, out.tokens, out.num_accepted))
    assert path.min() >= 0 and np.all(path[:, 0] == 0)
    parents = np.asarray(tree.parents)
    for b in range(n):
        k = n_acc[b]
        for i in range(1, k + 1):
            assert parents[path[b, i]] == path[b, i - 1]
            assert toks[b, i - 1] == np.asarray(tokens)[b, path[b, i]]
        assert np.all(path[b, k:] == path[b, k])  # Padded with the last accepted node.
        assert toks[b, k] == out.final_token[b]
        assert np.all(toks[b, k + 1 :] == -7)
    assert np.asarray(out.last_node).tolist() == path[np.arange(n), n_acc].tolist()


def test_traced_parents_match_static_tree():
    tree = rules.Tree(parents=(0, 0, 0, 1, 1, 3, 2))
    n = 256
    _, target, _, tokens = _tree_inputs(tree, n, seed=4)
    rule = rules.make('minp_verify', rho=0.2)
    ref = rules.verify_tree(rule, jax.random.PRNGKey(1), tree, tokens, target)
    parents_bm = jnp.broadcast_to(jnp.asarray(tree.parents), (n, tree.num_nodes))
    got = rules.verify_tree(
        rule,
        jax.random.PRNGKey(1),
        parents_bm,
        tokens,
        target,
        max_depth=tree.max_depth,
        max_children=tree.children.shape[1],
    )
    for a, b in zip(ref, got, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    children = rules.children_from_parents(jnp.asarray(tree.parents), 3)
    np.testing.assert_array_equal(np.asarray(children)[:, :2], tree.children)
    # The caller's children table (the tree round builds it once) gives the same walk.
    width = tree.children.shape[1]
    given = rules.verify_tree(
        rule, jax.random.PRNGKey(1), parents_bm, tokens, target, max_depth=tree.max_depth,
        max_children=width, children=rules.children_from_parents(parents_bm, width),
    )  # fmt: skip
    for a, b in zip(ref, given, strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match='children table of shape'):
        rules.verify_tree(rule, jax.random.PRNGKey(1), parents_bm, tokens, target,
                          max_depth=tree.max_depth, max_children=width,
                          children=children[None])  # fmt: skip


def test_a_target_law_over_the_walked_rows_is_the_same_walk():
    """`target_law` (a pytree callable on the logits of the node the walk stands on) gives
    the walk of the laws precomputed at every node, bit for bit, for a rule that reads no
    logits and for MARS, which does; and the two ways to pass the target are exclusive."""
    tree = rules.Tree(parents=(0, 0, 0, 1, 1, 3, 2))
    n = 256
    rng = np.random.default_rng(5)
    logits = jnp.asarray(rng.normal(size=(n, tree.num_nodes, V)) * 2.0, jnp.float32)
    law = jax.tree_util.Partial(jax.nn.softmax)
    _, _, _, tokens = _tree_inputs(tree, n, seed=4)
    key = jax.random.PRNGKey(2)
    for rule in (rules.make('lenience', l=0.3), rules.make('mars', theta=0.5)):
        ref = rules.verify_tree(rule, key, tree, tokens, jax.nn.softmax(logits),
                                target_logits_bmv=logits)  # fmt: skip
        got = rules.verify_tree(rule, key, tree, tokens, None, target_logits_bmv=logits,
                                target_law=law)  # fmt: skip
        for a, b in zip(ref, got, strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b), err_msg=rule.name)
    with pytest.raises(ValueError, match='pass target_probs_bmv, or target_law'):
        rules.verify_tree(rule, key, tree, tokens, jax.nn.softmax(logits),
                          target_logits_bmv=logits, target_law=law)  # fmt: skip
    with pytest.raises(ValueError, match='target_law reads target_logits_bmv'):
        rules.verify_tree(rules.make('lenience', l=0.3), key, tree, tokens, None,
                          target_law=law)  # fmt: skip


def test_greedy_tree_accepts_argmax_path():
    tree = rules.Tree.full(branching=3, depth=2)
    p_mv, target, _, tokens = _tree_inputs(tree, 8, seed=9)
    out = rules.verify_tree(rules.make('greedy'), jax.random.PRNGKey(0), tree, tokens, target)
    node, toks = 0, []
    while True:
        kids = [k for k in tree.children[node] if k >= 0]
        top = int(np.argmax(p_mv[node]))
        match = [k for k in kids if int(tokens[0, k]) == top]
        toks.append(top)
        if not match:
            break
        node = match[0]
    n = len(toks) - 1
    assert np.all(np.asarray(out.num_accepted) == n)
    np.testing.assert_array_equal(np.asarray(out.tokens)[:, : n + 1], np.tile(toks, (8, 1)))


def test_tree_rejects_unsupported_modes():
    tree = rules.Tree.chain(2)
    _, target, draft, tokens = _tree_inputs(tree, 4, seed=0)
    with pytest.raises(ValueError, match='does not support'):
        rules.verify_tree(rules.make('cos', lam=0.3), jax.random.PRNGKey(0), tree, tokens, target)
    for draws in ('iid', 'distinct'):
        with pytest.raises(ValueError, match=f'does not support {draws}'):
            rules.verify_tree(rules.make('lenience', l=0.5), jax.random.PRNGKey(0), tree,
                              tokens, target, draft, draws=draws)  # fmt: skip
    with pytest.raises(ValueError, match="draws='wr'"):
        rules.verify_tree(rules.make('lossless'), jax.random.PRNGKey(0), tree, tokens, target,
                          draft, draws='wr')  # fmt: skip
    with pytest.raises(ValueError, match='parents'):
        rules.Tree(parents=(0, 2, 1))


# ----------------------------------------------------------------------------------------
# One node with deterministic ordered siblings, against the independent enumeration.

NODE_V = 7
# Four nodes (target p, siblings in draft order; -1 is padding, a repeated token is
# skipped). 0: a spread-out p, siblings of middling probability; 1, 2: a dominant argmax
# that is not drafted, siblings in the tail (outside the min-p set, below eta's threshold),
# so the gates are fractional and the final residual carries the law; 3: a sibling with
# p = 0 first, then the argmax.
NODE_P = np.array(
    [
        [0.086, 0.183, 0.077, 0.060, 0.230, 0.126, 0.238],
        [0.713, 0.004, 0.085, 0.024, 0.006, 0.078, 0.090],
        [0.010, 0.826, 0.018, 0.062, 0.021, 0.000, 0.063],
        [0.050, 0.500, 0.150, 0.000, 0.100, 0.120, 0.080],
    ],
    np.float32,
)
NODE_SIBS = np.array(
    [[2, 4, 2, 5, -1], [4, -1, 5, 2, 4], [6, 3, 6, -1, 2], [3, 2, 1, -1, 2]], np.int32
)
N_NODE = 50_000  # Rows per node: r(50k) = 0.0153 for V = 7, delta = 1e-8; 2 r = 0.031.


@functools.cache
def node_counts(spec: str) -> np.ndarray:
    """Token counts [K, V] of `verify_node` over N_NODE rows per node (rows interleaved)."""
    k = len(NODE_P)
    out = rules.verify_node(
        rules.make(spec),
        _cases.key(11),
        jnp.asarray(np.tile(NODE_P, (N_NODE, 1))),
        jnp.asarray(np.tile(NODE_SIBS, (N_NODE, 1))),
    )
    tok = np.asarray(out.token).reshape(N_NODE, k)
    return np.stack([np.bincount(tok[:, i], minlength=NODE_V) for i in range(k)])


def _enumerated(spec, mistake=None):
    name, params = parse_spec(spec)
    return np.stack(
        [node_law_enumerated(name, params, p, s, mistake) for p, s in zip(NODE_P, NODE_SIBS)]
    )


@pytest.mark.parametrize('spec', _cases.TREE_SPECS)
def test_node_law_matches_independent_enumeration(spec):
    """induced_tree_node equals the enumeration to 2e-6; verify_node's Monte Carlo law is
    within r(50k) = 0.0153 of it at each node (4 comparisons: false failure <= 4e-8)."""
    rule = rules.make(spec)
    enum = _enumerated(spec)
    np.testing.assert_allclose(enum.sum(-1), 1.0, atol=1e-9)
    pi = np.asarray(jax.jit(rule.induced_tree_node)(NODE_P, NODE_SIBS))
    np.testing.assert_allclose(pi, enum, atol=2e-6, err_msg=spec)
    counts = node_counts(spec)
    for i in range(len(NODE_P)):
        emp = counts[i] / counts[i].sum()
        d = tv(emp, enum[i])
        assert d <= tv_radius(N_NODE, NODE_V), (spec, i, d, emp, enum[i])


# Each guarded mistake, with the node where it shows and its TV from the correct law
# (all > 2 r(50k) = 0.031, so a verifier with the mistake fails the test above with
# probability >= 1 - 1e-8):
#   lossless     final from p, siblings kept           node 0: TV = 0.246
#   lenience     gate p(c) / l, not P_{j-1}(c) / l     node 0: TV = 0.072
#                final from p, siblings kept           node 0: TV = 0.117
#   minp_verify  soft gate min(1, P(c) / (rho max P))  node 1: TV = 0.628
#                final residual without the tail       node 1: TV = 0.142
#                final from p, siblings kept           node 1: TV = 0.169
#   eta_verify   tau from H(p), not H(P_{j-1})         node 1: TV = 0.060
#                hard gate 1[P(c) >= tau(P)]           node 1: TV = 0.725
#                final from p, siblings kept           node 2: TV = 0.059
NODE_MISTAKES = (
    ('lossless', 'final_full_p', 0),
    ('lenience:l=0.5', 'raw_p', 0),
    ('lenience:l=0.5', 'final_full_p', 0),
    ('minp_verify:rho=0.3', 'soft', 1),
    ('minp_verify:rho=0.3', 'final_truncated', 1),
    ('minp_verify:rho=0.3', 'final_full_p', 1),
    ('eta_verify:eta=0.2', 'entropy_of_p', 1),
    ('eta_verify:eta=0.2', 'hard', 1),
    ('eta_verify:eta=0.2', 'final_full_p', 2),
)


@pytest.mark.parametrize('spec,mistake,node', NODE_MISTAKES)
def test_node_power_against_mistakes(spec, mistake, node):
    """The mistaken law is > 2 r from the correct one, and verify_node's empirical law is
    within r of the correct law and further than r from the mistaken one."""
    correct, wrong = _enumerated(spec)[node], _enumerated(spec, mistake)[node]
    r = tv_radius(N_NODE, NODE_V)
    assert tv(correct, wrong) > 2 * r, (spec, mistake, tv(correct, wrong), r)
    counts = node_counts(spec)[node]
    emp = counts / counts.sum()
    assert tv(emp, correct) <= r, (spec, mistake, tv(emp, correct))
    assert tv(emp, wrong) > r, (spec, mistake, tv(emp, wrong))
