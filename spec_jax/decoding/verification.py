"""What a round verifies with: the engine's rule, or its matched baseline, chosen by a
traced flag, in chain and tree form (docs/engine.md, "Matched baselines")."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from spec_jax import rules

_LOSSLESS = rules.Lossless()


@jax.tree_util.register_pytree_node_class
class Verification:
    """The rule a run verifies with, or its matched baseline, chosen by a traced flag.

    With `baseline` false: `rule` on the processed p and q. With it true: the matched
    baseline, `rules.matched_baseline(rule)`: its truncation applied to p and q
    (`transform`) and lossless verification, whose output law is exactly the truncated
    target. Both branches are computed and one is selected, so flipping the flag does not
    compile a new loop (the verifier's cost is O(B A V), small beside a forward).
    """

    def __init__(self, rule: rules.Rule, baseline):
        self.rule = rule
        self.baseline = baseline

    def tree_flatten(self):
        return (self.rule, self.baseline), None

    @classmethod
    def tree_unflatten(cls, aux, children):
        del aux
        return cls(*children)

    @property
    def stats_need_q(self) -> bool:
        return self.rule.stats_need_q

    def transform(self, probs: jax.Array) -> jax.Array:
        truncated = rules.matched_baseline(self.rule).transform(probs)
        return jnp.where(self.baseline, truncated, probs)

    def stats(self, p, q):
        return self.rule.stats(p, q)

    def accept_from(self, px, qx, x, stats):
        lossless = _LOSSLESS.accept_from(px, qx, x, ())
        return jnp.where(self.baseline, lossless, self.rule.accept_from(px, qx, x, stats))

    def replacement(self, p, q):
        lossless = _LOSSLESS.replacement(p, q)
        return jnp.where(self.baseline, lossless, self.rule.replacement(p, q))

    def bonus(self, p):
        return jnp.where(self.baseline, p, self.rule.bonus(p))

    def emitted_law(self, p_btv: jax.Array, q_bav: jax.Array) -> jax.Array:
        """The law pi [B, T, V] of the token each offset of a round emits, given that it is
        reached: the rule's induced law at the A drafted offsets, its bonus law at the last
        (T = A + 1); a baseline emits its truncated target p_A at every offset.

        p_btv is the temperature-processed target (before any baseline truncation), q_bav
        the draft's processed law (A = 0: a width-0 round, the bonus law only)."""
        pi = self.rule.bonus(p_btv[:, -1:])
        if q_bav.shape[1]:
            pi = jnp.concatenate([self.rule.induced(p_btv[:, :-1], q_bav), pi], axis=1)
        return jnp.where(self.baseline, rules.matched_baseline(self.rule).law(p_btv), pi)

    def meter(self, pi: jax.Array, p: jax.Array) -> rules.Metered:
        """`rules.meter` of an emitted law against this rule's matched baseline law of p."""
        return rules.meter(pi, p, rules.matched_baseline(self.rule))

    # --- tree form (rules.verify_tree walks these; deterministic siblings only) ---------

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def tree_modes(self) -> tuple[str, ...]:
        """The rule's: a baseline verifies losslessly, which has every mode, but the flag is
        traced, so the rule's own modes bound the loop."""
        return self.rule.tree_modes

    def tree_gate(self, pc, c, state):
        lossless = _LOSSLESS.tree_gate(pc, c, state)
        return jnp.where(self.baseline, lossless, self.rule.tree_gate(pc, c, state))

    def tree_final(self, residual):
        return jnp.where(self.baseline, residual, self.rule.tree_final(residual))

    def tree_node_law(self, p_btv: jax.Array, siblings_btc: jax.Array) -> jax.Array:
        """The law [B, T, V] of the token emitted at the T nodes of a path, with
        temperature-processed target p_btv and ordered siblings [B, T, C] (-1 padded; none:
        the bonus law), given that the walk reached them; a baseline emits its truncated
        target p_A."""
        pi = self.rule.induced_tree_node(p_btv, siblings_btc)
        return jnp.where(self.baseline, rules.matched_baseline(self.rule).law(p_btv), pi)
