"""Rules as pytrees: traced parameters (one compile per sweep) and per-row PRNG keys."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules
from spec_jax import categorical
from spec_jax.rules import base, registry

from . import _cases

B, A, V = 5, 3, 13

# Six in-range values per float parameter name.
SWEEP = {
    'l': (0.15, 0.3, 0.45, 0.6, 0.8, 1.0),
    'lam': (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    'rho': (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    'w': (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    'alpha': (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    'eta': (0.02, 0.05, 0.1, 0.2, 0.4, 0.8),
    'eps': (0.02, 0.05, 0.1, 0.2, 0.4, 0.8),
    'delta': (0.1, 0.3, 0.5, 1.0, 2.0, 4.0),
    'w_d': (0.0, 0.2, 0.4, 0.6, 0.8, 1.0),
    't_s': (0.05, 0.2, 0.4, 0.6, 0.8, 1.0),
    't_a': (0.05, 0.2, 0.4, 0.6, 0.8, 1.0),
    'posterior_threshold': (0.05, 0.2, 0.4, 0.6, 0.8, 1.0),
    'posterior_alpha': (0.0, 0.2, 0.4, 0.8, 1.6, 3.2),
}


def _float_params(rule) -> tuple[str, ...]:
    """Names of the rule's pytree leaves (its float parameters)."""
    return tuple(f.name for f in dataclasses.fields(rule) if f.name not in rule.static_fields)


PARAM_SPECS = tuple(s for s in _cases.RULE_SPECS if _float_params(rules.make(s)))
BASELINE_SPECS = (
    ('minp_verify:rho=0.3', 'rho'),
    ('overshoot_tail:l=0.5,rho=0.3', 'rho'),
    ('eta_verify:eta=0.2', 'eta'),
    ('typical:eps=0.2', 'eps'),
    ('speccascade:deferral=token_v3,alpha=0.6', 'alpha'),
    ('speccascade:deferral=token_v2,alpha=0.2', 'alpha'),
)


def _block(seed=0, b=B, a=A, v=V):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(v, 0.5), size=(b, a + 1)).astype(np.float32)
    q = rng.dirichlet(np.full(v, 0.5), size=(b, a)).astype(np.float32)
    x = np.array([[rng.choice(v, p=q[i, j] / q[i, j].sum()) for j in range(a)] for i in range(b)])
    return jnp.asarray(p), jnp.asarray(q), jnp.asarray(x, jnp.int32)


def _counting_jit(fn):
    """jax.jit(fn) plus a list that grows by one each time fn is traced."""
    traces = []

    def traced(*args):
        traces.append(1)
        return fn(*args)

    return jax.jit(traced), traces


def _assert_same(got, want, msg=''):
    for name, g, w in zip(want._fields, got, want, strict=True):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(w), err_msg=f'{msg} {name}')


def test_every_rule_declares_its_static_fields():
    assert rules.Typical.static_fields == ('mode',)
    assert rules.SpecCascade.static_fields == ('deferral',)
    for name in rules.names():
        rule = rules.make(name)
        leaves = jax.tree_util.tree_leaves(rule)  # A None parameter (tv_budget l=None) is none.
        params = [f for f in _float_params(rule) if getattr(rule, f) is not None]
        assert len(leaves) == len(params), name
        assert all(isinstance(v, float) for v in leaves), (name, leaves)
        for f in rule.static_fields:  # Modes are strings; a few rules' ints (top_k, window).
            assert isinstance(getattr(rule, f), (str, int)), (name, f)


@pytest.mark.parametrize('spec', PARAM_SPECS)
def test_traced_parameters_match_static_and_compile_once(spec):
    p, q, x = _block(0)
    key = _cases.key(1)
    rule0 = rules.make(spec)

    f, traces = _counting_jit(lambda rule, key, p, q, x: rules.verify_chain(rule, key, p, q, x))

    # The old style: Python floats baked into the trace as constants (one compile per value).
    static = jax.jit(lambda k, p, q, x: rules.verify_chain(rule0, k, p, q, x))(key, p, q, x)
    _assert_same(f(rule0, key, p, q, x), static, spec)

    cache0 = rules.verify_chain._cache_size()
    for name in _float_params(rule0):
        outs = []
        for value in SWEEP[name]:
            rule = rules.make(spec, **{name: value})
            got = f(rule, key, p, q, x)
            _assert_same(got, rules.verify_chain(rule, key, p, q, x), f'{spec} {name}={value}')
            outs.append(np.asarray(got.accept_probs))
        # The parameter is live: the sweep changes the acceptance probabilities.
        assert any(not np.array_equal(outs[0], o) for o in outs[1:]), (spec, name)
    # f traced once for the spec value and every sweep value; verify_chain itself compiled
    # (at most) once for the whole sweep.
    assert len(traces) == 1, (spec, len(traces))
    assert rules.verify_chain._cache_size() <= cache0 + 1


