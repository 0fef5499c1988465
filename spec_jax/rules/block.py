"""Rules whose accepted length is not the leading run of per-position accepts: block
verification and FLy (docs/laws.md §7.4-§7.5).

Both set `block_level`: `verify_chain` draws the A uniforms and hands the whole block to
`accept_block`, which returns the kept length and the law of the token after it.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from spec_jax import categorical
from spec_jax.rules import base, contract, registry

Array = jax.Array


def _ratio_accept(px: Array, qx: Array) -> Array:
    """min(1, p(x)/q(x)); 1[p(x) > 0] where q(x) = 0 (a draw the draft cannot make)."""
    return jnp.where(
        qx > 0, jnp.clip(px / jnp.where(qx > 0, qx, 1.0), 0.0, 1.0), (px > 0).astype(px.dtype)
    )


def _residual(p: Array, q: Array) -> Array:
    return base.normalize_or(jnp.maximum(p - q, 0.0), p)


@registry.register
@dataclasses.dataclass(frozen=True)
class BlockVerify(base.Rule):
    """Block verification (Sun et al. 2024, arXiv 2403.10444; vLLM
    `rejection_sample_method="block"`), docs/laws.md §7.4. Lossless.

    With P_0 = 1 and P_i = min(1, P_{i-1} p_i(x_i) / q_i(x_i)) the capped joint ratio of the
    drafted prefix, the residual mass r_i = sum_y (P_i p_{i+1}(y) - q_{i+1}(y))_+ and the
    thresholds h_i = r_i / (r_i + 1 - P_i) (i < A; 1 where the denominator is 0), h_A = P_A:

    - The block test (in place of a(x)): tau = the largest i with u_i <= h_i (0 if none),
      not the first failure; the drafts x_1..x_tau are kept.
    - Replacement (tau < A): a sample of norm((P_tau p_{tau+1} - q_{tau+1})_+), falling back
      to p_{tau+1}.
    - Bonus (tau = A): p.
    - Law: the emitted sequence has the target's law, so each token's law given its prefix is
      p (what the meter records). With A = 1 it is token-level speculative sampling:
      a(x) = min(1, p(x)/q(x)).
    """

    name = 'block_verify'
    lossless = True
    block_level = True
    section = '§7.4'

    def thresholds(self, p: Array, q: Array, x: Array) -> tuple[Array, Array]:
        """(P [B, A], h [B, A]): the capped joint ratios P_1..P_A and thresholds h_1..h_A."""
        a = x.shape[1]
        px, qx = base.gather(p[:, :a], x), base.gather(q, x)
        ratio = jnp.where(qx > 0, px / jnp.where(qx > 0, qx, 1.0), jnp.where(px > 0, jnp.inf, 0.0))
        cols, prev = [], jnp.ones(x.shape[:1], p.dtype)
        for i in range(a):
            prev = jnp.where(prev > 0, jnp.minimum(1.0, prev * ratio[:, i]), 0.0)  # 0 * inf
            cols.append(prev)
        big_p = jnp.stack(cols, 1)  # [B, A]
        if a > 1:
            r = jnp.maximum(big_p[:, :-1, None] * p[:, 1:a] - q[:, 1:], 0.0).sum(-1)  # [B, A-1]
            denom = r + 1.0 - big_p[:, :-1]
            h_head = jnp.where(denom > 0, r / jnp.where(denom > 0, denom, 1.0), 1.0)
            h = jnp.concatenate([h_head, big_p[:, -1:]], 1)
        else:
            h = big_p
        return big_p, h

    def accept_block(self, u, p, q, x, raw):
        a = x.shape[1]
        big_p, h = self.thresholds(p, q, x)
        pos = jnp.arange(1, a + 1)[None, :]
        tau = jnp.max(jnp.where(u <= h, pos, 0), axis=1).astype(jnp.int32)
        p_tau = jnp.where(tau > 0, contract.row_at(big_p, tau - 1), 1.0)[:, None]
        p_next, q_next = contract.row_at(p, tau), contract.row_at(q, tau)
        repl = base.normalize_or(jnp.maximum(p_tau * p_next - q_next, 0.0), p_next)
        return contract.block_from(tau, a, repl, p[:, a], h)

    def round_law(self, p, q, x, raw):
        return p

    def accept_from(self, px, qx, x, stats):
        return _ratio_accept(px, qx)

    def replacement(self, p, q):
        return _residual(p, q)

    def induced(self, p, q):
        return p


def topk_entropy(logits: Array, k: int) -> Array:
    """-sum over the k largest T = 1 probabilities of p ln p (not renormalised), [..., V] -> [...]
    (FLy's `calculate_topk_entropy`)."""
    logp = jax.nn.log_softmax(jnp.asarray(logits, jnp.float32), axis=-1)
    top = categorical.top_k(logp, min(k, logp.shape[-1]))[0]
    return -jnp.sum(jnp.exp(top) * top, -1)


@registry.register
@dataclasses.dataclass(frozen=True)
class FLy(base.Rule):
    """FLy, training-free loosely speculative decoding (Li et al., arXiv 2511.22972;
    AMD-AGI/FLy), docs/laws.md §7.5.

    Native test at each drafted position i (1-indexed): accept on u_i <= min(1, p(x_i)/q(x_i))
    (speculative sampling; at T = 0 it is FLy's exact match with the target argmax). A
    natively rejected x_i is accepted anyway (deferred window) when

      H_i >= theta (H the top-`entropy_k` entropy of the T = 1 target, not renormalised),
      i + W < A with i 0-indexed and W = `window` (the last W positions never are),
      the next W - 1 drafts are natively accepted with the same uniforms (FLy's window
      pattern: rejected, then W - 1 accepted), and p(x_i) > 0, q(x_i) > 0.

    - The block test (in place of a(x)): keep the leading run of native-or-window accepts.
    - Replacement: the native residual norm((p - q)_+). Bonus: p.
    - Law: block-level (position i's depends on the drafts after it). Metered with the
      plug-in law of §7.5 (the realized window's native acceptance probabilities), not
      exactly. theta = inf switches the window off: lossless SD.
    """

    theta: float = 0.3
    window: int = 6
    entropy_k: int = 3

    name = 'fly'
    static_fields = ('window', 'entropy_k')
    needs_logits = True
    block_level = True
    section = '§7.5'

    def __post_init__(self):
        base.set_field(
            self,
            'theta',
            base.check_range('fly', 'theta', self.theta, 0.0, math.inf, lo_open=False,
                             hi_open=False),  # fmt: skip
        )
        for field in ('window', 'entropy_k'):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'fly: {field}={value!r} must be an integer >= 1')

    @property
    def lossless(self) -> bool:
        return base.host_equal(self.name, 'lossless', 'theta', self.theta, math.inf)

    def gate(self, raw: contract.Raw, a: int) -> Array:
        """[B, A] bool: entropy at least theta and room for the window (i + W < A)."""
        h = topk_entropy(raw.target_logits[:, :a], self.entropy_k)
        room = (jnp.arange(a) + self.window < a)[None, :]
        return (h >= self.theta) & room

    def window_after(self, v: Array, reduce) -> Array:
        """reduce over v[:, i+1 .. i+W-1] for each i, [B, A] (1 = neutral past the end)."""
        a = v.shape[1]
        out = jnp.ones_like(v)
        for s in range(1, self.window):
            shifted = jnp.concatenate([v[:, s:], jnp.ones_like(v[:, :s])], axis=1)[:, :a]
            out = reduce(out, shifted)
        return out

    def accept_block(self, u, p, q, x, raw):
        a = x.shape[1]
        px, qx = base.gather(p[:, :a], x), base.gather(q, x)
        native_prob = _ratio_accept(px, qx)
        native = u <= native_prob
        follow = self.window_after(native.astype(jnp.float32), jnp.minimum) > 0
        fly = ~native & self.gate(raw, a) & follow & (px > 0) & (qx > 0)
        n = contract.leading_run(native | fly)
        p_n, q_n = contract.row_at(p, n), contract.row_at(q, n)
        return contract.block_from(n, a, _residual(p_n, q_n), p[:, a], native_prob)

    def law_with(self, p: Array, q: Array, f: Array) -> Array:
        """pi [..., V] = min(p, q) + (q - min(p, q)) f 1[p > 0] + the rest on norm((p - q)_+),
        with f [...] the probability that a native rejection is window-accepted."""
        mn = jnp.minimum(p, q)
        fly = (q - mn) * jnp.where(p > 0, f[..., None], 0.0)
        rest = 1.0 - mn.sum(-1, keepdims=True) - fly.sum(-1, keepdims=True)
        return mn + fly + rest * _residual(p, q)

    def round_law(self, p, q, x, raw):
        """The plug-in law [B, A+1, V] (docs/laws.md §7.5), with the window factor of the
        realized drafts x [B, A]:
        f_i = 1[gate_i] prod_{s=1}^{W-1} a_{i+s}, a the native acceptance probabilities."""
        a = q.shape[1]
        native_prob = _ratio_accept(base.gather(p[:, :a], x), base.gather(q, x))
        f = self.gate(raw, a) * self.window_after(native_prob, jnp.multiply)
        return jnp.concatenate([self.law_with(p[:, :a], q, f), p[:, -1:]], 1)

    def accept_from(self, px, qx, x, stats):
        return _ratio_accept(px, qx)

    def replacement(self, p, q):
        return _residual(p, q)

    def induced(self, p, q):
        raise ValueError(
            "rule 'fly' has a block-level law: a position's depends on the drafts after it; "
            'see round_law and docs/laws.md §7.5'
        )
