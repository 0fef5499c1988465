"""Whole-tree verification: static shapes, losslessness, agreement with the node rule."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

from . import _cases

V = 5
N = 60_000


def _tree_inputs(tree, n, seed, sampled=False):
    """Random per-node targets (shared by all rows) and node tokens [n, M]."""
    rng = np.random.default_rng(seed)
    m = tree.num_nodes
    p_mv = rng.dirichlet(np.full(V, 0.7), size=m).astype(np.float32)
    q_mv = rng.dirichlet(np.full(V, 0.7), size=m).astype(np.float32)
    target = jnp.broadcast_to(jnp.asarray(p_mv), (n, m, V))
    draft = jnp.broadcast_to(jnp.asarray(q_mv), (n, m, V))
    if sampled:
        # Children of node i are drawn i.i.d. from q at node i.
        parents = jnp.asarray(tree.parents)
        logits = jnp.log(jnp.asarray(q_mv))[parents]  # [M, V]
        tokens = jax.random.categorical(jax.random.PRNGKey(seed), logits, shape=(n, m))
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


@pytest.mark.parametrize('sampled', [False, True])
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
    )
    toks = np.asarray(out.tokens)
    # First emitted token ~ p at the root.
    emp = _cases.empirical(toks[:, 0], V)
    assert 0.5 * np.abs(emp - p_mv[0]).sum() <= _cases.tv_bound(p_mv[0], N)
    # Given the first accepted node c, the second emitted token ~ p at node c.
    path = np.asarray(out.path)
    for node in (1, 2):
        rows = (np.asarray(out.num_accepted) >= 1) & (path[:, 1] == node)
        assert rows.sum() > 2000
        emp = _cases.empirical(toks[rows, 1], V)
        assert 0.5 * np.abs(emp - p_mv[node]).sum() <= _cases.tv_bound(p_mv[node], rows.sum())


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
    with pytest.raises(ValueError, match='sampled'):
        rules.verify_tree(
            rules.make('lenience', l=0.5), jax.random.PRNGKey(0), tree, tokens, target, draft
        )
    with pytest.raises(ValueError, match='parents'):
        rules.Tree(parents=(0, 2, 1))
