"""The DFlash block drafter (arXiv 2602.06036) in JAX: one forward proposes a whole block.

The published architecture (z-lab's `DFlashDraftModel`, a Qwen3-style stack):

- Context: the target's hidden states at E layers (`target_layer_ids`; HF `hidden_states`
  index id + 1, so spec_jax taps `id + 1`) at every committed position, concatenated
  [B, P, E * D] and projected by `fc` then `hidden_norm` into one D-wide context stream.
  Each layer projects that same stream with its own k/v projections: the context keys and
  values, cached like a KV cache (slot t: position t).
- Block: B_s tokens at positions C .. C + B_s - 1: the pending token s_C, then the mask
  token (`mask_token_id`) B_s - 1 times; their input is the TARGET's embeddings
  (times `embed_scale`, 1 in the released checkpoints).
- L decoder layers (Qwen3 layers: RMSNorm, attention with per-head q/k RMSNorm and RoPE at
  the positions above, SwiGLU MLP). A block query attends every context slot and every
  block token, bidirectionally (non-causal within the block; `causal=True` is the
  `is_causal` variant), never the future context.
- `norm`, then the target's lm head (times `output_multiplier`, soft-capped at
  `logit_softcap` when > 0): block position j >= 1 gives the law of the token at C + j.
  The positions' laws are marginals: the block is drafted in one call, not token by token.

Parameters (axis letters, docs/sharding.md): `fc_xd` [E * D, D], `hidden_norm_d`, `norm_d`,
and `layer_{i}`: `attn_norm_d`, `q_dnh`, `k_dkh`, `v_dkh`, `q_norm_h`, `k_norm_h`, `o_nhd`,
`mlp_norm_d`, `gate_df`, `up_df`, `down_fd`. The loader for the released format is
`spec_jax.checkpoints.dflash_format`; the drafter `spec_jax.decoding.drafters.dflash`.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax import sharding
from spec_jax.models import precision, rope
from spec_jax.models.attention import Rows, attend
from spec_jax.models.cache import write_layer
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.models.llama import rms_norm


@dataclasses.dataclass(frozen=True)
class DFlashConfig:
    """Static description of a DFlash drafter.

    Attributes:
      width: D, the drafter's width (the target's: its input is the target's embeddings).
      num_layers, num_heads, num_kv_heads, head_dim, mlp_width: L, N, K, H, F.
      vocab_size: V, the target's vocabulary (the drafter reads the target's lm head).
      taps: the target's hidden-state taps (spec_jax `tap_layers`: HF hidden_states index).
      block_size: B_s, the block one call drafts (B_s - 1 drafts after s_C).
      mask_token_id: the id whose embedding fills the undrafted block positions.
      causal: causal attention within the block (the released models: False).
      rms_eps, rope_theta, rope_scaling: as the target's.
      embed_scale, output_multiplier, logit_softcap: the optional `dflash_config` scalars.
      dtype: compute dtype.
    """

    width: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_width: int
    vocab_size: int
    taps: tuple[int, ...]
    block_size: int = 16
    mask_token_id: int = 0
    causal: bool = False
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    embed_scale: float = 1.0
    output_multiplier: float = 1.0
    logit_softcap: float = 0.0
    dtype: str = 'float32'

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f'num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}'
            )
        if self.block_size < 2:
            raise ValueError(f'block_size={self.block_size} must be >= 2 (s_C and one draft)')
        if not self.taps:
            raise ValueError('a DFlash drafter reads at least one target tap (taps=())')
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(
                f'mask_token_id={self.mask_token_id} is outside the vocabulary '
                f'[0, {self.vocab_size})'
            )

    @property
    def max_drafts(self) -> int:
        """The most drafts one block holds (B_s - 1)."""
        return self.block_size - 1

    @classmethod
    def for_target(cls, target: ModelConfig, num_layers: int = 1, **changes) -> DFlashConfig:
        """A drafter shaped like `num_layers` layers of `target`, reading `num_layers` taps
        spread over its layers (the released models: as many taps as draft layers, from
        target layer 1 to L - 3)."""
        taps = changes.pop('taps', None)
        if taps is None:
            last = max(1, target.num_layers - 3)
            taps = tuple(
                sorted({int(round(x)) + 1 for x in np.linspace(1, last, num_layers)} - {0})
            )
            taps = tuple(t for t in taps if t < target.num_layers) or (target.num_layers - 1,)
        base = dict(
            width=target.width,
            num_layers=num_layers,
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            mlp_width=target.mlp_width,
            vocab_size=target.vocab_size,
            taps=tuple(taps),
            mask_token_id=target.vocab_size - 1,
            rms_eps=target.rms_eps,
            rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            dtype=target.dtype,
        )
        base.update(changes)
        return cls(**base)

    def check_target(self, target: ModelConfig) -> None:
        """Raises ValueError when this drafter cannot run on `target`'s features."""
        if self.width != target.width:
            raise ValueError(
                f'DFlash drafter width {self.width} (fc out, embeddings) differs from the '
                f"target's width {target.width}"
            )
        if self.vocab_size != target.vocab_size:
            raise ValueError(
                f'DFlash drafter vocabulary {self.vocab_size} differs from the target '
                f'vocabulary {target.vocab_size} (it reads the target lm head)'
            )
        bad = [i for i in self.taps if not 0 < i < target.num_layers]
        if bad:
            raise ValueError(
                f'DFlash taps {bad} are outside [1, {target.num_layers}) (target layer ids '
                f"0 .. {target.num_layers - 2}: the target's last layer output is not tapped)"
            )


