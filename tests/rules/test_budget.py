"""tv_budget (docs/laws.md §8.2): its law, cap and frontier against numpy written from the
definition; its Monte Carlo law with the power to catch a 0.01 TV error; its tree forms.

The numpy law (`budget_law`) is the issue's definition, not the library's closed form: move
m = min(eps, sum (p - q)_+, sum (min(q, p/l) - p)_+) from where p > q (never below q) to
where q > p (never above q or p/l), each token giving and receiving in proportion to its
room. The rule's chain law is checked by enumerating the verifier's own pieces (a(x) for
every x, the replacement) and by Monte Carlo through `verify_chain`; `induced` is checked
against the same numpy law but never used as the reference.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules
from spec_jax.decoding import verification as verification_lib

from . import _cases
from .test_laws import node_law_enumerated, rate_radius, tv_radius


def budget_law(p, q, eps, l):
    """(pi, m) in float64 from the definition (proportional to the rooms)."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    give = np.maximum(p - q, 0.0)
    receive = np.maximum((q if l is None else np.minimum(q, p / l)) - p, 0.0)
    m = min(eps, give.sum(), receive.sum())
    if m <= 0:
        return p, 0.0
    return p - m * give / give.sum() + m * receive / receive.sum(), m


def greedy_law(p, q, eps, l):
    """The other choice: givers by largest p/q first, down to q; receivers by largest
    min(q, p/l)/p first, up to that ceiling."""
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    ceiling = q if l is None else np.minimum(q, p / l)
    give, receive = np.maximum(p - q, 0.0), np.maximum(ceiling - p, 0.0)
    m = min(eps, give.sum(), receive.sum())
    out = p.copy()
    with np.errstate(divide='ignore', invalid='ignore'):
        by_give = np.argsort(-np.where(q > 0, p / q, np.inf), kind='stable')
        by_receive = np.argsort(-np.where(p > 0, ceiling / p, np.inf), kind='stable')
    for order, room, sign in ((by_give, give, -1.0), (by_receive, receive, 1.0)):
        left = m
        for x in order:
            step = min(left, room[x])
            out[x] += sign * step
            left -= step
    return out


def node_target(p, siblings, eps, l):
    """The deterministic-sibling tree target from the definition: from outside S onto S,
    which is the chain law with q := 1 on S and 0 elsewhere (EAGLE's walk takes q := 1)."""
    on = np.isin(np.arange(np.size(p)), [s for s in siblings if s >= 0])
    return budget_law(p, on.astype(np.float64), eps, l)[0]


def random_laws(seed: int, k: int, v: int):
    """k (p, q) pairs [k, v]: Dirichlet(0.5) with ~30% of entries zeroed, plus one-hot p,
    one-hot q, p == q and disjoint supports."""
    rng = np.random.default_rng(seed)

    def draw():
        x = rng.dirichlet(np.full(v, 0.5), k) * (rng.random((k, v)) > 0.3)
        x[np.arange(k), rng.integers(0, v, k)] += 1e-3  # Never all zero.
        return x / x.sum(-1, keepdims=True)

    p, q = draw(), draw()
    p[0], q[1] = np.eye(v)[2], np.eye(v)[3]
    q[2] = p[2]
    p[3], q[3] = np.r_[0.6, 0.4, np.zeros(v - 2)], np.r_[0.0, 0.0, 0.5, 0.5, np.zeros(v - 4)]
    return p.astype(np.float32), q.astype(np.float32)


SETTINGS = [(eps, l) for eps in (0.0, 0.03, 0.1, 0.5, 1.0) for l in (None, 0.3, 0.7, 1.0)]


@jax.jit
def pieces(rule, p, q):
    """a(x) for every x [K, V] (the verifier's accept_prob), the replacement, induced, the
    acceptance rate."""
    v = p.shape[-1]
    xs = jnp.broadcast_to(jnp.arange(v), p.shape)
    a = jax.vmap(lambda x: rule.accept_prob(p, q, x), in_axes=1, out_axes=1)(xs)
    return a, rule.replacement(p, q), rule.induced(p, q), rule.acceptance_rate(p, q)


