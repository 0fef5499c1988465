"""A Llama-family decoder in Flax (Llama 2/3/3.x, Qwen2/2.5, Qwen3, SmolLM2).

The model call is the one contract every decoding mode uses:

    logits_btv, taps_bted, cache = forward(cfg, params, tokens_bt, positions_bt, cache, mask_bts)

Prefill, an AR step, chain verification (T = A + 1) and tree verification (T = M, mask =
ancestors) are this call with different T and mask; the model knows nothing of rules.
Layer i has its own parameters (`layer_{i}`) and its own cache arrays (see `Decoder`).

Parameter names end in their axes: `q_dnh` is [D, N, H].
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from spec_jax.models import rope
from spec_jax.models.attention import attend, from_query_rows, query_rows, to_rows
from spec_jax.models.cache import KVCache, write_layer
from spec_jax.models.config import ModelConfig

_init = nn.initializers.normal(stddev=0.02)


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """HF RMSNorm: variance in fp32, normalise, cast back, then scale."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * scale.astype(x.dtype)


def weight(module: nn.Module, cfg: ModelConfig, name: str, shape, init=_init) -> jax.Array:
    """Declares a parameter stored in cfg.param_dtype and returns it in cfg.dtype."""
    return module.param(name, init, shape, jnp.dtype(cfg.param_dtype)).astype(cfg.dtype)


class RMSNorm(nn.Module):
    eps: float
    param_dtype: str = 'float32'

    @nn.compact
    def __call__(self, x):
        scale = self.param(
            'scale', nn.initializers.ones, (x.shape[-1],), jnp.dtype(self.param_dtype)
        )
        return rms_norm(x, scale, self.eps)


class Attention(nn.Module):
    """Grouped-query attention over the cache (spec_jax.models.attention); never
    materialises repeated K/V heads."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_btd, positions_bt, mask_bts, kv):
        cfg = self.cfg
        w = partial(weight, self, cfg)
        d, n, k, h = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        q_btnh = jnp.einsum('btd,dnh->btnh', x_btd, w('q_dnh', (d, n, h)))
        k_btkh = jnp.einsum('btd,dkh->btkh', x_btd, w('k_dkh', (d, k, h)))
        v_btkh = jnp.einsum('btd,dkh->btkh', x_btd, w('v_dkh', (d, k, h)))
        if cfg.qkv_bias:
            q_btnh += w('q_bias_nh', (n, h), nn.initializers.zeros)
            k_btkh += w('k_bias_kh', (k, h), nn.initializers.zeros)
            v_btkh += w('v_bias_kh', (k, h), nn.initializers.zeros)
        if cfg.qk_norm:
            q_btnh = rms_norm(q_btnh, w('q_norm_h', (h,), nn.initializers.ones), cfg.rms_eps)
            k_btkh = rms_norm(k_btkh, w('k_norm_h', (h,), nn.initializers.ones), cfg.rms_eps)
        inv_freq = rope.inverse_frequencies(h, cfg.rope_theta, cfg.rope_scaling)
        q_btnh = rope.apply_rope(q_btnh, positions_bt, inv_freq)
        k_btkh = rope.apply_rope(k_btkh, positions_bt, inv_freq)

        if kv is None:  # No cache: the new tokens attend to each other only (training).
            keys_rsh, values_rsh = to_rows(k_btkh), to_rows(v_btkh)
        else:
            keys_rsh, values_rsh, kv = write_layer(kv, k_btkh, v_btkh, x_btd.dtype)
        out_rqh = attend(query_rows(q_btnh, k), keys_rsh, values_rsh, mask_bts)
        out_btf = from_query_rows(out_rqh, *x_btd.shape[:2])
        return jnp.einsum('btf,fd->btd', out_btf, w('o_nhd', (n, h, d)).reshape(n * h, d)), kv


class Mlp(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_btd):
        w = partial(weight, self, self.cfg)
        d, f = self.cfg.width, self.cfg.mlp_width
        gate_btf = jnp.einsum('btd,df->btf', x_btd, w('gate_df', (d, f)))
        up_btf = jnp.einsum('btd,df->btf', x_btd, w('up_df', (d, f)))
        return jnp.einsum('btf,fd->btd', jax.nn.silu(gate_btf) * up_btf, w('down_fd', (f, d)))


class Block(nn.Module):
    """One decoder layer: (x, kv) -> (x, kv), kv = (cache_k [R, S, H], cache_v, lengths)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_btd, positions_bt, mask_bts, kv):
        cfg, eps = self.cfg, self.cfg.rms_eps
        attn_out, kv = Attention(cfg, name='attn')(
            RMSNorm(eps, cfg.param_dtype, name='attn_norm')(x_btd), positions_bt, mask_bts, kv
        )
        x_btd = x_btd + attn_out
        x_btd = x_btd + Mlp(cfg, name='mlp')(RMSNorm(eps, cfg.param_dtype, name='mlp_norm')(x_btd))
        return x_btd, kv


