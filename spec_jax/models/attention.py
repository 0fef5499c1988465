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

Row order (`Rows`): mesh blocks first. On a mesh whose 'data' axis splits the batch D
ways and whose 'model' axis splits the KV heads M ways, row

    r = ((d * M + m) * B/D + b') * K/M + k'     for batch row b = d * B/D + b',
                                                 KV head k = m * K/M + k'

so the R axis split over ('data', 'model') into D * M contiguous blocks gives device
(d, m) exactly the rows of its batch rows and its KV heads, whatever B/D and K/M are:
attention, the cache write and the cache itself stay on their device, with the heads
split (a batch-major order, b * K + k, would make a data shard of several rows a batch
split instead, and XLA then gathered the attention weights in every layer). On one
device (D = M = 1) this is the batch-major order. Query q of a row is new token q // G
and query head k * G + q % G.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from spec_jax import sharding
from spec_jax.models import precision


@dataclasses.dataclass(frozen=True)
class Rows:
    """The row order of B batch rows and K KV heads on a mesh (module docstring).

    Attributes:
      batch: B.
      kv_heads: K.
      data_axis, data: the mesh axis splitting the batch and its size D (None, 1: unsplit).
      model_axis, model: the mesh axis splitting the KV heads and its size M.
    """

    batch: int
    kv_heads: int
    data_axis: str | None = None
    data: int = 1
    model_axis: str | None = None
    model: int = 1

    @classmethod
    def on_mesh(
        cls, batch: int, kv_heads: int, rules: sharding.ShardingRules = sharding.RULES
    ) -> Rows:
        """The order under the current mesh (`jax.set_mesh`; none: batch-major): the batch
        split over `rules.batch` and the KV heads over `rules.kv_heads` where the mesh
        axis divides them, otherwise unsplit."""
        mesh = jax.sharding.get_abstract_mesh()

        def split(axis, size):
            ways = 1 if mesh.empty or axis is None else int(mesh.shape.get(axis, 1))
            return (axis, ways) if ways > 1 and size % ways == 0 else (None, 1)

        return cls(batch, kv_heads, *split(rules.batch, batch), *split(rules.kv_heads, kv_heads))

    @property
    def size(self) -> int:
        """R = B * K."""
        return self.batch * self.kv_heads

    @property
    def spec(self) -> P:
        """The PartitionSpec of the leading R axis: the mesh axes of its blocks."""
        axes = tuple(a for a in (self.data_axis, self.model_axis) if a)
        return P(axes if len(axes) > 1 else (axes[0] if axes else None))

    def constrain(self, x_r: jax.Array) -> jax.Array:
        """Inside jit: an array with leading axis R pinned to the rows' blocks (no-op
        without a mesh)."""
        if jax.sharding.get_abstract_mesh().empty:
            return x_r
        return jax.lax.with_sharding_constraint(x_r, P(*self.spec, *([None] * (x_r.ndim - 1))))

    def _regroup(self, x: jax.Array, axes: str, sizes: dict, order: str, shape) -> jax.Array:
        """x viewed as `axes` (letters of `sizes`; d, b, m, k: data blocks, batch rows
        in a block, model blocks, KV heads in a block), transposed to `order`, reshaped
        to `shape`. Block axes of size 1 are left out, so on one device these are the
        reshapes and transposes of a batch-major order, op for op."""
        sizes = dict(d=self.data, b=self.batch // self.data, m=self.model,
                     k=self.kv_heads // self.model, **sizes)  # fmt: skip
        kept = [a for a in axes if not (a in 'dm' and sizes[a] == 1)]
        x = x.reshape([sizes[a] for a in kept])
        return x.transpose([kept.index(a) for a in order if a in kept]).reshape(shape)

    def keys(self, x_btkh: jax.Array) -> jax.Array:
        """Keys or values [B, T, K, H] -> [R, T, H]."""
        _, t, _, h = x_btkh.shape
        x = self._regroup(x_btkh, 'dbtmkh', dict(t=t, h=h), 'dmbkth', (self.size, t, h))
        return self.constrain(x)

    def queries(self, q_btnh: jax.Array) -> jax.Array:
        """Queries [B, T, N, H] -> [R, Q, H] (N = K * G, Q = T * G)."""
        _, t, n, h = q_btnh.shape
        g = n // self.kv_heads
        x = self._regroup(q_btnh, 'dbtmkgh', dict(t=t, g=g, h=h), 'dmbktgh',
                          (self.size, t * g, h))  # fmt: skip
        return self.constrain(x)

    def outputs(self, out_rqh: jax.Array, num_new: int) -> jax.Array:
        """Attention outputs [R, Q, H] -> [B, T, N * H], heads in the projection's order."""
        _, q, h = out_rqh.shape
        g = q // num_new
        return self._regroup(out_rqh, 'dmbktgh', dict(t=num_new, g=g, h=h), 'dbtmkgh',
                             (self.batch, num_new, self.kv_heads * g * h))  # fmt: skip

    def per_row(self, x_b: jax.Array) -> jax.Array:
        """A per-batch-row array [B, ...] -> [R, ...], row r taking its batch row's entry."""
        d, m = self.data, self.model
        bl, kl, rest = self.batch // d, self.kv_heads // m, x_b.shape[1:]
        x = x_b.reshape(d, 1, bl, 1, *rest)
        return jnp.broadcast_to(x, (d, m, bl, kl, *rest)).reshape(self.size, *rest)

    def mask_scores(self, scores_rqs: jax.Array, mask_bts: jax.Array) -> jax.Array:
        """Hides key s from every query of new token t where mask_bts[b, t, s] is False."""
        _, t, s = mask_bts.shape
        d, m = self.data, self.model
        bl, kl, q = self.batch // d, self.kv_heads // m, scores_rqs.shape[1]
        scores = scores_rqs.reshape(d, m, bl, kl, t, q // t, s)
        mask = mask_bts.reshape(d, 1, bl, 1, t, 1, s)
        masked = jnp.where(mask, scores, jnp.finfo(jnp.float32).min)
        return masked.reshape(self.size, q, s)


# A call of more than QUERY_BLOCK new tokens attends in blocks of at most this many, one
# after another: a prefill's fp32 scores are [R, block * G, S] instead of [R, T * G, S] (the
# largest transient of a long prompt: 3 GiB a copy for Qwen2.5-0.5B's 14 heads over 2,048
# tokens at batch 8). Decoding and verification calls (T of a few dozen) are one block.
QUERY_BLOCK = 512


def attend(
    rows: Rows,
    q_rqh: jax.Array,
    keys_rsh: jax.Array,
    values_rsh: jax.Array,
    mask_bts: jax.Array,
    diagonal: Sequence[tuple[jax.Array, jax.Array]] = (),
    query_block: int = QUERY_BLOCK,
) -> jax.Array:
    """Softmax attention of query rows over key rows.

    Args:
      rows: the row order of all of them.
      q_rqh: queries [R, Q, H] (`Rows.queries`).
      keys_rsh, values_rsh: [R, S, H].
      mask_bts: [B, T, S], True where new token t may see key s.
      diagonal: extra (keys [R, T, H], values [R, T, H]) blocks; new token t sees only
        entry t of each (the EAGLE-3 training-time test's earlier steps, docs/eagle3.md §5).
        One softmax runs over the S keys and these together.
      query_block: T above this attends in ceil(T / query_block) equal blocks of new
        tokens under `lax.map` (the last padded with masked queries); 0: one block. Each
        query's softmax is its own, so blocks change which queries share a matmul only.

    Returns:
      [R, Q, H] in the queries' dtype.
    """
    t = mask_bts.shape[1]
    c = block_tokens(t, query_block)
    if c == t:
        return _attend(rows, q_rqh, keys_rsh, values_rsh, mask_bts, diagonal)
    n = -(-t // c)  # n * c - t < n of the tokens are padding.
    r, q, h = q_rqh.shape

    def blocks(x, axis):  # [..., T, ...] at `axis` -> [n, ..., c, ...], padded.
        x = jnp.pad(x, [(0, n * c - t if a == axis else 0) for a in range(x.ndim)])
        x = x.reshape(*x.shape[:axis], n, c, *x.shape[axis + 1 :])
        return jnp.moveaxis(x, axis, 0)

    g = q // t
    q_blocks = blocks(q_rqh.reshape(r, t, g * h), 1).reshape(n, r, c * g, h)
    diag = [(blocks(dk, 1), blocks(dv, 1)) for dk, dv in diagonal]

    def one(xs):
        q_rqh, mask_bts, diag = xs
        return _attend(rows, rows.constrain(q_rqh), keys_rsh, values_rsh, mask_bts, diag)

    out_blocks = jax.lax.map(one, (q_blocks, blocks(mask_bts, 1), diag))  # [n, R, c * G, H]
    return jnp.moveaxis(out_blocks, 0, 1).reshape(r, n * c * g, h)[:, :q]


def block_tokens(t: int, query_block: int = QUERY_BLOCK) -> int:
    """New tokens in each of `attend`'s blocks for a call of `t` (t itself: one block)."""
    if not query_block or t <= query_block:
        return t
    return -(-t // -(-t // query_block))


def _attend(rows, q_rqh, keys_rsh, values_rsh, mask_bts, diagonal) -> jax.Array:
    """`attend` in one block."""
    r, q, h = q_rqh.shape
    t = mask_bts.shape[1]
    scale = h**-0.5
    scores_rqs = precision.einsum('rqh,rsh->rqs', q_rqh, keys_rsh).astype(jnp.float32) * scale
    scores = [rows.mask_scores(scores_rqs, mask_bts)]
    q_rtgh = q_rqh.reshape(r, t, q // t, h)
    for keys_rth, _ in diagonal:
        diag_rtg = precision.einsum('rtgh,rth->rtg', q_rtgh, keys_rth).astype(jnp.float32)
        scores.append(diag_rtg.reshape(r, q, 1) * scale)
    probs = jax.nn.softmax(jnp.concatenate(scores, axis=-1), axis=-1).astype(q_rqh.dtype)
    s = keys_rsh.shape[1]
    out_rqh = precision.einsum('rqs,rsh->rqh', probs[..., :s], values_rsh)
    for i, (_, values_rth) in enumerate(diagonal):
        probs_rtg = probs[..., s + i].reshape(r, t, q // t)
        out_rqh += precision.einsum('rtg,rth->rtgh', probs_rtg, values_rth).reshape(r, q, h)
    return out_rqh
