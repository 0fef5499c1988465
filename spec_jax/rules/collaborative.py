"""Collaborative verification: lenience, CoS and the overshoot ablations (docs/laws.md §4)."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from spec_jax import sampling
from spec_jax.rules import base, registry


def _lossless_residual(p, q):
    """norm((p - q)_+), falling back to p when p == q."""
    return base.normalize_or(jnp.maximum(p - q, 0.0), p)


@registry.register
@dataclasses.dataclass(frozen=True)
class Lenience(base.Rule):
    """Lenience (Leviathan et al. 2023, App. A.5), docs/laws.md §4.1 (chain) and §4.2 (tree).

    Inputs: processed p and q (temperature only in the paper's lossy runs).

    - a(x) = min(1, p(x) / (l q(x))), l in (0, 1]; l = 1 is lossless.
    - Replacement: norm((p - q)_+), the *unscaled* lossless residual (Fast-HSD and Google).
    - Bonus: p.
    - Law (paper Eq. 7), with U = {q <= p}, M = {p < q < p/l}, S = {q >= p/l}:
        pi = D p + (1 - D) q on U,  q on M,  p/l on S,
      D = R / TV(p, q), R = 1 - sum_v min(q(v), p(v)/l). Hence pi <= p/l everywhere (the
      overshoot ceiling); acceptance rate sum_v min(q, p/l).
    - Tree (§4.2, deterministic siblings): g_j = min(1, P_{j-1}(c_j) / l), rejection zeroes
      the sibling and renormalises; all rejected: sample the residual; bonus p. Each emitted
      token keeps pi(c) <= p(c)/l.
    """

    l: float = 1.0

    name = 'lenience'
    tree_modes = ('deterministic',)
    section = '§4.1, §4.2'

    def __post_init__(self):
        base.set_field(
            self,
            'l',
            base.check_divisor('lenience', 'l', self.l),
        )

    @property
    def lossless(self) -> bool:
        """l = 1 is exactly speculative sampling. Host-side: raises TypeError on a traced l."""
        return base.host_equal('lenience', 'lossless', 'l', self.l, 1.0)

    def accept_from(self, px, qx, x, stats):
        # l q is floored at the smallest normal float32: flushed to 0 it made 0/0 where p = 0.
        ratio = px / jnp.maximum(self.l * jnp.where(qx > 0, qx, 1.0), base.TINY)
        return jnp.where(qx > 0, jnp.minimum(1.0, ratio), (px > 0).astype(px.dtype))

    def replacement(self, p, q):
        return _lossless_residual(p, q)

    def induced(self, p, q):
        tv = jnp.maximum(p - q, 0.0).sum(-1, keepdims=True)
        r = 1.0 - jnp.minimum(q, p / self.l).sum(-1, keepdims=True)
        delta = jnp.where(tv > base.ZERO_MASS, r / jnp.maximum(tv, base.ZERO_MASS), 1.0)
        under = delta * p + (1.0 - delta) * q
        return jnp.where(q <= p, under, jnp.where(q < p / self.l, q, p / self.l))

    def tree_gate(self, pc, c, state):
        return jnp.clip(pc / jnp.maximum(state.mass, base.ZERO_MASS) / self.l, 0.0, 1.0)


@registry.register
@dataclasses.dataclass(frozen=True)
class CoS(base.YieldRule):
    """CoS, collaborative decoding via speculation (Fu et al. 2025), docs/laws.md §4.3.

    Follows the Fast-HSD experiment code: `lam` is the weight on the DRAFT.

    - Mixture r = lam q + (1 - lam) p; a(x) = min(1, r(x)/q(x)) = min(1, lam + (1-lam) p/q).
      Yield y = min(q, r).
    - Replacement: norm((r - q)_+) = norm((p - q)_+), the lossless residual.
    - Bonus: p (the pure target, not r).
    - Law: pi = r = lam q + (1 - lam) p at drafted positions. No overshoot control:
      pi/p = (1 - lam) + lam q/p is unbounded as p -> 0. Acceptance 1 - (1 - lam) TV(p, q).
    - lam = 0 is lossless, lam = 1 accepts everything.
    """

    lam: float = 0.0

    name = 'cos'
    section = '§4.3'

    def __post_init__(self):
        base.set_field(
            self,
            'lam',
            base.check_range('cos', 'lam', self.lam, 0.0, 1.0, lo_open=False, hi_open=False),
        )

    @property
    def lossless(self) -> bool:
        """lam = 0 is exactly speculative sampling. Host-side: raises TypeError on a traced lam."""
        return base.host_equal('cos', 'lossless', 'lam', self.lam, 0.0)

    def yield_from(self, px, qx, x, stats):
        return jnp.minimum(qx, self.lam * qx + (1.0 - self.lam) * px)

    def induced(self, p, q):
        return self.lam * q + (1.0 - self.lam) * p


@registry.register
@dataclasses.dataclass(frozen=True)
class OvershootOnly(base.YieldRule):
    """Overshoot capping only (Fast-HSD disabled variant), docs/laws.md §4.5.

    - Yield y = min(q, p/l): a(x) = min(1, p(x) / (l q(x))).
    - Replacement: norm((p - y)_+), falling back to p. Bonus: p.
    - Law: pi = y + (1 - sum y) norm((p - y)_+), which is lenience's law (Eq. 7). Proof:
      the acceptance is lenience's, and the residuals agree because
      (p - min(q, p/l))_+ = (p - q)_+ pointwise: where q <= p, min(q, p/l) = q (as q <= p
      <= p/l); where q > p, min(q, p/l) >= p (both terms are >= p), so both sides are 0.
      Equal acceptance and equal residual give equal laws; `tests/rules` checks it.
    """

    l: float = 1.0

    name = 'overshoot_only'
    section = '§4.5'

    def __post_init__(self):
        base.set_field(
            self,
            'l',
            base.check_divisor('overshoot_only', 'l', self.l),
        )

    def yield_from(self, px, qx, x, stats):
        return jnp.minimum(qx, px / self.l)


@registry.register
@dataclasses.dataclass(frozen=True)
class OvershootTail(base.YieldRule):
    """Overshoot capping with tail truncation (Fast-HSD disabled variant), docs/laws.md §4.5.

    Inputs: processed p, q; the tail set is min-p on p with ratio `rho` (the patch used 0.5).

    - Yield y = min(q, p/l) 1[x in A], A = {v : p(v) >= rho max p}:
      a(x) = min(1, p/(l q)) inside A, 0 in the tail.
    - Replacement: norm((p - y)_+) (falls back to p): inside A the lossless residual, in the
      tail the full p(x), so the tail is only reached through rejections.
    - Bonus: p.
    - Law: pi = y + (1 - sum y) norm((p - y)_+).
    """

    l: float = 1.0
    rho: float = 0.5

    name = 'overshoot_tail'
    section = '§4.5'

    def __post_init__(self):
        base.set_field(
            self,
            'l',
            base.check_divisor('overshoot_tail', 'l', self.l),
        )
        base.set_field(
            self,
            'rho',
            base.check_range(
                'overshoot_tail', 'rho', self.rho, 0.0, 1.0, lo_open=False, hi_open=False
            ),
        )

    def stats(self, p, q):
        return sampling.min_p_threshold(p, self.rho)

    def yield_from(self, px, qx, x, stats):
        return jnp.where(px >= stats, jnp.minimum(qx, px / self.l), 0.0)


@registry.register
@dataclasses.dataclass(frozen=True)
class UniformInterp(base.Rule):
    """Uniform interpolation without an overshoot ceiling (contrast to docs/laws.md §4.1, §4.5).

    Definition. With U = {q <= p} (draft under-estimates), O = {q > p} (overshoot),
    TV = sum_v (p - q)_+ and q(O) = sum_{v in O} q(v), the rule targets

        pi(x) = (1 - w) p(x) + w q(x)   on U    (a fixed-weight mix of p and q)
        pi(x) = kappa q(x)              on O    (the draft's own shape: no ceiling)
        kappa = 1 - (1 - w) TV / q(O)           (kappa = 1 when q(O) = 0)

    Lenience has the same U-form with a data-dependent weight and caps O at p/l; here the
    weight is fixed and overshoot tokens keep probability kappa q(x) however small p(x) is,
    so pi/p is unbounded (kappa >= w). w is the weight on the draft: w = 1 accepts
    everything; w = 0 gives p on U but a q-shaped law on O (not lossless).

    - a(x) = 1 on U, kappa on O (uniform acceptance of overshoot tokens).
    - Replacement: norm((p - q)_+), the lossless residual (rejection mass (1 - w) TV).
    - Bonus: p.
    - Law: pi above. Mass check: sum_U pi = q(U) + (1 - w) TV and kappa q(O) =
      q(O) - (1 - w) TV.
    """

    w: float = 0.5

    name = 'uniform_interp'
    stats_need_q = True
    section = '§4.5 (contrast)'

    def __post_init__(self):
        base.set_field(
            self,
            'w',
            base.check_range('uniform_interp', 'w', self.w, 0.0, 1.0, lo_open=False, hi_open=False),
        )

    def stats(self, p, q):
        tv = jnp.maximum(p - q, 0.0).sum(-1)
        q_over = jnp.where(q > p, q, 0.0).sum(-1)
        kappa = 1.0 - (1.0 - self.w) * tv / jnp.maximum(q_over, 1e-30)
        return jnp.where(q_over > 0, jnp.clip(kappa, 0.0, 1.0), 1.0)

    def accept_from(self, px, qx, x, stats):
        return jnp.where(qx <= px, 1.0, stats)

    def replacement(self, p, q):
        return _lossless_residual(p, q)

    def induced(self, p, q):
        kappa = self.stats(p, q)[..., None]
        return jnp.where(q <= p, (1.0 - self.w) * p + self.w * q, kappa * q)
