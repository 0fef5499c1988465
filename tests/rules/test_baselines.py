"""Matched baselines (docs/laws.md §5) and distortion measures."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

import spec_jax.rules as rules
from spec_jax import sampling

from . import _cases

V = 7


def test_baseline_law_is_the_truncated_target_and_verifies_exactly():
    rng = np.random.default_rng(0)
    p = jnp.asarray(rng.dirichlet(np.full(V, 0.4), size=64), jnp.float32)
    q = jnp.asarray(rng.dirichlet(np.full(V, 0.4), size=64), jnp.float32)
    expected = {
        'minp_verify:rho=0.3': sampling.min_p(p, 0.3),
        'eta_verify:eta=0.1': sampling.eta(p, 0.1),
        'speccascade:deferral=token_v3,alpha=0.6': sampling.min_p(p, 0.4),
        'overshoot_tail:l=0.5,rho=0.5': sampling.min_p(p, 0.5),
        'lenience:l=0.5': p,
        'cos:lam=0.3': p,
        'greedy': jax.nn.one_hot(jnp.argmax(p, -1), V),
    }
    for spec, law in expected.items():
        base = rules.matched_baseline(rules.make(spec))
        assert base.rule.lossless and base.rule.name == 'lossless'
        np.testing.assert_allclose(base.law(p), law, atol=1e-6, err_msg=spec)
        # Lossless verification of the truncated target and draft emits exactly p_A.
        pi = base.rule.induced_generic(base.transform(p), base.transform(q))
        np.testing.assert_allclose(pi, law, atol=1e-5, err_msg=spec)
    typ = rules.make('typical', eps=0.2)
    law = rules.matched_baseline(typ).law(p)
    assert np.all(
        np.asarray(law)[~np.asarray(typ.allowed(p) | (jax.nn.one_hot(jnp.argmax(p, -1), V) > 0))]
        == 0
    )


def test_matched_baseline_chain_monte_carlo():
    # The baseline for min-p: truncate target and draft, verify losslessly -> law p_A.
    names, p, q = _cases.stacked()
    base = rules.matched_baseline(rules.make('minp_verify', rho=0.3))
    n = 50_000
    pa, qa = base.transform(jnp.asarray(p)), base.transform(jnp.asarray(q))
    key_x, key_v = jax.random.split(_cases.key(9))
    qa_rows = jnp.repeat(qa, n, 0)
    x = jax.random.categorical(key_x, jnp.log(qa_rows))[:, None].astype(jnp.int32)
    target = jnp.stack([jnp.repeat(pa, n, 0)] * 2, axis=1)
    out = rules.verify_chain(base.rule, key_v, target, qa_rows[:, None], x)
    toks = np.asarray(out.tokens[:, 0]).reshape(len(names), n)
    for i, name in enumerate(names):
        emp = _cases.empirical(toks[i], p.shape[-1])
        law = np.asarray(pa[i])
        assert 0.5 * np.abs(emp - law).sum() <= _cases.tv_bound(law, n), name


def test_distortion_measures():
    p = jnp.asarray([0.5, 0.5, 0.0])
    pi = jnp.asarray([0.25, 0.5, 0.25])
    np.testing.assert_allclose(rules.tv(pi, p), 0.25)
    assert np.isinf(float(rules.kl(pi, p)))
    assert np.isinf(float(rules.overshoot_ratio(pi, p)))
    np.testing.assert_allclose(rules.kl(p, pi), 0.5 * np.log(2.0), rtol=1e-6)
    np.testing.assert_allclose(rules.overshoot_ratio(p, pi), 2.0, rtol=1e-6)
    np.testing.assert_allclose(rules.tv(p, p), 0.0)
    # Chain truncation at q = p: pi = p 1_A + (1 - p(A)) p, so TV(pi, p_A) = (1 - p(A))^2 > 0
    # (the leaked tail mass). The paper says '-> 1 - p(A)', assuming pi -> p; it does not
    # (docs/laws.md §3.2).
    rng = np.random.default_rng(1)
    pp = jnp.asarray(rng.dirichlet(np.full(V, 0.5), size=16), jnp.float32)
    rule = rules.make('minp_verify', rho=0.3)
    d = rules.measure(rule, pp, pp)
    p_a = jnp.where(rule.allowed(pp), pp, 0).sum(-1)
    np.testing.assert_allclose(d.tv, (1 - p_a) ** 2, atol=1e-6)
    assert np.all(np.asarray(rules.measure(rules.make('lossless'), pp, pp[::-1]).tv) < 1e-6)