class Decoder(nn.Module):
    """The full decoder. See `forward` for the call contract.

    The layers are unrolled, each with its own parameters (`layer_{i}`) and its own cache
    arrays: XLA:CPU copies a layer's weights out of a stacked [L, ...] array when a scan
    slices it (measured: 2x the weight traffic of a decode step), while separate arrays are
    read in place. The price is compile time that grows with L.
    """

    cfg: ModelConfig
    tap_layers: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, tokens_bt, positions_bt, cache, mask_bts, logits_index_bu=None):
        cfg = self.cfg
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        embed_vd = self.param('embed_vd', _init, (cfg.vocab_size, cfg.width), pdt)
        x_btd = embed_vd[tokens_bt].astype(dt)

        taps = {}
        new_k, new_v = [], []
        for i in range(cfg.num_layers):
            if i in self.tap_layers:  # HF hidden_states[i]: the stream entering layer i.
                taps[i] = x_btd
            kv = None if cache is None else (cache.k[i], cache.v[i], cache.lengths)
            x_btd, kv = Block(cfg, name=f'layer_{i}')(x_btd, positions_bt, mask_bts, kv)
            if cache is not None:
                new_k.append(kv[0])
                new_v.append(kv[1])
        if cache is not None:
            cache = cache.replace(k=tuple(new_k), v=tuple(new_v))
        taps_bted = jnp.stack([taps[i] for i in self.tap_layers], 2) if taps else None

        if logits_index_bu is not None:
            x_btd = jnp.take_along_axis(x_btd, logits_index_bu[:, :, None], axis=1)
        x_btd = RMSNorm(cfg.rms_eps, cfg.param_dtype, name='final_norm')(x_btd)
        if cfg.tie_embeddings:
            head_vd = embed_vd
        else:
            head_vd = self.param('lm_head_vd', _init, (cfg.vocab_size, cfg.width), pdt)
        logits_btv = jnp.einsum('btd,vd->btv', x_btd, head_vd.astype(dt))
        return logits_btv.astype(jnp.float32), taps_bted, cache


@partial(jax.jit, static_argnums=0)
def init_params(cfg: ModelConfig, key: jax.Array) -> dict:
    """Random parameters (normal(0.02) weights, unit norms) for `cfg`."""
    tokens = jnp.zeros((1, 1), jnp.int32)
    mask = jnp.ones((1, 1, 1), bool)
    return Decoder(cfg).init(key, tokens, tokens, None, mask)['params']


@partial(jax.jit, static_argnames=('cfg', 'tap_layers'))
def forward(
    cfg: ModelConfig,
    params: dict,
    tokens_bt: jax.Array,
    positions_bt: jax.Array,
    cache: KVCache | None,
    mask_bts: jax.Array,
    tap_layers: Sequence[int] = (),
    logits_index_bu: jax.Array | None = None,
) -> tuple[jax.Array, jax.Array | None, KVCache | None]:
    """One model call.

    Args:
      cfg: the model config (static).
      params: the parameter pytree (an argument, never closed over: closing over weights
        turns them into constants and costs seconds of compile per shape).
      tokens_bt: token ids [B, T].
      positions_bt: RoPE positions [B, T].
      cache: a KVCache; the keys/values of the T tokens are written at slots
        cache.lengths[b] + t and NOT committed (see spec_jax.models.cache). None runs
        without a cache: tokens attend only to each other through a [B, T, T] mask.
      mask_bts: boolean attention mask [B, T, S] (S = cache slots, or T without a cache);
        any pattern works (causal, tree ancestry), so verification needs no model change.
      tap_layers: HF `hidden_states` indices whose residual streams to return (each in
        [0, L)); EAGLE-3 uses cfg.hf_taps().
      logits_index_bu: optional [B, U] indices into T: compute logits only there (saves the
        LM head on long prefills).

    Returns:
      (logits [B, T or U, V] fp32, taps [B, T, E, D] or None, updated cache or None).
    """
    tap_layers = tuple(tap_layers)
    for i in tap_layers:
        if not 0 <= i < cfg.num_layers:
            raise ValueError(f'tap layer {i} is outside [0, {cfg.num_layers})')
    return Decoder(cfg, tap_layers).apply(
        {'params': params}, tokens_bt, positions_bt, cache, mask_bts, logits_index_bu
    )


def causal_forward(
    cfg: ModelConfig, params: dict, tokens_bt: jax.Array, tap_layers: Sequence[int] = ()
) -> tuple[jax.Array, jax.Array | None]:
    """A whole sequence at positions 0..T-1 without a cache (the reference for tests, and
    teacher forwards): (logits [B, T, V], taps [B, T, E, D] or None)."""
    b, t = tokens_bt.shape
    positions_bt = jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (b, t))
    mask_btt = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
    logits_btv, taps, _ = forward(cfg, params, tokens_bt, positions_bt, None, mask_btt, tap_layers)
    return logits_btv, taps
