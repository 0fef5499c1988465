"""Truncation-based verification: min-p, eta and Medusa typical acceptance (docs/laws.md §3)."""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp

from spec_jax import sampling
from spec_jax.rules import base, registry


def _set_law(p, q, mask, rest):
    """q 1_A + (1 - q(A)) rest: the law of 'accept iff x in A, else emit a sample of rest'."""
    qa = jnp.where(mask, q, 0.0)
    return qa + (1.0 - qa.sum(-1, keepdims=True)) * rest


class _HardSetChain(base.Rule):
    """The chain form Fast-HSD runs for a truncation set A(p) (docs/laws.md §3.2): accept iff
    p(x) >= threshold (`stats`), else emit a sample of the full p; law q 1_A + (1 - q(A)) p.
    Subclasses define `allowed(p)` and `stats(p, q)` (the per-row threshold), and their
    `tree_gate` (the node form).

    `tree_form` (a class attribute, so a rule name): 'node', the paper's tree rule (§3.3:
    the gate on the residual, the final token from the residual); 'chain' (the *_chainform
    rules), the chain form at every tree node: a sibling passes iff it is in A(p) of the
    node's original p, and when none does the token is a sample of the full p (no
    residual). On a one-child chain the chain form's node law is the chain law with
    q = onehot(c) exactly, so `TreeShape.chain(A)` ablates drafting alone.
    """

    tree_form: ClassVar[str] = 'node'

    def accept_from(self, px, qx, x, stats):
        return (px >= stats).astype(px.dtype)

    def replacement(self, p, q):
        return p

    def induced(self, p, q):
        return _set_law(p, q, self.allowed(p), p)

    def tree_node_stats(self, p):
        return self.stats(p, None) if self.tree_form == 'chain' else None

    def tree_gate_raw(self, pc, c, state, node):  # The chain form: the threshold of p.
        return self.accept_from(pc, pc, c, node)

    def tree_final_raw(self, residual, p, node):
        return self.replacement(p, None)


@registry.register
@dataclasses.dataclass(frozen=True)
class MinPVerify(_HardSetChain):
    """Min-p truncation verification as Fast-HSD runs it (SpecCascade), docs/laws.md §3.2-§3.3.

    Inputs: the processed target p (temperature only; the set is read from it) and q.
    A = {v : p(v) >= rho max p} (`sampling.min_p_mask`).

    - a(x) = 1[x in A] (hard).
    - Replacement: a sample of the full, untruncated p.
    - Bonus: p.
    - Law: pi = q 1_A + (1 - q(A)) p; acceptance q(A). The tail keeps (1 - q(A)) p(x), so
      the distortion against the matched baseline p_A does not vanish as the draft improves:
      at q = p, pi = p 1_A + (1 - p(A)) p and TV(pi, p_A) = (1 - p(A))^2. (The paper
      writes 'pi -> p, TV -> 1 - p(A)'; the exact limit is this one: docs/laws.md §3.2.)
    - rho = 0 accepts everything; rho = 1 accepts only the argmax (and exact ties).
    - Tree (§3.3): g_j = 1[P_{j-1}(c_j) >= rho max P_{j-1}] = 1[c_j in A]
      (the argmax is never rejected, so the ratio is invariant to renormalisation);
      rejection zeroes the sibling; all rejected: sample p with the siblings removed (tail
      included). Law: P(emit c_j) = g_j prod_{i<j}(1 - g_i), P(v not in C) =
      prod_i (1 - g_i) p(v)/(1 - p(C)); with a good draft c_1 = argmax p and
      pi -> onehot(argmax p) (near-greedy).
    - Tree, `minp_verify_chainform` (tree_form 'chain'): the same gate, all rejected: a
      sample of the full p. Law:
      onehot(c*) for c* the first sibling in A; p when no sibling is in A.
    """

    rho: float = 0.5

    name = 'minp_verify'
    tree_modes = ('deterministic',)
    section = '§3.2, §3.3'

    def __post_init__(self):
        base.set_field(
            self,
            'rho',
            base.check_range(
                'minp_verify', 'rho', self.rho, 0.0, 1.0, lo_open=False, hi_open=False
            ),
        )

    def allowed(self, p):
        """The allowed set A [..., V] bool."""
        return sampling.min_p_mask(p, self.rho)

    def stats(self, p, q):
        return sampling.min_p_threshold(p, self.rho)

    def tree_gate(self, pc, c, state):
        return (pc >= self.rho * state.pmax).astype(pc.dtype)


