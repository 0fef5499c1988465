"""The engines' rules (rules/engines.py) and the single-factor overshoot ablations
(rules/ablations.py) against their upstream definitions, enumerated here in numpy.

Each enumeration is the upstream procedure as docs/laws.md §2.4, §3.7, §4.6 and §4.7 state
it (a drafted x ~ q accepted with a(x), else a draw from the replacement, which for sglang
and onehot_q is p without x, x-dependent as upstream; SGLang's tree walk with ONE coin per
parent, enumerated over the coin's intervals), sharing no code with the library.

Monte Carlo bound (as tests/rules/test_laws.py): for n i.i.d. draws of a law over V = 7
tokens, P(TV(empirical, law) >= r(n)) <= delta = 1e-8 with r(n) = sqrt((V ln 2 +
ln(1/delta)) / (2n)) (Bretagnolle-Huber-Carol; `tv_radius`), 0.0109 at n = 100k; a test
makes at most 10 comparisons, so a correct verifier passes with probability >= 1 - 1e-7.
Power: each check also names a mistaken law w (a wrong parameter, a residual that keeps x,
lenience's ceiling for lenience_flat's flat overshoot, a fresh coin per sibling) and
asserts TV(pi, w) > 2 r(n), so the realised empirical law, within r(n) of the verifier's
true law with probability 1 - 1e-8, is further than r(n) from w: the check fails a verifier
whose law is w (asserted on the realised draws).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules
from spec_jax.rules import ablations

from . import _cases
from .test_laws import node_law_enumerated, rate_radius, tv, tv_radius

V = 7
N = 100_000
P0 = np.array([0.40, 0.22, 0.15, 0.10, 0.07, 0.04, 0.02])
P1 = np.array([0.05, 0.10, 0.30, 0.05, 0.20, 0.25, 0.05])  # The bonus row.
Q0 = np.array([0.20, 0.30, 0.05, 0.03, 0.22, 0.13, 0.07])


# ---- the upstream procedures, in numpy ----------------------------------------------------


def _norm(f, fallback):
    s = f.sum()
    return f / s if s > 1e-12 else fallback


def _without(p, x):
    """p with token x removed, renormalised (SGLang's and vLLM's replacement)."""
    kept = p.copy()
    kept[x] = 0.0
    return _norm(kept, p)


def _geometric(p, q, w_d):
    g = np.power(q, w_d) * np.power(p, 1.0 - w_d)
    return _norm(g, p)


def _ceiling_bisect(p, q, w):
    """c >= 1 with sum_{q > p} (q - c p)_+ = (1 - w) TV, by bisection (inf if unreachable)."""
    over = q > p
    target = (1.0 - w) * np.maximum(p - q, 0.0).sum()

    def g(c):
        return np.maximum(q - c * p, 0.0)[over].sum()

    if g(1.0) <= target:
        return 1.0
    if q[over & (p == 0)].sum() >= target:
        return np.inf
    lo, hi = 1.0, 2.0
    while g(hi) > target:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if g(mid) > target else (lo, mid)
    return hi


def upstream(spec: str, p, q, mistake: str | None = None):
    """(a [V], replacement(x) -> [V]) of the rule `spec` as upstream defines it."""
    params = rules.make(spec)
    name = params.name
    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    ratio = np.divide(p, q, out=np.full_like(p, np.inf), where=q > 0)
    lossless_res = _norm(np.maximum(p - q, 0.0), p)
    if name == 'static_ensemble':  # transformers: ratio 1 - w + w p/q, residual (p - q)_+.
        w = params.w if mistake is None else float(mistake)
        a = np.minimum(1.0, 1.0 - w + w * ratio)
        return a, lambda x: lossless_res
    if name == 'logit_ensemble':
        nu = _geometric(p, q, params.w_d)
        if mistake == 'linear':  # transformers' linear mixture with the same weight on q.
            nu = params.w_d * q + (1.0 - params.w_d) * p
        a = np.minimum(1.0, np.divide(nu, q, out=np.full_like(p, np.inf), where=q > 0))
        res = _norm(np.maximum(nu - q, 0.0), p)
        return a, lambda x: res
    if name in ('sglang', 'onehot_q'):
        if name == 'sglang':
            t_acc = max(params.t_a, 1e-9)
            a = np.where(p >= params.t_s, 1.0, np.minimum(1.0, p / t_acc))
            a = np.where(p > 0, a, 0.0)
        else:
            a = p.copy()
        if mistake == 'keep_x':
            return a, lambda x: p
        return a, lambda x: _without(p, x)
    over = q > p
    if name == 'lenience_flat':
        if mistake == 'ceiling':  # Lenience itself.
            return np.minimum(1.0, ratio / params.l), lambda x: lossless_res
        rejected = np.maximum(q - p / params.l, 0.0).sum()
        kappa = 1.0 - rejected / q[over].sum() if over.any() else 1.0
        return np.where(over, kappa, 1.0), lambda x: lossless_res
    if name == 'interp_ceiling':
        if mistake == 'flat':  # uniform_interp with the same w.
            tv_pq = np.maximum(p - q, 0.0).sum()
            kappa = 1.0 - (1.0 - params.w) * tv_pq / q[over].sum() if over.any() else 1.0
            return np.where(over, kappa, 1.0), lambda x: lossless_res
        c = _ceiling_bisect(p, q, params.w)
        with np.errstate(invalid='ignore'):  # c = inf times p = 0, masked below.
            capped = np.where(p > 0, np.minimum(1.0, c * p / np.where(q > 0, q, 1.0)), 0.0)
        return np.where(over, capped, 1.0), lambda x: lossless_res
    raise ValueError(spec)


def chain_law(spec: str, p, q, mistake: str | None = None):
    """(pi, replacement law given a rejection, acceptance) by enumerating the draft x."""
    a, res = upstream(spec, p, q, mistake)
    pi, rejected = np.zeros(V), np.zeros(V)
    for x in np.flatnonzero(q > 0):
        pi[x] += q[x] * a[x]
        rejected += q[x] * (1.0 - a[x]) * res(x)
    beta = float(np.sum(q * a))
    return pi + rejected, _norm(rejected, np.asarray(p, np.float64)), beta


def sglang_node_law(p, siblings, t_s, t_a, mistake: str | None = None):
    """SGLang's tree kernel at one node: ONE coin u ~ U[0, 1) for all children in order,
    S += p(c), accept iff p(c) > 0 and (u < S/t_a or p(c) >= t_s); all rejected: p without
    the children. Child c is accepted on u in [0, b_c), so the first accepted child is j on
    [max_{i<j} b_i, b_j). `mistake='fresh_coin'`: a new coin for every child."""
    p = np.asarray(p, np.float64)
    t_acc = max(t_a, 1e-9)
    law, s, covered, reach, kept = np.zeros_like(p), 0.0, 0.0, 1.0, p.copy()
    for c in siblings:
        if c < 0:
            continue
        s += p[c]
        b = 0.0 if p[c] <= 0 else (1.0 if p[c] >= t_s else min(1.0, s / t_acc))
        if mistake == 'fresh_coin':
            law[c] += reach * b
            reach *= 1.0 - b
        else:
            law[c] += max(0.0, b - covered)
            covered = max(covered, b)
        kept[c] = 0.0
    rest = reach if mistake == 'fresh_coin' else 1.0 - covered
    return law + rest * _norm(kept, p)


# ---- the closed forms against the enumerations ---------------------------------------------

SPECS = (
    'static_ensemble:w=0.6',
    'logit_ensemble:w_d=0.4',
    'sglang:t_s=0.3,t_a=0.5',
    'sglang:t_s=0.0,t_a=0.0',
    'onehot_q',
    'lenience_flat:l=0.5',
    'interp_ceiling:w=0.5',
    'interp_ceiling:w=0.9',
)


def _pairs():
    """_cases' edge cases at V = 7 (disjoint supports, p == q, one-hot p, ...) and 10
    random Dirichlet pairs with small entries."""
    rng = np.random.default_rng(32)
    named = list(_cases.cases(V).values())
    p = np.stack([a for a, _ in named] + list(rng.dirichlet(np.full(V, 0.5), 10)))
    q = np.stack([b for _, b in named] + list(rng.dirichlet(np.full(V, 0.5), 10)))
    return p.astype(np.float32), q.astype(np.float32)


@pytest.mark.parametrize('spec', SPECS)
def test_closed_forms_match_the_upstream_enumeration(spec):
    rule = rules.make(spec)
    p, q = _pairs()

    @jax.jit
    def forms(rule, p, q):
        return (rule.induced(p, q), rule.induced_generic(p, q), rule.replacement(p, q),
                rule.acceptance_rate(p, q))  # fmt: skip

    pi, generic, repl, beta = (np.asarray(x, np.float64) for x in forms(rule, p, q))
    for k in range(len(p)):
        want_pi, want_repl, want_beta = chain_law(spec, p[k], q[k])
        np.testing.assert_allclose(pi[k], want_pi, atol=2e-5, err_msg=f'{spec} pi {k}')
        np.testing.assert_allclose(generic[k], want_pi, atol=2e-5, err_msg=f'{spec} {k}')
        if want_beta < 1 - 1e-6:  # The replacement is only drawn after a rejection.
            np.testing.assert_allclose(repl[k], want_repl, atol=2e-5, err_msg=f'{spec} r {k}')
        assert abs(beta[k] - want_beta) < 2e-5, (spec, k, beta[k], want_beta)


def test_closed_form_laws_as_documented():
    """The laws docs/laws.md states, on random pairs: static ensemble nu = w p + (1 - w) q;
    onehot_q and sglang (1, 1) pi = p for any q; interp_ceiling (1 - w) p + w q on U and
    pi <= c p on O; lenience_flat's U law and acceptance are lenience's."""
    p, q = _pairs()
    for k in range(len(p)):
        pk, qk = p[k].astype(np.float64), q[k].astype(np.float64)
        np.testing.assert_allclose(chain_law('static_ensemble:w=0.6', pk, qk)[0],
                                   0.6 * pk + 0.4 * qk, atol=1e-9)  # fmt: skip
        for spec in ('onehot_q', 'sglang:t_s=1,t_a=1'):
            np.testing.assert_allclose(chain_law(spec, pk, qk)[0], pk, atol=1e-9)
        under, tv_pq = qk <= pk, np.maximum(pk - qk, 0.0).sum()
        pi, _, beta = chain_law('interp_ceiling:w=0.5', pk, qk)
        c = _ceiling_bisect(pk, qk, 0.5)
        if q[k][pk == 0].sum() < 0.5 * tv_pq:  # The ceiling is reachable.
            np.testing.assert_allclose(pi[under], (0.5 * pk + 0.5 * qk)[under], atol=1e-9)
            assert abs(beta - (1 - 0.5 * tv_pq)) < 1e-6  # p, q sum to 1 within float32.
        bound = np.where(pk > 0, c * np.where(pk > 0, pk, 1.0), 0.0)  # c p (c may be inf).
        assert np.all(pi[~under] <= bound[~under] + 1e-12), (k, c)
        flat, _, beta_flat = chain_law('lenience_flat:l=0.5', pk, qk)
        len_law, _, beta_len = chain_law('lenience_flat:l=0.5', pk, qk, 'ceiling')  # Lenience.
        np.testing.assert_allclose(flat[under], len_law[under], atol=1e-9)
        assert abs(beta_flat - beta_len) < 1e-9


def test_ceiling_multiple_matches_bisection():
    """The sorted solve of `ceiling_multiple` against bisection, compared through what c
    decides: the acceptance min(1, c p/q) of the overshoot tokens with p > 0 (where there are
    none, any c is right)."""
    p, q = _pairs()
    multiple = jax.jit(ablations.ceiling_multiple)

    def accept(c, pk, qk):
        over = (qk > pk) & (pk > 0)
        return np.minimum(1.0, c * pk[over] / qk[over]) if np.isfinite(c) else np.ones(over.sum())

    for w in (0.0, 0.3, 0.7, 1.0):
        got = np.asarray(multiple(jnp.asarray(p), jnp.asarray(q), w), np.float64)
        for k in range(len(p)):
            pk, qk = p[k].astype(np.float64), q[k].astype(np.float64)
            want = _ceiling_bisect(pk, qk, w)
            np.testing.assert_allclose(accept(got[k], pk, qk), accept(want, pk, qk), atol=1e-5,
                                       err_msg=f'w={w} case {k}: c {got[k]} vs {want}')


def test_logit_ensemble_is_upstreams_logit_mixture():
    """DIVERSED mixes raw logits and `generate` divides the mixture by T: on laws processed
    by that temperature, softmax(w_d log q + (1 - w_d) log p) is the same law."""
    rng = np.random.default_rng(5)
    z_p, z_q = rng.normal(0, 3, (2, 8, V))
    for t in (0.7, 1.0, 1.6):
        for w_d in (0.0, 0.3, 0.5, 1.0):
            mixed = (w_d * z_q + (1 - w_d) * z_p) / t
            nu = np.exp(mixed - mixed.max(-1, keepdims=True))
            nu /= nu.sum(-1, keepdims=True)
            p = jax.nn.softmax(jnp.asarray(z_p / t, jnp.float32), -1)
            q = jax.nn.softmax(jnp.asarray(z_q / t, jnp.float32), -1)
            got = np.asarray(rules.make('logit_ensemble', w_d=w_d).induced(p, q))
            np.testing.assert_allclose(got, nu, atol=2e-6, err_msg=f'T={t} w_d={w_d}')


def test_lossless_settings_give_the_lossless_law():
    """HF w = 1, DIVERSED w_d = 0, interp_ceiling w = 0: lossless SD's acceptance and
    replacement exactly; SGLang (1, 1) is onehot_q (a = p(x)); both have law p, and their
    tree node law is p (EAGLE's walk)."""
    p, q = (jnp.asarray(x) for x in _pairs())
    sibs = jnp.argsort(-q, -1)[:, :3].astype(jnp.int32)

    @jax.jit
    def forms(rule):
        node = rule.induced_tree_node(p, sibs) if rule.tree_modes else p
        return rule.accept_all(p, q), rule.replacement(p, q), rule.induced_generic(p, q), node

    accept, repl, _, _ = forms(rules.make('lossless'))
    for spec in ('static_ensemble:preset=default', 'logit_ensemble:w_d=0', 'interp_ceiling:w=0'):
        rule = rules.make(spec)
        assert rule.lossless, spec
        got = forms(rule)
        np.testing.assert_allclose(got[0], accept, atol=1e-6, err_msg=spec)
        np.testing.assert_allclose(got[1], repl, atol=1e-6, err_msg=spec)
        np.testing.assert_allclose(got[2], p, atol=1e-5, err_msg=spec)
    sg, onehot = rules.make('sglang:preset=default'), rules.make('onehot_q')
    assert sg.lossless and onehot.lossless
    assert not rules.make('sglang', t_s=0.9).lossless and not rules.make('lenience_flat').lossless
    for rule in (sg, onehot):
        got = forms(rule)
        np.testing.assert_allclose(got[0], p, atol=1e-7)  # a(x) = p(x).
        np.testing.assert_allclose(got[2], p, atol=1e-5)
        np.testing.assert_allclose(got[3], p, atol=1e-5)  # EAGLE's walk: the node law is p.


def test_presets_and_spec_strings():
    assert rules.make('sglang:preset=default') == rules.SGLangThresholds(t_s=1.0, t_a=1.0)
    assert rules.make('static_ensemble:preset=docs') == rules.StaticEnsemble(w=0.7)
    assert rules.make('static_ensemble:preset=docs,w=0.5') == rules.StaticEnsemble(w=0.5)
    assert rules.make('logit_ensemble', preset='default') == rules.LogitEnsemble(w_d=0.5)
    with pytest.raises(ValueError, match="no preset 'fast'; its presets: default"):
        rules.make('sglang:preset=fast')
    with pytest.raises(ValueError, match='its presets: none'):
        rules.make('onehot_q', preset='default')
    with pytest.raises(ValueError, match=r'sglang: t_a=1.5 is outside the valid range \[0, 1\]'):
        rules.make('sglang', t_a=1.5)
    for name in ('static_ensemble', 'logit_ensemble', 'sglang', 'onehot_q', 'lenience_flat',
                 'interp_ceiling'):  # fmt: skip
        assert name in rules.names()
        assert rules.matched_baseline(rules.make(name)).truncation == 'none', name


# ---- Monte Carlo through the verifiers -----------------------------------------------------


_CHAIN_TRACES: list[str] = []  # One entry per trace of `_chain` (the rule's name).


@jax.jit
def _chain(rule, key, p_av1, q_av, x):
    """N one-draft chains at fixed (p_0, p_1), q_0 and drafts x [N]."""
    _CHAIN_TRACES.append(rule.name)
    p = jnp.broadcast_to(p_av1, (N,) + p_av1.shape)
    q = jnp.broadcast_to(q_av, (N,) + q_av.shape)
    out = rules.verify_chain(rule, key, p, q, x[:, None])
    return out.tokens, out.num_accepted


def _assert_law(tokens, law, wrong, what):
    """Empirical law within r(n) of `law`; `wrong` (if given) > 2 r(n) away and rejected."""
    n = tokens.size
    emp, r = _cases.empirical(tokens, V), tv_radius(tokens.size, V)
    assert tv(emp, law) <= r, (what, 'law rejected', n, tv(emp, law), r, emp, law)
    if wrong is not None:
        assert tv(law, wrong) > 2 * r, (what, 'no power', n, tv(law, wrong), r)
        assert tv(emp, wrong) > r, (what, 'mistake not rejected', n, tv(emp, wrong), r)


@pytest.mark.parametrize(
    'spec,mistake',
    [
        ('static_ensemble:w=0.6', '0.4'),
        ('logit_ensemble:w_d=0.5', 'linear'),
        ('sglang:t_s=0.3,t_a=0.5', 'keep_x'),
        ('onehot_q', 'keep_x'),
        ('lenience_flat:l=0.5', 'ceiling'),
        ('interp_ceiling:w=0.5', 'flat'),
    ],
)
def test_verify_chain_emits_the_upstream_law(spec, mistake):
    """100k chains of one draft x ~ Q0: the drafted position's token (all rows), the
    replacement (rows rejected at 0) and the bonus (rows accepted, from P1), each >= 16k rows,
    against the enumeration; the acceptance frequency within Hoeffding's radius; power
    against the named mistake on the position law (margins 0.04-0.1 against 2 r = 0.022)."""
    pi, repl, beta = chain_law(spec, P0, Q0)
    wrong = chain_law(spec, P0, Q0, mistake)[0]
    key = jax.random.PRNGKey(sum(map(ord, spec)))
    x = jax.random.categorical(jax.random.fold_in(key, 1), jnp.log(jnp.asarray(Q0)), shape=(N,))
    p_av1 = jnp.asarray(np.stack([P0, P1]), jnp.float32)
    tokens, n = (np.asarray(t) for t in _chain(rules.make(spec), key, p_av1,
                                               jnp.asarray(Q0[None], jnp.float32), x))  # fmt: skip
    _assert_law(tokens[:, 0], pi, wrong, (spec, 'position'))
    _assert_law(tokens[n == 0, 0], repl, None, (spec, 'replacement'))
    _assert_law(tokens[n == 1, 1], P1, None, (spec, 'bonus'))
    assert abs(np.mean(n) - beta) <= rate_radius(N), (spec, np.mean(n), beta)


def test_onehot_q_deterministic_draft_has_law_p():
    """vLLM's n-gram case: the draft is the fixed token 0 with q = onehot(0); the emitted
    token has law P0. Mistake (the residual keeps x): TV 0.24 against 2 r = 0.022."""
    q = np.eye(V)[0]
    pi, _, _ = chain_law('onehot_q', P0, q)
    np.testing.assert_allclose(pi, P0, atol=1e-12)
    np.testing.assert_allclose(rules.make('onehot_q').induced_generic(
        jnp.asarray(P0, jnp.float32), jnp.asarray(q, jnp.float32)), P0, atol=1e-6)  # fmt: skip
    wrong = chain_law('onehot_q', P0, q, 'keep_x')[0]
    p_av1 = jnp.asarray(np.stack([P0, P1]), jnp.float32)
    tokens, _ = _chain(rules.make('onehot_q'), jax.random.PRNGKey(4), p_av1,
                       jnp.asarray(q[None], jnp.float32), jnp.zeros((N,), jnp.int32))  # fmt: skip
    _assert_law(np.asarray(tokens[:, 0]), P0, wrong, 'onehot deterministic')


NODE_CASES = [  # (t_s, t_a, siblings): t_s inactive with a residual; t_s active; t_a = 0.
    (0.5, 0.8, [1, 3]),
    (0.35, 0.8, [1, 3, 0]),
    (0.6, 0.0, [4, 2, -1]),
]


def test_sglang_tree_node_law_matches_the_shared_coin():
    """`induced_tree_node` (conditional gates on independent uniforms) against the
    shared-coin enumeration, on P0 and on random rows with random sibling sets."""
    rng = np.random.default_rng(11)
    rows = np.stack([P0] + list(rng.dirichlet(np.full(V, 0.6), 6))).astype(np.float32)
    node = jax.jit(lambda rule, p, sibs: rule.induced_tree_node(p, sibs))
    for t_s, t_a, sibs in NODE_CASES + [(1.0, 1.0, [2, 0, 5]), (0.2, 0.3, [6, 5, 4])]:
        padded = np.full((len(rows), 3), -1, np.int32)
        padded[:, : len(sibs)] = sibs
        got = np.asarray(node(rules.make('sglang', t_s=t_s, t_a=t_a), rows, padded))
        for k, p in enumerate(rows):
            want = sglang_node_law(p, sibs, t_s, t_a)
            np.testing.assert_allclose(got[k], want, atol=2e-6, err_msg=f'{t_s} {t_a} {sibs}')
    p = _pairs()[0]
    sibs = np.argsort(-p, -1)[:, :3].astype(np.int32)
    np.testing.assert_allclose(node(rules.make('onehot_q'), p, sibs),
                               np.stack([node_law_enumerated('lossless', {}, p[k], sibs[k])
                                         for k in range(len(p))]), atol=2e-6)  # fmt: skip


@jax.jit
def _node(rule, key, p, siblings):
    return rules.verify_node(rule, key, jnp.broadcast_to(p, (N, V)),
                             jnp.broadcast_to(siblings, (N, siblings.shape[-1]))).token  # fmt: skip


@pytest.mark.parametrize('t_s,t_a,sibs', NODE_CASES)
def test_sglang_verify_node_emits_the_shared_coin_law(t_s, t_a, sibs):
    """100k copies of one node: r = 0.0109. Power against a fresh coin per child (upstream
    shares one): margins >= 0.11 where a second child is reached (2 r = 0.022)."""
    law = sglang_node_law(P0, sibs, t_s, t_a)
    wrong = sglang_node_law(P0, sibs, t_s, t_a, 'fresh_coin')
    rule = rules.make('sglang', t_s=t_s, t_a=t_a)
    tokens = _node(rule, jax.random.PRNGKey(int(100 * t_s)), jnp.asarray(P0, jnp.float32),
                   jnp.asarray(sibs, jnp.int32))  # fmt: skip
    has_power = tv(law, wrong) > 0.05
    _assert_law(np.asarray(tokens), law, wrong if has_power else None, ('node', t_s, t_a))


def test_sglang_verify_tree_root_and_path():
    """`verify_tree` on root -> {1, 2}, node 1 -> {3}: the root's token has the node law,
    and given the first child accepted, the second position has the law of node 1."""
    tree = rules.Tree(parents=(0, 0, 0, 1))
    rule = rules.make('sglang', t_s=0.5, t_a=0.8)
    p_root, p_one = P0, P1
    target = np.stack([p_root, p_one, P0, P0]).astype(np.float32)  # Rows 2, 3: leaves.
    tokens_m = np.array([0, 1, 3, 2], np.int32)  # Node tokens; root unused.
    out = rules.verify_tree(rule, _cases.key(9), tree, jnp.broadcast_to(tokens_m, (N, 4)),
                            jnp.broadcast_to(target, (N, 4, V)))  # fmt: skip
    first, second = np.asarray(out.tokens[:, 0]), np.asarray(out.tokens[:, 1])
    _assert_law(first, sglang_node_law(p_root, [1, 3], 0.5, 0.8), None, 'root')
    down = np.asarray(out.num_accepted) >= 1
    down &= first == 1
    _assert_law(second[down], sglang_node_law(p_one, [2], 0.5, 0.8), None, 'node 1')


# ---- one compile per sweep -----------------------------------------------------------------

SWEEPS = [
    ('static_ensemble', 'w', (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)),
    ('logit_ensemble', 'w_d', (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)),
    ('sglang', 't_s', (0.05, 0.1, 0.2, 0.4, 0.7, 1.0)),
    ('sglang', 't_a', (0.0, 0.1, 0.3, 0.5, 0.8, 1.0)),
    ('lenience_flat', 'l', (0.15, 0.3, 0.45, 0.6, 0.8, 1.0)),
    ('interp_ceiling', 'w', (0.0, 0.2, 0.4, 0.6, 0.8, 1.0)),
]


@pytest.mark.parametrize('name,param,values', SWEEPS)
def test_parameter_sweep_compiles_verify_chain_once(name, param, values):
    """Six values through the Monte Carlo tests' jitted chain (the same shapes, so a run of
    the whole file compiles nothing here): at most one trace for the sweep, and the
    parameter is live (the tokens change)."""
    x = jnp.asarray(np.tile(np.arange(V), N // V + 1)[:N], jnp.int32)
    p_av1 = jnp.asarray(np.stack([P0, P1]), jnp.float32)
    q_av = jnp.asarray(Q0[None], jnp.float32)
    before = _CHAIN_TRACES.count(name)
    outs = [np.asarray(_chain(rules.make(name, **{param: v}), jax.random.PRNGKey(0), p_av1,
                              q_av, x)[1]) for v in values]  # fmt: skip
    assert _CHAIN_TRACES.count(name) - before <= 1, (name, param, _CHAIN_TRACES)
    assert len({o.sum() for o in outs}) > 1, (name, param)