@pytest.mark.parametrize('spec, name', BASELINE_SPECS)
def test_matched_baseline_with_traced_param(spec, name):
    p = _block(2)[0][:, 0]  # [B, V]

    def baseline_of(rule, p):
        baseline = rules.matched_baseline(rule)
        assert isinstance(baseline.param if name != 'eps' else rule.eps, jax.core.Tracer)
        return baseline.transform(p), baseline.law(p), baseline.allowed(p)

    g, g_traces = _counting_jit(baseline_of)
    # A MatchedBaseline is itself a pytree argument.
    h, h_traces = _counting_jit(lambda baseline, p: baseline.transform(p))

    outs = []
    for value in SWEEP[name]:
        rule = rules.make(spec, **{name: value})
        want = rules.matched_baseline(rule)
        transform, law, allowed = g(rule, p)
        np.testing.assert_array_equal(transform, want.transform(p), err_msg=f'{spec} {value}')
        np.testing.assert_array_equal(law, want.law(p))
        np.testing.assert_array_equal(allowed, want.allowed(p))
        np.testing.assert_array_equal(h(want, p), want.transform(p))
        outs.append(np.asarray(transform))
    assert len(g_traces) == 1 and len(h_traces) == 1, (spec, g_traces, h_traces)
    assert any(not np.array_equal(outs[0], o) for o in outs[1:]), spec


KEY_KINDS = {
    'raw': lambda seed: jax.random.split(jax.random.PRNGKey(seed), B),  # uint32 [B, 2]
    'typed': lambda seed: jax.random.split(jax.random.key(seed), B),  # key<fry> [B]
    'rbg': lambda seed: jax.random.split(jax.random.key(seed, impl='rbg'), B),
}


@pytest.mark.parametrize('kind', sorted(KEY_KINDS))
def test_per_row_keys_make_rows_independent_of_the_batch(kind):
    p, q, x = _block(3)
    keys = KEY_KINDS[kind](5)
    assert categorical.is_key_batch(keys) and not categorical.is_key_batch(keys[0])
    rule = rules.make('lenience', l=0.3)
    full = rules.verify_chain(rule, keys, p, q, x)
    assert full.tokens.shape == (B, A + 1)
    for b in range(B):
        alone = rules.verify_chain(rule, keys[b : b + 1], p[b : b + 1], q[b : b + 1], x[b : b + 1])
        row = jax.tree_util.tree_map(lambda v, b=b: v[b : b + 1], full)
        _assert_same(alone, row, f'{kind} row {b}')
        # And the same as the one-key path on that row alone with key b.
        single = rules.verify_chain(rule, keys[b], p[b : b + 1], q[b : b + 1], x[b : b + 1])
        _assert_same(single, row, f'{kind} row {b} single key')
    # Reordering the rows (with their keys) reorders the results.
    perm = np.array([3, 0, 4, 1, 2])
    shuffled = rules.verify_chain(rule, keys[perm], p[perm], q[perm], x[perm])
    _assert_same(shuffled, jax.tree_util.tree_map(lambda v: v[perm], full), kind)


def test_per_row_keys_edge_cases():
    p, q, x = _block(4)
    keys = KEY_KINDS['raw'](6)
    rule = rules.make('lossless')
    # Draft length 0: only the bonus token, drawn from each row's own key.
    out = rules.verify_chain(rule, keys, p[:, :1], q[:, :0], x[:, :0])
    assert out.tokens.shape == (B, 1)
    want = jax.jit(
        lambda k, p: categorical.sample_rows(jax.vmap(lambda k: jax.random.split(k)[1])(k), p)
    )(keys, p[:, 0])
    np.testing.assert_array_equal(out.final_token, want)
    # A traced rule and per-row keys together.
    f = jax.jit(lambda r, k, p, q, x: rules.verify_chain(r, k, p, q, x))
    cos = rules.make('cos', lam=0.3)
    _assert_same(f(cos, keys, p, q, x), rules.verify_chain(cos, keys, p, q, x))
    with pytest.raises(ValueError, match='3 keys for a batch of 5 rows'):
        rules.verify_chain(rule, keys[:3], p, q, x)
    with pytest.raises(ValueError, match='expected one key or a batch'):
        rules.verify_chain(rule, jnp.zeros((B, 2, 2), jnp.uint32), p, q, x)


