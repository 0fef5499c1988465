"""Safe defaults and numeric edges (issue 45 item 5): tv_budget's default ceiling keeps masks,
divisor parameters below the smallest normal float32 are ValueErrors, bf16 / fp16 laws are
computed in float32, NaN / inf rows are counted and reported, the verifiers run under
jax_enable_x64."""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules
from spec_jax import categorical, sampling
from spec_jax.decoding import stats as stats_lib
from spec_jax.rules import base

from . import _cases

# ---- tv_budget's default keeps a ceiling ------------------------------------------------------


def masked_pairs(n: int, v: int, seed: int):
    """n targets with about half their tokens masked to 0 (the argmax kept), and full-support
    drafts: float32 [n, V] each."""
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.full(v, 0.5), n)
    keep = rng.random((n, v)) < 0.5
    keep[np.arange(n), p.argmax(-1)] = True
    p = np.where(keep, p, 0.0)
    p /= p.sum(-1, keepdims=True)
    return p.astype(np.float32), rng.dirichlet(np.full(v, 0.5), n).astype(np.float32)


def test_tv_budget_default_never_puts_mass_where_p_is_0():
    """Over 2,000 random masked targets (V 11, eps 0.05 / 0.2 / 1): the default rule (l 0.5)
    has pi = 0 exactly where p = 0 and pi <= 2 p, in its chain law, its deterministic tree
    target (siblings: q's top 3, masked tokens among them) and its sampled tree target; and
    verify_chain's tokens (20,000 rows, one draft each from q) never land where p = 0. l None,
    asked for by name, does put mass there (what the docs say it breaks)."""
    assert rules.make('tv_budget').l == 0.5 and rules.make('tv_budget:eps=0.1').l == 0.5
    p, q = masked_pairs(2_000, 11, 0)
    zero = p == 0
    sibs = jnp.asarray(np.argsort(-q, -1)[:, :3].astype(np.int32))
    assert zero[np.arange(len(p))[:, None], np.asarray(sibs)].any()  # Masked siblings occur.
    pj, qj = jnp.asarray(p), jnp.asarray(q)
    for eps in (0.05, 0.2, 1.0):
        rule = rules.make('tv_budget', eps=eps)
        laws = rule.induced(pj, qj), rule.tree_target(pj, sibs), rule.tree_target(pj, sibs, qj)
        for law in map(np.asarray, laws):
            assert np.all(law[zero] == 0.0), eps
            assert np.all(law <= 2.0 * p * (1 + 1e-5) + 1e-7), eps
    n = 20_000
    rows = np.arange(n) % len(p)
    x = jax.random.categorical(jax.random.PRNGKey(0), jnp.log(qj[rows]), axis=-1)[:, None]
    p_rows = jnp.broadcast_to(pj[rows][:, None], (n, 2, 11))
    out = rules.verify_chain(rules.make('tv_budget', eps=1.0), _cases.key(1), p_rows,
                             qj[rows][:, None], x)  # fmt: skip
    emitted = np.asarray(out.tokens[:, :2])
    for k in range(2):
        live = k <= np.asarray(out.num_accepted)
        assert not zero[rows[live], emitted[live, k]].any(), k
    free = np.asarray(rules.make('tv_budget', eps=0.2, l=None).induced(pj, qj))
    assert free[zero].max() > 0.05  # No ceiling: mass where p = 0 (masks broken).


# ---- divisor parameters -------------------------------------------------------------------------

DIVISOR_RULES = (('tv_budget', {'eps': 0.1}), ('lenience', {}), ('overshoot_only', {}),
                 ('overshoot_tail', {'rho': 0.3}), ('lenience_flat', {}))  # fmt: skip


@pytest.mark.parametrize('name,extra', DIVISOR_RULES)
def test_divisor_below_the_smallest_normal_float32_is_a_clear_error(name, extra):
    """l below np.finfo(np.float32).tiny (flushed to 0: p / l = 0/0 where p = 0, the whole
    law NaN) is a ValueError naming the value; at tiny itself every law is finite, sums to 1
    and every acceptance probability is in [0, 1]."""
    tiny = float(np.finfo(np.float32).tiny)
    assert base.TINY == tiny
    for bad in (tiny / 2, 1e-39, 0.0, -1.0, float('nan')):
        with pytest.raises(ValueError, match=f'{name}: l={re.escape(repr(bad))} is outside'):
            rules.make(name, l=bad, **extra)
    rule = rules.make(name, l=tiny, **extra)
    _, p, q = _cases.stacked()
    pi = np.asarray(rule.induced(jnp.asarray(p), jnp.asarray(q)))
    acc = np.asarray(rule.accept_all(jnp.asarray(p), jnp.asarray(q)))
    assert np.all(np.isfinite(pi)) and np.allclose(pi.sum(-1), 1.0, atol=1e-5), pi
    assert np.all(np.isfinite(acc)) and np.all((acc >= 0) & (acc <= 1)), acc
    if 'deterministic' in rule.tree_modes:
        sibs = jnp.asarray(np.argsort(-q, -1)[:, :3].astype(np.int32))
        node = np.asarray(rule.induced_tree_node(jnp.asarray(p), sibs))
        assert np.all(np.isfinite(node)) and np.allclose(node.sum(-1), 1.0, atol=1e-5)


