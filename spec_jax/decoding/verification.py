"""What a round verifies with: the engine's rule, or its matched baseline, chosen by a
traced flag, in chain and tree form (docs/engine.md, "Matched baselines")."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

import jax
import jax.numpy as jnp

from spec_jax import rules
from spec_jax.rules import base, contract

_LOSSLESS = rules.Lossless()


@functools.partial(jax.tree_util.register_dataclass, data_fields=['sampler', 'verification'],
                   meta_fields=[])  # fmt: skip
@dataclasses.dataclass(frozen=True)
class TargetLaw:
    """Raw target logits [..., V] -> the law a round verifies against: the sampler's
    processed p, then the matched baseline's truncation under the flag. A tree walk applies
    it to the rows it reads only (`rules.verify_tree(target_law=)`: max_depth + 1 of the M
    nodes), not to every node the target scored."""

    sampler: Any
    verification: Verification

    def __call__(self, logits: jax.Array) -> jax.Array:
        return self.verification.transform_target(self.sampler.probs(logits), logits)


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

    @property
    def needs_logits(self) -> bool:
        return self.rule.needs_logits

    @property
    def block_level(self) -> bool:
        return self.rule.block_level

    def transform(self, probs: jax.Array) -> jax.Array:
        """The draft's processed law under the flag (`MatchedBaseline.transform_draft`)."""
        truncated = rules.matched_baseline(self.rule).transform_draft(probs)
        return jnp.where(self.baseline, truncated, probs)

    def transform_target(self, probs: jax.Array, logits: jax.Array) -> jax.Array:
        """The target's processed law under the flag; `logits` are its raw logits (read by the
        baselines whose set comes from them)."""
        truncated = rules.matched_baseline(self.rule).transform(probs, logits)
        return jnp.where(self.baseline, truncated, probs)

    def accept_block(self, u, p, q, x, raw):
        """A block-level rule's block, or under the flag lossless SD's (the leading run of
        u_i <= min(1, p/q), the residual at n, the bonus p)."""
        a = x.shape[1]
        lossless_a = _LOSSLESS.accept_from(base.gather(p[:, :a], x), base.gather(q, x), x, ())
        n = contract.leading_run(u <= lossless_a)
        residual = _LOSSLESS.replacement(contract.row_at(p, n), contract.row_at(q, n))
        lossless = contract.block_from(n, a, residual, p[:, a], lossless_a)
        block = self.rule.accept_block(u, p, q, x, raw)
        return contract.Block(*(jnp.where(self.baseline, w, r) for w, r in zip(lossless, block)))

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

    def emitted_law(
        self, p_btv: jax.Array, q_bav: jax.Array, x_ba=None, raw: contract.Raw | None = None
    ) -> jax.Array:
        """The law pi [B, T, V] of the token each offset of a round emits, given that it is
        reached: the rule's induced law at the A drafted offsets, its bonus law at the last
        (T = A + 1); a baseline emits its truncated target p_A at every offset.

        p_btv is the temperature-processed target (before any baseline truncation), q_bav
        the draft's processed law (A = 0: a width-0 round, the bonus law only). A block-level
        rule gives its `round_law` (which may read the drafts x_ba and the raw logits)."""
        logits = None if raw is None else raw.target_logits
        if self.rule.block_level:
            pi = self.rule.round_law(p_btv, q_bav, x_ba, raw)
            law = rules.matched_baseline(self.rule).law(p_btv, logits)
            return jnp.where(self.baseline, law, pi)
        pi = self.rule.bonus(p_btv[:, -1:])
        if q_bav.shape[1]:
            pi = jnp.concatenate([self.rule.induced(p_btv[:, :-1], q_bav), pi], axis=1)
        return jnp.where(self.baseline, rules.matched_baseline(self.rule).law(p_btv), pi)

    def meter(self, pi: jax.Array, p: jax.Array, logits: jax.Array | None = None) -> rules.Metered:
        """`rules.meter` of an emitted law against this rule's matched baseline law of p
        (`logits`: the target's raw logits of the same rows, for the sets read from them)."""
        return rules.meter(pi, p, rules.matched_baseline(self.rule), logits)

    # --- tree form (rules.verify_tree walks these; deterministic siblings only) ---------

    @property
    def name(self) -> str:
        return self.rule.name

    @property
    def tree_modes(self) -> tuple[str, ...]:
        """The rule's: a baseline verifies losslessly, which has every mode, but the flag is
        traced, so the rule's own modes bound the loop."""
        return self.rule.tree_modes

    def tree_target(self, p, siblings, q=None):
        target = self.rule.tree_target(p, siblings, q)  # p itself for most rules: no op.
        return p if target is p else jnp.where(self.baseline, p, target)

    def tree_gate(self, pc, c, state):
        lossless = _LOSSLESS.tree_gate(pc, c, state)
        return jnp.where(self.baseline, lossless, self.rule.tree_gate(pc, c, state))

    def tree_final(self, residual):
        return jnp.where(self.baseline, residual, self.rule.tree_final(residual))

    def tree_node_raw(self, logits):
        return self.rule.tree_node_raw(logits)

    def tree_node_stats(self, p):
        return self.rule.tree_node_stats(p)

    def tree_gate_raw(self, pc, c, state, node):
        lossless = _LOSSLESS.tree_gate(pc, c, state)
        return jnp.where(self.baseline, lossless, self.rule.tree_gate_raw(pc, c, state, node))

    def tree_final_raw(self, residual, p, node):
        return jnp.where(self.baseline, residual, self.rule.tree_final_raw(residual, p, node))

    def tree_node_law(
        self,
        p_btv: jax.Array,
        siblings_btc: jax.Array,
        logits_btv: jax.Array | None = None,
        q_btv: jax.Array | None = None,
    ) -> jax.Array:
        """The law [B, T, V] of the token emitted at the T nodes of a path, with
        temperature-processed target p_btv and ordered siblings [B, T, C] (-1 padded; none:
        the bonus law), given that the walk reached them; a baseline emits its truncated
        target p_A. `logits_btv`: the nodes' raw target logits, for rules that read them.

        `q_btv`: for sampled siblings, the law [B, T, V] each node's children were drawn
        from. The walk is then lossless against the rule's `tree_target(p, siblings, q)`
        (p for lossless SD, the chain law pi(p, q) for tv_budget), so over the draws that is
        the law emitted, not the deterministic-sibling law of the drawn set (docs/laws.md
        §8.2; tests/rules/test_tree_meter.py checks it against `verify_node`)."""
        if q_btv is not None:
            has_kids = (siblings_btc >= 0).any(-1, keepdims=True)
            target = self.rule.tree_target(p_btv, siblings_btc, q_btv)
            pi = jnp.where(has_kids, target, self.rule.bonus(p_btv))
            law = rules.matched_baseline(self.rule).law(p_btv, logits_btv)
            return jnp.where(self.baseline, law, pi)
        if logits_btv is None:
            pi = self.rule.induced_tree_node(p_btv, siblings_btc)
            return jnp.where(self.baseline, rules.matched_baseline(self.rule).law(p_btv), pi)
        pi = self.rule.induced_tree_node_raw(p_btv, siblings_btc, logits_btv)
        law = rules.matched_baseline(self.rule).law(p_btv, logits_btv)
        return jnp.where(self.baseline, law, pi)


def raw_inputs(sampler, logits_btv, q_bav, history_bs, context_len_b) -> contract.Raw:
    """What a rule that needs logits reads (`rules.Raw`): the target's raw logits, the draft's
    T = 1 log-probabilities recovered from its processed law q as T log q (exact for a
    temperature-only sampler; log q at T = 0, where q is one-hot: the drafters return q
    only), and the token history with its valid length per row."""
    t = jnp.asarray(sampler.temperature, jnp.float32)
    t = t.reshape(t.shape + (1,) * (3 - t.ndim))
    log_q = jnp.where(q_bav > 0, jnp.log(jnp.where(q_bav > 0, q_bav, 1.0)), -jnp.inf)
    draft_logits = jnp.where(t > 0, jnp.where(q_bav > 0, t * log_q, -jnp.inf), log_q)
    return contract.Raw(logits_btv.astype(jnp.float32), draft_logits, history_bs, context_len_b)
