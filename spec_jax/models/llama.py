"""A Llama-family decoder in Flax (Llama 2/3/3.x, Qwen2/2.5, Qwen3, SmolLM2).

The model call is the one contract every decoding mode uses:

    logits_btv, taps_bted, cache = forward(cfg, params, tokens_bt, positions_bt, cache, mask_bts)

Prefill, an AR step, chain verification (T = A + 1) and tree verification (T = M, mask =
ancestors) are this call with different T and mask; the model knows nothing of rules.
Layer i has its own parameters (`layer_{i}`) and its own cache arrays, or, with
`cfg.scan_layers`, all layers run as one scan over stacked parameters (see `Decoder`).
Projections are float or int8 with per-channel scales (`cfg.weights`, spec_jax.models.quant).

Parameter names end in their axes: `q_dnh` is [D, N, H].
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from spec_jax import sharding
from spec_jax.models import precision, quant, rope
from spec_jax.models.attention import Rows, attend
from spec_jax.models.cache import KVCache, write_layer
from spec_jax.models.config import ModelConfig

_init = nn.initializers.normal(stddev=0.02)
LAYERS = 'layers'  # The stacked layers of a scan_layers model (`stack_layers`).


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """HF RMSNorm: variance in fp32, normalise, cast back, then scale."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return normed.astype(x.dtype) * scale.astype(x.dtype)


def weight(module: nn.Module, cfg: ModelConfig, name: str, shape, init=_init) -> jax.Array:
    """Declares a parameter stored in cfg.param_dtype and returns it in cfg.dtype."""
    return module.param(name, init, shape, jnp.dtype(cfg.param_dtype)).astype(cfg.dtype)


def project(
    module: nn.Module, cfg: ModelConfig, spec: str, x: jax.Array, name: str, shape, view=None
) -> jax.Array:
    """einsum(spec, x, W) for the projection `name` of `shape` (viewed as `view` in the
    einsum), declared as cfg.weights says: a float weight, or int8 with its scale
    (`quant.scale_name(name)`, over the output channels) dequantized inside the dot."""
    if cfg.weights == 'float':
        w = weight(module, cfg, name, shape)
        return precision.einsum(spec, x, w if view is None else w.reshape(view))
    w_q = module.param(name, quant.int8_init, shape, jnp.int8)
    scale = module.param(
        quant.scale_name(name), quant.init_scale, quant.scale_shape(name, shape), jnp.float32
    )
    return quant.matmul(spec, x, w_q if view is None else w_q.reshape(view), scale)


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
    def __call__(self, x_btd, positions_bt, mask_bts, kv, rows: Rows):
        cfg = self.cfg
        w = partial(weight, self, cfg)
        d, n, k, h = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        proj = partial(project, self, cfg)
        q_btnh = proj('btd,dnh->btnh', x_btd, 'q_dnh', (d, n, h))
        k_btkh = proj('btd,dkh->btkh', x_btd, 'k_dkh', (d, k, h))
        v_btkh = proj('btd,dkh->btkh', x_btd, 'v_dkh', (d, k, h))
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
            keys_rsh, values_rsh = rows.keys(k_btkh), rows.keys(v_btkh)
        else:
            keys_rsh, values_rsh, kv = write_layer(kv, k_btkh, v_btkh, x_btd.dtype, rows)
        out_rqh = attend(rows, rows.queries(q_btnh), keys_rsh, values_rsh, mask_bts)
        out_btf = rows.outputs(out_rqh, x_btd.shape[1])
        return proj('btf,fd->btd', out_btf, 'o_nhd', (n, h, d), view=(n * h, d)), kv


class Mlp(nn.Module):
    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_btd):
        proj = partial(project, self, self.cfg)
        d, f = self.cfg.width, self.cfg.mlp_width
        gate_btf = proj('btd,df->btf', x_btd, 'gate_df', (d, f))
        up_btf = proj('btd,df->btf', x_btd, 'up_df', (d, f))
        return proj('btf,fd->btd', jax.nn.silu(gate_btf) * up_btf, 'down_fd', (f, d))


class Block(nn.Module):
    """One decoder layer: (x, kv) -> (x, kv), kv = (cache_k [R, S, H], cache_v, lengths)."""

    cfg: ModelConfig

    @nn.compact
    def __call__(self, x_btd, positions_bt, mask_bts, kv, rows: Rows):
        cfg, eps = self.cfg, self.cfg.rms_eps
        attn_out, kv = Attention(cfg, name='attn')(
            RMSNorm(eps, cfg.param_dtype, name='attn_norm')(x_btd), positions_bt, mask_bts, kv,
            rows,
        )  # fmt: skip
        x_btd = x_btd + attn_out
        x_btd = x_btd + Mlp(cfg, name='mlp')(RMSNorm(eps, cfg.param_dtype, name='mlp_norm')(x_btd))
        return x_btd, kv


