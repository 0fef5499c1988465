"""The overshoot ablation as single factors (docs/laws.md §4.7).

Lenience (§4.1) and `uniform_interp` (§4.5) differ in two things. Both accept every token of
U = {q <= p}, reject mass R on the overshoot set O = {q > p} and emit the lossless residual
norm((p - q)_+) on rejection, so pi = D p + (1 - D) q on U with D = R / TV(p, q):

  - the weight: lenience's D is adaptive (R = 1 - sum min(q, p/l) is set by the ceiling),
    uniform_interp's is fixed (D = 1 - w);
  - the overshoot set: lenience caps it (pi = min(q, p/l), the ceiling), uniform_interp
    keeps q's shape there (pi = kappa q, no ceiling).

The two rules here change one factor each:

  rule                 weight on U                    overshoot set O
  lenience (l)         adaptive D_l = R_l / TV        ceiling min(q, p/l)
  lenience_flat (l)    adaptive D_l (lenience's)      flat kappa_l q, no ceiling
  interp_ceiling (w)   fixed 1 - w                    ceiling min(q, c p), c solved per row
  uniform_interp (w)   fixed 1 - w                    flat kappa_w q, no ceiling

lenience(l) and lenience_flat(l) reject the same mass R_l (same acceptance rate);
interp_ceiling(w) and uniform_interp(w) reject the same (1 - w) TV.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from spec_jax.rules import base, registry

# Sort key of an overshoot token with p = 0 (no ceiling c p reaches it): above every ratio.
_NO_CEILING = 3e38


def _lossless_residual(p, q):
    """norm((p - q)_+), falling back to p when p == q."""
    return base.normalize_or(jnp.maximum(p - q, 0.0), p)


def ceiling_multiple(p, q, w):
    """The c >= 1 with sum_O (q - c p)_+ = (1 - w) TV(p, q), per row: [..., V] -> [...].

    g(c) = sum over O = {q > p} of (q - c p)_+ decreases from TV (c = 1) to
    Z0 = q({q > 0 = p}) (c -> inf): tokens with p = 0 are never reached by c p. With the
    ratios r = q/p of O sorted in descending order and Q_j, P_j the cumulative q and p,
    g(r_(j)) = Q_j - r_(j) P_j increases with j, and on the segment [r_(j+1), r_(j)]
    g(c) = Q_j - c P_j, so c = (Q_j - T) / P_j for the last j with g(r_(j)) <= T,
    T = (1 - w) TV. Where T >= TV (w = 0, or no overshoot) c = 1; where T < Z0 no finite c
    reaches T: c = inf (every O token with p > 0 accepted, rejection Z0 > T).
    """
    over = q > p
    ratio = jnp.where(over, jnp.where(p > 0, q / jnp.where(p > 0, p, 1.0), _NO_CEILING), 1.0)
    order = jnp.argsort(-ratio, axis=-1)
    r = jnp.take_along_axis(ratio, order, -1)
    q_sorted = jnp.take_along_axis(jnp.where(over, q, 0.0), order, -1)
    p_sorted = jnp.take_along_axis(jnp.where(over, p, 0.0), order, -1)
    cq, cp = jnp.cumsum(q_sorted, -1), jnp.cumsum(p_sorted, -1)
    g_at = cq - jnp.where(cp > 0, r * cp, 0.0)
    target = (1.0 - w) * jnp.maximum(p - q, 0.0).sum(-1)
    j = jnp.sum(g_at <= target[..., None], -1)  # >= 1 unless T < Z0's first token.
    idx = jnp.maximum(j - 1, 0)[..., None]
    qj = jnp.take_along_axis(cq, idx, -1)[..., 0]
    pj = jnp.take_along_axis(cp, idx, -1)[..., 0]
    c = jnp.where((j > 0) & (pj > 0), (qj - target) / jnp.maximum(pj, 1e-30), jnp.inf)
    # T >= TV (w = 0, or no overshoot): c = 1, lossless SD's acceptance exactly.
    return jnp.where(target >= jnp.maximum(p - q, 0.0).sum(-1), 1.0, jnp.maximum(c, 1.0))


@registry.register
@dataclasses.dataclass(frozen=True)
class InterpCeiling(base.Rule):
    """uniform_interp's fixed weight with lenience's ceiling, docs/laws.md §4.7.

    With O = {q > p}, TV = TV(p, q) and c >= 1 the row's ceiling multiple solving
    sum_O (q - c p)_+ = (1 - w) TV (`ceiling_multiple`; c plays lenience's 1/l, set per row
    so that the weight is fixed):

    - a(x) = 1 on U = {q <= p}; on O, min(1, c p(x)/q(x)) (0 where p(x) = 0).
    - Replacement: norm((p - q)_+), the lossless residual (rejection mass (1 - w) TV).
    - Bonus: p.
    - Law: pi = (1 - w) p + w q on U (uniform_interp's), min(q, c p) on O (lenience's shape,
      pi/p <= c). w = 0 is lossless (c = 1), w = 1 accepts everything. Where the draft puts
      more than (1 - w) TV on tokens with p = 0, no ceiling reaches it: c = inf, those are
      rejected and D = q(p = 0) / TV exceeds 1 - w.
    """

    w: float = 0.5

    name = 'interp_ceiling'
    stats_need_q = True
    section = '§4.7'

    def __post_init__(self):
        base.set_field(
            self,
            'w',
            base.check_range('interp_ceiling', 'w', self.w, 0.0, 1.0, lo_open=False,
                             hi_open=False),  # fmt: skip
        )

    @property
    def lossless(self) -> bool:
        """w = 0 is speculative sampling. Host-side: raises TypeError on a traced w."""
        return base.host_equal('interp_ceiling', 'lossless', 'w', self.w, 0.0)

    def stats(self, p, q):
        return ceiling_multiple(p, q, self.w)

    def accept_from(self, px, qx, x, stats):
        capped = jnp.minimum(1.0, stats * px / jnp.where(qx > 0, qx, 1.0))
        over = jnp.where(px > 0, capped, 0.0)
        return jnp.where(qx <= px, 1.0, over).astype(px.dtype)

    def replacement(self, p, q):
        return _lossless_residual(p, q)


@registry.register
@dataclasses.dataclass(frozen=True)
class LenienceFlat(base.Rule):
    """Lenience's adaptive weight without its ceiling, docs/laws.md §4.7.

    With O = {q > p}, R_l = 1 - sum_v min(q(v), p(v)/l) (lenience's rejection mass) and
    kappa = 1 - R_l / q(O) (1 when q(O) = 0; kappa >= 1 - TV/q(O) >= 0 since R_l <= TV):

    - a(x) = 1 on U = {q <= p}; kappa on O (the same for every overshoot token).
    - Replacement: norm((p - q)_+), the lossless residual (rejection mass R_l).
    - Bonus: p.
    - Law: pi = D p + (1 - D) q on U with D = R_l / TV (lenience's), kappa q on O (no
      ceiling: pi/p is unbounded as p -> 0). Same acceptance rate 1 - R_l as lenience(l).
      Not lossless for any l: at l = 1, pi = p on U and (p(O)/q(O)) q on O.
    """

    l: float = 0.5

    name = 'lenience_flat'
    stats_need_q = True
    section = '§4.7'

    def __post_init__(self):
        base.set_field(
            self,
            'l',
            base.check_divisor('lenience_flat', 'l', self.l),
        )

    def stats(self, p, q):
        rejected = jnp.maximum(q - p / self.l, 0.0).sum(-1)
        q_over = jnp.where(q > p, q, 0.0).sum(-1)
        kappa = 1.0 - rejected / jnp.maximum(q_over, 1e-30)
        return jnp.where(q_over > 0, jnp.clip(kappa, 0.0, 1.0), 1.0)

    def accept_from(self, px, qx, x, stats):
        return jnp.where(qx <= px, 1.0, stats).astype(px.dtype)

    def replacement(self, p, q):
        return _lossless_residual(p, q)
