"""Unit properties of docs/laws.md §6 and parameter validation."""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

V = 7
LAWS_MD = os.path.join(os.path.dirname(__file__), '..', '..', 'docs', 'laws.md')
with open(LAWS_MD) as _f:
    LAWS = _f.read()


def _pairs(n=400, seed=0, conc=0.5):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(V, conc), size=n).astype(np.float32)
    q = rng.dirichlet(np.full(V, conc), size=n).astype(np.float32)
    return jnp.asarray(p), jnp.asarray(q)


def _accept_and_law(rule):
    return jax.jit(
        lambda p, q: (
            rule.accept_all(p, q),
            rule.induced(p, q),
            rule.replacement(p, q),
            rule.acceptance_rate(p, q),
        )
    )


def test_lenience_one_is_lossless_pointwise():
    p, q = _pairs()
    a1, pi1, r1, _ = _accept_and_law(rules.make('lenience', l=1.0))(p, q)
    a0, pi0, r0, _ = _accept_and_law(rules.make('lossless'))(p, q)
    np.testing.assert_allclose(a1, a0, atol=1e-6)
    np.testing.assert_allclose(r1, r0, atol=1e-6)
    np.testing.assert_allclose(pi1, p, atol=1e-5)
    assert rules.make('lenience', l=1.0).lossless and not rules.make('lenience', l=0.5).lossless


@pytest.mark.parametrize('l', [0.2, 0.5, 0.8])
def test_lenience_law_is_capped_by_p_over_l(l):
    p, q = _pairs(seed=1, conc=0.3)
    rule = rules.make('lenience', l=l)
    _, pi, _, rate = _accept_and_law(rule)(p, q)
    assert np.all(np.asarray(pi) <= np.asarray(p) / l + 1e-6)
    np.testing.assert_allclose(rate, jnp.minimum(q, p / l).sum(-1), atol=1e-5)
    # The tree form keeps the ceiling too (docs/laws.md §4.2).
    sibs = jnp.argsort(-q, axis=-1)[:, :3]
    pi_tree = jax.jit(rule.induced_tree_node)(p, sibs)
    assert np.all(np.asarray(pi_tree) <= np.asarray(p) / l + 1e-6)


def test_overshoot_only_has_lenience_law():
    p, q = _pairs(seed=2)
    for l in (0.3, 0.7):
        a, pi, r, _ = _accept_and_law(rules.make('overshoot_only', l=l))(p, q)
        a_l, pi_l, r_l, _ = _accept_and_law(rules.make('lenience', l=l))(p, q)
        np.testing.assert_allclose(a, a_l, atol=1e-6)
        np.testing.assert_allclose(r, r_l, atol=1e-6)
        np.testing.assert_allclose(pi, pi_l, atol=1e-6)


def test_cos_zero_is_lossless_and_cos_has_no_ceiling():
    p, q = _pairs(seed=3)
    a, pi, r, _ = _accept_and_law(rules.make('cos', lam=0.0))(p, q)
    a0, _, r0, _ = _accept_and_law(rules.make('lossless'))(p, q)
    np.testing.assert_allclose(a, a0, atol=1e-6)
    np.testing.assert_allclose(r, r0, atol=1e-6)
    np.testing.assert_allclose(pi, p, atol=1e-6)
    # A token the target nearly forbids keeps ~ lam q(x).
    p_tail = jnp.asarray([[0.97, 0.03 - 1e-6, 1e-6, 0, 0, 0, 0]], jnp.float32)
    q_tail = jnp.asarray([[0.2, 0.2, 0.6, 0, 0, 0, 0]], jnp.float32)
    pi = rules.make('cos', lam=0.5).induced(p_tail, q_tail)
    assert float(rules.overshoot_ratio(pi, p_tail)[0]) > 1e4


def test_min_p_extremes():
    p, q = _pairs(seed=4)
    a, pi, _, _ = _accept_and_law(rules.make('minp_verify', rho=0.0))(p, q)
    np.testing.assert_array_equal(np.asarray(a), 1.0)
    np.testing.assert_allclose(pi, q, atol=1e-6)
    a, _, _, _ = _accept_and_law(rules.make('minp_verify', rho=1.0))(p, q)
    top = jax.nn.one_hot(jnp.argmax(p, -1), V)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(top))