# ---- bf16 and fp16 are computed in float32 ----------------------------------------------------


def exact_pairs(v: int = 6, k: int = 8):
    """k (p, q) pairs [k, V] of multiples of 1/256 summing to 1: exact in bf16 and fp16, so a
    law computed in float32 from the narrow inputs is the float32 law bit for bit."""
    rng = np.random.default_rng(5)
    out = []
    for _ in range(2):
        cuts = np.sort(rng.integers(0, 257, (k, v - 1)), -1)
        out.append(np.diff(np.concatenate([np.zeros((k, 1)), cuts, np.full((k, 1), 256)], -1),
                           axis=-1) / 256.0)  # fmt: skip
    return out[0].astype(np.float32), out[1].astype(np.float32)


@pytest.mark.parametrize('dtype', [jnp.bfloat16, jnp.float16])
def test_narrow_inputs_are_computed_in_float32(dtype):
    """Every rule's induced law of bf16 inputs (tv_budget's of fp16 too) is float32 and equals
    the float32 law (exact inputs); tv_budget's sums to 1 and moves eps 0.05 to 1e-6 where the bf16
    computation itself (the unwrapped method) is 1e-4 or more off (the issue measured sum
    1.0007, TV 0.0502). The verifiers, the meter and the sampler's truncations take them too."""
    p, q = exact_pairs()
    lo_p, lo_q = jnp.asarray(p, dtype), jnp.asarray(q, dtype)
    for spec in _cases.RULE_SPECS if dtype == jnp.bfloat16 else ('tv_budget:eps=0.1,l=0.5',):
        rule = rules.make(spec)
        got = rule.induced(lo_p, lo_q)
        assert got.dtype == jnp.float32, spec
        np.testing.assert_allclose(np.asarray(got), np.asarray(rule.induced(p, q)), atol=1e-7,
                                   err_msg=spec)  # fmt: skip
    budget = rules.make('tv_budget', eps=0.05, l=None)
    pi = np.asarray(budget.induced(lo_p, lo_q), np.float64)
    moved = np.minimum(0.05, np.maximum(p - q, 0).sum(-1))
    np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-6)
    np.testing.assert_allclose(0.5 * np.abs(pi - p).sum(-1), moved, atol=1e-6)
    narrow = np.asarray(type(budget).induced.__wrapped__(budget, lo_p, lo_q), np.float64)
    assert np.abs(narrow.sum(-1) - 1).max() > 1e-4 or np.abs(
        0.5 * np.abs(narrow - p).sum(-1) - moved).max() > 1e-4  # fmt: skip
    x = jnp.asarray(np.argmax(q, -1)[:, None].astype(np.int32))
    p2 = jnp.stack([lo_p, lo_p], 1)
    out = rules.verify_chain(budget, _cases.key(2), p2, lo_q[:, None], x)
    ref = rules.verify_chain(budget, _cases.key(2), jnp.stack([p, p], 1), q[:, None], x)
    assert out.accept_probs.dtype == jnp.float32
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(ref.tokens))
    node = rules.verify_node(budget, _cases.key(3), lo_p, x, lo_q)
    assert node.final_dist.dtype == jnp.float32
    metered = rules.meter(jnp.asarray(pi, dtype), lo_p, rules.matched_baseline(budget))
    assert metered.tv.dtype == jnp.float32
    for fn, value in ((sampling.top_p, 0.8), (sampling.min_p, 0.3), (sampling.typical, 0.7),
                      (sampling.eta, 0.1), (sampling.top_k, 3)):  # fmt: skip
        law = fn(lo_p, value)
        assert law.dtype == jnp.float32, fn
        np.testing.assert_allclose(np.asarray(law).sum(-1), 1.0, atol=1e-6)
    assert categorical.upcast(jnp.asarray(p)) is not None and categorical.upcast(p) is p