def init_params(cfg: DFlashConfig, key: jax.Array, std: float = 0.02) -> dict:
    """Random parameters (normal(std) weights, unit norms), float32."""
    d, n, k, h, f = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_width
    keys = iter(jax.random.split(key, 1 + 7 * cfg.num_layers))

    def normal(shape):
        return std * jax.random.normal(next(keys), shape, jnp.float32)

    params = {
        'fc_xd': normal((len(cfg.taps) * d, d)),
        'hidden_norm_d': jnp.ones((d,)),
        'norm_d': jnp.ones((d,)),
    }
    for i in range(cfg.num_layers):
        params[f'layer_{i}'] = {
            'attn_norm_d': jnp.ones((d,)),
            'q_dnh': normal((d, n, h)),
            'k_dkh': normal((d, k, h)),
            'v_dkh': normal((d, k, h)),
            'q_norm_h': jnp.ones((h,)),
            'k_norm_h': jnp.ones((h,)),
            'o_nhd': normal((n, h, d)),
            'mlp_norm_d': jnp.ones((d,)),
            'gate_df': normal((d, f)),
            'up_df': normal((d, f)),
            'down_fd': normal((f, d)),
        }
    return params


def _keys_values(cfg, lp, x_btd, positions_bt):
    """One layer's keys and values [B, T, K, H] of a stream (k RMS-normed, RoPE'd)."""
    dt = jnp.dtype(cfg.dtype)
    k_btkh = precision.einsum('btd,dkh->btkh', x_btd, lp['k_dkh'].astype(dt))
    v_btkh = precision.einsum('btd,dkh->btkh', x_btd, lp['v_dkh'].astype(dt))
    k_btkh = rms_norm(k_btkh, lp['k_norm_h'], cfg.rms_eps)
    inv_freq = rope.inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    return rope.apply_rope(k_btkh, positions_bt, inv_freq), v_btkh


def context(cfg: DFlashConfig, params: dict, taps_bted: jax.Array, positions_bt: jax.Array):
    """Each layer's context keys and values of the target's taps [B, T, E, D] at positions
    [B, T]: a tuple of L (k [B, T, K, H], v [B, T, K, H])."""
    dt = jnp.dtype(cfg.dtype)
    b, t = taps_bted.shape[:2]
    x_btd = precision.einsum(
        'btx,xd->btd', taps_bted.astype(dt).reshape(b, t, -1), params['fc_xd'].astype(dt)
    )
    x_btd = rms_norm(x_btd, params['hidden_norm_d'], cfg.rms_eps)
    return tuple(
        _keys_values(cfg, params[f'layer_{i}'], x_btd, positions_bt) for i in range(cfg.num_layers)
    )


