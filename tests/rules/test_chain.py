"""verify_chain: shapes, greedy prefix, padding, zero normalisers, jit/vmap, no retracing."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

from . import _cases

B, A, V = 7, 4, 11


def _random_block(seed, b=B, a=A, v=V):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(v, 0.5), size=(b, a + 1)).astype(np.float32)
    q = rng.dirichlet(np.full(v, 0.5), size=(b, a)).astype(np.float32)
    x = np.array([[rng.choice(v, p=q[i, j] / q[i, j].sum()) for j in range(a)] for i in range(b)])
    return jnp.asarray(p), jnp.asarray(q), jnp.asarray(x, jnp.int32)


def test_greedy_accepts_exactly_the_argmax_prefix():
    p, q, _ = _random_block(0)
    top = np.asarray(jnp.argmax(p, -1))  # [B, A+1]
    x = top[:, :A].copy()
    prefix = np.array([0, 1, 2, 3, 4, 4, 2])  # Mismatch at these positions (4 = none).
    for i, k in enumerate(prefix):
        if k < A:
            x[i, k] = (x[i, k] + 1) % V
    out = rules.verify_chain(rules.make('greedy'), _cases.key(0), p, q, jnp.asarray(x))
    np.testing.assert_array_equal(np.asarray(out.num_accepted), prefix)
    toks = np.asarray(out.tokens)
    for i, k in enumerate(prefix):
        np.testing.assert_array_equal(toks[i, : k + 1], top[i, : k + 1])
        assert np.all(toks[i, k + 1 :] == 0)
    acc = np.asarray(out.accepted)
    np.testing.assert_array_equal(acc, np.arange(A)[None] < prefix[:, None])


def test_result_layout_and_padding():
    p, q, x = _random_block(1)
    out = rules.verify_chain(rules.make('lenience', l=0.5), _cases.key(3), p, q, x, pad_id=-1)
    assert out.tokens.shape == (B, A + 1) and out.tokens.dtype == jnp.int32
    assert out.accepted.shape == (B, A) and out.num_accepted.dtype == jnp.int32
    n = np.asarray(out.num_accepted)
    toks, xs = np.asarray(out.tokens), np.asarray(x)
    for i in range(B):
        np.testing.assert_array_equal(toks[i, : n[i]], xs[i, : n[i]])
        assert toks[i, n[i]] == out.final_token[i]
        assert np.all(toks[i, n[i] + 1 :] == -1)
    np.testing.assert_array_equal(np.asarray(out.num_emitted), n + 1)
    np.testing.assert_array_equal(np.asarray(out.reached), np.arange(A)[None] <= n[:, None])


@pytest.mark.parametrize('spec', ['lenience:l=0.3', 'uniform_interp:w=0.2'])
def test_zero_normalisers_never_nan(spec):
    rule = rules.make(spec)
    eye = np.eye(V, dtype=np.float32)
    rand = np.random.default_rng(0).dirichlet(np.ones(V)).astype(np.float32)
    half = np.r_[np.full(5, 0.2), np.zeros(V - 5)].astype(np.float32)
    other = np.r_[np.zeros(5), np.full(V - 5, 1.0 / (V - 5))].astype(np.float32)
    pairs = [(rand, rand), (eye[3], rand), (eye[3], eye[3]), (half, other), (eye[0], eye[1])]
    p = jnp.asarray(np.stack([np.stack([a] * (A + 1)) for a, _ in pairs]))
    q = jnp.asarray(np.stack([np.stack([b] * A) for _, b in pairs]))
    x = jnp.asarray(np.stack([np.argmax(b) * np.ones(A, int) for _, b in pairs]), jnp.int32)
    for fn in (rule.replacement, rule.induced, rule.accept_all):
        assert np.all(np.isfinite(np.asarray(jax.jit(fn)(p[:, 0], q[:, 0])))), fn
    out = rules.verify_chain(rule, _cases.key(1), p, q, x)
    toks = np.asarray(out.tokens)
    assert toks.min() >= 0 and toks.max() < V
    # One-hot p: whatever happens, the emitted token at the first reject is the p token.
    assert np.all(toks[1][: int(out.num_accepted[1]) + 1][-1:] == 3)


def test_vmap_and_jit_compose():
    p, q, x = _random_block(2)
    rule = rules.make('minp_verify', rho=0.2)
    keys = jax.random.split(jax.random.key(4), 3)  # threefry: vmap-consistent, unlike rbg.
    f = jax.jit(jax.vmap(lambda k, p, q, x: rules.verify_chain(rule, k, p, q, x)))
    out = f(keys, jnp.stack([p] * 3), jnp.stack([q] * 3), jnp.stack([x] * 3))
    assert out.tokens.shape == (3, B, A + 1)
    single = rules.verify_chain(rule, keys[1], p, q, x)
    np.testing.assert_array_equal(np.asarray(out.tokens[1]), np.asarray(single.tokens))
    # Rule methods vectorise over arbitrary leading axes.
    assert rule.accept_prob(p[:, :A], q, x).shape == (B, A)
    assert rule.induced(p[:, :A], q).shape == (B, A, V)


def test_no_retracing_across_values():
    rule = rules.make('lenience', l=0.5)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(key, p, q, x):
        return rules.verify_chain(rule, key, p, q, x)

    for seed in range(3):
        p, q, x = _random_block(10 + seed)
        step(_cases.key(seed), p, q, x).tokens.block_until_ready()
