"""Grouped-query attention on rows: one row R per (batch row, KV head), R = B * K.

Every attention product here is a plain batched matmul over R:

    scores [R, Q, S] = q [R, Q, H] . keys [R, S, H]     Q = T * G queries of one KV head
    out    [R, Q, H] = probs [R, Q, S] . values [R, S, H]

The KV cache is stored in the same [R, S, H] layout (spec_jax.models.cache), so a decode
step reads it exactly as it was written. That is what keeps XLA:CPU from copying it: with
a [B, K, S, H] cache and B = 1, the size-1 axis sits between the cache update and the
matmul, and XLA duplicated the update into both of its users, copying each layer's keys
and values four times per step (measured: 5 of 45 ms per decode step of the embedded
default at S = 192, growing with S). A single row (B = 1 and K = 1: multi-query attention)
brings the size-1 axis and the copies back; every supported family has K >= 2. Query-row
order also lets XLA read the weights in place: the earlier [B, K, G, T, S] scores made it
re-layout the [N, H, D] output weights every step.

Row r holds batch row r // K and KV head r % K (batch-major); query q of a row is new token
q // G and query head (r % K) * G + q % G.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp


def to_rows(x_btkh: jax.Array) -> jax.Array:
    """Keys or values [B, T, K, H] -> [R, T, H]."""
    b, t, k, h = x_btkh.shape
    return x_btkh.transpose(0, 2, 1, 3).reshape(b * k, t, h)


def query_rows(q_btnh: jax.Array, num_kv_heads: int) -> jax.Array:
    """Queries [B, T, N, H] -> [R, Q, H] (N = K * G, Q = T * G)."""
    b, t, n, h = q_btnh.shape
    k, g = num_kv_heads, n // num_kv_heads
    return q_btnh.reshape(b, t, k, g, h).transpose(0, 2, 1, 3, 4).reshape(b * k, t * g, h)


def from_query_rows(out_rqh: jax.Array, batch: int, num_new: int) -> jax.Array:
    """Attention outputs [R, Q, H] -> [B, T, N * H], heads in the projection's order."""
    r, q, h = out_rqh.shape
    k, g = r // batch, q // num_new
    out_bktgh = out_rqh.reshape(batch, k, num_new, g, h)
    return out_bktgh.transpose(0, 2, 1, 3, 4).reshape(batch, num_new, k * g * h)


def _mask_scores(scores_rqs: jax.Array, mask_bts: jax.Array) -> jax.Array:
    """Hides key s from every query of new token t where mask_bts[b, t, s] is False."""
    b, t, s = mask_bts.shape
    r, q = scores_rqs.shape[:2]
    scores_bktgs = scores_rqs.reshape(b, r // b, t, q // t, s)
    masked = jnp.where(mask_bts[:, None, :, None], scores_bktgs, jnp.finfo(jnp.float32).min)
    return masked.reshape(r, q, s)


def attend(
    q_rqh: jax.Array,
    keys_rsh: jax.Array,
    values_rsh: jax.Array,
    mask_bts: jax.Array,
    diagonal: Sequence[tuple[jax.Array, jax.Array]] = (),
) -> jax.Array:
    """Softmax attention of query rows over key rows.

    Args:
      q_rqh: queries [R, Q, H] (`query_rows`).
      keys_rsh, values_rsh: [R, S, H].
      mask_bts: [B, T, S], True where new token t may see key s.
      diagonal: extra (keys [R, T, H], values [R, T, H]) blocks; new token t sees only
        entry t of each (the EAGLE-3 training-time test's earlier steps, docs/eagle3.md §5).
        One softmax runs over the S keys and these together.

    Returns:
      [R, Q, H] in the queries' dtype.
    """
    r, q, h = q_rqh.shape
    t = mask_bts.shape[1]
    scale = h**-0.5
    scores_rqs = jnp.einsum('rqh,rsh->rqs', q_rqh, keys_rsh).astype(jnp.float32) * scale
    scores = [_mask_scores(scores_rqs, mask_bts)]
    q_rtgh = q_rqh.reshape(r, t, q // t, h)
    for keys_rth, _ in diagonal:
        diag_rtg = jnp.einsum('rtgh,rth->rtg', q_rtgh, keys_rth).astype(jnp.float32)
        scores.append(diag_rtg.reshape(r, q, 1) * scale)
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(q_rqh.dtype)
    s = keys_rsh.shape[1]
    out_rqh = jnp.einsum('rqs,rsh->rqh', probs[..., :s], values_rsh)
    for i, (_, values_rth) in enumerate(diagonal):
        probs_rtg = probs[..., s + i].reshape(r, t, q // t)
        out_rqh += jnp.einsum('rtg,rth->rtgh', probs_rtg, values_rth).reshape(r, q, h)
    return out_rqh