def test_token_v3_same_law_as_minp_but_higher_acceptance():
    p, q = _pairs(seed=5)
    for alpha in (0.3, 0.5, 0.9):
        _, pi3, _, b3 = _accept_and_law(
            rules.make('speccascade', deferral='token_v3', alpha=alpha)
        )(p, q)
        _, pim, _, bm = _accept_and_law(rules.make('minp_verify', rho=1 - alpha))(p, q)
        np.testing.assert_allclose(pi3, pim, atol=1e-6)
        assert np.all(np.asarray(b3) >= np.asarray(bm) - 1e-6)
        assert float(b3.mean()) > float(bm.mean()) + 0.01


def test_truncation_yield_sums_to_one_and_uniform_interp_form():
    p, q = _pairs(seed=6)
    rule = rules.make('minp_verify', rho=0.3)
    qa = jnp.where(rule.allowed(p), q, 0.0)
    np.testing.assert_allclose((qa / qa.sum(-1, keepdims=True)).sum(-1), 1.0, atol=1e-6)
    w = 0.3
    _, pi, _, _ = _accept_and_law(rules.make('uniform_interp', w=w))(p, q)
    under = np.asarray(q <= p)
    np.testing.assert_allclose(
        np.asarray(pi)[under], np.asarray((1 - w) * p + w * q)[under], atol=1e-6
    )


@pytest.mark.parametrize(
    'name, params, match',
    [
        ('lenience', {'l': 0.0}, r'l=0.0 is outside the valid range \[1.17549e-38, 1\]: '),
        ('lenience', {'l': 1.5}, r'\[1.17549e-38, 1\]'),
        ('overshoot_only', {'l': -1}, r'\[1.17549e-38, 1\]'),
        ('eta_verify', {'eta': 0.0}, r'eta=0.0 is outside the valid range \(0, 1\)'),
        ('eta_verify', {'eta': 1.0}, r'\(0, 1\)'),
        ('cos', {'lam': 1.2}, r'\[0, 1\]'),
        ('minp_verify', {'rho': -0.1}, r'\[0, 1\]'),
        ('uniform_interp', {'w': 2}, r'\[0, 1\]'),
        ('typical', {'eps': 0.0}, r'eps'),
        ('typical', {'eps': 0.1, 'mode': 'nope'}, r'mode'),
        ('speccascade', {'deferral': 'token_v4'}, r'token_v4'),
        ('speccascade', {'alpha': 2.0}, r'alpha'),
        ('nonexistent', {}, r'unknown rule .nonexistent.; known rules'),
        ('lenience', {'lam': 0.5}, r'no parameter'),
        ('lenience', {'l': 'abc'}, r'not a number'),
    ],
)
def test_invalid_parameters_raise_clear_errors(name, params, match):
    with pytest.raises(ValueError, match=match):
        rules.make(name, **params)


def test_rules_are_hashable_and_spec_strings_parse():
    a = rules.make('speccascade:deferral=token_v3,alpha=0.5')
    b = rules.SpecCascade(deferral='token_v3', alpha=0.5)
    assert a == b and hash(a) == hash(b)
    assert {rules.make('lenience', l=0.5), rules.make('lenience:l=0.5')} == {rules.Lenience(0.5)}
    for name in rules.names():
        rule = rules.make(name)
        assert rule.name == name and isinstance(rule.lossless, bool)
        assert rule.section.startswith('§'), name
        doc = (type(rule).__doc__ or '').lower()
        for word in ('a(x)', 'replacement', 'bonus', 'law', 'docs/laws.md §'):
            assert word in doc, (name, word)
        # The section the rule names is a heading of docs/laws.md.
        number = rule.section[1:].split(' ')[0].split(',')[0].split('-')[0]
        assert re.search(rf'^#+ {re.escape(number)}[ .]', LAWS, re.M), (name, rule.section)
