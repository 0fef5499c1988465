"""The KV cache as an explicit pytree, and its pure operations.

One pair of arrays per layer, each `[R, S, H]` with one row per (batch row, KV head),
R = B * K, in the mesh-block order of `attention.Rows` (batch-major on one device; each
device holds its own batch rows' KV heads on a mesh): a layer updates its own buffers in
place. The cache's `rules` (static) say which mesh axes split its rows: the target's
(`sharding.RULES`) or a drafter's (`sharding.DRAFT_RULES`: batch only).

A model call *writes* the keys and values of its T new tokens at slots
`lengths[b] .. lengths[b] + T - 1` of each row but does not *commit* them: `lengths`
is unchanged by the call. The caller commits what it keeps with `advance` (prefill, AR
step, accepted chain drafts) or `commit_path` (an accepted tree path). Entries past a
row's length are garbage that no mask ever shows and that the next write overwrites, so
rejecting speculative tokens costs nothing.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
from flax import struct

from spec_jax import sharding
from spec_jax.models.attention import Rows
from spec_jax.models.config import ModelConfig


@struct.dataclass
class KVCache:
    """Keys, values and committed lengths.

    Attributes:
      k: keys, a tuple of L arrays [R, S, H] (R = B * K), or one [L, R, S, H] array for a
        cfg.scan_layers model.
      v: values, likewise.
      lengths: committed tokens per row [B] int32; the next write starts here.
      rules: the sharding rules of its rows (static; `rows`).
    """

    k: tuple[jax.Array, ...]
    v: tuple[jax.Array, ...]
    lengths: jax.Array
    rules: sharding.ShardingRules = struct.field(pytree_node=False, default=sharding.RULES)

    @classmethod
    def init(
        cls,
        cfg: ModelConfig,
        batch: int,
        max_len: int,
        dtype=None,
        rules: sharding.ShardingRules = sharding.RULES,
    ) -> KVCache:
        """An empty cache of `max_len` slots per row, its rows split by `rules`."""
        zeros = partial(
            empty_layer, batch, cfg.num_kv_heads, max_len, cfg.head_dim, dtype or cfg.dtype,
            rules,
        )  # fmt: skip
        k = tuple(zeros() for _ in range(cfg.num_layers))
        v = tuple(zeros() for _ in range(cfg.num_layers))
        if cfg.scan_layers:  # Scanned layers (models/llama.py) carry one [L, R, S, H] array.
            k, v = jnp.stack(k), jnp.stack(v)
        return cls(
            k=k,
            v=v,
            lengths=sharding.constrain(jnp.zeros((batch,), jnp.int32), 'b', rules),
            rules=rules,
        )

    def rows(self) -> Rows:
        """The row order of its arrays under the current mesh."""
        return Rows.on_mesh(self.batch, self.k[0].shape[0] // self.batch, self.rules)

    @property
    def max_len(self) -> int:
        """S, the number of slots per row."""
        return self.k[0].shape[1]

    @property
    def batch(self) -> int:
        return self.lengths.shape[0]

    def positions(self, num_new: int) -> jax.Array:
        """RoPE positions of `num_new` tokens appended to each row: [B, T]."""
        return self.lengths[:, None] + jnp.arange(num_new, dtype=jnp.int32)[None, :]

    def causal_mask(self, num_new: int) -> jax.Array:
        """Mask [B, T, S] for T tokens appended in a chain: slot s is visible to new token t
        iff s <= lengths[b] + t."""
        return attention_mask(self.lengths, num_new, self.max_len)

    def advance(self, num_tokens: jax.Array) -> KVCache:
        """Commits `num_tokens` [B] (or a scalar) written tokens per row."""
        return self.replace(lengths=self.lengths + jnp.asarray(num_tokens, jnp.int32))

    def set_lengths(self, lengths: jax.Array) -> KVCache:
        return self.replace(lengths=jnp.asarray(lengths, jnp.int32))

    def commit_path(self, path_bp: jax.Array, path_len_b: jax.Array) -> KVCache:
        """Commits an accepted tree path.

        The last call wrote tree node i of row b at slot lengths[b] + i. This moves the
        nodes on the accepted path (node indices `path_bp` [B, P], the first `path_len_b`
        [B] of them valid; padding must be a valid node index) to the contiguous slots
        lengths[b] .. lengths[b] + path_len - 1, then commits them. All sources are gathered
        before any write, so overlapping ranges are safe.
        """
        num_path = path_bp.shape[1]
        src_bp = self.lengths[:, None] + path_bp
        dst_bp = self.lengths[:, None] + jnp.arange(num_path, dtype=jnp.int32)[None, :]
        keep_bp = jnp.arange(num_path)[None, :] < path_len_b[:, None]
        # Padding entries rewrite their destination with its own value: a no-op.
        src_bp = jnp.where(keep_bp, src_bp, dst_bp)
        rows = self.rows()
        src_rp, dst_rp = rows.per_row(src_bp), rows.per_row(dst_bp)
        rows_r1 = jnp.arange(rows.size)[:, None]

        def move(x_rsh):
            return x_rsh.at[rows_r1, dst_rp].set(x_rsh[rows_r1, src_rp])

        def move_layers(x):  # A tuple of L [R, S, H] arrays, or one stacked [L, R, S, H].
            return tuple(map(move, x)) if isinstance(x, tuple) else jax.vmap(move)(x)

        return self.replace(
            k=move_layers(self.k),
            v=move_layers(self.v),
            lengths=self.lengths + path_len_b,
        )


def empty_layer(
    batch: int,
    num_kv_heads: int,
    max_len: int,
    head_dim: int,
    dtype,
    rules: sharding.ShardingRules = sharding.RULES,
) -> jax.Array:
    """One layer's zero keys (or values) [R, S, H], R = batch * num_kv_heads, its rows
    split over the current mesh by `rules` (`attention.Rows`)."""
    zeros_rsh = jnp.zeros((batch * num_kv_heads, max_len, head_dim), dtype)
    return Rows.on_mesh(batch, num_kv_heads, rules).constrain(zeros_rsh)


def write_layer(kv, k_btkh: jax.Array, v_btkh: jax.Array, dtype, rows: Rows):
    """Writes one layer's new keys/values [B, T, K, H] at slots lengths[b] + t.

    Args:
      kv: (cache_k [R, S, H], cache_v, lengths [B]) of one layer.
      k_btkh, v_btkh: the new keys and values.
      dtype: the compute dtype of the returned keys/values.
      rows: the cache's row order.

    Returns:
      (keys [R, S, H], values [R, S, H] in `dtype`, the updated kv).
    """
    cache_k, cache_v, lengths_b = kv
    t = k_btkh.shape[1]
    rows_r1 = jnp.arange(rows.size)[:, None]
    slots_rt = rows.per_row(lengths_b)[:, None] + jnp.arange(t)[None, :]
    cache_k = cache_k.at[rows_r1, slots_rt].set(rows.keys(k_btkh).astype(cache_k.dtype))
    cache_v = cache_v.at[rows_r1, slots_rt].set(rows.keys(v_btkh).astype(cache_v.dtype))
    return cache_k.astype(dtype), cache_v.astype(dtype), (cache_k, cache_v, lengths_b)


def attention_mask(lengths_b: jax.Array, num_new: int, max_len: int) -> jax.Array:
    """Causal mask [B, T, S] for T new tokens written after `lengths_b` committed ones."""
    limit_bt = lengths_b[:, None] + jnp.arange(num_new, dtype=jnp.int32)[None, :]
    slots_s = jnp.arange(max_len, dtype=jnp.int32)
    return slots_s[None, None, :] <= limit_bt[:, :, None]


def tree_mask(lengths_b: jax.Array, ancestors_bqm: jax.Array, max_len: int) -> jax.Array:
    """Mask [B, Q, S] for Q queries over M tree nodes written at slots lengths[b] + i.

    Query i sees every committed slot and the slots of the nodes j with
    `ancestors_bqm[b, i, j]` (its ancestors, itself included). With Q = M the queries are
    the nodes themselves (target verification); a draft head's frontier of Q nodes reads
    the M slots of its scratch region the same way.
    """
    batch, num_q, num_nodes = ancestors_bqm.shape
    slots_s = jnp.arange(max_len, dtype=jnp.int32)
    committed_bs = slots_s[None, :] < lengths_b[:, None]
    offset_bs = slots_s[None, :] - lengths_b[:, None]
    in_tree_bs = (offset_bs >= 0) & (offset_bs < num_nodes)
    node_bs = jnp.clip(offset_bs, 0, num_nodes - 1)
    ancestor_bqs = jnp.take_along_axis(
        ancestors_bqm, jnp.broadcast_to(node_bs[:, None, :], (batch, num_q, max_len)), axis=2
    )
    return committed_bs[:, None, :] | (in_tree_bs[:, None, :] & ancestor_bqs)
