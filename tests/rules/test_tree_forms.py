"""Tree forms that read the node's original p (docs/laws.md §3.3, §3.5): the truncation
rules' chain forms (`minp_verify_chainform`, `eta_verify_chainform`) and typical
acceptance's tree form, against a numpy enumeration written here from the docs, and the
chain forms' node law on a one-child chain against the chain law.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules
from spec_jax.decoding.verification import Verification

from . import _cases
from .test_laws import tv, tv_radius
from .test_tree import NODE_P, NODE_SIBS, NODE_V, _tree_inputs

SPECS = (
    'minp_verify_chainform:rho=0.3',
    'eta_verify_chainform:eta=0.2',
    'typical:eps=0.2',
    'typical:eps=0.2,mode=sample',
)
N_ROWS = 20_000  # Rows per node: r(20k) = 0.024 for V = 7, delta = 1e-8.


def allowed_and_fallback(rule, p: np.ndarray):
    """(the allowed set A of the node's p, the law emitted when no sibling is in A), numpy,
    from the rule's parameter values."""
    p = np.asarray(p, np.float64)
    if rule.name == 'minp_verify_chainform':
        return p >= rule.rho * p.max(), p
    nz = p > 0
    if rule.name == 'eta_verify_chainform':
        h = -np.sum(p[nz] * np.log(p[nz]))
        return p >= min(rule.eta, np.sqrt(rule.eta) * np.exp(-h)), p
    assert rule.name == 'typical', rule.name
    h = -np.sum(p * np.log(p + 1e-5))  # Medusa's entropy, strict '>'.
    allowed = p > min(rule.eps, rule.delta * np.exp(-h))
    top = np.eye(len(p))[np.argmax(p)]
    if rule.mode == 'argmax':
        return allowed, top
    keep = allowed | (top > 0)
    return allowed, np.where(keep, p, 0.0) / np.where(keep, p, 0.0).sum()


def enumerated(spec: str, p, sibs) -> tuple[np.ndarray, bool]:
    """(the node law of a gate on the original p without a residual: the first sibling in A
    (padding -1 skipped), else the fallback; whether a sibling is accepted)."""
    allowed, fallback = allowed_and_fallback(rules.make(spec), p)
    for c in sibs:
        if c >= 0 and allowed[c]:
            return np.eye(len(p))[c], True
    return fallback, False


@pytest.mark.parametrize('spec', SPECS)
def test_node_law_matches_enumeration(spec):
    """induced_tree_node equals the enumeration to 2e-6 at the four nodes of
    tests/rules/test_tree.py (which accept a sibling at some nodes and fall back at
    others); verify_node's Monte Carlo law is within r(20k) of it at each node."""
    rule = rules.make(spec)
    enum, accepted = zip(*(enumerated(spec, p, s) for p, s in zip(NODE_P, NODE_SIBS)))
    enum = np.stack(enum)
    assert any(accepted) and not all(accepted), accepted  # Both outcomes are exercised.
    pi = np.asarray(jax.jit(rule.induced_tree_node)(NODE_P, NODE_SIBS))
    np.testing.assert_allclose(pi, enum, atol=2e-6, err_msg=spec)
    k = len(NODE_P)
    out = rules.verify_node(rule, _cases.key(5), jnp.asarray(np.tile(NODE_P, (N_ROWS, 1))),
                            jnp.asarray(np.tile(NODE_SIBS, (N_ROWS, 1))))  # fmt: skip
    tok = np.asarray(out.token).reshape(N_ROWS, k)
    for i in range(k):
        emp = np.bincount(tok[:, i], minlength=NODE_V) / N_ROWS
        assert tv(emp, enum[i]) <= tv_radius(N_ROWS, NODE_V), (spec, i, emp, enum[i])


@pytest.mark.parametrize('name', ['minp_verify', 'eta_verify'])
def test_chain_form_on_a_one_child_chain_is_the_chain_law(name):
    """On a one-child chain (one sibling c) the chain form's node law is the chain law with
    q = onehot(c), for every c, on random and peaked targets; the node form (the paper's
    tree rule) differs from it by more than 0.05 in TV somewhere, so `TreeShape.chain(A)`
    with the node form would not ablate drafting alone."""
    spec = {'minp_verify': 'rho=0.3', 'eta_verify': 'eta=0.2'}[name]
    chain_form = rules.make(f'{name}_chainform:{spec}')
    node_form = rules.make(f'{name}:{spec}')
    rng = np.random.default_rng(0)
    p = np.concatenate([rng.dirichlet(np.full(NODE_V, 0.5), 6), NODE_P]).astype(np.float32)
    rows = np.repeat(p, NODE_V, 0)  # Every (p, c).
    sibs = np.tile(np.arange(NODE_V), len(p))[:, None].astype(np.int32)
    q = jax.nn.one_hot(sibs[:, 0], NODE_V)
    chain = np.asarray(chain_form.induced(jnp.asarray(rows), q))
    np.testing.assert_array_equal(chain, np.asarray(node_form.induced(jnp.asarray(rows), q)))
    got = np.asarray(jax.jit(chain_form.induced_tree_node)(rows, sibs))
    np.testing.assert_allclose(got, chain, atol=1e-7)
    node = np.asarray(jax.jit(node_form.induced_tree_node)(rows, sibs))
    assert tv(node, chain).max() > 0.05, tv(node, chain).max()


def test_the_engines_verification_walks_the_tree_form(spec='typical:eps=0.2'):
    """Through `Verification` (the engine's wrapper, traced baseline flag) the walk over a
    whole tree emits the rule's tokens with the flag off and lossless verification's with it
    on, draw for draw."""
    tree = rules.Tree.full(branching=2, depth=2)
    _, target, _, tokens = _tree_inputs(tree, 512, seed=6)
    keys = jax.random.split(jax.random.PRNGKey(2), 512)
    rule = rules.make(spec)

    def walk(r):
        return np.asarray(rules.verify_tree(r, keys, tree, tokens, target).tokens)

    bare, lossless = walk(rule), walk(rules.make('lossless'))
    assert (bare != lossless).any()
    np.testing.assert_array_equal(walk(Verification(rule, jnp.asarray(False))), bare)
    np.testing.assert_array_equal(walk(Verification(rule, jnp.asarray(True))), lossless)