class Decoder(nn.Module):
    """The full decoder. See `forward` for the call contract.

    By default the layers are unrolled, each with its own parameters (`layer_{i}`) and its
    own cache arrays: XLA:CPU copies a layer's weights out of a stacked [L, ...] array when
    a scan slices it (measured: 2x the weight traffic of a decode step), while separate
    arrays are read in place. That is why CPU keeps them unrolled. The price is compile
    time that grows with L.

    `cfg.scan_layers` (for TPU and GPU, where a dot is expected to read its slice of the
    stacked weights in place; not measured here) runs one `nn.scan` over the layers instead:
    the parameters live under `layers` with a leading L axis (`stack_layers` /
    `unstack_layers` convert; checkpoints keep `layer_{i}` on disk) and the KV cache is one
    [L, R, S, H] array for keys and one for values (`KVCache.init` of the config), carried
    through the scan and updated at [i] in place, so no layer's cache is stacked or split
    per call (a tuple of L arrays would be). The compiled program holds one layer, so
    compile time no longer grows with L (measured on CPU, 32 layers of the tiny width: a
    decode step compiles in 2.5-3.3 s scanned against 8.8-10.6 s unrolled, the AR decode
    loop in 8-10 s against 37-45 s; docs/quantization.md, "Scanned layers").
    """

    cfg: ModelConfig
    tap_layers: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, tokens_bt, positions_bt, cache, mask_bts, logits_index_bu=None):
        cfg = self.cfg
        dt, pdt = jnp.dtype(cfg.dtype), jnp.dtype(cfg.param_dtype)
        embed_vd = self.param('embed_vd', _init, (cfg.vocab_size, cfg.width), pdt)
        x_btd = embed_vd[tokens_bt].astype(dt)

        if cache is None:
            rows = Rows.on_mesh(tokens_bt.shape[0], cfg.num_kv_heads, sharding.RULES)
        else:
            rows = cache.rows()
        layers = _scanned_layers if cfg.scan_layers else _unrolled_layers
        x_btd, taps_bted, cache = layers(
            cfg, self.tap_layers, x_btd, positions_bt, mask_bts, cache, rows
        )

        if logits_index_bu is not None:
            x_btd = jnp.take_along_axis(x_btd, logits_index_bu[:, :, None], axis=1)
        x_btd = RMSNorm(cfg.rms_eps, cfg.param_dtype, name='final_norm')(x_btd)
        if cfg.tie_embeddings:
            logits_btv = precision.einsum('btd,vd->btv', x_btd, embed_vd.astype(dt))
        else:
            v, d = cfg.vocab_size, cfg.width
            logits_btv = project(self, cfg, 'btd,vd->btv', x_btd, 'lm_head_vd', (v, d))
        return logits_btv.astype(jnp.float32), taps_bted, cache


def _unrolled_layers(cfg, tap_layers, x_btd, positions_bt, mask_bts, cache, rows):
    """The layers one after another (`layer_{i}`, a cache tuple of L arrays): called inside
    `Decoder`'s compact call, so the blocks are its submodules. Returns (x, taps, cache)."""
    taps = {}
    new_k, new_v = [], []
    for i in range(cfg.num_layers):
        if i in tap_layers:  # HF hidden_states[i]: the stream entering layer i.
            taps[i] = x_btd
        kv = None if cache is None else (cache.k[i], cache.v[i], cache.lengths)
        x_btd, kv = Block(cfg, name=f'layer_{i}')(x_btd, positions_bt, mask_bts, kv, rows)
        if cache is not None:
            new_k.append(kv[0])
            new_v.append(kv[1])
    if cache is not None:
        cache = cache.replace(k=tuple(new_k), v=tuple(new_v))
    taps_bted = jnp.stack([taps[i] for i in tap_layers], 2) if taps else None
    return x_btd, taps_bted, cache


class _ScanBlock(Block):
    """A `Block` as one step of `nn.scan` over the layers (its parameters the same as a
    `layer_{i}`'s, stacked on a leading L axis by the scan).

    carry: (x [B, T, D], cache keys [L, R, S, H] or None, values, taps [E, B, T, D] or
    None); i: the layer's index (scanned); positions, mask and lengths broadcast. The layer
    reads its cache arrays at [i] and writes them back in place into the carried stack.
    """

    tap_layers: tuple[int, ...] = ()
    rows: Rows | None = None

    def __call__(self, carry, i, positions_bt, mask_bts, lengths_b):
        x_btd, k_lrsh, v_lrsh, taps_ebtd = carry
        for e, layer in enumerate(self.tap_layers):
            taps_ebtd = taps_ebtd.at[e].set(jnp.where(i == layer, x_btd, taps_ebtd[e]))
        kv = None if k_lrsh is None else (k_lrsh[i], v_lrsh[i], lengths_b)
        x_btd, kv = super().__call__(x_btd, positions_bt, mask_bts, kv, self.rows)
        if kv is not None:
            k_lrsh = jax.lax.dynamic_update_index_in_dim(k_lrsh, kv[0], i, 0)
            v_lrsh = jax.lax.dynamic_update_index_in_dim(v_lrsh, kv[1], i, 0)
        return (x_btd, k_lrsh, v_lrsh, taps_ebtd), None


