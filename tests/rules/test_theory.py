"""`theory.parameter_curve` in tree mode against the tree node law enumerated here, in
float64 numpy, by walking the siblings (docs/laws.md §2.2, §3.3, §4.2): not through the
rules' `induced_tree_node`, which the curve itself calls."""

from __future__ import annotations

import numpy as np
import pytest

from spec_jax.rules import theory

SEED, VOCAB, PAIRS, SCALE, T, SIBLINGS = 3, 64, 16, 2.0, 0.6, 4


def softmax(z: np.ndarray) -> np.ndarray:
    e = np.exp(z - z.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


def family() -> tuple[np.ndarray, np.ndarray]:
    """The curve's (p, q_t): p from the same seeded logits; q_t rebuilt here as
    softmax((1 - t) log q_0 + t log p)."""
    ends = theory.synthetic_family(SEED, VOCAB, PAIRS, 2, SCALE)
    p, q0 = ends['p'].astype(np.float64), ends['q'][0].astype(np.float64)
    p, q0 = p / p.sum(-1, keepdims=True), q0 / q0.sum(-1, keepdims=True)
    return p, softmax((1 - T) * np.log(q0) + T * np.log(p))


def node_law(p: np.ndarray, siblings: list[int], gate) -> np.ndarray:
    """The law of the token a node emits: walk the siblings in order, each accepted with
    gate(residual, c) where the residual is p with the rejected ones zeroed and
    renormalised; all rejected, a sample of the last residual."""
    law, reach, residual = np.zeros_like(p), 1.0, p.copy()
    for c in siblings:
        g = gate(residual / residual.sum(), c)
        law[c] += reach * g
        reach *= 1.0 - g
        residual[c] = 0.0
    return law + reach * residual / residual.sum()


def minp_gate(rho):
    return lambda res, c: float(res[c] >= rho * res.max())


def lenience_gate(l):
    return lambda res, c: min(1.0, res[c] / l)


def minp_baseline(rho):
    def law(p):
        kept = np.where(p >= rho * p.max(), p, 0.0)
        return kept / kept.sum()

    return law


def mean_tv(gate, baseline) -> float:
    p, q = family()
    tvs = []
    for k in range(PAIRS):
        siblings = list(np.argsort(-q[k], kind='stable')[:SIBLINGS])
        pi = node_law(p[k], siblings, gate)
        assert pi.sum() == pytest.approx(1.0)
        tvs.append(0.5 * np.abs(pi - baseline(p[k])).sum())
    return float(np.mean(tvs))


@pytest.mark.parametrize(
    'rule, param, values, gate, baseline',
    [
        ('minp_verify', 'rho', (0.1, 0.4, 0.8), minp_gate, minp_baseline),
        ('lenience', 'l', (0.2, 0.5, 0.8), lenience_gate, lambda _: lambda p: p),
    ],
)
def test_tree_curve_is_the_tree_node_law(rule, param, values, gate, baseline):
    curve = theory.parameter_curve(
        rule, param, values, mode='tree', num_siblings=SIBLINGS, quality_t=T, seed=SEED,
        vocab=VOCAB, num_pairs=PAIRS, logit_scale=SCALE,
    )  # fmt: skip
    want = [mean_tv(gate(v), baseline(v)) for v in values]
    assert curve['tv'] == pytest.approx(want, abs=1e-6)
    assert curve['mode'] == 'tree' and 'synthetic' in curve['label']
    assert f'top-{SIBLINGS} siblings' in curve['label']
    # The chain curve is another law: the tree's is not the chain's relabelled.
    chain = theory.parameter_curve(
        rule, param, values, quality_t=T, seed=SEED, vocab=VOCAB, num_pairs=PAIRS,
        logit_scale=SCALE,
    )  # fmt: skip
    assert max(abs(a - b) for a, b in zip(chain['tv'], curve['tv'])) > 1e-3


def test_tree_curve_needs_a_tree_form():
    with pytest.raises(ValueError, match='no deterministic tree form'):
        theory.parameter_curve('cos', 'lam', (0.2,), mode='tree', num_siblings=2)
    with pytest.raises(ValueError, match='mode'):
        theory.parameter_curve('lenience', 'l', (0.2,), mode='graph')
