"""spec_jax.sampling: each transform matches its definition; validation; the Sampler."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import sampling

V = 13


def _probs(n=64, seed=0, conc=0.4):
    rng = np.random.default_rng(seed)
    return rng.dirichlet(np.full(V, conc), size=n).astype(np.float32)


def _entropy(p):
    return -np.sum(np.where(p > 0, p * np.log(np.where(p > 0, p, 1)), 0), -1)


def test_min_p_keeps_exactly_the_ratio_set():
    p = _probs()
    for rho in (0.0, 0.1, 0.5, 1.0):
        mask = np.asarray(sampling.min_p_mask(jnp.asarray(p), rho))
        np.testing.assert_array_equal(mask, p >= rho * p.max(-1, keepdims=True))
        out = np.asarray(sampling.min_p(jnp.asarray(p), rho))
        np.testing.assert_allclose(
            out, np.where(mask, p, 0) / np.where(mask, p, 0).sum(-1)[:, None], rtol=1e-5, atol=1e-7
        )


def test_eta_keeps_the_entropy_threshold_set():
    p = _probs(seed=1)
    for eta in (0.01, 0.1, 0.3):
        tau = np.minimum(eta, np.sqrt(eta) * np.exp(-_entropy(p)))
        mask = np.asarray(sampling.eta_mask(jnp.asarray(p), eta))
        expected = (p >= tau[:, None] * (1 + 1e-6)) | (np.arange(V) == p.argmax(-1)[:, None])
        loose = p >= tau[:, None] * (1 - 1e-6)
        assert np.all(mask >= expected) and np.all(mask <= loose | expected)


def test_epsilon_keeps_tokens_above_eps_and_never_empty():
    p = _probs(seed=2)
    for eps in (0.05, 0.2, 0.99):
        mask = np.asarray(sampling.epsilon_mask(jnp.asarray(p), eps))
        np.testing.assert_array_equal(mask, (p >= eps) | (np.arange(V) == p.argmax(-1)[:, None]))
        assert np.all(mask.sum(-1) >= 1)


def test_top_p_keeps_the_smallest_prefix_reaching_the_mass():
    p = _probs(seed=3)
    for top_p in (0.1, 0.5, 0.9, 1.0):
        mask = np.asarray(sampling.top_p_mask(jnp.asarray(p), top_p))
        for row, m in zip(p, mask, strict=True):
            order = np.argsort(-row)
            cum = np.cumsum(row[order].astype(np.float64))
            k = int(np.searchsorted(cum, top_p)) + 1  # Smallest k with mass >= P.
            k = V if top_p >= 1.0 else k  # P = 1 keeps every token.
            expected = np.zeros(V, bool)
            expected[order[: min(k, V)]] = True
            np.testing.assert_array_equal(m, expected)


def test_top_k_static_and_traced():
    p = jnp.asarray(_probs(seed=4))
    for k in (1, 3, V):
        mask = np.asarray(sampling.top_k_mask(p, k))
        assert np.all(mask.sum(-1) == k)
        traced = np.asarray(jax.jit(sampling.top_k_mask)(p, jnp.asarray(k)))
        np.testing.assert_array_equal(mask, traced)
    np.testing.assert_array_equal(np.asarray(sampling.top_k_mask(p, 0)), True)
    per_row = jnp.arange(p.shape[0]) % 4 + 1
    assert np.all(np.asarray(sampling.top_k_mask(p, per_row)).sum(-1) == np.asarray(per_row))


def test_typical_keeps_the_smallest_most_typical_set():
    p = _probs(seed=5)
    for mass in (0.2, 0.6, 0.95):
        mask = np.asarray(sampling.typical_mask(jnp.asarray(p), mass))
        for row, m in zip(p, mask, strict=True):
            dist = np.abs(-np.log(row) - _entropy(row))
            order = np.argsort(dist)
            cum = np.cumsum(row[order])
            k = int(np.searchsorted(cum, mass * (1 - 1e-6))) + 1
            expected = np.zeros(V, bool)
            expected[order[: min(k, V)]] = True
            expected[row.argmax()] = True
            np.testing.assert_array_equal(m, expected)


def test_temperature_and_greedy():
    logits = jnp.asarray(np.random.default_rng(6).normal(size=(4, V)), jnp.float32)
    np.testing.assert_allclose(
        sampling.softmax_with_temperature(logits, 0.5), jax.nn.softmax(logits / 0.5), rtol=1e-5
    )
    greedy = np.asarray(sampling.softmax_with_temperature(logits, 0.0))
    np.testing.assert_array_equal(greedy, np.eye(V)[np.asarray(logits).argmax(-1)])
    per_row = np.asarray(sampling.softmax_with_temperature(logits, jnp.asarray([0.0, 1, 2, 0])))
    np.testing.assert_array_equal(per_row[0], greedy[0])
    np.testing.assert_allclose(per_row[2], jax.nn.softmax(logits[2] / 2), rtol=1e-5)
    # Prefix broadcasting: a per-row temperature [B] against [B, T, V].
    out = sampling.softmax_with_temperature(jnp.stack([logits] * 3, 1), jnp.asarray([0, 1, 1, 1.0]))
    np.testing.assert_array_equal(np.asarray(out[0, 2]), greedy[0])


def test_sampler_order_and_validation():
    logits = jnp.asarray(np.random.default_rng(7).normal(size=(8, V)) * 2, jnp.float32)
    s = sampling.Sampler(temperature=0.7, top_k=8, top_p=0.9, min_p=0.05, eta=0.01)
    p = sampling.softmax_with_temperature(logits, 0.7)
    for fn, arg in (
        (sampling.top_k, 8),
        (sampling.top_p, 0.9),
        (sampling.min_p, 0.05),
        (sampling.eta, 0.01),
    ):
        p = fn(p, arg)
    np.testing.assert_allclose(s.probs(logits), p, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(np.asarray(s.probs(logits)).sum(-1), 1.0, atol=1e-5)
    assert hash(s) == hash(
        sampling.Sampler(temperature=0.7, top_k=8, top_p=0.9, min_p=0.05, eta=0.01)
    )
    bad = [
        (dict(temperature=-1.0), r'temperature=-1.0 is outside the valid range \[0, inf\)'),
        (dict(top_p=0.0), r'top_p=0.0 is outside the valid range \(0, 1\]'),
        (dict(top_p=1.5), r'top_p'),
        (dict(min_p=1.1), r'min_p=1.1 is outside the valid range \[0, 1\]'),
        (dict(eta=0.0), r'eta=0.0 is outside the valid range \(0, 1\)'),
        (dict(epsilon=1.0), r'epsilon=1.0 is outside the valid range \(0, 1\)'),
        (dict(top_k=-1), r'top_k=-1 is outside the valid range \[0, inf\)'),
        (dict(top_k=2.5), r'top_k=2.5 must be an integer'),
        (dict(typical_p=0.0), r'typical_p'),
        (dict(temperature=np.array([0.5, -0.1])), r'temperature'),
    ]
    for kwargs, match in bad:
        with pytest.raises(ValueError, match=match):
            sampling.Sampler(**kwargs)


def test_sampler_is_a_pytree_and_does_not_retrace_on_values():
    logits = jnp.asarray(np.random.default_rng(8).normal(size=(4, V)), jnp.float32)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def probs(sampler, logits):
        return sampler.probs(logits)

    for t, tp in ((0.5, 0.9), (1.0, 0.8), (0.0, 0.95)):
        probs(sampling.Sampler(temperature=jnp.full((4,), t, jnp.float32), top_p=tp), logits)
    out = probs(sampling.Sampler(temperature=jnp.asarray([0.0, 0.5, 1.0, 2.0]), top_p=1.0), logits)
    np.testing.assert_array_equal(np.asarray(out[0]), np.eye(V)[int(jnp.argmax(logits[0]))])


def test_greedy_is_the_one_hot_first_argmax():
    """Ties, NaN and all -inf rows as `jnp.argmax` decides them (the first maximum, the
    first NaN, index 0)."""
    x = np.random.default_rng(0).normal(size=(5, 7, 33)).astype(np.float32)
    x[0, 0, [3, 9]] = 50.0
    x[1, 2, [8, 4]] = np.nan
    x[2, 1] = -np.inf
    want = jax.nn.one_hot(jnp.argmax(jnp.asarray(x), -1), 33)
    np.testing.assert_array_equal(sampling.greedy(jnp.asarray(x)), want)