@registry.register
@dataclasses.dataclass(frozen=True)
class EtaVerify(_HardSetChain):
    """Eta truncation verification ('Medusa'/'Typical' rows), docs/laws.md §3.2-§3.3.

    Inputs: the processed target p (temperature only) and q.
    A = {v : p(v) >= tau(p)}, tau(P) = min(eta, sqrt(eta) exp(-H(P))) (`sampling.eta_mask`).

    Chain (hard, as the patched HF code):
    - a(x) = 1[x in A]. Replacement: a sample of the full p. Bonus: p.
    - Law: pi = q 1_A + (1 - q(A)) p; at q = p, TV(pi, p_A) = (1 - p(A))^2 > 0.

    Tree (soft, as the patched EAGLE code): g_j = min(1, P_{j-1}(c_j) /
    tau(P_{j-1})) with the entropy recomputed on the current residual P_{j-1} (g = 1 if
    tau <= 1e-9); rejection zeroes the sibling and renormalises; all rejected: sample the
    residual. The code clamps P at 1e-10 inside the log; here the entropy is exact
    (0 log 0 = 0). Law: P(emit c_j) = g_j prod_{i<j}(1 - g_i); near-greedy as the draft
    improves, since tau < max p makes g_1 = 1 for c_1 = argmax p.

    Tree, `eta_verify_chainform` (tree_form 'chain'): the chain form at each node,
    g_j = 1[c_j in A(p)] on the node's original p, all rejected: a sample of the full p; on
    a one-child chain the chain law.
    """

    eta: float = 0.1

    name = 'eta_verify'
    tree_modes = ('deterministic',)
    section = '§3.2, §3.3'

    def __post_init__(self):
        base.set_field(
            self,
            'eta',
            base.check_range('eta_verify', 'eta', self.eta, 0.0, 1.0, lo_open=True, hi_open=True),
        )

    def allowed(self, p):
        """The allowed set A [..., V] bool."""
        return sampling.eta_mask(p, self.eta)

    def stats(self, p, q):
        return sampling.eta_threshold(p, self.eta)

    def tree_gate(self, pc, c, state):
        big_p = pc / jnp.maximum(state.mass, base.ZERO_MASS)
        h = base.residual_entropy(state)
        tau = jnp.minimum(self.eta, jnp.sqrt(jnp.asarray(self.eta, h.dtype)) * jnp.exp(-h))
        return jnp.where(tau <= 1e-9, 1.0, jnp.clip(big_p / jnp.maximum(tau, 1e-30), 0.0, 1.0))


@registry.register
@dataclasses.dataclass(frozen=True)
class MinPVerifyChainForm(MinPVerify):
    """`minp_verify` whose tree form is its chain form (docs/laws.md §3.3), the ablation of
    drafting alone: a chain round and a `TreeShape.chain(A)` round then verify alike.

    - a(x) = 1[x in A], A the min-p set of the node's original p. Replacement: a sample of the
      full p. Bonus: p. Chain law as `minp_verify`: q 1_A + (1 - q(A)) p.
    - Tree: the first sibling in A is accepted; none: a sample of the full p (no residual).
      Law: onehot(c*), c* the first sibling in A, else p; on a one-child chain the chain law
      with q = onehot(c).
    """

    name = 'minp_verify_chainform'
    tree_form = 'chain'


