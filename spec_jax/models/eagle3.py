"""The EAGLE-3 draft head (docs/eagle3.md §1) in Flax.

One call of the head:

    logits_btu, hidden_btd, kv = eagle3_forward(cfg, params, embeds_btd, hidden, positions_bt,
                                                mask_bts, apply_fc=True)

- `hidden` is either the target's taps [B, T, E, D_t] (E = 3: HF hidden_states
  [2, L//2, L-3], concatenated low/mid/high and projected by `fc`; `apply_fc=True`), or the
  head's own previous output [B, T, D] (`apply_fc=False`). The flag is static: the head
  never guesses from widths (the official code's width test misfires on 1xH inputs).
- `embeds_btd` are the TARGET's input embeddings of the paired tokens (the head does not own
  them unless the checkpoint ships `embed_tokens`).
- the single decoder layer ("midlayer") attends with input concat(norm(embed), norm(hidden))
  of width 2D (embedding FIRST), residual = the hidden stream before `hidden_norm`;
  `norm` then `lm_head` over the reduced draft vocabulary U (`draft_vocab_size`);
  `d2t` maps a draft id u to the target id u + d2t[u]; `t2d` marks target ids in U.
- Pairing (docs/eagle3.md §2): feature of position t goes with token t+1 at RoPE position t;
  the output at t predicts token t+2.
- EAGLE-3.1 (docs/eagle3.md §1): `fc_norm` RMS-normalises each tap on its own (scale
  `fc_norm_ed` [E, D_t]) before the concatenation and `fc`; `norm_output` returns the layer
  output after `norm` as the next step's hidden (upstream EAGLE-3 returns it before `norm`).

Attention context: with a KV cache (`kv=(cache_k [R, S, H], cache_v, lengths [B])`, R = B * K)
the new keys are written at slots lengths+t and the mask is [B, T, S] (chain or tree
drafting). Without a cache the T tokens attend each other through a [B, T, T] mask, plus,
for the training-time test, `diag_kv`: keys/values of earlier TTT steps, each attended only
at the same index t (docs/eagle3.md §5). The rows of its attention and cache split over the
mesh by the call's `rules` (default `sharding.DRAFT_RULES`: the batch only, the head's
weights on every device).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from functools import partial

import flax.linen as nn
import jax
import jax.numpy as jnp

from spec_jax import sharding
from spec_jax.models import precision, rope
from spec_jax.models.attention import Rows, attend
from spec_jax.models.cache import write_layer
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.models.llama import RMSNorm, rms_norm

_init = nn.initializers.normal(stddev=0.02)


@dataclasses.dataclass(frozen=True)
class Eagle3Config:
    """Static description of an EAGLE-3 head.

    Attributes:
      target_width: D_t, the target's residual width (fc input is E * D_t).
      width: D, the head's width (usually D_t).
      num_heads, num_kv_heads, head_dim: N, K, H of the midlayer attention.
      mlp_width: F.
      vocab_size: V, the target's vocabulary (size of t2d).
      draft_vocab_size: U, the reduced draft vocabulary (rows of lm_head, size of d2t).
      rms_eps: RMSNorm epsilon.
      rope_theta, rope_scaling: the head's RoPE (official Llama-3.1 head: 10000, none).
      taps: HF hidden_states indices of the target's features (low, mid, high).
      norm_before_residual: residual taken after hidden_norm (speculators option).
      own_embedding: the head ships its own embed_tokens [V, D].
      fc_norm: EAGLE-3.1: an RMSNorm per tap (`fc_norm_ed` [E, D_t]) before `fc`.
      norm_output: EAGLE-3.1: the returned hidden (the next step's input) is `norm`'s output.
      dtype: compute dtype.
    """

    target_width: int
    width: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    mlp_width: int
    vocab_size: int
    draft_vocab_size: int
    rms_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_scaling: RopeScaling = RopeScaling()
    taps: tuple[int, ...] = (2, 15, 27)
    norm_before_residual: bool = False
    own_embedding: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    dtype: str = 'float32'

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f'num_heads {self.num_heads} is not a multiple of num_kv_heads {self.num_kv_heads}'
            )
        if not 0 < self.draft_vocab_size <= self.vocab_size:
            raise ValueError(
                f'draft_vocab_size {self.draft_vocab_size} must be in '
                f'[1, vocab_size {self.vocab_size}]'
            )
        if len(self.taps) != 3:
            raise ValueError(f'EAGLE-3 uses 3 feature taps, got {self.taps}')

    @property
    def num_taps(self) -> int:
        return len(self.taps)

    def replace(self, **changes) -> Eagle3Config:
        return dataclasses.replace(self, **changes)

    @classmethod
    def for_target(cls, target: ModelConfig, draft_vocab_size: int, **changes) -> Eagle3Config:
        """A head shaped like one layer of `target` (the official recipe)."""
        base = dict(
            target_width=target.width,
            width=target.width,
            num_heads=target.num_heads,
            num_kv_heads=target.num_kv_heads,
            head_dim=target.head_dim,
            mlp_width=target.mlp_width,
            vocab_size=target.vocab_size,
            draft_vocab_size=draft_vocab_size,
            rms_eps=target.rms_eps,
            rope_theta=target.rope_theta,
            rope_scaling=target.rope_scaling,
            taps=target.hf_taps(),
            dtype=target.dtype,
        )
        base.update(changes)
        return cls(**base)

    def check_target(self, target: ModelConfig) -> None:
        """Raises ValueError when this head cannot run on `target`'s features."""
        if self.target_width != target.width:
            raise ValueError(
                f'EAGLE-3 head expects target width {self.target_width} (fc in-dim '
                f'{self.num_taps * self.target_width}) but the target has width {target.width}'
            )
        if self.vocab_size != target.vocab_size:
            raise ValueError(
                f'EAGLE-3 head t2d covers {self.vocab_size} target ids but the '
                f'target vocabulary has {target.vocab_size}'
            )
        bad = [i for i in self.taps if not 0 <= i < target.num_layers]
        if bad:
            raise ValueError(
                f"tap layers {bad} are outside the target's {target.num_layers} layers"
            )


class Midlayer(nn.Module):
    """The EAGLE-3 decoder layer with a 2D-wide attention input."""

    cfg: Eagle3Config
    rules: sharding.ShardingRules = sharding.DRAFT_RULES

    @nn.compact
    def __call__(self, embeds_btd, hidden_btd, positions_bt, mask_bts, kv, diag_kv, ctx_kv):
        cfg = self.cfg
        rows = Rows.on_mesh(embeds_btd.shape[0], cfg.num_kv_heads, self.rules)
        dt = jnp.dtype(cfg.dtype)
        d, n, k, h = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        normed_hidden = RMSNorm(cfg.rms_eps, name='hidden_norm')(hidden_btd)
        residual = normed_hidden if cfg.norm_before_residual else hidden_btd
        x_btx = jnp.concatenate(
            [RMSNorm(cfg.rms_eps, name='input_norm')(embeds_btd), normed_hidden], axis=-1
        )
        q_btnh = precision.einsum(
            'btx,xnh->btnh', x_btx, self.param('q_xnh', _init, (2 * d, n, h)).astype(dt)
        )
        k_btkh = precision.einsum(
            'btx,xkh->btkh', x_btx, self.param('k_xkh', _init, (2 * d, k, h)).astype(dt)
        )
        v_btkh = precision.einsum(
            'btx,xkh->btkh', x_btx, self.param('v_xkh', _init, (2 * d, k, h)).astype(dt)
        )
        inv_freq = rope.inverse_frequencies(h, cfg.rope_theta, cfg.rope_scaling)
        q_btnh = rope.apply_rope(q_btnh, positions_bt, inv_freq)
        k_btkh = rope.apply_rope(k_btkh, positions_bt, inv_freq)
        new_kv = (k_btkh, v_btkh)

        if ctx_kv is not None:  # TTT step j >= 1: step-0 keys, then this step on the diagonal.
            keys_rsh, values_rsh = map(rows.keys, ctx_kv)
            diag_kv = (*diag_kv, (k_btkh, v_btkh))
        elif kv is None:
            keys_rsh, values_rsh = rows.keys(k_btkh), rows.keys(v_btkh)
        else:
            keys_rsh, values_rsh, new_kv = write_layer(kv, k_btkh, v_btkh, dt, rows)
        # Earlier TTT steps: one extra key per step, at the same index t (the diagonal).
        diagonal = [(rows.keys(dk), rows.keys(dv)) for dk, dv in diag_kv]
        out_rqh = attend(rows, rows.queries(q_btnh), keys_rsh, values_rsh, mask_bts, diagonal)
        out_btf = rows.outputs(out_rqh, q_btnh.shape[1])
        o_fd = self.param('o_nhd', _init, (n, h, d)).astype(dt).reshape(n * h, d)
        attn = precision.einsum('btf,fd->btd', out_btf, o_fd)
        x_btd = residual + attn
        y_btd = RMSNorm(cfg.rms_eps, name='mlp_norm')(x_btd)
        gate = precision.einsum(
            'btd,df->btf', y_btd, self.param('gate_df', _init, (d, cfg.mlp_width)).astype(dt)
        )
        up = precision.einsum(
            'btd,df->btf', y_btd, self.param('up_df', _init, (d, cfg.mlp_width)).astype(dt)
        )
        down = self.param('down_fd', _init, (cfg.mlp_width, d)).astype(dt)
        x_btd = x_btd + precision.einsum('btf,fd->btd', jax.nn.silu(gate) * up, down)
        return x_btd, new_kv


class Eagle3(nn.Module):
    """[fc_norm] + fc + midlayer + norm + lm_head (reduced vocabulary). See the module
    docstring."""

    cfg: Eagle3Config
    rules: sharding.ShardingRules = sharding.DRAFT_RULES

    @nn.compact
    def __call__(
        self,
        embeds_btd,
        hidden,
        positions_bt,
        mask_bts,
        kv=None,
        diag_kv=(),
        ctx_kv=None,
        apply_fc=True,
        logits_index_bu=None,
    ):
        cfg = self.cfg
        dt = jnp.dtype(cfg.dtype)
        fc_xd = self.param('fc_xd', _init, (cfg.num_taps * cfg.target_width, cfg.width))
        if cfg.fc_norm:
            fc_norm_ed = self.param(
                'fc_norm_ed', nn.initializers.ones, (cfg.num_taps, cfg.target_width)
            )
        if apply_fc:
            b, t = hidden.shape[:2]
            hidden = hidden.astype(dt)
            if cfg.fc_norm:  # Each tap [B, T, E, D_t] normalised on its own D_t axis.
                hidden = rms_norm(hidden, fc_norm_ed, cfg.rms_eps)
            hidden = precision.einsum('btx,xd->btd', hidden.reshape(b, t, -1), fc_xd.astype(dt))
        hidden_btd, new_kv = Midlayer(cfg, self.rules, name='midlayer')(
            embeds_btd.astype(dt),
            hidden.astype(dt),
            positions_bt,
            mask_bts,
            kv,
            tuple(diag_kv),
            ctx_kv,
        )
        norm = RMSNorm(cfg.rms_eps, name='norm')
        if cfg.norm_output:  # EAGLE-3.1: every position's output normed, and fed back so.
            hidden_btd = norm(hidden_btd)
        x_btd = hidden_btd
        if logits_index_bu is not None:  # Logits at the chosen positions only.
            x_btd = jnp.take_along_axis(x_btd, logits_index_bu[:, :, None], axis=1)
        if not cfg.norm_output:
            x_btd = norm(x_btd)
        head_ud = self.param('lm_head_ud', _init, (cfg.draft_vocab_size, cfg.width))
        return _project(cfg, x_btd, head_ud), hidden_btd, new_kv


def _project(cfg: Eagle3Config, x_btd: jax.Array, head_ud: jax.Array) -> jax.Array:
    """The draft-vocabulary head on normed outputs: logits [B, T, U] in fp32."""
    dt = jnp.dtype(cfg.dtype)
    return precision.einsum('btd,ud->btu', x_btd, head_ud.astype(dt)).astype(jnp.float32)


def head_logits(cfg: Eagle3Config, params: dict, hidden_btd: jax.Array) -> jax.Array:
    """The head's logits over its draft vocabulary [B, T, U] (fp32) from its output hidden
    (`eagle3_forward`'s second output): what a call's `logits_index_bu` computes at the
    chosen positions, later and only where needed (a drafter that follows a round without
    drafting skips it)."""
    x_btd = hidden_btd
    if not cfg.norm_output:
        x_btd = rms_norm(x_btd, params['norm']['scale'], cfg.rms_eps)
    return _project(cfg, x_btd, params['lm_head_ud'])


def init_params(cfg: Eagle3Config, key: jax.Array) -> dict:
    """Random head parameters (normal(0.02) weights, unit norms)."""
    return _init_params(cfg, key)


@partial(jax.jit, static_argnums=0)
def _init_params(cfg, key):
    b, t = 1, 1
    embeds = jnp.zeros((b, t, cfg.width))
    taps = jnp.zeros((b, t, cfg.num_taps, cfg.target_width))
    pos = jnp.zeros((b, t), jnp.int32)
    mask = jnp.ones((b, t, t), bool)
    params = Eagle3(cfg).init(key, embeds, taps, pos, mask)['params']
    if cfg.own_embedding:
        params = dict(params, embed_vd=_init(key, (cfg.vocab_size, cfg.width)))
    return params


def eagle3_forward(
    cfg: Eagle3Config,
    params: dict,
    embeds_btd: jax.Array,
    hidden: jax.Array,
    positions_bt: jax.Array,
    mask_bts: jax.Array,
    kv=None,
    diag_kv: Sequence[tuple[jax.Array, jax.Array]] = (),
    ctx_kv: tuple[jax.Array, jax.Array] | None = None,
    apply_fc: bool = True,
    logits_index_bu: jax.Array | None = None,
    rules: sharding.ShardingRules = sharding.DRAFT_RULES,
):
    """One head call (not jitted itself: jit the caller).

    Args:
      cfg: the head config.
      params: the head parameters.
      embeds_btd: target input embeddings of the paired tokens [B, T, D].
      hidden: target taps [B, T, E, D_t] (apply_fc=True) or head outputs [B, T, D].
      positions_bt: RoPE positions [B, T] (the feature's position).
      mask_bts: [B, T, S] with a cache, [B, T, T] without.
      kv: None, or (cache_k [R, S, H], cache_v [R, S, H], lengths [B]) (R = B * K).
      diag_kv: earlier TTT steps' (k [B, T, K, H], v [B, T, K, H]) (no cache only).
      ctx_kv: TTT steps >= 1: the step-0 (k, v) [B, T, K, H] attended through `mask_bts`
        instead of this call's own keys, which then join `diag_kv` (the diagonal).
      apply_fc: project `hidden` with fc (target taps) or not (the head's own output).
      logits_index_bu: optional [B, U'] indices into T: logits only there (the draft-vocab
        head is the head's largest matmul); the output hidden keeps every position.
      rules: how the rows of its attention and cache split over the current mesh (the
        cache's, `cache.empty_layer(..., rules)`).

    Returns:
      (logits over the draft vocab [B, T or U', U] fp32, output hidden [B, T, D] (before
       `norm`; after it with `cfg.norm_output`),
       the updated cache tuple, or this call's (k [B, T, K, H], v [B, T, K, H]) without one).
    """
    params = {k: v for k, v in params.items() if k != 'embed_vd'}
    return Eagle3(cfg, rules).apply(
        {'params': params},
        embeds_btd,
        hidden,
        positions_bt,
        mask_bts,
        kv,
        tuple(diag_kv),
        ctx_kv,
        apply_fc,
        logits_index_bu,
    )


def init_from_target(cfg: Eagle3Config, params: dict, target_params: dict, draft_ids_u) -> dict:
    """Starts the head in the target's output space: lm_head = the target's head rows of the
    draft vocabulary, norm = the target's final norm, fc = identity on the high tap (when
    D == D_t; small noise elsewhere). Only the midlayer has to learn the one-token shift.
    """
    import numpy as np

    p = jax.tree.map(np.array, params)
    head_vd = target_params.get('lm_head_vd', target_params['embed_vd'])
    p['lm_head_ud'] = np.asarray(head_vd)[np.asarray(draft_ids_u)].astype(np.float32)
    p['norm']['scale'] = np.asarray(target_params['final_norm']['scale'], np.float32)
    if cfg.width == cfg.target_width:
        d = cfg.width
        fc = p['fc_xd'] * 0.1
        fc[(cfg.num_taps - 1) * d :] += np.eye(d, dtype=np.float32)
        p['fc_xd'] = fc
    return jax.tree.map(jnp.asarray, p)


def embed(cfg: Eagle3Config, params: dict, target_embed_vd: jax.Array, tokens_bt: jax.Array):
    """Token embeddings for the head: its own table when it ships one, else the target's."""
    table = params['embed_vd'] if cfg.own_embedding else target_embed_vd
    return table[tokens_bt].astype(jnp.dtype(cfg.dtype))


def draft_to_target(d2t_u: jax.Array, draft_ids: jax.Array) -> jax.Array:
    """Maps draft-vocab ids to target ids: u + d2t[u]."""
    return draft_ids + d2t_u[draft_ids]


def vocab_maps(used_target_ids, vocab_size: int):
    """(d2t [U] int32 offsets, t2d [V] bool) for a set of target ids (sorted ascending)."""
    import numpy as np

    used = np.unique(np.asarray(used_target_ids, np.int64))
    if used.size and (used[0] < 0 or used[-1] >= vocab_size):
        raise ValueError(f'draft vocabulary ids must be in [0, {vocab_size})')
    d2t = (used - np.arange(used.size)).astype(np.int32)
    t2d = np.zeros(vocab_size, bool)
    t2d[used] = True
    return d2t, t2d


def draft_vocab_from_counts(counts_v, draft_vocab_size: int, always=()):
    """The `draft_vocab_size` most frequent target ids (ties: lower id), plus `always`
    (e.g. stop tokens), sorted ascending (EAGLE-3 `scandata`)."""
    import numpy as np

    counts = np.asarray(counts_v, np.float64).copy()
    if draft_vocab_size > counts.size:
        raise ValueError(
            f'draft vocab {draft_vocab_size} is larger than the target vocab {counts.size}'
        )
    for i in always:
        counts[i] = np.inf
    order = np.lexsort((np.arange(counts.size), -counts))
    return np.sort(order[:draft_vocab_size])


@dataclasses.dataclass
class Eagle3Head:
    """A loaded or trained head: config, parameters, and the vocabulary maps.

    Attributes:
      cfg: the head config.
      params: trainable parameters.
      d2t: [U] int32 offsets (target id = u + d2t[u]).
      t2d: [V] bool, target ids inside the draft vocabulary.
    """

    cfg: Eagle3Config
    params: dict
    d2t: jax.Array
    t2d: jax.Array

    @property
    def draft_ids_u(self) -> jax.Array:
        """The target id of each draft id [U]."""
        return jnp.arange(self.cfg.draft_vocab_size) + jnp.asarray(self.d2t)
