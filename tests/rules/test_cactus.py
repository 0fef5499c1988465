"""Cactus (docs/laws.md §8.3): the closed-form mixture law against an enumeration written
independently in numpy, delta 0 lossless, a traced delta, no tree form. Its Monte Carlo law
through `verify_chain` is the generic test (tests/rules/test_laws.py, `_cases.RULE_SPECS`)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules


def enumerated(p, q, delta):
    """pi by the definition: every drafted x, its acceptance and its own residual."""
    v = len(p)
    pi = np.zeros(v)
    for x in range(v):
        if q[x] == 0:
            continue
        a = min(1.0, p[x] + np.sqrt(2 * delta * p[x] * (1 - p[x])))
        h = p * (1 - a) / (1 - p[x]) if p[x] < 1 else np.zeros(v)
        h[x] = a
        acc = min(1.0, a / q[x])
        pi[x] += q[x] * acc
        r = np.maximum(h - q, 0.0)
        if acc < 1:
            pi += q[x] * (1 - acc) * r / r.sum()
    return pi


def test_closed_form_equals_enumeration():
    """300 random pairs (V 2-8, Dirichlet 0.5, zeros in p and q), delta 0 to 2, float64."""
    rng = np.random.default_rng(0)
    with jax.enable_x64(True):
        for t in range(300):
            v = int(rng.integers(2, 9))
            p, q = rng.dirichlet(np.full(v, 0.5)), rng.dirichlet(np.full(v, 0.5))
            if t % 3 == 0:
                p[rng.integers(v)] = 0.0
                p /= p.sum()
            if t % 4 == 0:
                q[rng.integers(v)] = 0.0
                q /= q.sum()
            delta = (0.0, 0.01, 0.1, 0.5, 2.0)[t % 5]
            got = np.asarray(rules.make('cactus', delta=delta).induced(jnp.asarray(p),
                                                                       jnp.asarray(q)))
            np.testing.assert_allclose(got, enumerated(p, q, delta), atol=1e-12)


def test_delta_zero_is_lossless_and_delta_distorts():
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.ones(7), 50), rng.dirichlet(np.ones(7), 50)
    zero = rules.make('cactus', delta=0.0)
    assert zero.lossless and not rules.make('cactus', delta=0.1).lossless
    np.testing.assert_allclose(zero.induced(p, q), p, atol=1e-6)
    tv = np.asarray(rules.tv(rules.make('cactus', delta=0.5).induced(p, q), p))
    assert tv.mean() > 1e-2


def test_delta_is_a_traced_leaf_without_retrace():
    p = jnp.asarray(np.random.default_rng(2).dirichlet(np.ones(5), (4, 3)), jnp.float32)
    q = jnp.asarray(np.random.default_rng(3).dirichlet(np.ones(5), (4, 2)), jnp.float32)
    x = jnp.zeros((4, 2), jnp.int32)
    traces = []

    @jax.jit
    def run(rule):
        traces.append(1)
        return rules.verify_chain(rule, jax.random.key(0), p, q, x).tokens

    for d in (0.0, 0.3, 1.0):
        run(rules.make('cactus', delta=d))
    assert len(traces) == 1
    assert jax.tree_util.tree_leaves(rules.make('cactus', delta=0.3)) == [0.3]


def test_no_tree_form_and_bad_delta():
    with pytest.raises(ValueError, match='cactus'):
        rules.verify_node(rules.make('cactus'), jax.random.key(0), jnp.ones((1, 3)) / 3,
                          jnp.zeros((1, 2), jnp.int32))
    with pytest.raises(ValueError, match='delta'):
        rules.make('cactus', delta=-0.1)
