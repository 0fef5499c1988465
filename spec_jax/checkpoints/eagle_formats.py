"""EAGLE-3 heads on disk: the official layout and the speculators layout (docs/eagle3.md §3).

Official (SafeAILab/EAGLE, SpecForge): `fc.weight [D, 3*D_t]`, `midlayer.*` (a Llama layer
with `hidden_norm`, q/k/v in-dim 2D), `norm.weight`, `lm_head.weight [U, D]`, `d2t [U]`
int64, `t2d [V]` bool, optional `embed_tokens.weight`; config.json is a LlamaConfig with
`draft_vocab_size` (no rope_theta means the HF default 10000).

Speculators (vllm-project/speculators): `layers.0.*` instead of `midlayer.*`, optional
`fc.bias`; config.json has `speculators_model_type: eagle3`, a nested
`transformer_layer_config`, `draft_vocab_size`, `norm_before_residual`, `target_hidden_size`
and `eagle_aux_hidden_state_layer_ids` (layer OUTPUT ids: HF index = id + 1).

EAGLE-3.1 (either layout): `fc_norm.{i}.weight [D_t]`, one RMSNorm per tap i (the layout of
vLLM #42764), present iff the head normalises its taps (`fc_norm`); `norm_output` adds no
tensor (config.json only, `eagle_config.flag`).

The format is detected from the tensors (`midlayer.` vs `layers.0.` prefixes), shapes are
validated against the config and, when given, the target; every mismatch raises
`CheckpointError` naming the tensor and both sizes. config.json: `eagle_config`.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from spec_jax.checkpoints.convert import CheckpointError
from spec_jax.checkpoints.eagle_config import (
    FORMATS,
    OFFICIAL,
    SPECULATORS,
    config_from_json,
    config_to_json,
    flag,
)
from spec_jax.checkpoints.hf import open_safetensors
from spec_jax.models.config import ModelConfig
from spec_jax.models.eagle3 import Eagle3Config, Eagle3Head

__all__ = [
    'FORMATS',
    'OFFICIAL',
    'SPECULATORS',
    'config_from_json',
    'config_to_json',
    'detect_format',
    'head_to_state',
    'load_head',
    'read_state',
    'save_head',
    'state_to_head',
]

# our midlayer path -> HF sub-name (after the `midlayer.` / `layers.0.` prefix)
_LAYER_NAMES = {
    'hidden_norm/scale': 'hidden_norm.weight',
    'input_norm/scale': 'input_layernorm.weight',
    'q_xnh': 'self_attn.q_proj.weight',
    'k_xkh': 'self_attn.k_proj.weight',
    'v_xkh': 'self_attn.v_proj.weight',
    'o_nhd': 'self_attn.o_proj.weight',
    'mlp_norm/scale': 'post_attention_layernorm.weight',
    'gate_df': 'mlp.gate_proj.weight',
    'up_df': 'mlp.up_proj.weight',
    'down_fd': 'mlp.down_proj.weight',
}


def _prefix(fmt: str) -> str:
    return 'midlayer.' if fmt == OFFICIAL else 'layers.0.'


def _fc_norm_names(num_taps: int) -> list[str]:
    return [f'fc_norm.{i}.weight' for i in range(num_taps)]


def detect_format(names) -> str:
    """'official' or 'speculators' from tensor names; CheckpointError when neither."""
    names = set(names)
    has_mid = any(n.startswith('midlayer.') for n in names)
    has_layers = any(n.startswith('layers.0.') for n in names)
    if 'fc.weight' not in names:
        raise CheckpointError(
            'not an EAGLE-3 head: no fc.weight (EAGLE-3 heads project the 3 target taps with fc)'
        )
    if has_mid == has_layers:
        raise CheckpointError(
            'not an EAGLE-3 head: expected midlayer.* (official) or '
            'layers.0.* (speculators) tensors, found '
            f'{"both" if has_mid else "neither"}'
        )
    return OFFICIAL if has_mid else SPECULATORS


# ---- params <-> state dict --------------------------------------------------------------


def head_to_state(head: Eagle3Head, fmt: str = OFFICIAL) -> dict[str, np.ndarray]:
    """HF-named numpy tensors (torch layout: [out, in]) of a head in format `fmt`."""
    if fmt not in FORMATS:
        raise ValueError(f'format must be one of {FORMATS}, got {fmt!r}')
    cfg, p = head.cfg, head.params
    d, n, k, h = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    mid = p['midlayer']
    get = {
        'hidden_norm/scale': mid['hidden_norm']['scale'],
        'input_norm/scale': mid['input_norm']['scale'],
        'mlp_norm/scale': mid['mlp_norm']['scale'],
        'q_xnh': np.asarray(mid['q_xnh']).reshape(2 * d, n * h).T,
        'k_xkh': np.asarray(mid['k_xkh']).reshape(2 * d, k * h).T,
        'v_xkh': np.asarray(mid['v_xkh']).reshape(2 * d, k * h).T,
        'o_nhd': np.asarray(mid['o_nhd']).reshape(n * h, d).T,
        'gate_df': np.asarray(mid['gate_df']).T,
        'up_df': np.asarray(mid['up_df']).T,
        'down_fd': np.asarray(mid['down_fd']).T,
    }
    pre = _prefix(fmt)
    state = {pre + _LAYER_NAMES[k_]: np.ascontiguousarray(np.asarray(v)) for k_, v in get.items()}
    state['fc.weight'] = np.ascontiguousarray(np.asarray(p['fc_xd']).T)
    state['norm.weight'] = np.asarray(p['norm']['scale'])
    state['lm_head.weight'] = np.asarray(p['lm_head_ud'])
    state['d2t'] = np.asarray(head.d2t).astype(np.int64)
    state['t2d'] = np.asarray(head.t2d).astype(bool)
    if cfg.own_embedding:
        state['embed_tokens.weight'] = np.asarray(p['embed_vd'])
    if cfg.fc_norm:
        for name, scale in zip(_fc_norm_names(cfg.num_taps), np.asarray(p['fc_norm_ed'])):
            state[name] = np.ascontiguousarray(scale)
    return state


def state_to_head(cfg: Eagle3Config, state: dict, dtype: str = 'float32') -> Eagle3Head:
    """Builds an Eagle3Head from HF-named tensors (either format), validating every shape.

    An `fc_norm.*` tensor turns `cfg.fc_norm` on (EAGLE-3.1); `cfg.fc_norm` then needs all E.

    Raises:
      CheckpointError: a missing tensor (d2t/t2d and fc_norm.i included) or a shape that does
        not match.
    """
    fmt = detect_format(state)
    if not cfg.fc_norm and any(name.startswith('fc_norm.') for name in state):
        cfg = cfg.replace(fc_norm=True)
    pre = _prefix(fmt)
    d, n, k, h, f = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_width
    x = 2 * d
    want = {
        'fc.weight': (d, cfg.num_taps * cfg.target_width),
        'norm.weight': (d,),
        'lm_head.weight': (cfg.draft_vocab_size, d),
        pre + 'hidden_norm.weight': (d,),
        pre + 'input_layernorm.weight': (d,),
        pre + 'post_attention_layernorm.weight': (d,),
        pre + 'self_attn.q_proj.weight': (n * h, x),
        pre + 'self_attn.k_proj.weight': (k * h, x),
        pre + 'self_attn.v_proj.weight': (k * h, x),
        pre + 'self_attn.o_proj.weight': (d, n * h),
        pre + 'mlp.gate_proj.weight': (f, d),
        pre + 'mlp.up_proj.weight': (f, d),
        pre + 'mlp.down_proj.weight': (d, f),
    }
    if cfg.fc_norm:  # EAGLE-3.1: one RMSNorm per tap, over the target's width.
        want.update({name: (cfg.target_width,) for name in _fc_norm_names(cfg.num_taps)})
    if cfg.draft_vocab_size != cfg.vocab_size or 'd2t' in state:
        want['d2t'] = (cfg.draft_vocab_size,)
        want['t2d'] = (cfg.vocab_size,)
    missing = [name for name in want if name not in state]
    if missing:
        hint = ''
        if 'd2t' in missing or 't2d' in missing:
            hint = (
                f' (a reduced draft vocabulary of {cfg.draft_vocab_size} < '
                f'{cfg.vocab_size} needs d2t and t2d to map draft ids to target ids)'
            )
        elif any(name.startswith('fc_norm.') for name in missing):
            hint = (
                f' (an EAGLE-3.1 fc_norm head has one fc_norm.i.weight per tap, i < {cfg.num_taps})'
            )
        raise CheckpointError(f'EAGLE-3 head ({fmt} layout) lacks {missing}{hint}')
    # A tensor this loader does not model (q/k/v biases, a norm before fc, another layer)
    # would be dropped silently and change the head's outputs.
    unknown = sorted(set(state) - set(want) - {'fc.bias', 'embed_tokens.weight'})
    if unknown:
        raise CheckpointError(
            f'EAGLE-3 head ({fmt} layout) has tensors this loader does not support: {unknown}'
        )
    for name, shape in want.items():
        got = tuple(np.shape(state[name]))
        if got != shape:
            what = ''
            if name == 'fc.weight':
                what = (
                    f': fc in-dim must be {cfg.num_taps} taps x target width '
                    f'{cfg.target_width} = {shape[1]}'
                )
            elif name.startswith('fc_norm.'):
                what = f': one RMSNorm scale over a tap of target width {cfg.target_width}'
            raise CheckpointError(f'{name} has shape {got}, expected {shape}{what}')
    if 'fc.bias' in state and np.any(np.asarray(state['fc.bias']) != 0):
        raise CheckpointError('fc.bias is nonzero: heads with an fc bias are not supported')
    npd = np.dtype(jnp.dtype(dtype))

    def arr(name):
        return jnp.asarray(np.asarray(state[name]).astype(npd))

    def t(name):
        return np.asarray(state[name]).astype(npd).T

    mid = {
        'hidden_norm': {'scale': arr(pre + 'hidden_norm.weight')},
        'input_norm': {'scale': arr(pre + 'input_layernorm.weight')},
        'mlp_norm': {'scale': arr(pre + 'post_attention_layernorm.weight')},
        'q_xnh': jnp.asarray(t(pre + 'self_attn.q_proj.weight').reshape(x, n, h)),
        'k_xkh': jnp.asarray(t(pre + 'self_attn.k_proj.weight').reshape(x, k, h)),
        'v_xkh': jnp.asarray(t(pre + 'self_attn.v_proj.weight').reshape(x, k, h)),
        'o_nhd': jnp.asarray(t(pre + 'self_attn.o_proj.weight').reshape(n, h, d)),
        'gate_df': jnp.asarray(t(pre + 'mlp.gate_proj.weight')),
        'up_df': jnp.asarray(t(pre + 'mlp.up_proj.weight')),
        'down_fd': jnp.asarray(t(pre + 'mlp.down_proj.weight')),
    }
    params = {
        'fc_xd': jnp.asarray(t('fc.weight')),
        'midlayer': mid,
        'norm': {'scale': arr('norm.weight')},
        'lm_head_ud': arr('lm_head.weight'),
    }
    if cfg.fc_norm:
        names = _fc_norm_names(cfg.num_taps)
        params['fc_norm_ed'] = jnp.asarray(
            np.stack([np.asarray(state[n]) for n in names]).astype(npd)
        )
    if 'embed_tokens.weight' in state:
        shape = tuple(np.shape(state['embed_tokens.weight']))
        if shape != (cfg.vocab_size, d):
            raise CheckpointError(
                f'embed_tokens.weight has shape {shape}, expected {(cfg.vocab_size, d)}'
            )
        params['embed_vd'] = arr('embed_tokens.weight')
        cfg = cfg.replace(own_embedding=True)
    if 'd2t' in state:
        d2t64 = np.asarray(state['d2t']).astype(np.int64)
        ids = np.arange(cfg.draft_vocab_size) + d2t64
        if ids.size and (ids.min() < 0 or ids.max() >= cfg.vocab_size):
            raise CheckpointError(
                f'd2t maps draft ids outside the target vocabulary [0, {cfg.vocab_size})'
            )
        t2d = np.asarray(state['t2d']).astype(bool)
        if int(t2d.sum()) != cfg.draft_vocab_size or not t2d[ids].all():
            raise CheckpointError('t2d does not mark exactly the target ids that d2t maps to')
        d2t = d2t64.astype(np.int32)
    else:  # Full vocabulary: identity maps.
        d2t = np.zeros(cfg.vocab_size, np.int32)
        t2d = np.ones(cfg.vocab_size, bool)
    return Eagle3Head(cfg, params, jnp.asarray(d2t), jnp.asarray(t2d))


# ---- directories ------------------------------------------------------------------------


def save_head(
    directory: str,
    head: Eagle3Head,
    fmt: str = OFFICIAL,
    dtype: str = 'bfloat16',
    target_name: str = '',
) -> str:
    """Writes config.json + model.safetensors of `head` in format `fmt`."""

    os.makedirs(directory, exist_ok=True)
    state = head_to_state(head, fmt)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == 'bfloat16' else np.dtype(dtype)
    out = {}
    for name, w in state.items():
        out[name] = w if name in ('d2t', 't2d') else np.asarray(w, np.float32).astype(np_dtype)
    save_file(out, os.path.join(directory, 'model.safetensors'), metadata={'format': 'pt'})
    with open(os.path.join(directory, 'config.json'), 'w') as f:
        json.dump(config_to_json(head.cfg, fmt, target_name), f, indent=2)
    return directory


def read_state(directory: str) -> dict[str, np.ndarray]:
    """All tensors of model.safetensors (or sharded safetensors) in `directory` as numpy."""

    where, _ = open_safetensors(directory)
    state = {name: np.array(st.get(name)) for name, st in where.items()}
    return state


def load_head(
    directory: str, target: ModelConfig | None = None, dtype: str = 'float32'
) -> Eagle3Head:
    """Loads an EAGLE-3 head directory (official or speculators layout).

    Args:
      directory: holds config.json and safetensors (or pytorch_model.bin when torch exists).
      target: the target config; when given, widths, vocab and taps are checked against it.
      dtype: parameter dtype.

    Raises:
      CheckpointError: unknown layout, missing tensors (d2t, t2d, fc ...), shape mismatches
        (fc width vs the target's taps, draft vocab larger than the target's).
    """
    path = os.path.join(directory, 'config.json')
    if not os.path.isfile(path):
        raise CheckpointError(f'{directory} has no config.json')
    with open(path) as f:
        config = json.load(f)
    if any(name.endswith('.safetensors') for name in os.listdir(directory)):
        state = read_state(directory)
    elif os.path.isfile(os.path.join(directory, 'pytorch_model.bin')):
        import torch  # Optional: only for .bin heads (the parity extra installs it).

        sd = torch.load(os.path.join(directory, 'pytorch_model.bin'), map_location='cpu')
        state = {
            k: v.float().numpy() if v.is_floating_point() else v.numpy() for k, v in sd.items()
        }
    else:
        raise CheckpointError(f'{directory} has no safetensors or pytorch_model.bin')
    if 'vocab_size' not in (config.get('transformer_layer_config') or config) and target:
        config = dict(config, vocab_size=target.vocab_size)
    cfg = config_from_json(config, target)
    if flag(config, 'fc_norm') is False and any(n.startswith('fc_norm.') for n in state):
        raise CheckpointError(
            f'{directory}: config.json sets fc_norm: false but the head has fc_norm tensors '
            f'{sorted(n for n in state if n.startswith("fc_norm."))}'
        )
    return state_to_head(cfg, state, dtype)