# ---- NaN and inf rows are counted ----------------------------------------------------------------


def test_nonfinite_rows_are_counted_and_reported():
    """A NaN target row or an inf draft row: every rule rejects there and the token is no
    law's draw (token 0 for a NaN row), so the verifiers flag the row (`nonfinite`), the
    engine's statistics count the round, and `summarize` reports and warns."""
    _, p, q = _cases.stacked()
    b = len(p)
    p2 = np.stack([p, p], 1)
    p2[1, 0, 2] = np.nan
    q1 = q[:, None].copy()
    q1[3, 0, 0] = np.inf
    x = jnp.zeros((b, 1), jnp.int32)
    want = np.zeros(b, bool)
    want[[1, 3]] = True
    for spec in ('lossless', 'minp_verify:rho=0.3'):
        out = rules.verify_chain(rules.make(spec), _cases.key(4), jnp.asarray(p2),
                                 jnp.asarray(q1), x)  # fmt: skip
        np.testing.assert_array_equal(np.asarray(out.nonfinite), want, err_msg=spec)
    node = rules.verify_node(rules.Lossless(), _cases.key(5), jnp.asarray(p2[:, 0]),
                             jnp.zeros((b, 2), jnp.int32))  # fmt: skip
    np.testing.assert_array_equal(np.asarray(node.nonfinite), np.arange(b) == 1)
    tree = rules.Tree.full(2, 2)
    p_bmv = np.broadcast_to(p[:, None], (b, tree.num_nodes, p.shape[-1])).copy()
    p_bmv[2, 0, 1] = np.inf  # The root: every walk reads it.
    tokens = jnp.zeros((b, tree.num_nodes), jnp.int32)
    walk = rules.verify_tree(rules.Lossless(), _cases.key(6), tree, tokens, jnp.asarray(p_bmv))
    np.testing.assert_array_equal(np.asarray(walk.nonfinite), np.arange(b) == 2)
    stats = stats_lib.Stats.zeros(b, 1, 4)
    live = jnp.asarray(np.arange(b) != 3)  # A finished row is not counted.
    stats = stats.update(out, live).update(out, jnp.ones(b, bool))
    with pytest.warns(RuntimeWarning, match='3 rounds verified a target or draft law'):
        summary = stats_lib.summarize(stats)
    assert summary['nonfinite_rounds'] == 3
    assert summary['per_row']['nonfinite'] == [0, 2, 0, 1, 0, 0]


# ---- jax_enable_x64 ---------------------------------------------------------------------------


def test_verifiers_run_under_x64():
    """jax_enable_x64 makes jnp.arange int64; the sibling scan and the walk's carries stay
    int32 (this raised a TypeError: an int64 arange against an int32 carry). verify_node with
    distinct siblings; verify_tree on a static tree (EAGLE siblings) and on traced parents
    (i.i.d. siblings)."""
    _, p, q = _cases.stacked()
    b = len(p)
    sibs = jnp.asarray(np.argsort(-q, -1)[:, :2].astype(np.int32))
    tree = rules.Tree.full(2, 2)
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, p.shape[-1], (b, tree.num_nodes)),
                         jnp.int32)  # fmt: skip
    p_bmv = jnp.asarray(np.broadcast_to(p[:, None], (b, tree.num_nodes, p.shape[-1])))
    q_bmv = jnp.asarray(np.broadcast_to(q[:, None], (b, tree.num_nodes, q.shape[-1])))
    with jax.enable_x64(True):
        assert jnp.arange(2).dtype == jnp.int64
        rule = rules.make('tv_budget', eps=0.1)
        outs = [rules.verify_node(rule, _cases.key(7), jnp.asarray(p), sibs, jnp.asarray(q),
                                  draws='distinct')]  # fmt: skip
        for out in outs:
            assert out.token.dtype == jnp.int32 and out.choice.dtype == jnp.int32
        parents = jnp.asarray(tree.parents, jnp.int32)
        walks = [rules.verify_tree(rule, _cases.key(8), tree, tokens, p_bmv),
                 rules.verify_tree(rule, _cases.key(8), parents, tokens, p_bmv, q_bmv,
                                   max_depth=2, max_children=2)]  # fmt: skip
        for walk in walks:
            assert walk.num_accepted.dtype == jnp.int32 and walk.path.dtype == jnp.int32
            assert np.all(np.asarray(walk.num_accepted) <= 2)