def _scanned_layers(cfg, tap_layers, x_btd, positions_bt, mask_bts, cache, rows):
    """The layers as one `nn.scan` (parameters under `layers`, [L, ...]; a cache of
    stacked [L, R, S, H] arrays). Returns (x, taps, cache)."""
    if cache is not None and isinstance(cache.k, tuple):
        raise ValueError(
            'a scan_layers model takes a cache of stacked [L, R, S, H] arrays '
            f'(KVCache.init with its cfg); got a tuple of {len(cache.k)} layer arrays'
        )
    taps = None
    if tap_layers:
        taps = jnp.zeros((len(tap_layers), *x_btd.shape), x_btd.dtype)
    k, v, lengths = (None, None, None) if cache is None else (cache.k, cache.v, cache.lengths)
    scan = nn.scan(
        _ScanBlock,
        variable_axes={'params': 0},
        split_rngs={'params': True},
        in_axes=(0, nn.broadcast, nn.broadcast, nn.broadcast),
        length=cfg.num_layers,
    )
    steps = jnp.arange(cfg.num_layers, dtype=jnp.int32)
    (x_btd, k, v, taps), _ = scan(cfg, tuple(tap_layers), rows, name=LAYERS)(
        (x_btd, k, v, taps), steps, positions_bt, mask_bts, lengths
    )
    if cache is not None:
        cache = cache.replace(k=k, v=v)
    taps_bted = None if taps is None else taps.transpose(1, 2, 0, 3)
    return x_btd, taps_bted, cache


def stack_layers(params: dict, num_layers: int, consume: bool = False) -> dict:
    """Unrolled parameters (`layer_0` ... `layer_{L-1}`, the checkpoint layout) -> the
    `scan_layers` tree: one `layers` tree of the same names, each leaf stacked [L, ...].

    Leaf by leaf; with `consume` each per-layer leaf is dropped from `params` once stacked
    (a loader then holds the model plus one stacked leaf, not two models). numpy leaves
    stack to numpy, jax arrays to jax arrays (a mesh placement is redone by the caller)."""
    missing = [f'layer_{i}' for i in range(num_layers) if f'layer_{i}' not in params]
    if missing:
        raise ValueError(f'stack_layers: params lack {missing[:4]} (have {sorted(params)[:6]})')
    out = {k: v for k, v in params.items() if not k.startswith('layer_')}
    layers = [params[f'layer_{i}'] for i in range(num_layers)]

    def stack(trees, path=()):
        node = {}
        for key in list(trees[0]):
            if isinstance(trees[0][key], dict):
                node[key] = stack([t[key] for t in trees], path + (key,))
                continue
            xs = [t[key] for t in trees]
            if consume:
                for t in trees:
                    del t[key]
            is_np = all(isinstance(x, np.ndarray) for x in xs)
            node[key] = np.stack(xs) if is_np else jnp.stack(xs)
            del xs
        return node

    out[LAYERS] = stack(layers)
    if consume:
        for i in range(num_layers):
            del params[f'layer_{i}']
    return out


def unstack_layers(params: dict) -> dict:
    """The inverse of `stack_layers`: `layers` [L, ...] -> `layer_{i}` (what the savers and
    `checkpoints.convert.params_to_state` take)."""
    if LAYERS not in params:
        raise ValueError(f'unstack_layers: params have no {LAYERS!r} tree ({sorted(params)[:6]})')
    stacked = params[LAYERS]
    num_layers = jax.tree.leaves(stacked)[0].shape[0]
    out = {k: v for k, v in params.items() if k != LAYERS}
    for i in range(num_layers):
        out[f'layer_{i}'] = jax.tree.map(lambda x, i=i: x[i], stacked)
    return out


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


def repeat_kv_heads(
    cfg: ModelConfig, params: dict, times: int, repeat=None
) -> tuple[ModelConfig, dict]:
    """The same model with each KV head held `times` times in a row (K' = K * times).

    Query head n reads KV head n // G; with G' = G / times it reads head n // G' of the
    copies, a copy of n // G: the outputs are unchanged. A model axis larger than K
    (`sharding.kv_repeat`) then splits the copies, so each device keeps one KV head of its
    query heads' group in its weights and cache instead of all of them. Every parameter
    whose name carries the letter K (projections, biases, quantization scales) is repeated,
    by `repeat(x, axis, letters)` (default `jnp.repeat(x, times, axis)`; the loader's also
    places the result).
    """
    if times == 1:
        return cfg, params
    if cfg.group_size % times:
        raise ValueError(
            f'{cfg.num_heads} query heads over {cfg.num_kv_heads} KV heads: groups of '
            f'{cfg.group_size} do not split {times} ways'
        )
    if repeat is None:
        repeat = lambda x, axis, letters: jnp.repeat(x, times, axis=axis)  # noqa: E731

    def one(path, x):
        letters = sharding.letters_of(str(getattr(path[-1], 'key', '')), x.ndim)
        return repeat(x, letters.index('k'), letters) if 'k' in letters else x

    return (
        cfg.replace(num_kv_heads=cfg.num_kv_heads * times),
        jax.tree_util.tree_map_with_path(one, params),
    )