@registry.register
@dataclasses.dataclass(frozen=True)
class EtaVerifyChainForm(EtaVerify):
    """`eta_verify` whose tree form is its chain form (docs/laws.md §3.3), the ablation of
    drafting alone: a chain round and a `TreeShape.chain(A)` round then verify alike.

    - a(x) = 1[x in A], A the eta set of the node's original p (entropy of p, not of the
      residual; hard, not the node form's soft gate). Replacement: a sample of the full p.
      Bonus: p. Chain law as `eta_verify`: q 1_A + (1 - q(A)) p.
    - Tree: the first sibling in A is accepted; none: a sample of the full p (no residual).
      Law: onehot(c*), c* the first sibling in A, else p; on a one-child chain the chain law
      with q = onehot(c).
    """

    name = 'eta_verify_chainform'
    tree_form = 'chain'


@registry.register
@dataclasses.dataclass(frozen=True)
class Typical(base.Rule):
    """Medusa typical acceptance (FasterDecoding/Medusa; vLLM), docs/laws.md §3.5-§3.6.

    Inputs: the processed target p (temperature before both probability and entropy); q is
    ignored by the gate. A = {v : p(v) > min(eps, delta exp(-H(p)))} with Medusa's entropy
    H = -sum p log(p + 1e-5) and strict '>'; delta defaults to sqrt(eps) (then A is the eta
    set up to >= vs > and the 1e-5).

    - a(x) = 1[x in A].
    - Replacement: mode 'argmax' (Medusa fast=True, vLLM): onehot(argmax p); mode 'sample'
      (Medusa fast=False): a sample of p restricted to A (plus the argmax), renormalised.
    - Bonus: p (vLLM samples the bonus from the target).
    - Law: pi = q 1_A + (1 - q(A)) onehot(argmax p)   ('argmax'),
           pi = q 1_A + (1 - q(A)) p_A                ('sample').
    - Tree (deterministic siblings, §3.5): the chain form at each node, a hard gate on the
      node's original p (no residual: a rejected sibling changes neither the set nor the
      replacement): the first sibling in A is accepted; none: the replacement above.
      Law: onehot(c*) for c* the first sibling in A, else the replacement law.
    """

    eps: float = 0.09
    delta: float | None = None
    mode: str = 'argmax'

    name = 'typical'
    static_fields = ('mode',)
    tree_modes = ('deterministic',)
    section = '§3.5, §3.6'

    def __post_init__(self):
        eps = base.check_range('typical', 'eps', self.eps, 0.0, 1.0, lo_open=True, hi_open=True)
        base.set_field(self, 'eps', eps)
        if self.delta is not None:
            delta = self.delta
        elif isinstance(eps, jax.core.Tracer):  # Built inside jit from a traced eps.
            delta = jnp.sqrt(eps)
        else:
            delta = math.sqrt(eps)
        base.set_field(
            self,
            'delta',
            base.check_range('typical', 'delta', delta, 0.0, math.inf, lo_open=True, hi_open=True),
        )
        if self.mode not in ('argmax', 'sample'):
            raise ValueError(f"typical: mode={self.mode!r} must be 'argmax' or 'sample'")

    def threshold(self, p):
        """min(eps, delta exp(-H(p))) with Medusa's H = -sum p log(p + 1e-5), [...]."""
        h = -jnp.sum(p * jnp.log(p + 1e-5), -1)
        return jnp.minimum(self.eps, self.delta * jnp.exp(-h))

    def allowed(self, p):
        """The acceptance set A [..., V] bool (strict '>')."""
        return p > self.threshold(p)[..., None]

    def stats(self, p, q):
        return self.threshold(p)

    def accept_from(self, px, qx, x, stats):
        return (px > stats).astype(px.dtype)

    def replacement(self, p, q):
        if self.mode == 'argmax':
            return base.onehot_argmax(p)
        return sampling.renormalize(p, self.allowed(p) | (base.onehot_argmax(p) > 0))

    def induced(self, p, q):
        return _set_law(p, q, self.allowed(p), self.replacement(p, q))

    def tree_node_stats(self, p):
        return self.threshold(p)

    def tree_gate_raw(self, pc, c, state, node):  # Hard, on the node's original p.
        return self.accept_from(pc, pc, c, node)

    def tree_final_raw(self, residual, p, node):
        return self.replacement(p, None)