@pytest.mark.parametrize('eps,l', SETTINGS)
def test_law_cap_and_frontier_against_numpy(eps, l):
    """The verifier's law (sum_x q(x) [a(x) 1_x + (1 - a(x)) replacement]) and `induced`
    equal the numpy law to 1e-6; TV(pi, p) = min(eps, rooms) to 1e-6, never above eps;
    acceptance = sum(min(p, q)) + TV(pi, p) to 1e-6 (on the frontier)."""
    p, q = random_laws(7, 41, 11)
    rule = rules.make('tv_budget', eps=eps, l=l)
    a, repl, induced, rate = (np.asarray(x, np.float64) for x in pieces(rule, p, q))
    q64 = q.astype(np.float64)
    accepted = q64 * a
    enumerated = accepted + (1.0 - accepted.sum(-1, keepdims=True)) * repl
    for i in range(len(p)):
        want, m = budget_law(p[i], q[i], eps, l)
        np.testing.assert_allclose(enumerated[i], want, atol=1e-6, err_msg=f'row {i}')
        np.testing.assert_allclose(induced[i], want, atol=1e-6, err_msg=f'row {i}')
        tv = 0.5 * np.abs(enumerated[i] - p[i]).sum()
        assert abs(tv - m) <= 1e-6 and tv <= eps + 1e-6, (i, tv, m, eps)
        lossless = np.minimum(p[i], q[i]).astype(np.float64).sum()
        assert abs(rate[i] - (lossless + tv)) <= 1e-6, (i, rate[i], lossless, tv)
    if eps > 0 and l != 1.0:
        assert max(budget_law(p[i], q[i], eps, l)[1] for i in range(len(p))) > 0  # It moves.


def test_eps_0_and_l_1_are_lossless_sd_exactly():
    """Law p bit for bit, and verify_chain's tokens equal lossless SD's on the same keys."""
    p, q, _ = (np.asarray(x) for x in _chain(2_003))
    x = jax.random.categorical(jax.random.PRNGKey(5), jnp.log(q), axis=-1)
    key = _cases.key(9)
    want = rules.verify_chain(rules.make('lossless'), key, p, q, x)
    for spec in ('tv_budget:eps=0', 'tv_budget:eps=0,l=0.5', 'tv_budget:eps=0.3,l=1'):
        rule = rules.make(spec)
        assert rule.lossless, spec
        np.testing.assert_array_equal(np.asarray(rule.induced(p[:, :-1], q)), p[:, :-1])
        if rule.l is None:  # One compiled verifier for the two with l (the same structure).
            continue
        got = rules.verify_chain(rule, key, p, q, x)
        np.testing.assert_array_equal(np.asarray(got.tokens), np.asarray(want.tokens), spec)
    assert not rules.make('tv_budget:eps=0.1,l=None').lossless


def _chain(n: int):
    """n rows of a 2-draft chain from random_laws: p [n, 3, V], q [n, 2, V]."""
    p, q = random_laws(3, 24, 7)
    rows = np.random.default_rng(0).integers(0, 24, (n, 3))
    return jnp.asarray(p[rows]), jnp.asarray(q[rows[:, :2]]), rows


# The Monte Carlo chain: one position, V 5, eps 0.05 moves 0.05 (rooms 0.35 and 0.25, not
# binding), so the laws at eps 0.04 and 0.06 are 0.01 from it in TV.
MC_P = np.array([0.40, 0.25, 0.05, 0.30, 0.00], np.float32)
MC_Q = np.array([0.10, 0.20, 0.30, 0.25, 0.15], np.float32)
N_MC = 500_000


def test_monte_carlo_law_has_the_power_to_catch_0_01():
    """verify_chain's token at the drafted position, 500k rows: within r = 0.0048 (V 5,
    delta 1e-8, Bretagnolle-Huber-Carol, tests/rules/test_laws.py) of the law; 2r = 0.0096
    < 0.01, so a law 0.01 away (eps 0.04 or 0.06 instead of 0.05; the greedy sharing, 0.04
    away) fails with probability >= 1 - 1e-8: asserted on the realised draws. Acceptance
    within Hoeffding's 0.0045 of sum(min(p, q)) + 0.05."""
    n, v = N_MC, MC_P.size
    p = jnp.broadcast_to(jnp.asarray(np.stack([MC_P, MC_P])), (n, 2, v))
    q = jnp.broadcast_to(jnp.asarray(MC_Q[None]), (n, 1, v))
    x = jax.random.categorical(jax.random.PRNGKey(11), jnp.log(q), axis=-1)
    out = rules.verify_chain(rules.make('tv_budget', eps=0.05, l=None), _cases.key(12), p, q, x)
    got = _cases.empirical(np.asarray(out.tokens[:, 0]), v)
    r = tv_radius(n, v)
    assert 2 * r < 0.01, r
    law, m = budget_law(MC_P, MC_Q, 0.05, None)
    assert m == pytest.approx(0.05)
    assert 0.5 * np.abs(got - law).sum() <= r, (got, law)
    for wrong in (budget_law(MC_P, MC_Q, 0.04, None)[0], budget_law(MC_P, MC_Q, 0.06, None)[0],
                  greedy_law(MC_P, MC_Q, 0.05, None)):  # fmt: skip
        assert 0.5 * np.abs(wrong - law).sum() >= 0.01 - 1e-9
        assert 0.5 * np.abs(got - wrong).sum() > r, (got, wrong)
    freq = float(np.asarray(out.num_accepted).mean())
    want = float(np.minimum(MC_P, MC_Q).sum()) + 0.05
    assert abs(freq - want) <= rate_radius(n), (freq, want)


