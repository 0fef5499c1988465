"""Cactus, constrained acceptance speculative sampling (Hao and Mou, ICLR 2026, arXiv
2604.04987), docs/laws.md §8.3: a per-token bound delta on the divergence of the accepted
token's probability from the target's; delta 0 is lossless SD.

Its reference target h depends on the drafted token x, so the rejection residual does too:
the rule decides its block itself (`block_level`: the replacement at the first rejection
reads that rejected x), and its emitted law is a mixture over x, derived in closed form
in `induced` (O(V log V): two sorts, no [V, V] table).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from spec_jax.rules import base, contract, registry

Array = jax.Array


def raised(p: Array, delta) -> Array:
    """a = clip(p + sqrt(2 delta p (1 - p)), 0, 1), elementwise (p of the drafted token)."""
    return jnp.clip(p + jnp.sqrt(2.0 * delta * jnp.clip(p * (1.0 - p), 0.0, None)), 0.0, 1.0)


def _ratio(num: Array, den: Array) -> Array:
    """min(1, num / den) where den > 0, else 1[num > 0] (a draw the draft cannot make)."""
    return jnp.where(
        den > 0, jnp.clip(num / jnp.where(den > 0, den, 1.0), 0.0, 1.0), (num > 0).astype(num.dtype)
    )


def _scale(p: Array, a: Array) -> Array:
    """c = (1 - a)/(1 - p): h(y) = c p(y) off the drafted token; 0 where p = 1 (then a = 1)."""
    return jnp.where(p < 1.0, (1.0 - a) / jnp.where(p < 1.0, 1.0 - p, 1.0), 0.0)


def _sum_above(keys: Array, weights: Array, at: Array, strict_below: bool) -> Array:
    """sum of weights [W, V] whose key lies below `at` [V] (strict_below) or above it, per
    row: a sort of the keys, prefix sums and a search, O(V log V). Returns [W, V]."""
    order = jnp.argsort(keys)
    k = jnp.take_along_axis(keys, order, -1)
    w = jnp.take_along_axis(weights, order, -1)
    cum = jnp.concatenate([jnp.zeros_like(w[..., :1]), jnp.cumsum(w, -1)], -1)  # [W, V+1]
    side = 'left' if strict_below else 'right'
    idx = jax.vmap(lambda kr, ar: jnp.searchsorted(kr, ar, side=side))(k, at)
    below = jnp.take_along_axis(cum, idx, -1)
    return below if strict_below else cum[..., -1:] - below


@registry.register
@dataclasses.dataclass(frozen=True)
class Cactus(base.Rule):
    """Cactus (Hao and Mou, ICLR 2026, arXiv 2604.04987), docs/laws.md §8.3.

    Inputs: processed p and q; delta >= 0, a traced parameter (a leaf).

    - For the drafted x: a = p(x) + sqrt(2 delta p(x)(1 - p(x))) clipped to [0, 1], and the
      reference h_x(x) = a, h_x(y) = p(y)(1 - a)/(1 - p(x)) for y != x (a law: p raised at
      x, the rest scaled down).
    - a(x) = min(1, a / q(x)) (accept on u <= a(x), u in (0, 1]).
    - Replacement at a rejected x: a sample of norm((h_x - q)_+) (it depends on x: the rule
      is `block_level`, `accept_block` reads the rejected draft). `replacement(p, q)` is the
      law of that token given a rejection, averaged over the rejected x.
    - Bonus: p.
    - Law: the mixture over x ~ q, pi(v) = min(q(v), a_v) + sum_x (q(x) - a_x)_+ r_x(v),
      r_x = norm((h_x - q)_+); in closed form (docs/laws.md §8.3)
        pi(v) = min(q(v), a_v) + p(v) sum_x k_x (c_x - q(v)/p(v))_+,
      c_x = (1 - a_x)/(1 - p(x)), k_x = (q(x) - a_x)_+ / sum_y (c_x p(y) - q(y))_+.
      delta = 0: a = p(x), h_x = p, so pi = p (lossless SD, its own ratio and residual).
    - Matched baseline: plain lossless SD (no truncation set; §5).
    - Tree: none. h_x is built from one drafted token; after a sibling's rejection the
      next sibling would be verified against norm((h_x - q)_+) of the rejected one, a law
      the paper defines no bound for (the engine refuses a tree with this rule).
    """

    delta: float = 0.5

    name = 'cactus'
    block_level = True
    stats_need_q = True
    section = '§8.3'

    def __post_init__(self):
        base.set_field(
            self,
            'delta',
            base.check_range('cactus', 'delta', self.delta, 0.0, math.inf, lo_open=False,
                             hi_open=True),  # fmt: skip
        )

    @property
    def lossless(self) -> bool:
        """delta = 0. Host-side: TypeError on a traced parameter."""
        return base.host_equal(self.name, 'lossless', 'delta', self.delta, 0.0)

    # --- per-position pieces ---------------------------------------------------------------

    def accept_from(self, px, qx, x, stats):
        return _ratio(raised(px, self.delta), qx)

    def reference(self, p: Array, x: Array) -> Array:
        """h_x [..., V] for the drafted tokens x [...] of p [..., V]."""
        px = base.gather(p, x)
        a = raised(px, self.delta)
        at_x = base.vocab_index(p) == x[..., None]
        return jnp.where(at_x, a[..., None], p * _scale(px, a)[..., None])

    def residual_at(self, p: Array, q: Array, x: Array) -> Array:
        """norm((h_x - q)_+) [..., V], the law drawn from when x [...] is rejected (p where
        the mass is 0, which a rejection never meets: h_x(x) < q(x) leaves mass off x)."""
        return base.normalize_or(jnp.maximum(self.reference(p, x) - q, 0.0), p)

    def induced(self, p, q):
        """The mixture over the drafted x in closed form, [..., V] (docstring; §8.3)."""
        shape = p.shape
        p2, q2 = p.reshape(-1, shape[-1]), q.reshape(-1, shape[-1])
        a = raised(p2, self.delta)
        c = _scale(p2, a)
        w = jnp.maximum(q2 - a, 0.0)  # Mass drafted at x and rejected.
        rho = jnp.where(p2 > 0, q2 / jnp.where(p2 > 0, p2, 1.0), jnp.inf)
        # Z_x = sum_y (c_x p(y) - q(y))_+ = c_x P(rho < c_x) - Q(rho < c_x); > 0 where w_x > 0.
        z = c * _sum_above(rho, p2, c, True) - _sum_above(rho, q2, c, True)
        k = jnp.where(w > 0, w / jnp.maximum(z, 1e-30), 0.0)
        # G(rho_v) = sum_{c_x > rho_v} k_x (c_x - rho_v); the x = v term is 0 (c_v p(v) < q(v)).
        finite = jnp.where(p2 > 0, rho, 0.0)
        g = _sum_above(c, k * c, finite, False) - finite * _sum_above(c, k, finite, False)
        pi = jnp.minimum(q2, a) + jnp.where(p2 > 0, p2 * jnp.maximum(g, 0.0), 0.0)
        return pi.reshape(shape)

    def replacement(self, p, q):
        accepted = jnp.minimum(q, raised(p, self.delta))
        rest = self.induced(p, q) - accepted
        return base.normalize_or(jnp.maximum(rest, 0.0), p)

    # --- the block ---------------------------------------------------------------------------

    def accept_block(self, u, p, q, x, raw):
        a = x.shape[1]
        ratio = _ratio(raised(base.gather(p[:, :a], x), self.delta), base.gather(q, x))
        n = contract.leading_run(u <= ratio)
        xn = contract.row_at(x, n)  # The rejected draft (clipped where n = A: unused).
        repl = self.residual_at(contract.row_at(p, n), contract.row_at(q, n), xn)
        return contract.block_from(n, a, repl, p[:, a], ratio)