@pytest.mark.parametrize('kind', sorted(KEY_KINDS))
def test_sample_rows(kind):
    rng = np.random.default_rng(7)
    probs = jnp.asarray(rng.dirichlet(np.full(V, 0.5), size=(B, 2)), jnp.float32)
    keys = KEY_KINDS[kind](8)
    rows = jax.jit(categorical.sample_rows, static_argnames='method')
    got = rows(keys, probs)  # [B, 2, V] -> [B, 2]
    assert got.shape == (B, 2) and got.dtype == jnp.int32
    one = jax.jit(categorical.sample)
    for b in range(B):
        np.testing.assert_array_equal(got[b], one(keys[b], probs[b]))
    np.testing.assert_array_equal(rows(keys, probs)[1:3], rows(keys[1:3], probs[1:3]))
    onehot = jax.nn.one_hot(jnp.arange(B) % V, V)
    for method in ('cdf', 'gumbel'):
        np.testing.assert_array_equal(rows(keys, onehot, method=method), np.arange(B))
    with pytest.raises(ValueError, match='keys for probs'):
        categorical.sample_rows(keys[:2], probs[:, 0])
    with pytest.raises(ValueError, match='not a batch of keys'):
        categorical.sample_rows(keys[0], probs[:1, 0])


def test_unflatten_skips_validation_but_constructors_validate():
    for name in rules.names():
        rule = rules.make(name)
        leaves, treedef = jax.tree_util.tree_flatten(rule)
        again = jax.tree_util.tree_unflatten(treedef, leaves)
        assert again == rule and hash(again) == hash(rule) and repr(again) == repr(rule)
        sentinel = jax.tree_util.tree_map(lambda v: object(), rule)  # Must not raise.
        assert type(sentinel) is type(rule)
        for f in rule.static_fields:
            assert getattr(sentinel, f) == getattr(rule, f)
        if leaves:  # Out-of-range leaves are accepted by unflatten (no __post_init__).
            bad = jax.tree_util.tree_map(lambda v: 5.0, rule)
            assert set(jax.tree_util.tree_leaves(bad)) == {5.0}
    baseline = rules.matched_baseline(rules.make('typical', eps=0.2))
    leaves, treedef = jax.tree_util.tree_flatten(baseline)
    assert len(leaves) == 2 and jax.tree_util.tree_unflatten(treedef, leaves) == baseline
    assert jax.tree_util.tree_map(lambda v: object(), baseline).truncation == 'typical_accept'
    with pytest.raises(ValueError, match=r'lenience: l=2.0 is outside the valid range \[1.17'):
        rules.make('lenience', l=2.0)
    with pytest.raises(ValueError, match=r'\[1.17549e-38, 1\]'):
        rules.Lenience(l=2.0)
    with pytest.raises(ValueError, match='mode'):
        rules.Typical(mode='nope')


def test_rules_built_inside_jit_and_host_side_lossless():
    p, q, _ = _block(9)
    p, q = p[:, 0], q[:, 0]
    want = rules.make('lenience', l=0.4).accept_all(p, q)
    got = jax.jit(lambda l: rules.Lenience(l=l).accept_all(p, q))(0.4)
    np.testing.assert_array_equal(got, jax.jit(rules.make('lenience', l=0.4).accept_all)(p, q))
    np.testing.assert_allclose(got, want, rtol=1e-6)
    typ = jax.jit(lambda e: rules.Typical(eps=e).threshold(p))(0.2)
    np.testing.assert_allclose(typ, rules.make('typical', eps=0.2).threshold(p), rtol=1e-6)
    assert rules.make('lenience', l=1.0).lossless is True
    assert rules.make('cos', lam=0.3).lossless is False
    with pytest.raises(TypeError, match='host-side property'):
        jax.jit(lambda r: jnp.asarray(r.lossless))(rules.make('lenience', l=1.0))


def test_register_pytree_checks_static_fields():
    @dataclasses.dataclass(frozen=True)
    class Forgot(base.Rule):
        kind: str = 'a'
        x: float = 0.5

    with pytest.raises(ValueError, match="field 'kind'.*static_fields"):
        registry.register_pytree(Forgot)

    @dataclasses.dataclass(frozen=True)
    class Typo(base.Rule):
        x: float = 0.5
        static_fields = ('kindd',)

    with pytest.raises(ValueError, match='kindd'):
        registry.register_pytree(Typo)
