"""Monte Carlo: the verifiers' emitted tokens follow each rule's closed-form laws.

Chain mode (`rules.verify_chain`, A = 3 drafts, V = 7). Every batch row carries its own
chain of target rows p_0..p_A and draft rows q_0..q_{A-1}; no two consecutive positions
share (p, q), and the rows of the different groups are interleaved in the batch, so a
verifier that reads the wrong position (p_{i+1} for p_i, p_{A-1} for the bonus row) or the
wrong batch row has a different law. Three conditional laws are checked separately:

  (a) the token at drafted position i given that i was reached: rule.induced(p_i, q_i);
  (b) the token at position i given a rejection at i (the replacement):
      rule.replacement(p_i, q_i);
  (c) the token after a fully accepted block (the bonus): rule.bonus(p_A), the LAST row;

plus the acceptance rate at position i given it was reached, rule.acceptance_rate(p_i, q_i).

Bound. For n i.i.d. draws from a law pi over V categories, the Bretagnolle-Huber-Carol
inequality gives P(sum_v |pi_hat(v) - pi(v)| >= eps) <= 2^V exp(-n eps^2 / 2) (a union of
Hoeffding bounds over the 2^V subsets; it holds as well for independent rows with
different laws). In TV (half the L1 norm) this is

  P(TV(pi_hat, pi) >= r(n)) <= delta  for  r(n) = sqrt((V ln 2 + ln(1/delta)) / (2 n)),

and we use delta = 1e-8 per comparison (`tv_radius`). Conditioning on the event that
selects the rows (reached / rejected at i / fully accepted) keeps the selected tokens
i.i.d. with the conditional law, so r(n) applies with n the number of selected rows. A
test makes at most 100 comparisons, so a correct implementation passes it with
probability >= 1 - 1e-6 (union bound); the seeds are fixed, so a pass is reproducible.

Power. If the implementation's true law is a mistaken law w instead of pi, its empirical
law is within r(n) of w (same bound), hence TV(pi_hat, pi) >= TV(pi, w) - r(n) > r(n)
whenever TV(pi, w) > 2 r(n): the test then fails with probability >= 1 - 1e-8. The
`test_power_*` tests assert this margin for each guarded mistake on the chain used
(`POWER_P`, `POWER_Q`) and show it empirically: the law measured from the real verifier is
further than r(n) from the mistaken closed form, and verifiers built with a wrong
parameter fail the comparison with the correct closed form.

Tree mode: the law at one node is compared with an enumeration of the sibling walk written
independently in numpy (`node_law_enumerated`, from docs/laws.md §2.2, §3.3, §4.2).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

from . import _cases

DELTA = 1e-8
# Covers float32 rounding of the closed forms and of the samplers (~1e-6).
FLOAT_SLACK = 1e-4


def tv(a, b) -> np.ndarray:
    """Total variation over the last axis, in float64."""
    return 0.5 * np.abs(np.asarray(a, np.float64) - np.asarray(b, np.float64)).sum(-1)


def tv_radius(n: int, v: int, delta: float = DELTA) -> float:
    """r(n) with P(TV(empirical of n draws, law) >= r(n)) <= delta (Bretagnolle-Huber-Carol).

    V = 7, delta = 1e-8: r = sqrt(11.64 / n) + FLOAT_SLACK: 0.0172 at n = 40k, 0.0077 at
    n = 200k (V = 6: sqrt(11.29 / n) + FLOAT_SLACK).
    """
    if n <= 0:
        return math.inf
    return math.sqrt((v * math.log(2.0) + math.log(1.0 / delta)) / (2.0 * n)) + FLOAT_SLACK


def rate_radius(n: int, delta: float = DELTA) -> float:
    """Hoeffding: P(|frequency of n Bernoulli draws - mean| >= r) <= delta."""
    if n <= 0:
        return math.inf
    return math.sqrt(math.log(2.0 / delta) / (2.0 * n)) + FLOAT_SLACK


# ----------------------------------------------------------------------------------------
# Chain mode.

V = 7
A = 3

# The power chain: distinct p_i at every position (p_0..p_3) and q_i (q_0..q_2), with
# zeros in both so that p(x) = 0 < q(x) and q(x) = 0 < p(x) occur. Expected row counts out
# of N_POWER = 200k (beta_i: acceptance rate at position i):
#
#   lossless        beta = (0.50, 0.44, 0.46); reach i: 200k, 100k, 44k; rejected at i:
#                   100k, 56k, 24k; fully accepted: 20k.
#   lenience l=0.5  beta = (0.80, 0.73, 0.77); reach i: 200k, 160k, 117k.
#   cos lam=0.4     beta = (0.70, 0.66, 0.68); reach i: 200k, 140k, 93k.
#
# TV between each guarded mistake and the correct law, against 2 r(n) for those counts (the
# `test_power_*` tests assert TV > 2 r(n) with the realised counts):
#
#   replacement ~ p_i, not norm((p_i - q_i)_+):  TV = 0.43, 0.38, 0.40
#     lossless rejections: 2r = 0.022, 0.029, 0.045 (lenience <= 0.042, cos <= 0.040)
#   lenience law with l = 0.4 instead of 0.5:    TV = 0.065, 0.045, 0.085
#                    l = 0.6 instead of 0.5:     TV = 0.097, 0.090, 0.077
#     reach: 2r = 0.016, 0.017, 0.020
#   cos law with lam = 0.3 or 0.5 (the law moves by 0.1 TV(p_i, q_i), TV(p_i, q_i) = 0.50,
#   0.56, 0.54):                                 TV = 0.050, 0.056, 0.054
#     reach: 2r = 0.016, 0.018, 0.023
#   bonus ~ p_{A-1} instead of p_A:              TV = 0.26;  fully accepted: 2r = 0.048
#   target row i + 1 read for row i (the lossless law at i becomes p_{i+1}):
#                                                TV = 0.51, 0.61, 0.26
#     reach: 2r = 0.016, 0.022, 0.033; the replacement becomes norm((p_{i+1} - q_i)_+):
#                                                TV = 0.72, 1.00, 0.18 vs 2r <= 0.045
POWER_P = np.array(
    [
        [0.15, 0.14, 0.03, 0.05, 0.39, 0.16, 0.08],
        [0.32, 0.02, 0.03, 0.11, 0.00, 0.30, 0.22],
        [0.00, 0.17, 0.05, 0.17, 0.24, 0.01, 0.36],
        [0.10, 0.06, 0.07, 0.07, 0.24, 0.15, 0.31],
    ],
    np.float32,
)
POWER_Q = np.array(
    [
        [0.03, 0.15, 0.01, 0.13, 0.03, 0.32, 0.33],
        [0.00, 0.13, 0.08, 0.13, 0.14, 0.06, 0.46],
        [0.01, 0.42, 0.05, 0.30, 0.02, 0.16, 0.04],
    ],
    np.float32,
)
N_CASE = 40_000  # Rows per edge-case group.
N_POWER = 200_000  # Rows of the power chain.


def chain_groups():
    """Per-group chains: p [K, A+1, V], q [K, A, V] and rows per group [K].

    Groups 0..5 walk through the edge cases of `_cases.cases` (random, peaked p / flat q,
    flat p / peaked q, disjoint supports, p == q, one-hot p): position i of group g takes
    case (g + i) mod 6 and the bonus row is the p of case (g + A) mod 6, so every case
    occurs at every position. Group 6 is the power chain.
    """
    named = list(_cases.cases(V).values())
    k = len(named)
    p = np.stack(
        [np.stack([named[(g + i) % k][0] for i in range(A + 1)]) for g in range(k)] + [POWER_P]
    )
    q = np.stack(
        [np.stack([named[(g + i) % k][1] for i in range(A)]) for g in range(k)] + [POWER_Q]
    )
    sizes = np.array([N_CASE] * k + [N_POWER])
    return p.astype(np.float32), q.astype(np.float32), sizes


POWER = len(_cases.cases(V))  # Index of the power group.


class ChainCounts(NamedTuple):
    """Conditional token counts of one `verify_chain` run, per group and position.

    reached [K, A, V]: token i over rows with n >= i;  replaced [K, A, V]: token i over
    rows with n == i (rejected at i);  bonus [K, V]: token A over rows with n == A;
    accepted [K, A]: rows with n >= i + 1.
    """

    reached: np.ndarray
    replaced: np.ndarray
    bonus: np.ndarray
    accepted: np.ndarray


@functools.cache
def chain_counts(spec: str, seed: int = 0) -> ChainCounts:
    """Runs `rules.verify_chain` on all groups at once (rows shuffled) and counts."""
    rule = rules.make(spec)
    p, q, sizes = chain_groups()
    k = len(sizes)
    rng = np.random.default_rng(seed)
    grp = rng.permutation(np.repeat(np.arange(k), sizes))
    x = np.zeros((grp.size, A), np.int32)
    for g in range(k):
        rows = np.flatnonzero(grp == g)
        for i in range(A):
            q64 = q[g, i].astype(np.float64)
            x[rows, i] = rng.choice(V, size=rows.size, p=q64 / q64.sum())
    out = rules.verify_chain(rule, _cases.key(seed), p[grp], q[grp], jnp.asarray(x))
    n = np.asarray(out.num_accepted)
    tokens = np.asarray(out.tokens)
    reached = np.zeros((k, A, V), np.int64)
    replaced = np.zeros((k, A, V), np.int64)
    accepted = np.zeros((k, A), np.int64)
    for i in range(A):
        idx = grp * V + tokens[:, i]
        reached[:, i] = np.bincount(idx[n >= i], minlength=k * V).reshape(k, V)
        replaced[:, i] = np.bincount(idx[n == i], minlength=k * V).reshape(k, V)
        accepted[:, i] = np.bincount(grp[n >= i + 1], minlength=k)
    idx = grp * V + tokens[:, A]
    bonus = np.bincount(idx[n == A], minlength=k * V).reshape(k, V)
    return ChainCounts(reached, replaced, bonus, accepted)


def closed_forms(rule, p, q):
    """Host closed forms: induced, induced_generic, replacement, acceptance [K, A(, V)], bonus."""

    @jax.jit
    def laws(p, q):
        pd = p[:, :A]
        return (
            rule.induced(pd, q),
            rule.induced_generic(pd, q),
            rule.replacement(pd, q),
            rule.acceptance_rate(pd, q),
            rule.bonus(p[:, A]),
        )

    return tuple(np.asarray(x, np.float64) for x in laws(jnp.asarray(p), jnp.asarray(q)))


def _law(counts):
    n = int(counts.sum())
    return counts / max(n, 1), n


@pytest.mark.parametrize('spec', _cases.RULE_SPECS)
def test_chain_laws_per_position(spec):
    """(a) position laws, (b) replacement laws, (c) bonus law and acceptance per position.

    7 groups x (3 + 3 + 3 + 1) = 70 comparisons at delta = 1e-8: a correct verifier passes
    with probability >= 1 - 7e-7.
    """
    rule = rules.make(spec)
    p, q, _ = chain_groups()
    pi, generic, repl, rate, bonus = closed_forms(rule, p, q)
    assert np.all(np.isfinite(pi)) and np.all(np.isfinite(generic)), spec
    np.testing.assert_allclose(pi.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(repl.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(bonus.sum(-1), 1.0, atol=1e-5)
    np.testing.assert_allclose(pi, generic, atol=2e-6)
    c = chain_counts(spec)
    for g in range(len(p)):
        for i in range(A):
            emp, n = _law(c.reached[g, i])
            d = tv(emp, pi[g, i])
            assert d <= tv_radius(n, V), (spec, g, i, '(a) position law', n, d, emp, pi[g, i])
            freq = c.accepted[g, i] / max(n, 1)
            assert abs(freq - rate[g, i]) <= rate_radius(n), (spec, g, i, 'acceptance', freq)
            emp, n = _law(c.replaced[g, i])
            d = tv(emp, repl[g, i])
            assert d <= tv_radius(n, V), (spec, g, i, '(b) replacement', n, d, emp, repl[g, i])
        emp, n = _law(c.bonus[g])
        d = tv(emp, bonus[g])
        assert d <= tv_radius(n, V), (spec, g, '(c) bonus', n, d, emp, bonus[g])


def _assert_power(counts, correct, wrong, what):
    """The mistaken law is rejected: TV(correct, wrong) > 2 r(n), and the empirical law of
    the real verifier is within r(n) of the correct law and further than r(n) from the
    mistaken one."""
    emp, n = _law(counts)
    r = tv_radius(n, V)
    margin = tv(correct, wrong)
    assert margin > 2 * r, (what, 'no power', n, margin, r)
    assert tv(emp, correct) <= r, (what, 'correct law rejected', n, tv(emp, correct), r)
    assert tv(emp, wrong) > r, (what, 'mistake not rejected', n, tv(emp, wrong), r)


@pytest.mark.parametrize('spec', ['lossless', 'lenience:l=0.5', 'cos:lam=0.4'])
def test_power_replacement_drawn_from_p(spec):
    """Mistake: the replacement is a sample of p_i instead of norm((p_i - q_i)_+).

    The three rules share that residual. TV(norm((p_i - q_i)_+), p_i) = 0.43, 0.38, 0.40
    at positions 0..2 of the power chain, against 2 r(rejected at i) <= 0.045 (>= 24k
    rejections at every position for every rule)."""
    rule = rules.make(spec)
    p, q, _ = chain_groups()
    _, _, repl, _, _ = closed_forms(rule, p, q)
    c = chain_counts(spec)
    for i in range(A):
        _assert_power(c.replaced[POWER, i], repl[POWER, i], p[POWER, i], (spec, i))


@pytest.mark.parametrize('wrong_l', [0.4, 0.6])
def test_power_lenience_l_off_by_0_1(wrong_l):
    """Mistake: lenience run with l = 0.5 +- 0.1. TV(law_0.5, law_0.4) = 0.065, 0.045,
    0.085 and TV(law_0.5, law_0.6) = 0.097, 0.090, 0.077 at positions 0..2, against
    2 r(reached) = 0.016, 0.017, 0.020 (the mutants reach more or fewer rows: 2 r <= 0.023).

    Shown twice: the l = 0.5 verifier's position laws are rejected by the l = 0.4 / 0.6
    closed forms, and a verifier built with l = 0.4 / 0.6 fails the comparison with the
    l = 0.5 closed forms."""
    p, q, _ = chain_groups()
    pi = closed_forms(rules.make('lenience', l=0.5), p, q)[0]
    pi_wrong = closed_forms(rules.make('lenience', l=wrong_l), p, q)[0]
    c = chain_counts('lenience:l=0.5')
    mutant = chain_counts(f'lenience:l={wrong_l}')
    for i in range(A):
        _assert_power(c.reached[POWER, i], pi[POWER, i], pi_wrong[POWER, i], ('l', wrong_l, i))
        emp, n = _law(mutant.reached[POWER, i])
        assert tv(emp, pi[POWER, i]) > tv_radius(n, V), ('mutant passes', wrong_l, i)


@pytest.mark.parametrize('wrong_lam', [0.3, 0.5])
def test_power_cos_lambda_off_by_0_1(wrong_lam):
    """Mistake: CoS run with lam = 0.4 +- 0.1. The law is lam q + (1 - lam) p, so the
    mistake moves it by TV = 0.1 TV(p_i, q_i) = 0.050, 0.056, 0.054 at positions 0..2,
    against 2 r(reached) = 0.016, 0.018, 0.023 (mutants: 2 r <= 0.025). Shown on the
    lam = 0.4 verifier and on verifiers built with the wrong lam."""
    p, q, _ = chain_groups()
    pi = closed_forms(rules.make('cos', lam=0.4), p, q)[0]
    pi_wrong = closed_forms(rules.make('cos', lam=wrong_lam), p, q)[0]
    c = chain_counts('cos:lam=0.4')
    mutant = chain_counts(f'cos:lam={wrong_lam}')
    for i in range(A):
        _assert_power(c.reached[POWER, i], pi[POWER, i], pi_wrong[POWER, i], ('lam', wrong_lam, i))
        emp, n = _law(mutant.reached[POWER, i])
        assert tv(emp, pi[POWER, i]) > tv_radius(n, V), ('mutant passes', wrong_lam, i)


def test_power_bonus_from_row_a_minus_1():
    """Mistake: the bonus is drawn from p_{A-1} instead of p_A (the last target row).
    TV(p_2, p_3) = 0.26 against 2 r(fully accepted, ~20k rows) = 0.048."""
    p, _, _ = chain_groups()
    c = chain_counts('lossless')
    _assert_power(c.bonus[POWER], p[POWER, A], p[POWER, A - 1], 'bonus row')


def test_power_target_row_shift():
    """Mistake: position i reads target row i + 1 (p_{i+1} for p_i): the lossless law at i
    would be p_{i+1}. TV(p_i, p_{i+1}) = 0.51, 0.61, 0.26 against 2 r(reached) = 0.016,
    0.022, 0.033. The replacement would be norm((p_{i+1} - q_i)_+): TV = 0.72, 1.00, 0.18
    against 2 r(rejected) = 0.022, 0.029, 0.045."""
    p, q, _ = chain_groups()
    c = chain_counts('lossless')
    rule = rules.make('lossless')
    _, _, repl, _, _ = closed_forms(rule, p, q)
    # norm((p_{i+1} - q_i)_+): the replacement with the target row shifted by one.
    repl_shift = np.asarray(
        jax.jit(rule.replacement)(jnp.asarray(p[:, 1:]), jnp.asarray(q)), np.float64
    )
    for i in range(A):
        _assert_power(c.reached[POWER, i], p[POWER, i], p[POWER, i + 1], ('shift', i))
        _assert_power(c.replaced[POWER, i], repl[POWER, i], repl_shift[POWER, i], ('shift', i))


# ----------------------------------------------------------------------------------------
# Tree mode: an independent enumeration of the deterministic-sibling walk.


def _entropy(x: np.ndarray) -> float:
    nz = x > 0
    return float(-np.sum(x[nz] * np.log(x[nz])))


def node_law_enumerated(name: str, params: dict, p, siblings, mistake: str | None = None):
    """Law of the token emitted at one tree node, deterministic ordered siblings, in numpy.

    Written from docs/laws.md (§2.2 skeleton; gates of §2.2, §3.3, §4.2), not from the library:
    P_0 = p; for each sibling c_j in order (padding -1 and repeated tokens skipped) accept
    with g_j computed on the current residual P_{j-1}; on rejection zero c_j and
    renormalise; P(emit c_j) = g_j prod_{i<j} (1 - g_i); if all are rejected emit a sample
    of the final residual P_m (greedy: the argmax of p). EAGLE's guard: if a rejection
    leaves residual mass <= 1e-9, the token comes from the full p.

      lossless     g = P(c)
      greedy       g = 1[c = argmax p]
      lenience     g = min(1, P(c) / l)
      minp_verify  g = 1[P(c) >= rho max P]                        (hard)
      eta_verify   g = min(1, P(c) / tau(P)), tau(P) = min(eta, sqrt(eta) exp(-H(P)))
                   with H the entropy of the residual P; g = 1 if tau <= 1e-9  (soft)

    `mistake` builds a wrong variant, to show the tests' power: 'raw_p' (lenience reads
    p(c) instead of the renormalised P(c)), 'soft' (min-p gate min(1, P(c) / (rho max P))),
    'hard' (eta gate 1[P(c) >= tau(P)]), 'entropy_of_p' (eta's tau from H(p), not H(P)),
    'final_truncated' (min-p final residual restricted to the min-p set of p: the tail
    dropped), 'final_full_p' (the final token from p, siblings not removed).
    """
    p = np.asarray(p, np.float64)
    raw = p.copy()
    reach, law, seen = 1.0, np.zeros_like(p), set()
    for c in (int(s) for s in siblings):
        if c < 0 or c in seen:
            continue
        seen.add(c)
        big_p = raw / raw.sum()
        if name == 'lossless':
            g = big_p[c]
        elif name == 'greedy':
            g = float(c == int(np.argmax(p)))
        elif name == 'lenience':
            g = min(1.0, (p[c] if mistake == 'raw_p' else big_p[c]) / params['l'])
        elif name == 'minp_verify':
            thr = params['rho'] * big_p.max()
            g = min(1.0, big_p[c] / thr) if mistake == 'soft' else float(big_p[c] >= thr)
        elif name == 'eta_verify':
            eta = params['eta']
            h = _entropy(p if mistake == 'entropy_of_p' else big_p)
            tau = min(eta, math.sqrt(eta) * math.exp(-h))
            if tau <= 1e-9:
                g = 1.0
            elif mistake == 'hard':
                g = float(big_p[c] >= tau)
            else:
                g = min(1.0, big_p[c] / tau)
        else:
            raise ValueError(name)
        law[c] += reach * g
        reach *= 1.0 - g
        raw[c] = 0.0
        if raw.sum() <= 1e-9:
            return law + reach * p
    if name == 'greedy':
        final = np.eye(p.size)[int(np.argmax(p))]
    elif mistake == 'final_full_p':
        final = p
    elif mistake == 'final_truncated':
        kept = np.where(p >= params['rho'] * p.max(), raw, 0.0)
        final = kept / kept.sum() if kept.sum() > 0 else raw / raw.sum()
    else:
        final = raw / raw.sum()
    return law + reach * final


def parse_spec(spec: str) -> tuple[str, dict]:
    """'lenience:l=0.5' -> ('lenience', {'l': 0.5})."""
    name, _, rest = spec.partition(':')
    params = {}
    for item in filter(None, rest.split(',')):
        k, v = item.split('=')
        params[k] = float(v)
    return name, params


def _siblings(q):
    """Per case: three distinct siblings in descending q order, a duplicate, and padding."""
    order = np.argsort(-q, axis=-1, kind='stable')
    return np.concatenate([order[:, :3], order[:, :1], -np.ones_like(order[:, :1])], axis=1)


# Root with four children (the fourth duplicates the first, so it must be skipped) and one
# grandchild, so that the walk also descends.
_TREE = rules.Tree(parents=(0, 0, 0, 0, 0, 1))
N_TREE = 100_000


def _rows(x, n):
    """[K, ...] -> [K * n, ...], each case repeated n times."""
    return jnp.repeat(jnp.asarray(x), n, axis=0)


@pytest.mark.parametrize('spec', _cases.TREE_SPECS)
def test_tree_root_law_matches_enumeration(spec):
    """The first token of `verify_tree` (the root's node rule) on every `_cases` case.

    `rule.induced_tree_node` must equal the independent enumeration (to 2e-6), and the
    Monte Carlo law of 100k rows per case must be within r(100k) = 0.0107 (V = 6,
    delta = 1e-8; 6 comparisons) of it."""
    rule = rules.make(spec)
    name, params = parse_spec(spec)
    names, p, q = _cases.stacked()
    k, v = p.shape
    sibs = _siblings(q).astype(np.int32)
    enum = np.stack([node_law_enumerated(name, params, p[i], sibs[i]) for i in range(k)])
    pi = np.asarray(jax.jit(rule.induced_tree_node)(p, sibs))
    np.testing.assert_allclose(pi, enum, atol=2e-6, err_msg=spec)
    node_tokens = np.concatenate([np.zeros((k, 1)), sibs[:, :4], sibs[:, :1]], 1)
    m = _TREE.num_nodes
    target = jnp.broadcast_to(_rows(p, N_TREE)[:, None], (k * N_TREE, m, v))
    out = rules.verify_tree(
        rule, _cases.key(1), _TREE, _rows(node_tokens.astype(np.int32), N_TREE), target
    )
    tokens = np.asarray(out.tokens[:, 0]).reshape(k, N_TREE)
    for i, case in enumerate(names):
        emp = _cases.empirical(tokens[i], v)
        d = tv(emp, enum[i])
        assert d <= tv_radius(N_TREE, v), (spec, case, d, emp, enum[i])


def test_tree_node_distinct_siblings_is_lossless():
    """Siblings drawn from q without replacement (Gumbel top-3), verified with q_j = q
    without the earlier siblings: the node law is p, r(100k) = 0.0107 (V = 6). Power: the
    same draws verified as i.i.d. ones (q for q_j) leave p by more than 3 radii in some
    case (a check that fails if the two gates coincide)."""
    names, p, q = _cases.stacked()
    k, v = p.shape
    key_s, key_v = jax.random.split(_cases.key(3))
    gumbel = jax.random.gumbel(key_s, (k * N_TREE, v))
    sibs = jax.lax.top_k(jnp.log(_rows(q, N_TREE)) + gumbel, 3)[1].astype(jnp.int32)
    laws = {}
    for draws in ('distinct', 'iid'):
        out = rules.verify_node(rules.make('lossless'), key_v, _rows(p, N_TREE), sibs,
                                _rows(q, N_TREE), draws=draws)  # fmt: skip
        tokens = np.asarray(out.token).reshape(k, N_TREE)
        laws[draws] = [_cases.empirical(tokens[i], v) for i in range(k)]
    radius = tv_radius(N_TREE, v)
    for i, case in enumerate(names):
        d = tv(laws['distinct'][i], p[i])
        assert d <= radius, (case, d, laws['distinct'][i], p[i])
    wrong = max(tv(laws['iid'][i], p[i]) for i in range(k))
    assert wrong > 3 * radius, wrong


def test_tree_node_specinfer_sampled_siblings_is_lossless():
    """SpecInfer (sampled siblings, §2.3): the node law is p; r(100k) = 0.0107 (V = 6)."""
    names, p, q = _cases.stacked()
    k, v = p.shape
    key_s, key_v = jax.random.split(_cases.key(2))
    sibs = jax.random.categorical(key_s, jnp.log(_rows(q, N_TREE)), shape=(3, k * N_TREE)).T
    out = rules.verify_node(
        rules.make('lossless'), key_v, _rows(p, N_TREE), sibs.astype(jnp.int32), _rows(q, N_TREE)
    )
    tokens = np.asarray(out.token).reshape(k, N_TREE)
    for i, case in enumerate(names):
        emp = _cases.empirical(tokens[i], v)
        d = tv(emp, p[i])
        assert d <= tv_radius(N_TREE, v), (case, d, emp, p[i])
