"""Lossless rules: speculative sampling and greedy verification (docs/laws.md §2)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from spec_jax.rules import base, registry


@registry.register
@dataclasses.dataclass(frozen=True)
class Lossless(base.YieldRule):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023), docs/laws.md §2.1-§2.3.

    Inputs: p and q processed identically (temperature, and the truncation warper in matched
    baselines); q must be the law the draft token was actually sampled from.

    - a(x) = min(1, p(x)/q(x)); yield y = min(p, q).
    - Replacement: norm((p - q)_+), falling back to p when p == q.
    - Bonus: p.
    - Law: pi = p exactly; acceptance rate 1 - TV(p, q).
    - Tree, deterministic siblings (EAGLE, §2.2): accept sibling c_j with probability
      P_{j-1}(c_j) (q := 1); on rejection zero c_j and renormalise; all rejected: emit a
      sample of the residual. Law at the node: p exactly.
    - Tree, i.i.d. siblings (SpecInfer, §2.3): accept c_j ~ q with min(1, P(c_j)/q(c_j));
      on rejection P <- norm((P - q)_+). Law: p exactly.
    - Tree, distinct siblings (drawn without replacement; Jeon et al. 2024): c_j ~ q_j, q
      without c_1..c_{j-1} renormalised; accept with min(1, P(c_j)/q_j(c_j)); on rejection
      P <- norm((P - q_j)_+). Law: p exactly (docs/engine.md "Tree rounds").
    """

    name = 'lossless'
    lossless = True
    tree_modes = ('deterministic', 'iid', 'distinct')
    section = '§2.1-§2.3'

    def yield_from(self, px, qx, x, stats):
        return jnp.minimum(px, qx)

    def induced(self, p, q):
        return p

    def tree_gate(self, pc, c, state):
        return jnp.clip(pc / jnp.maximum(state.mass, base.ZERO_MASS), 0.0, 1.0)

    def induced_tree_node(self, p, siblings):
        """Law at a node with deterministic siblings: p exactly (§2.2)."""
        return p


@registry.register
@dataclasses.dataclass(frozen=True)
class Greedy(base.Rule):
    """Greedy verification (docs/laws.md §2.1).

    Accept the drafted token iff it is the target argmax.

    Lossless with respect to greedy decoding (temperature 0): its law is onehot(argmax p),
    which is p itself when p is the T = 0 processed target.

    - a(x) = 1[x = argmax p] (first index on ties, as `jnp.argmax`).
    - Replacement: onehot(argmax p). Bonus: onehot(argmax p).
    - Law: pi = onehot(argmax p); accepts exactly the prefix of drafts equal to the target
      argmax at each position.
    - Tree: sibling c is accepted iff c = argmax p (EAGLE greedy); if none is, the argmax
      is emitted.
    """

    name = 'greedy'
    lossless = True
    tree_modes = ('deterministic',)
    section = '§2.1 (greedy)'

    def stats(self, p, q):
        return jnp.argmax(p, -1).astype(jnp.int32)

    def accept_from(self, px, qx, x, stats):
        return (x == stats).astype(px.dtype)

    def replacement(self, p, q):
        return base.onehot_argmax(p)

    def bonus(self, p):
        return base.onehot_argmax(p)

    def induced(self, p, q):
        return base.onehot_argmax(p)

    def tree_gate(self, pc, c, state):
        return (c == state.top).astype(pc.dtype)

    def tree_final(self, residual):
        return base.onehot_argmax(residual)
