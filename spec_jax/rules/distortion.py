"""Distortion measures between an induced law pi and a reference law (docs/laws.md §3-§5).

`compare` / `measure` (theory, diagnose) put pi first: KL(pi || reference). `meter` is what
the engine records at every emitted position of a run (docs/eval.md, metrics): TV(pi, p_A),
KL(p_A || pi) (the other direction is infinite for truncation rules, whose pi leaks mass
outside A where p_A is 0), the mass pi puts outside the allowed set A, the overshoot
max pi/p against the temperature-processed target p (not p_A), and JS(pi, p_A), bounded
where KL is infinite. `frontier` / `frontier_gap`: the distortion frontier every rule lives
under (docs/laws.md §8): acceptance <= sum(min(p, q)) + TV(pi, p).
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from spec_jax import categorical
from spec_jax.rules import base
from spec_jax.rules.baselines import MatchedBaseline, matched_baseline


def tv(pi: jax.Array, p: jax.Array) -> jax.Array:
    """Total variation 1/2 sum |pi - p| over the last axis, [..., V] -> [...]."""
    return 0.5 * jnp.abs(pi - p).sum(-1)


def kl(pi: jax.Array, p: jax.Array) -> jax.Array:
    """KL(pi || p) = sum pi log(pi/p) in nats, [..., V] -> [...]; inf if pi leaves supp p."""
    pos = pi > 0
    log_ratio = jnp.log(jnp.where(pos, pi, 1.0)) - jnp.log(jnp.where(p > 0, p, 1.0))
    terms = jnp.where(pos, jnp.where(p > 0, pi * log_ratio, jnp.inf), 0.0)
    return terms.sum(-1)


def js(a: jax.Array, b: jax.Array) -> jax.Array:
    """Jensen-Shannon divergence 1/2 KL(a || m) + 1/2 KL(b || m), m = (a + b)/2, in nats,
    [..., V] -> [...]: symmetric, bounded by ln 2, finite where KL is not (docs/laws.md §5)."""
    m = 0.5 * (a + b)
    safe_m = jnp.where(m > 0, m, 1.0)

    def half(x):  # x > 0 implies m > 0, so every term is finite.
        pos = x > 0
        return jnp.where(pos, x * (jnp.log(jnp.where(pos, x, 1.0)) - jnp.log(safe_m)), 0.0).sum(-1)

    return jnp.clip(0.5 * (half(a) + half(b)), 0.0, jnp.log(2.0))


def overshoot_ratio(pi: jax.Array, p: jax.Array) -> jax.Array:
    """max_x pi(x)/p(x) over tokens with pi(x) > 0, [..., V] -> [...] (inf if p(x) = 0)."""
    ratio = jnp.where(p > 0, pi / jnp.where(p > 0, p, 1.0), jnp.inf)
    return jnp.where(pi > 0, ratio, 0.0).max(-1)


def frontier(p: jax.Array, q: jax.Array, pi: jax.Array) -> jax.Array:
    """The distortion frontier at one position, [..., V] -> [...]: sum(min(p, q)) + TV(pi, p),
    the most any verification rule whose emitted law is pi can accept when the draft is
    drawn from q and the target is p (docs/laws.md §8)."""
    return jnp.minimum(p, q).sum(-1) + tv(pi, p)


def frontier_gap(
    p: jax.Array, q: jax.Array, pi: jax.Array, acceptance: jax.Array | None = None
) -> jax.Array:
    """How far below the distortion frontier a rule sits at one position, [..., V] -> [...].

    Args:
      p: [..., V] processed target.
      q: [..., V] processed draft (the law the drafted token was drawn from).
      pi: [..., V] the rule's emitted law at the position (its `induced` or `round_law`).
      acceptance: [...] the rule's acceptance probability there (`acceptance_rate`); None
        for the most a rule with law pi can accept, sum(min(pi, q)) (an accepted x is
        emitted as x, so q(x) a(x) <= min(q(x), pi(x))).

    Returns:
      frontier(p, q, pi) - acceptance: >= 0 for every rule (up to rounding); 0 for rules on
      the frontier (lenience, CoS, the static ensemble, tv_budget), > 0 for distortion paid
      that buys no acceptance (truncation rules). With acceptance None it is the triangle
      inequality's slack TV(pi, p) + TV(pi, q) - TV(p, q).
    """
    if acceptance is None:
        acceptance = jnp.minimum(pi, q).sum(-1)
    return frontier(p, q, pi) - acceptance


class Distortion(NamedTuple):
    """Distances of an induced law from its reference, each [...]."""

    tv: jax.Array
    kl: jax.Array
    overshoot: jax.Array


def compare(pi: jax.Array, reference: jax.Array) -> Distortion:
    """tv, kl and overshoot ratio of pi against reference, [..., V] -> Distortion of [...]."""
    return Distortion(tv(pi, reference), kl(pi, reference), overshoot_ratio(pi, reference))


def measure(rule: base.Rule, p: jax.Array, q: jax.Array) -> Distortion:
    """Chain-mode distortion of `rule` at one position against its matched baseline.

    Args:
      rule: the lossy (or lossless) rule.
      p: [..., V] processed target (temperature only, as the lossy rule sees it).
      q: [..., V] processed draft.

    Returns:
      Distortion of rule.induced(p, q) against matched_baseline(rule).law(p).
    """
    return compare(rule.induced(p, q), matched_baseline(rule).law(p))


def measure_tree_node(rule: base.Rule, p: jax.Array, siblings: jax.Array) -> Distortion:
    """Tree-node distortion of `rule` (siblings [..., C]) against its matched baseline."""
    return compare(rule.induced_tree_node(p, siblings), matched_baseline(rule).law(p))


class Metered(NamedTuple):
    """What the engine meters at one emitted position, each [...].

    Attributes:
      tv: TV(pi, p_A), p_A the matched baseline's law of the same processed target p.
      kl: KL(p_A || pi) in nats.
      outside: pi(V minus A), the mass pi puts outside the baseline's allowed set (0 for
        rules whose baseline truncates nothing).
      overshoot: max_x pi(x) / p(x) against the processed target p itself.
      js: JS(pi, p_A) in nats (at most ln 2): a bounded divergence, finite where KL is not.
      tv_plain: TV(pi, p) against the processed target itself, plain lossless SD's law:
        `tv` where the baseline truncates nothing; for a rule matched with a truncated
        target, its distortion against what plain SD emits (the truncation's included).
    """

    tv: jax.Array
    kl: jax.Array
    outside: jax.Array
    overshoot: jax.Array
    js: jax.Array
    tv_plain: jax.Array


def meter(
    pi: jax.Array, p: jax.Array, baseline: MatchedBaseline, logits: jax.Array | None = None
) -> Metered:
    """Metered distortion of the emitted law pi [..., V] given the processed target p [..., V]
    and the matched baseline whose law p_A = baseline.law(p) is the reference (`logits`: the
    target's raw logits, for the baselines whose set is read from them, docs/laws.md §7)."""
    pi, p = categorical.upcast(pi), categorical.upcast(p)
    law = baseline.law(p, logits)
    outside = jnp.where(baseline.allowed(p, logits), 0.0, pi).sum(-1)
    # KL >= 0; rounding can take a near-zero one a hair below.
    return Metered(
        tv(pi, law), jnp.maximum(kl(law, pi), 0.0), outside, overshoot_ratio(pi, p),
        js(pi, law), tv(pi, p),
    )  # fmt: skip
