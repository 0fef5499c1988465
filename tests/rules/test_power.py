"""Power of the token-level law checks against a 0.02-TV mistake (issue 29 point 5).

For lenience, min-p and CoS in chain mode and min-p and lenience in tree mode: N
independent rows of one position (fixed p, q over V = 7; one node with fixed siblings in
tree mode) go through the real verifier (`rules.verify_chain` with one draft x ~ q, or
`rules.verify_node`), and a binomial test asks whether the emitted token's frequency in an
event S matches the law enumerated from the rule's definition (tests/decoding/
test_meter_laws.py's `chain_position_law` / `tree_node_law`, not the rule's `induced`).

The mistake is a verifier whose law w is off by TV(pi, w) >= 0.02: the rule's parameter
shifted until the TV reaches 0.02, or, where the law is piecewise constant in the
parameter (min-p's tree gate passes a sibling or not), the rule's token replaced with
probability eps by a draw from another law (a mixture at TV 0.02). The event is
S = {v : w(v) > pi(v)}, so w(S) - pi(S) = TV(pi, w) >= 0.02.

Bound: the test accepts the law pi when the count K ~ Bin(N, pi(S)) lies in [lo, hi],
P(K < lo) <= ALPHA / 2 and P(K > hi) <= ALPHA / 2 under pi: a correct verifier fails with
probability <= ALPHA = 1e-6 (two-sided). Power: the probability, from the binomial law, that
a count from Bin(N, pi(S) +- 0.02) falls outside [lo, hi] (the smaller of the two
directions; it only grows with a larger shift), asserted >= 0.99 at N = 40,009; the test
then runs the mistaken verifier and asserts it is rejected.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

import spec_jax.rules as rules
from tests.decoding.test_meter_laws import chain_position_law, parse, tree_node_law

ALPHA = 1e-6  # Two-sided size of each binomial test.
POWER = 0.99  # Required probability of rejecting a law whose P(S) is off by 0.02.
SHIFT = 0.02  # The TV of the mistake the checks must catch.
N = 40_009
P = np.array([0.40, 0.22, 0.15, 0.10, 0.07, 0.04, 0.02])
Q = np.array([0.20, 0.30, 0.05, 0.03, 0.22, 0.13, 0.07])
SIBLINGS = {'minp_verify': [4, 5], 'lenience': [1, 0]}  # Tree mode's node children.


def acceptance_region(s: float) -> tuple[int, int]:
    """[lo, hi] with P(K < lo) <= ALPHA/2 and P(K > hi) <= ALPHA/2 for K ~ Bin(N, s)."""
    return int(stats.binom.ppf(ALPHA / 2, N, s)), int(stats.binom.isf(ALPHA / 2, N, s))


def power(s: float, shift: float = SHIFT) -> float:
    """P(reject) when the true P(S) is s + shift or s - shift (the smaller)."""
    lo, hi = acceptance_region(s)
    return min(stats.binom.cdf(lo - 1, N, t) + stats.binom.sf(hi, N, t)
               for t in (s - shift, s + shift) if 0 <= t <= 1)  # fmt: skip


def law(mode: str, name: str, value: float) -> np.ndarray:
    if mode == 'chain':
        return chain_position_law(name, value, P, Q)
    return tree_node_law(name, value, P, SIBLINGS[name])


@jax.jit
def chain_tokens(rule, key):
    """The token emitted at the first position of N one-draft chains, x ~ Q."""
    k_draft, k_verify = jax.random.split(key)
    p = jnp.broadcast_to(jnp.asarray(P, jnp.float32), (N, 2, len(P)))
    q = jnp.broadcast_to(jnp.asarray(Q, jnp.float32), (N, 1, len(P)))
    x = jax.random.categorical(k_draft, jnp.log(q[:, 0]))[:, None]
    return rules.verify_chain(rule, k_verify, p, q, x).tokens[:, 0]


@jax.jit
def node_tokens(rule, key, siblings):
    """The token emitted at N copies of one tree node with children `siblings`."""
    p = jnp.broadcast_to(jnp.asarray(P, jnp.float32), (N, len(P)))
    return rules.verify_node(rule, key, p, jnp.broadcast_to(siblings, (N, len(siblings)))).token


def sample(mode: str, spec: str, key, mix=None):
    """Tokens of the real verifier of `spec`; `mix` = (eps, law r): each replaced by a draw
    from r with probability eps (the mixture mistake)."""
    rule = rules.make(spec)
    if mode == 'chain':
        tokens = chain_tokens(rule, key)
    else:
        tokens = node_tokens(rule, key, jnp.asarray(SIBLINGS[parse(spec)[0]], jnp.int32))
    if mix is not None:
        eps, other = mix
        k_u, k_r = jax.random.split(jax.random.fold_in(key, 1))
        swap = jax.random.uniform(k_u, (N,)) < eps
        drawn = jax.random.categorical(k_r, jnp.log(jnp.asarray(other, jnp.float32)), shape=(N,))
        tokens = jnp.where(swap, drawn, tokens)
    return np.asarray(tokens)


def shifted(mode: str, name: str, value: float, step: float, limit: float):
    """The smallest parameter value + k * step (k = 1, 2, ...) whose law is >= SHIFT away in
    TV, with that law."""
    pi = law(mode, name, value)
    for k in range(1, 400):
        other = value + k * step
        if not 0 < other <= limit:
            break
        w = law(mode, name, other)
        if 0.5 * np.abs(w - pi).sum() >= SHIFT:
            return other, w
    raise AssertionError(f'no {name} parameter near {value} moves the law by {SHIFT}')


@pytest.mark.parametrize(
    'mode,spec,step,limit',
    [
        ('chain', 'lenience:l=0.5', 0.002, 1.0),
        ('chain', 'minp_verify:rho=0.3', -0.002, 1.0),
        ('chain', 'cos:lam=0.6', 0.002, 1.0),
        ('tree', 'lenience:l=0.5', 0.002, 1.0),
        ('tree', 'minp_verify:rho=0.3', None, None),  # Piecewise constant: a mixture.
    ],
)
def test_token_check_rejects_a_0_02_tv_mistake(mode, spec, step, limit):
    """The true verifier passes the binomial test of its enumerated law on S; the law off by
    TV >= 0.02 fails it, with the power computed from the binomial distribution."""
    name, value = parse(spec)
    pi = law(mode, name, value)
    key = jax.random.PRNGKey(sum(map(ord, mode + spec)))
    if step is None:  # The rule's token, or with probability eps a draw from Q.
        eps = SHIFT / (0.5 * np.abs(Q - pi).sum())
        wrong_spec, w, mix = spec, (1 - eps) * pi + eps * Q, (eps, Q)
    else:
        wrong_value, w = shifted(mode, name, value, step, limit)
        wrong_spec, mix = f'{spec.split("=")[0]}={wrong_value:.6f}', None
    distance = 0.5 * np.abs(w - pi).sum()
    assert SHIFT - 1e-9 <= distance < 2 * SHIFT, distance  # A mistake of about 0.02 TV.
    event = w > pi
    s = pi[event].sum()
    assert w[event].sum() - s == pytest.approx(distance)  # S moves by the whole TV.
    lo, hi = acceptance_region(s)
    assert power(s) >= POWER, (power(s), s)

    k_true = np.isin(sample(mode, spec, key), np.flatnonzero(event)).sum()
    assert lo <= k_true <= hi, (k_true, lo, hi, N * s)  # The true law passes...
    k_wrong = np.isin(sample(mode, wrong_spec, jax.random.fold_in(key, 7), mix),
                      np.flatnonzero(event)).sum()  # fmt: skip
    assert not lo <= k_wrong <= hi, (k_wrong, lo, hi, N * w[event].sum())  # ...the mistake not.
