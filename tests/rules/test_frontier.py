"""The distortion frontier (docs/laws.md §8.1): acceptance <= sum(min(p, q)) + TV(pi, p).

Every registered rule's closed form (its law and acceptance at one position) on random laws
with zeros and one-hot rows: none lies above the frontier; the collaborative rules whose law
lies between p and q token by token sit on it to 1e-7 (float64); the truncation rules and
the flat ablations lie below it (distortion that buys no acceptance). Rules that read
logits or decide the block are checked through `accept_block` and `round_law` at A = 1 (at
A > 1 block verification's look-ahead is not a per-position rule: §8.1).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

from . import _cases
from .test_budget import random_laws

# Every registered rule, by spec (each speccascade deferral).
SPECS = _cases.RULE_SPECS + ('minp_verify_chainform:rho=0.3', 'eta_verify_chainform:eta=0.2',
                             'relaxed:top_k=3,delta=0.4', 'mars:theta=0.3',
                             'fuzzy:threshold=0.3', 'fly:window=1', 'block_verify')  # fmt: skip
# On the frontier at every position: pi lies between p and q token by token, and every token
# of min(pi, q) is accepted.
ON = ('lossless', 'lenience:l=0.5', 'lenience:l=0.2', 'cos:lam=0.4', 'overshoot_only:l=0.5',
      'static_ensemble:w=0.7', 'interp_ceiling:w=0.5', 'tv_budget:eps=0.1,l=0.5',
      'speccascade:deferral=chow,alpha=0.5', 'speccascade:deferral=diff,alpha=0.2',
      'speccascade:deferral=opt,alpha=0.5', 'block_verify', 'entropy_verify',
      'cactus:delta=0.5')  # fmt: skip
# Strictly below on some law, and on average.
BELOW = ('greedy', 'overshoot_tail:l=0.5,rho=0.3', 'uniform_interp:w=0.3',
         'lenience_flat:l=0.4', 'minp_verify:rho=0.3', 'eta_verify:eta=0.2',
         'minp_verify_chainform:rho=0.3', 'eta_verify_chainform:eta=0.2', 'typical:eps=0.2',
         'typical:eps=0.2,mode=sample', 'speccascade:deferral=token_v1,alpha=0.3',
         'speccascade:deferral=token_v2,alpha=0.2', 'speccascade:deferral=token_v3,alpha=0.6',
         'logit_ensemble:w_d=0.3', 'sglang:t_s=0.5,t_a=0.5', 'onehot_q',
         'relaxed:top_k=3,delta=0.4', 'mars:theta=0.3')  # fmt: skip


@jax.jit
def per_position(rule, p, q):
    pi = rule.induced(p, q)
    return rules.frontier_gap(p, q, pi, rule.acceptance_rate(p, q)), rules.tv(pi, p)


@jax.jit
def through_blocks(rule, p, q, z, zd):
    """A = 1: acceptance sum_x q(x) a(x) from accept_block's accept_probs for every draft x,
    and the q-weighted round law at the drafted position (the same for every x here)."""
    raw = rules.Raw(z, zd)

    def one(x):
        xb = jnp.full((p.shape[0], 1), x, jnp.int32)
        block = rule.accept_block(jnp.full(xb.shape, 0.5), p, q, xb, raw)
        return block.accept_probs[:, 0], rule.round_law(p, q, xb, raw)[:, 0]

    a, laws = jax.vmap(one, out_axes=1)(jnp.arange(p.shape[-1]))  # [B, V], [B, V(x), V]
    qx = q[:, 0]
    pi = jnp.einsum('bx,bxv->bv', qx, laws)
    acc = (qx * a).sum(-1)
    return rules.frontier_gap(p[:, 0], qx, pi, acc), rules.tv(pi, p[:, 0])


def gaps(spec: str) -> np.ndarray:
    """The rule's gap to the frontier on 97 random laws (V 11), float64."""
    rule = rules.make(spec)
    if not (rule.block_level or rule.needs_logits):
        p, q = (x.astype(np.float64) for x in random_laws(5, 97, 11))
        return np.asarray(per_position(rule, p / p.sum(-1, keepdims=True),
                                       q / q.sum(-1, keepdims=True))[0])  # fmt: skip
    rng = np.random.default_rng(6)
    z = rng.normal(0.0, 2.0, (97, 2, 11))
    zd = z[:, :1] + rng.normal(0.0, 1.5, (97, 1, 11))

    def softmax(x):
        e = np.exp(x - x.max(-1, keepdims=True))
        return e / e.sum(-1, keepdims=True)

    return np.asarray(through_blocks(rule, softmax(z), softmax(zd), z, zd)[0])


@pytest.fixture(scope='module')
def all_gaps():
    with jax.enable_x64(True):
        return {spec: gaps(spec) for spec in SPECS}


def test_no_registered_rule_lies_above_the_frontier(all_gaps):
    assert {s.split(':')[0] for s in SPECS} == set(rules.names())
    assert set(SPECS) == set(ON) | set(BELOW) | {'fuzzy:threshold=0.3', 'fly:window=1'}
    for name, g in all_gaps.items():
        assert g.min() >= -1e-6, (name, g.min())


def test_collaborative_rules_sit_on_the_frontier(all_gaps):
    """To 1e-7 at every position (float64; the logit-reading rules compute in float32)."""
    for name in ON:
        assert np.abs(all_gaps[name]).max() <= 1e-7, (name, np.abs(all_gaps[name]).max())


def test_truncation_rules_and_flat_ablations_lie_below(all_gaps):
    for name in BELOW:
        g = all_gaps[name]
        assert g.max() > 1e-2 and g.mean() > 1e-3, (name, g.max(), g.mean())


def test_frontier_gap_without_acceptance_is_the_triangle_slack():
    """acceptance None: the most a rule with law pi accepts, sum(min(pi, q)); the gap is then
    TV(pi, p) + TV(pi, q) - TV(p, q) >= 0, 0 for pi between p and q."""
    p, q = random_laws(2, 13, 7)
    pi = rules.make('minp_verify:rho=0.3').induced(p, q)
    slack = rules.tv(pi, p) + rules.tv(pi, q) - rules.tv(p, q)
    np.testing.assert_allclose(rules.frontier_gap(p, q, pi), slack, atol=1e-6)
    assert float(jnp.max(slack)) > 1e-2
    mix = 0.3 * p + 0.7 * q
    np.testing.assert_allclose(rules.frontier_gap(p, q, mix), 0.0, atol=1e-6)