def test_proportional_sharing_against_greedy_by_ratio():
    """The choice (the docstring's numbers): on 2,000 Dirichlet(0.5) pairs, V 11, eps 0.05,
    both move m (the same TV and acceptance); proportional sharing's worst overshoot max
    pi/p and worst shrink max p/pi are never above greedy's on any pair, and their medians
    and the mean KL(p || pi) are lower."""
    rng = np.random.default_rng(1)
    p, q = rng.dirichlet(np.full(11, 0.5), (2, 2_000))
    rule = rules.make('tv_budget', eps=0.05, l=None)
    pi = np.asarray(jax.jit(lambda r, a, b: r.induced(a, b))(
        rule, jnp.asarray(p, jnp.float32), jnp.asarray(q, jnp.float32)), np.float64)
    stats = {'proportional': [], 'greedy': []}
    for i in range(len(p)):
        for name, law in (('proportional', pi[i]), ('greedy', greedy_law(p[i], q[i], 0.05, None))):
            assert 0.5 * np.abs(law - p[i]).sum() == pytest.approx(
                min(0.05, np.maximum(p[i] - q[i], 0).sum()), abs=2e-6)
            kl = float(np.sum(p[i] * np.log(p[i] / law)))
            stats[name].append(((law / p[i]).max(), (p[i] / law).max(), kl))
    prop, greedy = np.array(stats['proportional']), np.array(stats['greedy'])
    assert np.all(prop[:, :2] <= greedy[:, :2] * (1 + 1e-5))
    medians = np.median(prop, 0), np.median(greedy, 0)
    print('median max pi/p, max p/pi, KL(p || pi): proportional', medians[0], 'greedy', medians[1])
    assert np.all(medians[0] < medians[1]) and prop[:, 2].mean() < greedy[:, 2].mean()


def _sibs(q):
    """Three distinct siblings by descending q, a duplicate and padding (as test_laws)."""
    order = np.argsort(-q, axis=-1, kind='stable')
    return np.concatenate([order[:, :3], order[:, :1], -np.ones_like(order[:, :1])], 1)


N_TREE = 60_000


@pytest.mark.parametrize('eps,l', [(0.1, None), (0.05, 0.5)])
def test_tree_node_law_against_an_enumeration_of_the_siblings(eps, l):
    """Deterministic siblings (EAGLE top-k): the rule's node law equals EAGLE's lossless walk
    enumerated in numpy (test_laws.node_law_enumerated) on the target moved from outside S
    onto S; TV(pi, p) = min(eps, 1 - p(S), rooms) <= eps; P(a sibling) = p(S) + TV; the
    verify_node token law within r(60k) = 0.0138 (V 6) of it."""
    names, p, q = _cases.stacked()
    sibs = _sibs(q).astype(np.int32)
    rule = rules.make('tv_budget', eps=eps, l=l)
    got = np.asarray(jax.jit(lambda r, a, s: r.induced_tree_node(a, s))(rule, p, sibs))
    k, v = p.shape
    out = rules.verify_node(rule, _cases.key(4), jnp.repeat(jnp.asarray(p), N_TREE, 0),
                            jnp.repeat(jnp.asarray(sibs), N_TREE, 0))  # fmt: skip
    tokens = np.asarray(out.token).reshape(k, N_TREE)
    for i, case in enumerate(names):
        target = node_target(p[i], sibs[i], eps, l)
        law = node_law_enumerated('lossless', {}, target, sibs[i])
        np.testing.assert_allclose(got[i], law, atol=1e-6, err_msg=case)
        on = np.isin(np.arange(v), sibs[i][sibs[i] >= 0])
        tv = 0.5 * np.abs(law - p[i]).sum()
        top = 1.0 if l is None else np.minimum(1.0, p[i][on] / l)
        rooms = min(1.0 - p[i][on].sum(), np.maximum(top - p[i][on], 0).sum())
        assert tv == pytest.approx(min(eps, rooms), abs=1e-6) and tv <= eps + 1e-6, case
        assert law[on].sum() == pytest.approx(p[i][on].sum() + tv, abs=1e-6), case
        emp = _cases.empirical(tokens[i], v)
        assert 0.5 * np.abs(emp - law).sum() <= tv_radius(N_TREE, v), (case, emp, law)


