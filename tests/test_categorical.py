"""spec_jax.categorical: draws follow their weights; one-hot rows are exact (the per-row keys are
tested with the rules that use them, tests/rules/test_traced.py)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import categorical

V = 13


def _probs(n=64, seed=0, conc=0.4):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, conc), size=n).astype(np.float32)


def test_sample_follows_probs_and_onehot_is_exact():
    p = jnp.asarray(_probs(n=1, seed=9))
    n = 100_000
    toks = categorical.sample(jax.random.key(0), jnp.repeat(p, n, 0))
    emp = np.bincount(np.asarray(toks), minlength=V) / n
    pv = np.asarray(p[0], np.float64)
    assert 0.5 * np.abs(emp - pv).sum() <= 4 * 0.5 * np.sum(np.sqrt(pv * (1 - pv) / n)) + 1e-4
    onehot = jax.nn.one_hot(jnp.arange(V), V)
    np.testing.assert_array_equal(
        np.asarray(categorical.sample(jax.random.key(1), onehot)), np.arange(V)
    )


def test_sample_blocked_cdf_at_large_vocab():
    v, n = 3001, 100_000  # Not a multiple of the 256-token block: exercises the padding.
    probs = np.zeros(v, np.float32)
    support = np.array([3, 255, 256, 1000, 2999, 3000])
    probs[support] = [0.1, 0.2, 0.05, 0.3, 0.15, 0.2]
    keys = jax.random.split(jax.random.key(3), n)
    # vmap over keys keeps one copy of the (unnormalised) row instead of n.
    draw = jax.jit(jax.vmap(lambda k: categorical.sample(k, jnp.asarray(probs) * 7.0)))
    toks = np.asarray(draw(keys))
    assert set(np.unique(toks)) <= set(support.tolist())
    emp = np.bincount(toks, minlength=v)[support] / n
    pv = probs[support].astype(np.float64)
    assert 0.5 * np.abs(emp - pv).sum() <= 4 * 0.5 * np.sum(np.sqrt(pv * (1 - pv) / n)) + 1e-4
    onehot = jax.nn.one_hot(jnp.asarray([0, 255, 256, 3000]), v)
    for method in ('cdf', 'gumbel'):
        got = categorical.sample(jax.random.key(4), onehot, method=method)
        np.testing.assert_array_equal(np.asarray(got), [0, 255, 256, 3000])
    with pytest.raises(ValueError, match='method'):
        categorical.sample(jax.random.key(0), onehot, method='nope')


def test_top_two_is_lax_top_k_of_two_with_ties_by_lower_index():
    """Values and ids equal `jax.lax.top_k(x, 2)`'s on random rows, rows with tied maxima
    (first, last, both), a tie for second place, -inf entries and V = 2."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(5, 3, 97)).astype(np.float32)
    x[0, 0, [7, 50]] = 9.0  # Two maxima: ids 7, 50.
    x[0, 1, [0, 96]] = 9.0  # At the ends.
    x[0, 2, :] = 1.0  # All equal: ids 0, 1.
    x[1, 0, 3], x[1, 0, [11, 40]] = 9.0, 8.0  # A tie for second: id 11.
    x[1, 1, :90] = -np.inf  # The top two among the last 7.
    for rows in (x, x[..., :2]):
        got_v, got_i = categorical.top_two(jnp.asarray(rows))
        want_v, want_i = jax.lax.top_k(jnp.asarray(rows), 2)
        np.testing.assert_array_equal(np.asarray(got_i), np.asarray(want_i))
        np.testing.assert_array_equal(np.asarray(got_v), np.asarray(want_v))
