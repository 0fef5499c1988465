"""Rules the serving engines ship, on the per-position contract (docs/laws.md §2.4, §3.7, §4.6).

Each is the engine's rule as its code runs it, read from the processed p and q this package
gives every rule (the upstream file and commit are cited in docs/laws.md):

  static_ensemble (w)    transformers' `assistant_ensemble_weight`: verify against
                         nu = w p + (1 - w) q (§4.6)
  logit_ensemble (w_d)   DIVERSED's static ensemble, mixed in logit space:
                         nu = softmax(w_d log q + (1 - w_d) log p) (§4.6)
  sglang (t_s, t_a)      SGLang / sglang-jax `tree_speculative_sampling_target_only`
                         thresholds, chain and tree (§3.7)
  onehot_q               vLLM's drafts without probabilities (n-gram, argmax drafts): q is
                         taken as a point mass, chain and tree (§2.4)

The upstream engines' defaults are named presets (`rules.make('sglang:preset=default')`).
The sglang and onehot_q replacements depend on the rejected token x upstream (p with x
removed); the contract's `replacement(p, q)` does not see x, so it returns that law averaged
over the rejected x (`_leave_one_out`): the emitted token has the upstream law at every
position (for a point-mass draft the two are the same law), docs/laws.md §2.4.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from spec_jax.rules import base, registry

# SGLang's launcher floors threshold_acc at this value before dividing by it.
ACC_FLOOR = 1e-9


def _leave_one_out(p, q, accept):
    """Law of p with the rejected draft x removed, given a rejection, averaged over x.

    Upstream emits a sample of p_{-x} = p 1[v != x] / (1 - p(x)) after rejecting x. Given a
    rejection, x has law q(x)(1 - a(x)) / Z (Z = sum_x q(x)(1 - a(x))), so the emitted token
    has law r(v) = p(v) (W - w(v)) / Z with w(x) = q(x)(1 - a(x)) / (1 - p(x)), W = sum w.
    A token with p(x) = 1 is always accepted (a = 1), so w there is 0. Falls back to p when
    nothing is rejected.

    Args:
      p, q: [..., V] processed target and draft laws.
      accept: [..., V] a(v) for every token.

    Returns:
      [..., V] the replacement law.
    """
    reject = q * (1.0 - accept)
    w = jnp.where(p < 1.0, reject / jnp.maximum(1.0 - p, 1e-30), 0.0)
    return base.normalize_or(p * (w.sum(-1, keepdims=True) - w), p)


@registry.register
@dataclasses.dataclass(frozen=True)
class StaticEnsemble(base.YieldRule):
    """Static ensemble verification (transformers `assistant_ensemble_weight`), docs/laws.md §4.6.

    transformers PR 45979 (`_speculative_sampling`): the draft is verified against the
    mixture nu = w p + (1 - w) q, w the weight on the TARGET (w = 1, upstream's None, is
    lossless; w = 0 accepts everything).

    - a(x) = min(1, nu(x)/q(x)) = min(1, 1 - w + w p(x)/q(x)); yield y = min(q, nu).
    - Replacement: norm((p - q)_+) (= norm((nu - q)_+), since nu - q = w (p - q)).
    - Bonus: p.
    - Law: pi = nu = w p + (1 - w) q exactly; acceptance 1 - w TV(p, q). It is CoS (§4.3)
      with lam = 1 - w. Upstream's greedy mode (argmax of nu on T = 1 softmaxes) reads raw
      logits and is not this rule.
    - Presets: 'default' (w = 1, upstream's None), 'docs' (w = 0.7, the docs' example).
    """

    w: float = 1.0

    name = 'static_ensemble'
    section = '§4.6'
    presets = {'default': {'w': 1.0}, 'docs': {'w': 0.7}}  # Named engine settings.

    def __post_init__(self):
        base.set_field(
            self,
            'w',
            base.check_range('static_ensemble', 'w', self.w, 0.0, 1.0, lo_open=False,
                             hi_open=False),  # fmt: skip
        )

    @property
    def lossless(self) -> bool:
        """w = 1 is speculative sampling. Host-side: raises TypeError on a traced w."""
        return base.host_equal('static_ensemble', 'lossless', 'w', self.w, 1.0)

    def yield_from(self, px, qx, x, stats):
        return jnp.minimum(qx, self.w * px + (1.0 - self.w) * qx)

    def induced(self, p, q):
        return self.w * p + (1.0 - self.w) * q


@registry.register
@dataclasses.dataclass(frozen=True)
class LogitEnsemble(base.YieldRule):
    """DIVERSED's static ensemble, mixed in logit space, docs/laws.md §4.6.

    comeusr/diversed `EnsembleWrapper.forward` mixes the raw logits, w_d z_q + (1 - w_d) z_p
    (w_d the weight on the DRAFT), and `generate` applies the temperature to the mixture.
    On temperature-processed laws (one temperature) that is exactly
    nu = softmax(w_d log q + (1 - w_d) log p) = q^w_d p^(1 - w_d) / Z, which this rule
    computes; with a truncation in the processing it is the geometric mixture of the
    truncated laws (support: both supports), not the truncation of the mixture. The learned
    per-token weight of DIVERSED needs its trained head and is not here.

    - a(x) = min(1, nu(x)/q(x)); yield y = min(q, nu), target t = nu.
    - Replacement: norm((nu - q)_+) (not the lossless residual: nu - q is not proportional to
      p - q), falling back to p.
    - Bonus: p.
    - Law: pi = nu exactly (lossless verification against nu). w_d = 0 is lossless, w_d = 1
      accepts everything. Where Z = 0 (disjoint supports) nu falls back to p.
    - Presets: 'default' (w_d = 0.5, `scripts/run_inference.py --static_weight`), 'readme'
      (w_d = 0.3, the README's example).
    """

    w_d: float = 0.0

    name = 'logit_ensemble'
    stats_need_q = True
    section = '§4.6'
    presets = {'default': {'w_d': 0.5}, 'readme': {'w_d': 0.3}}

    def __post_init__(self):
        base.set_field(
            self,
            'w_d',
            base.check_range('logit_ensemble', 'w_d', self.w_d, 0.0, 1.0, lo_open=False,
                             hi_open=False),  # fmt: skip
        )

    @property
    def lossless(self) -> bool:
        """w_d = 0 is speculative sampling. Host-side: raises TypeError on a traced w_d."""
        return base.host_equal('logit_ensemble', 'lossless', 'w_d', self.w_d, 0.0)

    def _weights(self, p, q):
        """q^w_d p^(1 - w_d), [..., V] (0^0 = 1, so w_d = 0 gives p and w_d = 1 gives q)."""
        return jnp.power(q, self.w_d) * jnp.power(p, 1.0 - self.w_d)

    def stats(self, p, q):
        return self._weights(p, q).sum(-1)  # Z, [...]

    def _nu(self, px, qx, z):
        return jnp.where(z > base.ZERO_MASS, self._weights(px, qx) / jnp.maximum(z, 1e-30), px)

    def yield_from(self, px, qx, x, stats):
        return jnp.minimum(qx, self._nu(px, qx, stats))

    def target_from(self, px, qx, x, stats):
        return self._nu(px, qx, stats)

    def induced(self, p, q):
        return self._nu(p, q, self.stats(p, q)[..., None])


@registry.register
@dataclasses.dataclass(frozen=True)
class SGLangThresholds(base.Rule):
    """SGLang / sglang-jax acceptance thresholds (target only), docs/laws.md §3.7.

    `tree_speculative_sampling_target_only` with `speculative_accept_threshold_single` t_s
    and `speculative_accept_threshold_acc` t_a (t_a floored at 1e-9); the acceptance does not
    read q (only the averaged replacement does).

    - Chain: a(x) = 0 if p(x) = 0, else 1 if p(x) >= t_s, else min(1, p(x)/t_a).
    - Replacement: p with the rejected x removed, renormalised (upstream); here its average
      over the rejected x (`_leave_one_out`), the same law at the position.
    - Bonus: p.
    - Law: pi(v) = q(v) a(v) + p(v) sum_{x != v} q(x) (1 - a(x)) / (1 - p(x)); with a
      point-mass draft at x: a(x) at x, (1 - a(x)) p(v)/(1 - p(x)) elsewhere.
    - Tree (deterministic siblings): one uniform u per parent shared by its children in
      sibling order and a running sum S_j = p(c_1) + ... + p(c_j); child j is accepted iff
      p(c_j) > 0 and (u < S_j / t_a or p(c_j) >= t_s); a rejected child is removed from p;
      all rejected: a sample of p without them; at a leaf the bonus p. Written as the
      conditional gate given the earlier rejections (independent uniforms, same law):
      g_j = 1 if p(c_j) >= t_s, else (min(1, S_j/t_a) - min(1, S_{j-1}/t_a)) /
      (1 - min(1, S_{j-1}/t_a)).
    - (t_s, t_a) = (1, 1), upstream's default (preset 'default'), is lossless: g_j =
      p(c_j) / (1 - S_{j-1}), EAGLE's rule (§2.2).
    """

    t_s: float = 1.0
    t_a: float = 1.0

    name = 'sglang'
    tree_modes = ('deterministic',)
    section = '§3.7'
    presets = {'default': {'t_s': 1.0, 't_a': 1.0}}

    def __post_init__(self):
        for field in ('t_s', 't_a'):
            value = base.check_range('sglang', field, getattr(self, field), 0.0, 1.0,
                                     lo_open=False, hi_open=False)  # fmt: skip
            base.set_field(self, field, value)

    @property
    def lossless(self) -> bool:
        """(t_s, t_a) = (1, 1). Host-side: raises TypeError on traced thresholds."""
        return base.host_equal('sglang', 'lossless', 't_s', self.t_s, 1.0) and base.host_equal(
            'sglang', 'lossless', 't_a', self.t_a, 1.0
        )

    def _t_acc(self):
        return jnp.maximum(self.t_a, ACC_FLOOR)

    def accept_from(self, px, qx, x, stats):
        a = jnp.where(px >= self.t_s, 1.0, jnp.minimum(1.0, px / self._t_acc()))
        return jnp.where(px > 0, a, 0.0).astype(px.dtype)

    def replacement(self, p, q):
        return _leave_one_out(p, q, self.accept_all(p, q))

    def tree_gate(self, pc, c, state):
        t_acc = self._t_acc()
        before = jnp.clip(1.0 - state.mass, 0.0, 1.0)  # S_{j-1}: p of the rejected siblings.
        lo = jnp.minimum(1.0, before / t_acc)
        hi = jnp.minimum(1.0, (before + pc) / t_acc)
        g = jnp.where(lo < 1.0, (hi - lo) / jnp.maximum(1.0 - lo, 1e-30), 1.0)
        g = jnp.where(pc >= self.t_s, 1.0, jnp.clip(g, 0.0, 1.0))
        return jnp.where(pc > 0, g, 0.0)


@registry.register
@dataclasses.dataclass(frozen=True)
class OneHotQ(base.Rule):
    """One-hot-q verification (vLLM's drafts without probabilities), docs/laws.md §2.4.

    vLLM's rejection sampler with no draft probabilities (n-gram and argmax drafts) takes
    q(x) = 1 for the drafted x; the acceptance does not read q (only the averaged replacement
    does).

    - a(x) = p(x).
    - Replacement: p with the rejected x removed, renormalised (upstream); here its average
      over the rejected x (`_leave_one_out`), the same law at the position.
    - Bonus: p.
    - Law: pi = p for ANY draft law q: pi(v) = q(v) p(v) + sum_{x != v} q(x) (1 - p(x))
      p(v) / (1 - p(x)) = p(v) (q(v) + 1 - q(v)). Lossless; acceptance sum_x q(x) p(x),
      below 1 - TV(p, q) unless q is a point mass.
    - Tree (deterministic siblings): EAGLE's walk (§2.2), g_j = P_{j-1}(c_j); law p.
    """

    name = 'onehot_q'
    lossless = True
    tree_modes = ('deterministic',)
    section = '§2.4'

    def accept_from(self, px, qx, x, stats):
        return jnp.clip(px, 0.0, 1.0)

    def replacement(self, p, q):
        return _leave_one_out(p, q, jnp.clip(p, 0.0, 1.0))

    def induced(self, p, q):
        return p

    def tree_gate(self, pc, c, state):
        return jnp.clip(pc / jnp.maximum(state.mass, base.ZERO_MASS), 0.0, 1.0)