def specinfer_node_law(target_of, p, q, c: int = 2):
    """The node law of SpecInfer's walk (c siblings i.i.d. from q; accept with
    min(1, P/q), on rejection P <- norm((P - q)_+)), enumerated over every draw, with a
    target `target_of(siblings)` that may depend on the drawn siblings."""
    v = p.size
    law = np.zeros(v)
    for draw in np.ndindex(*(v,) * c):
        weight = float(np.prod(q[list(draw)]))
        if weight == 0:
            continue
        big_p, reach = np.asarray(target_of(draw), np.float64), weight
        for s in draw:
            a = min(1.0, big_p[s] / q[s])
            law[s] += reach * a
            reach *= 1.0 - a
            rest = np.maximum(big_p - q, 0.0)
            big_p = rest / rest.sum() if rest.sum() > 1e-12 else big_p
        law += reach * big_p
    return law


def test_sampled_siblings_keep_the_cap_a_draw_dependent_target_does_not():
    """i.i.d. siblings (V 4, two of them, eps 0.05): the rule's target is the chain law
    pi(p, q), so the node law is pi(p, q) (enumerated, and verify_node's tokens within
    r(200k) = 0.0075) and TV(node law, p) <= eps; the target moved onto the drawn set
    instead (the deterministic form applied to the draws) leaves p by more than eps."""
    p = np.array([0.55, 0.35, 0.06, 0.04])
    q = np.array([0.05, 0.10, 0.45, 0.40])
    eps = 0.05
    chain = budget_law(p, q, eps, None)[0]
    law = specinfer_node_law(lambda sibs: chain, p, q)
    np.testing.assert_allclose(law, chain, atol=1e-9)
    assert 0.5 * np.abs(law - p).sum() <= eps + 1e-9
    broken = specinfer_node_law(lambda sibs: node_target(p, sibs, eps, None), p, q)
    assert 0.5 * np.abs(broken - p).sum() > eps + 0.01, broken
    n = 200_000
    pb, qb = (jnp.broadcast_to(jnp.asarray(x, jnp.float32), (n, 4)) for x in (p, q))
    sibs = jax.random.categorical(jax.random.PRNGKey(8), jnp.log(qb), shape=(2, n)).T
    rule = rules.make('tv_budget', eps=eps, l=None)
    out = rules.verify_node(rule, _cases.key(6), pb, sibs.astype(jnp.int32), qb)
    emp = _cases.empirical(np.asarray(out.token), 4)
    assert 0.5 * np.abs(emp - chain).sum() <= tv_radius(n, 4), (emp, chain)


def test_parameters_are_traced_and_checked():
    """A sweep over eps compiles once; bad values are ValueErrors naming them."""
    traces = []

    @jax.jit
    def law(rule, p, q):
        traces.append(1)
        return rule.induced(p, q)

    p, q = random_laws(2, 5, 7)
    outs = [law(rules.make('tv_budget', eps=e, l=0.5), p, q) for e in (0.0, 0.1, 0.2)]
    assert len(traces) == 1 and not np.allclose(outs[0], outs[2])
    assert rules.make('tv_budget:eps=0.1,l=None').l is None
    for bad in ({'eps': -0.1}, {'eps': 1.5}, {'l': 0.0}, {'l': 1.2}, {'eps': math.nan}):
        with pytest.raises(ValueError, match='tv_budget'):
            rules.make('tv_budget', **bad)
    assert rules.matched_baseline(rules.make('tv_budget', eps=0.1)).truncation == 'none'


def test_the_engine_walks_the_moved_target_and_its_baseline_walks_p():
    """`Verification` (the engine's rule wrapper) forwards `tree_target`: the rule's moved law,
    p under the baseline flag; for a rule without one it returns p itself (no op, so the
    other rules' tree programs are unchanged: test_logit_rules' jaxpr digests)."""
    names, p, q = _cases.stacked()
    sibs = jnp.asarray(_sibs(q).astype(np.int32))
    rule = rules.make('tv_budget', eps=0.1, l=None)
    moved = np.asarray(rule.tree_target(jnp.asarray(p), sibs))
    assert np.abs(moved - p).sum() > 0.1
    for baseline, want in ((False, moved), (True, p)):
        got = verification_lib.Verification(rule, baseline).tree_target(jnp.asarray(p), sibs)
        np.testing.assert_allclose(np.asarray(got), want, atol=1e-7)
    pj = jnp.asarray(p)
    assert verification_lib.Verification(rules.make('lenience', l=0.5), False).tree_target(
        pj, sibs) is pj  # fmt: skip
