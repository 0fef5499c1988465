"""Matched baselines: the truncation sampler plus lossless verification (docs/laws.md §5).

A lossy truncation verifier must be compared with 'target + the same truncation sampler +
lossless SD', whose output law is exactly the truncated target p_A; otherwise accuracy
changes caused by truncation itself are credited to the verifier. `matched_baseline(rule)`
builds that comparison for any rule: rules without a truncation set get the plain target
(their baseline is ordinary lossless speculative sampling).
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from spec_jax import sampling
from spec_jax.rules import base, registry
from spec_jax.rules.cascade import SpecCascade
from spec_jax.rules.collaborative import OvershootTail
from spec_jax.rules.logit_rules import Mars, Relaxed
from spec_jax.rules.lossless import Greedy, Lossless
from spec_jax.rules.truncation import EtaVerify, MinPVerify, Typical

TRUNCATIONS = ('none', 'argmax', 'min_p', 'eta', 'top_gap', 'typical_accept', 'relaxed', 'mars')
# Sets read from the target's raw logits (docs/laws.md §5, §7): the target only is truncated.
LOGIT_TRUNCATIONS = ('relaxed', 'mars')


@dataclasses.dataclass(frozen=True)
class MatchedBaseline:
    """A truncation transform and the lossless rule that verifies under it.

    In chain mode the transform is applied to the target at all A+1 positions and to the
    draft (the draft then samples from its own truncation q_A'); verification with `rule`
    (lossless) then emits exactly `transform(p)` = p_A. In EAGLE tree mode only the target
    is transformed; tokens outside A have p = 0 and are never accepted or sampled.

    A pytree: `rule`, `param` and `source` are children (so `param` and the source rule's
    parameters may be traced, e.g. when `matched_baseline(rule)` is called inside jit on a
    traced rule), `truncation` is static aux data. Unflattening skips `__post_init__`.

    Attributes:
      rule: the lossless rule.
      truncation: one of TRUNCATIONS (static).
      param: the truncation parameter (rho, eta, alpha gap) or None; a float or a traced
        scalar.
      source: the lossy rule this baseline matches.
    """

    rule: base.Rule
    truncation: str = 'none'
    param: Any = None
    source: base.Rule | None = None

    static_fields: ClassVar[tuple[str, ...]] = ('truncation',)

    def __post_init__(self):
        if self.truncation not in TRUNCATIONS:
            raise ValueError(f'truncation={self.truncation!r} is not one of {TRUNCATIONS}')

    def allowed(self, p: jax.Array, logits: jax.Array | None = None) -> jax.Array:
        """The allowed set A of the target p [..., V] -> [..., V] bool (`logits` [..., V]: the
        target's raw logits, which the 'relaxed' and 'mars' sets are read from)."""
        t = self.truncation
        if t in LOGIT_TRUNCATIONS:
            if logits is None:
                raise ValueError(
                    f'the {t!r} baseline set is read from the raw logits; pass logits='
                )
            return self.source.allowed_from_logits(logits) | (base.onehot_argmax(p) > 0)
        if t == 'none':
            return jnp.ones(p.shape, bool)
        if t == 'argmax':
            return base.onehot_argmax(p) > 0
        if t == 'min_p':
            return sampling.min_p_mask(p, self.param)
        if t == 'eta':
            return sampling.eta_mask(p, self.param)
        if t == 'top_gap':
            return p >= (p.max(-1) - self.param)[..., None]
        return self.source.allowed(p) | (base.onehot_argmax(p) > 0)  # typical_accept

    def transform(self, probs: jax.Array, logits: jax.Array | None = None) -> jax.Array:
        """Truncates and renormalises processed probabilities [..., V] (target and draft;
        `logits`: the raw logits of the same rows, for the sets read from them)."""
        if self.truncation == 'none':
            return probs
        return sampling.renormalize(probs, self.allowed(probs, logits))

    def transform_draft(self, probs: jax.Array) -> jax.Array:
        """The draft's transform: `transform`, except for the sets read from the target's raw
        logits, which leave the draft as it is (lossless SD on p_A emits p_A whatever q)."""
        if self.truncation in LOGIT_TRUNCATIONS:
            return probs
        return self.transform(probs)

    def law(self, p: jax.Array, logits: jax.Array | None = None) -> jax.Array:
        """The exact output law p_A of the baseline, [..., V]."""
        return self.transform(p, logits)


registry.register_pytree(MatchedBaseline)


def matched_baseline(rule: base.Rule) -> MatchedBaseline:
    """The matched baseline of `rule` (docs/laws.md §5).

    minp_verify(rho), overshoot_tail(rho) -> min-p(rho); eta_verify(eta) -> eta sampling;
    speccascade token_v3(alpha) -> min-p(1 - alpha); token_v2(alpha) -> the gap set
    {p >= max p - alpha}; typical -> its acceptance set; greedy -> argmax; every other rule
    (lossless, lenience, cos, the ablations, chow/diff/opt/token_v1 whose sets depend on q;
    the engines' static_ensemble, logit_ensemble, sglang and onehot_q, which have no allowed
    set, §5) -> the plain target. The verifier is always `lossless`.
    """
    lossless = Lossless()
    if isinstance(rule, Relaxed):  # §7.1: the top-K-within-delta set of the untempered target.
        return MatchedBaseline(lossless, 'relaxed', rule.delta, rule)
    if isinstance(rule, Mars):  # §7.2: the top 2 where the margin gate is open.
        return MatchedBaseline(lossless, 'mars', rule.theta, rule)
    if isinstance(rule, Greedy):
        return MatchedBaseline(lossless, 'argmax', None, rule)
    if isinstance(rule, (MinPVerify, OvershootTail)):
        return MatchedBaseline(lossless, 'min_p', rule.rho, rule)
    if isinstance(rule, EtaVerify):
        return MatchedBaseline(lossless, 'eta', rule.eta, rule)
    if isinstance(rule, Typical):
        return MatchedBaseline(lossless, 'typical_accept', None, rule)
    if isinstance(rule, SpecCascade) and rule.deferral == 'token_v3':
        return MatchedBaseline(lossless, 'min_p', 1.0 - rule.alpha, rule)
    if isinstance(rule, SpecCascade) and rule.deferral == 'token_v2':
        return MatchedBaseline(lossless, 'top_gap', rule.alpha, rule)
    return MatchedBaseline(lossless, 'none', None, rule)