def block_mask(cfg: DFlashConfig, lengths_b: jax.Array, num_new: int, slots: int) -> jax.Array:
    """[B, T, S]: block token t, written at slot lengths[b] + t, sees the committed slots and
    the whole block (its earlier tokens and itself only when `cfg.causal`)."""
    limit_bt = lengths_b[:, None] + (
        jnp.arange(num_new, dtype=jnp.int32)[None, :] if cfg.causal else num_new - 1
    )
    limit_bt = jnp.broadcast_to(limit_bt, (lengths_b.shape[0], num_new))
    return jnp.arange(slots, dtype=jnp.int32)[None, None, :] <= limit_bt[:, :, None]


def block_forward(
    cfg: DFlashConfig,
    params: dict,
    embeds_btd: jax.Array,
    positions_bt: jax.Array,
    kv,
    mask_bts: jax.Array,
    rules: sharding.ShardingRules = sharding.DRAFT_RULES,
):
    """The block's layers over the cached context (not jitted itself: jit the caller).

    Args:
      cfg, params: the drafter.
      embeds_btd: the block tokens' input embeddings [B, T, D] (target table, scaled).
      positions_bt: their RoPE positions [B, T].
      kv: (a tuple of L cache_k [R, S, H], a tuple of L cache_v, lengths [B]): the context
        slots; the block's own keys are written at lengths + t (past the context).
      mask_bts: [B, T, S] (`block_mask`).
      rules: how the attention rows split on the mesh (the cache's).

    Returns:
      (the block's output after `norm` [B, T, D], (cache_k tuple, cache_v tuple)).
    """
    dt = jnp.dtype(cfg.dtype)
    caches_k, caches_v, lengths_b = kv
    b, t = embeds_btd.shape[:2]
    rows = Rows.on_mesh(b, cfg.num_kv_heads, rules)
    inv_freq = rope.inverse_frequencies(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling)
    n, h = cfg.num_heads, cfg.head_dim
    x_btd = embeds_btd.astype(dt)
    new_k, new_v = [], []
    for i in range(cfg.num_layers):
        lp = params[f'layer_{i}']
        y_btd = rms_norm(x_btd, lp['attn_norm_d'], cfg.rms_eps)
        q_btnh = precision.einsum('btd,dnh->btnh', y_btd, lp['q_dnh'].astype(dt))
        q_btnh = rope.apply_rope(rms_norm(q_btnh, lp['q_norm_h'], cfg.rms_eps), positions_bt,
                                 inv_freq)  # fmt: skip
        k_btkh, v_btkh = _keys_values(cfg, lp, y_btd, positions_bt)
        keys_rsh, values_rsh, (ck, cv, _) = write_layer(
            (caches_k[i], caches_v[i], lengths_b), k_btkh, v_btkh, dt, rows
        )
        new_k.append(ck)
        new_v.append(cv)
        out_btf = rows.outputs(attend(rows, rows.queries(q_btnh), keys_rsh, values_rsh, mask_bts),
                               t)  # fmt: skip
        o_fd = lp['o_nhd'].astype(dt).reshape(n * h, cfg.width)
        x_btd = x_btd + precision.einsum('btf,fd->btd', out_btf, o_fd)
        y_btd = rms_norm(x_btd, lp['mlp_norm_d'], cfg.rms_eps)
        gate_btf = precision.einsum('btd,df->btf', y_btd, lp['gate_df'].astype(dt))
        up_btf = precision.einsum('btd,df->btf', y_btd, lp['up_df'].astype(dt))
        x_btd = x_btd + precision.einsum(
            'btf,fd->btd', jax.nn.silu(gate_btf) * up_btf, lp['down_fd'].astype(dt)
        )
    return rms_norm(x_btd, params['norm_d'], cfg.rms_eps), (tuple(new_k), tuple(new_v))


def logits(cfg: DFlashConfig, hidden_btd: jax.Array, head_vd: jax.Array) -> jax.Array:
    """The target's lm head on the block's output, with the optional multiplier and soft
    cap: [B, T, V] fp32."""
    dt = jnp.dtype(cfg.dtype)
    out_btv = precision.einsum('btd,vd->btv', hidden_btd, head_vd.astype(dt)).astype(jnp.float32)
    out_btv = out_btv * cfg.output_multiplier
    if cfg.logit_softcap > 0:
        out_btv = jnp.tanh(out_btv / cfg.logit_softcap) * cfg.logit_softcap
    return out_btv
