"""Four upstream verifier law bugs, each reproduced as a small chain verifier on the audit's
contract (`spec_jax.rules.audit.Verify`), and one correct control; docs/laws.md §9 shows the
audit flagging each (tests/rules/test_audit.py). Sources (read, not copied): SGLang #35771,
TensorRT-LLM #15098, transformers #47932, EAGLE #329.

Each is token-level speculative sampling, accept on u < a(x) with u in [0, 1), keep the
leading run, then draw the replacement at the first rejection or the bonus p_A, with one
mistake:

  sglang_35771   accepts on u <= p/q: at u = 0 a draft with p(x) = 0 is accepted (SGLang's
                 target-only sampler, coins from torch.rand in [0, 1)).
  trtllm_15098   reads the target row of the next node: position i is verified, and its
                 residual drawn, against p_{i+1} (the dynamic tree's logits sliced one row
                 off).
  hf_47932       verifies against the draft's law before its top-k (the q the candidate
                 generator returned), not the truncated law the draft was drawn from: here
                 q_raw = Z q on q's support and (1 - Z) spread over the rest, Z = 0.6 (the
                 issue measured Z from 0.48 (p05) to 0.99, TV up to 0.31).
  eagle_329      the T > 0 path ignores q: accepts with p(x) (q(x) taken as 1) and redraws
                 from p itself on rejection. EAGLE's own code redraws from p with x zeroed
                 and renormalised, which is exact for any proposal (P(v) = q(v) p(v) +
                 sum_{x != v} q(x) (1 - p(x)) p(v) / (1 - p(x)) = p(v)): `eagle_zeroed`, the
                 control the audit passes.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

from spec_jax import categorical
from spec_jax.rules import base, contract

Array = jax.Array


def _ratio(px: Array, qx: Array) -> Array:
    """min(1, p(x)/q(x)); 1[p(x) > 0] where q(x) = 0."""
    return jnp.where(qx > 0, jnp.clip(px / jnp.where(qx > 0, qx, 1.0), 0.0, 1.0),
                     (px > 0).astype(px.dtype))  # fmt: skip


def _residual(p: Array, q: Array) -> Array:
    return base.normalize_or(jnp.maximum(p - q, 0.0), p)


def token_chain(
    accept: Callable[[Array, Array, Array], Array],
    residual: Callable[[Array, Array, Array], Array],
    *,
    inclusive: bool = False,
    rows: Callable[[Array], Array] | None = None,
):
    """A chain verifier on the audit's contract from its parts.

    Args:
      accept: (p_i [B, A, V], q [B, A, V], x [B, A]) -> a [B, A].
      residual: (p_n [B, V], q_n [B, V], x_n [B]) -> the law [B, V] drawn at a rejection.
      inclusive: accept on u <= a (a bug at u = 0) instead of u < a.
      rows: p [B, A+1, V] -> the target rows [B, A, V] the drafted positions are verified
        against (default: p_0..p_{A-1}).
    """

    def verify(key, p, q, x, u):
        a = x.shape[1]
        p_used = p[:, :a] if rows is None else rows(p)
        prob = accept(p_used, q, x)
        ok = u <= prob if inclusive else u < prob
        n = contract.leading_run(ok)
        repl = residual(contract.row_at(p_used, n), contract.row_at(q, n), contract.row_at(x, n))
        dist = jnp.where((n < a)[:, None], repl, p[:, a])
        final = categorical.sample(key, dist)
        pos = jnp.arange(a + 1)[None, :]
        x_pad = jnp.concatenate([x, jnp.zeros_like(x[:, :1])], 1)
        tokens = jnp.where(pos < n[:, None], x_pad, jnp.where(pos == n[:, None], final[:, None], 0))
        return tokens.astype(jnp.int32), n

    return verify


def _sd_accept(p, q, x):
    return _ratio(base.gather(p, x), base.gather(q, x))


def _sd_residual(p, q, x):
    del x
    return _residual(p, q)


def correct():
    """Speculative sampling done right (u < min(1, p/q), norm((p - q)_+), bonus p_A)."""
    return token_chain(_sd_accept, _sd_residual)


def sglang_35771():
    """SGLang #35771: the inclusive test u <= p/q accepts a p(x) = 0 draft at u = 0."""
    return token_chain(_sd_accept, _sd_residual, inclusive=True)


def trtllm_15098():
    """TensorRT-LLM #15098: drafted position i verified against the next row p_{i+1}."""
    return token_chain(_sd_accept, _sd_residual, rows=lambda p: p[:, 1:])


def raw_before_topk(q: Array, z: float) -> Array:
    """The draft's law before a top-k that kept mass z: z q on q's support, 1 - z spread
    evenly over the tokens q has cut (over every token when q cuts none)."""
    cut = q <= 0
    count = cut.sum(-1, keepdims=True)
    spread = jnp.where(count > 0, cut / jnp.maximum(count, 1), 1.0 / q.shape[-1])
    return z * q + (1.0 - z) * spread


def hf_47932(z: float = 0.6):
    """transformers #47932: verified against the q before top-k, not the one sampled."""

    def accept(p, q, x):
        return _sd_accept(p, raw_before_topk(q, z), x)

    def residual(p, q, x):
        del x
        return _residual(p, raw_before_topk(q, z))

    return token_chain(accept, residual)


def _p_only(p, q, x):
    del q
    return base.gather(p, x)


def eagle_329():
    """EAGLE #329: accept with p(x) (q ignored), redraw from p on rejection."""

    def residual(p, q, x):
        del q, x
        return p

    return token_chain(_p_only, residual)


def eagle_zeroed():
    """EAGLE's deterministic-sibling rule in a chain: accept with p(x), redraw from p with x
    zeroed. Exact for any q (module docstring): the audit's control."""

    def residual(p, q, x):
        del q
        zeroed = jnp.where(base.vocab_index(p) == x[:, None], 0.0, p)
        return base.normalize_or(zeroed, p)

    return token_chain(_p_only, residual)


BUGS = {
    'sglang_35771': sglang_35771,
    'trtllm_15098': trtllm_15098,
    'hf_47932': hf_47932,
    'eagle_329': eagle_329,
}
