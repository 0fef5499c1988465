"""`rules.audit`: every registered rule passes against its own claimed law, the four upstream
verifier bugs (`rules.audit_examples`) are flagged, a host verifier goes through the adapter.

Bounds and power (spec_jax/rules/audit.py): on laws with uniform u each (law, offset) is a
Bretagnolle-Huber-Carol test of TV(empirical, claim) at alpha / m (alpha 0.01 per verifier,
m <= 21 comparisons: a verifier emitting its claims passes with probability >= 0.99, and
the seeds are fixed, so a pass is reproducible); a law off by TV >= `Row.detectable` is
flagged with probability >= 0.9: at n = 20011 rows that is 0.031 at offset 0 (0.044 at
n = 10007). With u at a bound the test is a support check (no false alarm; a per-row
outside-support probability >= 2.31 / n is flagged with probability >= 0.9). The bugs are
flagged far beyond those margins (the TVs and p-values in docs/laws.md §9).
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

import spec_jax.rules as rules
from spec_jax.rules import audit, audit_examples

N_BUGS = 20_011
N_RULES = 10_007
LAWS = audit.standard_laws(v=7, a=2, seed=0)


@functools.cache
def bug_reports():
    verifiers = {name: (make(), None) for name, make in audit_examples.BUGS.items()}
    verifiers['correct'] = (audit_examples.correct(), None)
    verifiers['eagle_zeroed'] = (audit_examples.eagle_zeroed(), None)
    verifiers['verify_chain'] = (audit.chain(rules.make('lossless')), None)
    return audit.audit_all(verifiers, LAWS, n=N_BUGS, seed=1)


def test_every_registered_rule_passes_against_its_claim():
    """Every name in `rules.names()` with its defaults, through `verify_chain`, against its
    `round_law` (lossless rules: p; lossy ones: their induced law), on all nine laws (u at
    its bounds included), in one compiled program."""
    verifiers = {}
    for name in rules.names():
        rule = rules.make(name)
        verifiers[name] = (audit.chain(rule), audit.rule_claim(rule))
    reports = audit.audit_all(verifiers, LAWS, n=N_RULES, seed=2)
    failed = {k: r.format() for k, r in reports.items() if not r.passed}
    assert not failed, '\n'.join(failed.values())
    assert set(reports) == set(rules.names())
    lossless = reports['lossless']
    assert lossless.m == 19  # 2 offsets of 'disjoint' never reached (its drafts: p = 0).
    row = next(r for r in lossless.rows if r.law == 'random' and r.offset == 0)
    assert row.n == N_RULES and row.detectable < 0.045 and abs(row.gap) < 2 * row.bound


@pytest.mark.parametrize('name', sorted(audit_examples.BUGS))
def test_each_upstream_bug_is_flagged(name):
    report = bug_reports()[name]
    assert not report.passed
    worst = report.worst()
    assert worst.p_value <= report.alpha / report.m
    if name == 'sglang_35771':  # Exact under uniform u: only u = 0 finds it.
        assert {r.law for r in report.flagged} == {'u_zero'}
        assert all(r.outside > 0.3 * r.n for r in report.flagged)
    else:
        assert any(r.u == 'uniform' and r.tv > 0.1 for r in report.flagged)


@pytest.mark.parametrize('name', ['correct', 'eagle_zeroed', 'verify_chain'])
def test_correct_verifiers_pass(name):
    """Controls: speculative sampling written out, EAGLE's zeroed redraw (exact for any q) and
    spec_jax's own verify_chain, on the same rows as the bugs."""
    report = bug_reports()[name]
    assert report.passed, report.format()


def test_measured_tv_matches_the_bugs_exact_law():
    """eagle_329's law at a drafted offset is q p + (1 - sum q p) p: the audit's measured TV to
    p is within the row's bound of the exact one (the audit measures, it does not just flag)."""
    report = bug_reports()['eagle_329']
    for li, law in enumerate(LAWS[:3]):  # random, zeros_p, zeros_q
        p, q = law.p[0].astype(np.float64), law.q[0].astype(np.float64)
        qp = q * p
        exact = 0.5 * np.abs(qp + (1 - qp.sum()) * p - p).sum()
        row = report.rows[li * 3]
        assert (row.law, row.offset) == (law.name, 0)
        assert abs(row.tv - exact) <= row.bound, (law.name, row.tv, exact)


