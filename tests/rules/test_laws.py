"""Monte Carlo: the emitted token's empirical law matches each rule's closed-form law.

Every case of `_cases.cases()` (random, peaked, flat, disjoint supports, p == q, one-hot p)
is verified in one batched call per rule: N rows per case share (p, q), and the histogram
of the first emitted token is compared with `rule.induced` (chain) or
`rule.induced_tree_node` (tree node) under the bound of `_cases.tv_bound`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

from . import _cases

N = 100_000


def _rows(x, n):
    """[K, ...] -> [K * n, ...], each case repeated n times."""
    return jnp.repeat(jnp.asarray(x), n, axis=0)


@pytest.mark.parametrize('spec', _cases.RULE_SPECS)
def test_chain_law_matches_induced(spec):
    rule = rules.make(spec)
    names, p, q = _cases.stacked()
    k, v = p.shape

    @jax.jit
    def laws(p, q):
        return rule.induced(p, q), rule.induced_generic(p, q), rule.acceptance_rate(p, q)

    pi, generic, rate = map(np.asarray, laws(p, q))
    assert np.all(np.isfinite(pi)) and np.all(np.isfinite(generic)), spec
    np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(pi, generic, atol=2e-6)

    key_x, key_v = jax.random.split(_cases.key(0))
    # A = 2 drafts per row, both ~ q; the target is p at every position. The first emitted
    # token has law pi; so does the second one given that the first draft was accepted.
    x = jax.random.categorical(key_x, jnp.log(_rows(q, N)), shape=(2, k * N)).T
    target = jnp.stack([_rows(p, N)] * 3, axis=1)  # [K*N, A+1, V]
    draft = jnp.stack([_rows(q, N)] * 2, axis=1)  # [K*N, A, V]
    out = rules.verify_chain(rule, key_v, target, draft, x.astype(jnp.int32))
    tokens = np.asarray(out.tokens).reshape(k, N, 3)
    n_acc = np.asarray(out.num_accepted).reshape(k, N)
    for i, name in enumerate(names):
        emp = _cases.empirical(tokens[i, :, 0], v)
        tv = 0.5 * np.abs(emp - pi[i]).sum()
        assert tv <= _cases.tv_bound(pi[i], N), (spec, name, tv, emp, pi[i])
        reached = n_acc[i] >= 1
        if reached.sum() >= 1000:
            emp2 = _cases.empirical(tokens[i, reached, 1], v)
            tv2 = 0.5 * np.abs(emp2 - pi[i]).sum()
            assert tv2 <= _cases.tv_bound(pi[i], reached.sum()), (spec, name, 'pos 2', tv2)
        r = rate[i]
        first = (n_acc[i] >= 1).mean()
        assert abs(first - r) <= 4 * np.sqrt(r * (1 - r) / N) + 1e-4, (spec, name)


def _siblings(q):
    """Per case: three distinct siblings in descending q order, a duplicate, and padding."""
    order = np.argsort(-q, axis=-1, kind='stable')
    return np.concatenate([order[:, :3], order[:, :1], -np.ones_like(order[:, :1])], axis=1)


# Root with four children (the fourth duplicates the first, so it must be skipped) and one
# grandchild, so that the walk also descends.
_TREE = rules.Tree(parents=(0, 0, 0, 0, 0, 1))


@pytest.mark.parametrize('spec', _cases.TREE_SPECS)
def test_tree_node_law_matches_induced(spec):
    rule = rules.make(spec)
    names, p, q = _cases.stacked()
    k, v = p.shape
    sibs = _siblings(q).astype(np.int32)
    pi = np.asarray(jax.jit(rule.induced_tree_node)(p, sibs))
    assert np.all(np.isfinite(pi)), spec
    np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-5)
    node_tokens = np.concatenate([np.zeros((k, 1)), sibs[:, :4], sibs[:, :1]], 1)
    m = _TREE.num_nodes
    target = jnp.broadcast_to(_rows(p, N)[:, None], (k * N, m, v))
    out = rules.verify_tree(
        rule, _cases.key(1), _TREE, _rows(node_tokens.astype(np.int32), N), target
    )
    tokens = np.asarray(out.tokens[:, 0]).reshape(k, N)
    for i, name in enumerate(names):
        emp = _cases.empirical(tokens[i], v)
        tv = 0.5 * np.abs(emp - pi[i]).sum()
        assert tv <= _cases.tv_bound(pi[i], N), (spec, name, tv, emp, pi[i])


def test_tree_node_specinfer_sampled_siblings_is_lossless():
    names, p, q = _cases.stacked()
    k, v = p.shape
    key_s, key_v = jax.random.split(_cases.key(2))
    sibs = jax.random.categorical(key_s, jnp.log(_rows(q, N)), shape=(3, k * N)).T
    out = rules.verify_node(
        rules.make('lossless'), key_v, _rows(p, N), sibs.astype(jnp.int32), _rows(q, N)
    )
    tokens = np.asarray(out.token).reshape(k, N)
    for i, name in enumerate(names):
        emp = _cases.empirical(tokens[i], v)
        tv = 0.5 * np.abs(emp - p[i]).sum()
        assert tv <= _cases.tv_bound(p[i], N), (name, tv, emp, p[i])