def test_tree_nodes_pass_against_their_claims():
    """`verify_node` with one drafted sibling: lossless in its three sibling modes (claim p),
    and the deterministic-sibling forms of lenience, minp_verify and greedy against the
    mixture of `induced_tree_node` over the drafted sibling; one compiled program."""
    cases = [('lossless', 'iid'), ('lossless', 'distinct'), ('lossless', 'deterministic'),
             ('lenience:l=0.5', 'deterministic'), ('minp_verify:rho=0.3', 'deterministic'),
             ('greedy', 'deterministic')]  # fmt: skip
    verifiers = {}
    for spec, draws in cases:
        rule = rules.make(spec)
        verifiers[f'{spec}/{draws}'] = (audit.node(rule, draws), audit.node_claim(rule, draws))
    reports = audit.audit_all(verifiers, LAWS, n=N_RULES, seed=3)
    failed = {k: r.format() for k, r in reports.items() if not r.passed}
    assert not failed, '\n'.join(failed.values())
    for report in reports.values():  # Offset 0 of the 7 uniform laws, nothing else reached.
        assert report.m == 7 and all(r.n == 0 for r in report.rows if r.offset > 0)


def _numpy_sd(p, q, x, u, w, inclusive=False):
    """Speculative sampling in numpy on the host contract (inclusive: SGLang's u <= a)."""
    b, a1, v = p.shape
    a = a1 - 1
    px = np.take_along_axis(p[:, :a], x[..., None], -1)[..., 0]
    qx = np.take_along_axis(q, x[..., None], -1)[..., 0]
    ratio = np.where(qx > 0, np.minimum(1.0, px / np.where(qx > 0, qx, 1.0)), px > 0)
    ok = u <= ratio if inclusive else u < ratio
    n = np.cumprod(ok, 1).sum(1)
    rows = np.arange(b)
    pn, qn = p[rows, n], q[rows, np.minimum(n, a - 1)]
    res = np.maximum(pn - qn, 0.0)
    mass = res.sum(1, keepdims=True)
    res = np.where(mass > 1e-9, res / np.maximum(mass, 1e-9), pn)
    dist = np.where((n < a)[:, None], res, p[:, a])
    cdf = np.cumsum(dist, 1)
    final = np.minimum((cdf <= (w * cdf[:, -1])[:, None]).sum(1), v - 1)
    pos = np.arange(a1)[None, :]
    x_pad = np.concatenate([x, np.zeros((b, 1), x.dtype)], 1)
    tokens = np.where(pos < n[:, None], x_pad, np.where(pos == n[:, None], final[:, None], 0))
    return tokens, n


def test_host_adapter():
    """A numpy verifier through `audit.host`: right, it passes; with SGLang's inclusive test,
    u = 0 flags it."""
    laws = tuple(law for law in LAWS if law.name in ('random', 'zeros_p', 'u_zero'))
    reports = audit.audit_all(
        {
            'numpy_sd': (audit.host(_numpy_sd), None),
            'numpy_inclusive': (audit.host(functools.partial(_numpy_sd, inclusive=True)), None),
        },
        laws,
        n=5003,
    )
    assert reports['numpy_sd'].passed, reports['numpy_sd'].format()
    flagged = reports['numpy_inclusive'].flagged
    assert flagged and {r.law for r in flagged} == {'u_zero'}


def test_bad_inputs_name_the_value():
    p = LAWS[0]
    with pytest.raises(ValueError, match='differ in shape'):
        audit.audit(audit_examples.correct(), (p, audit.standard_laws(v=5)[0]))
    with pytest.raises(ValueError, match="u='half'"):
        audit.audit(audit_examples.correct(), (p._replace(u='half'),))
    with pytest.raises(ValueError, match='alpha=2'):
        audit.audit(audit_examples.correct(), (p,), alpha=2)
