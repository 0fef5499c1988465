"""EAGLE-3 heads on disk: the official layout and the speculators layout (docs/eagle3.md §3).

Official (SafeAILab/EAGLE, SpecForge): `fc.weight [D, 3*D_t]`, `midlayer.*` (a Llama layer
with `hidden_norm`, q/k/v in-dim 2D), `norm.weight`, `lm_head.weight [U, D]`, `d2t [U]`
int64, `t2d [V]` bool, optional `embed_tokens.weight`; config.json is a LlamaConfig with
`draft_vocab_size` (no rope_theta means the HF default 10000).

Speculators (vllm-project/speculators): `layers.0.*` instead of `midlayer.*`, optional
`fc.bias`; config.json has `speculators_model_type: eagle3`, a nested
`transformer_layer_config`, `draft_vocab_size`, `norm_before_residual`, `target_hidden_size`
and `eagle_aux_hidden_state_layer_ids` (layer OUTPUT ids: HF index = id + 1).

The format is detected from the tensors (`midlayer.` vs `layers.0.` prefixes), shapes are
validated against the config and, when given, the target; every mismatch raises
`CheckpointError` naming the tensor and both sizes.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from spec_jax.checkpoints.convert import CheckpointError
from spec_jax.checkpoints.hf import open_safetensors
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.models.eagle3 import Eagle3Config, Eagle3Head

OFFICIAL = 'official'
SPECULATORS = 'speculators'
FORMATS = (OFFICIAL, SPECULATORS)

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
    return state


def state_to_head(cfg: Eagle3Config, state: dict, dtype: str = 'float32') -> Eagle3Head:
    """Builds an Eagle3Head from HF-named tensors (either format), validating every shape.

    Raises:
      CheckpointError: a missing tensor (d2t/t2d included) or a shape that does not match.
    """
    fmt = detect_format(state)
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


# ---- config.json ------------------------------------------------------------------------


def _rope_from(d: dict) -> tuple[float, RopeScaling]:
    params = d.get('rope_parameters') or {}
    theta = float(d.get('rope_theta', params.get('rope_theta', 10000.0)))
    scaling = d.get('rope_scaling') or (
        params if params.get('rope_type') not in (None, 'default') else None
    )
    if not scaling:
        return theta, RopeScaling()
    kind = scaling.get('rope_type', scaling.get('type', 'default'))
    if kind == 'default':
        return theta, RopeScaling()
    if kind == 'llama3':
        return theta, RopeScaling(
            'llama3',
            float(scaling['factor']),
            float(scaling.get('low_freq_factor', 1.0)),
            float(scaling.get('high_freq_factor', 4.0)),
            int(scaling.get('original_max_position_embeddings', 8192)),
        )
    if kind == 'linear':
        return theta, RopeScaling('linear', float(scaling['factor']))
    raise CheckpointError(f'EAGLE-3 head rope scaling {kind!r} is not supported')


def config_from_json(config: dict, target: ModelConfig | None = None) -> Eagle3Config:
    """An Eagle3Config from either layout's config.json (validated against `target`)."""
    if config.get('speculators_model_type') not in (None, 'eagle3'):
        raise CheckpointError(
            f'speculators model type {config["speculators_model_type"]!r} is not eagle3'
        )
    layer = config.get('transformer_layer_config') or config
    if 'hidden_size' not in layer:
        raise CheckpointError('EAGLE-3 config has no hidden_size')
    for option in ('norm_before_fc', 'attention_bias', 'mlp_bias'):
        if config.get(option) or layer.get(option):
            raise CheckpointError(
                f'EAGLE-3 config sets {option}: true, which this loader does not support '
                '(supported: a plain Llama midlayer, optionally norm_before_residual)'
            )
    width = int(layer['hidden_size'])
    heads = int(layer['num_attention_heads'])
    vocab = int(layer.get('vocab_size', config.get('vocab_size', 0)))
    draft_vocab = int(config.get('draft_vocab_size', config.get('truncated_vocab_size', vocab)))
    target_width = int(config.get('target_hidden_size') or layer.get('target_hidden_size') or width)
    theta, scaling = _rope_from(layer)
    ids = config.get('eagle_aux_hidden_state_layer_ids') or (config.get('eagle_config') or {}).get(
        'eagle_aux_hidden_state_layer_ids'
    )
    if ids:
        taps = tuple(int(i) + 1 for i in ids)  # layer OUTPUT ids -> HF hidden_states index
    elif 'spec_jax_taps' in config:
        taps = tuple(config['spec_jax_taps'])
    elif target is not None:
        taps = target.hf_taps()
    else:
        taps = (2, 15, 27)
    if draft_vocab > vocab:
        raise CheckpointError(
            f'draft_vocab_size {draft_vocab} is larger than the target vocab_size {vocab}'
        )
    cfg = Eagle3Config(
        target_width=target_width,
        width=width,
        num_heads=heads,
        num_kv_heads=int(layer.get('num_key_value_heads', heads)),
        head_dim=int(layer.get('head_dim') or width // heads),
        mlp_width=int(layer['intermediate_size']),
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        rms_eps=float(layer.get('rms_norm_eps', 1e-6)),
        rope_theta=theta,
        rope_scaling=scaling,
        taps=taps,
        norm_before_residual=bool(config.get('norm_before_residual', False)),
    )
    if target is not None:
        try:
            cfg.check_target(target)
        except ValueError as e:
            raise CheckpointError(str(e)) from None
    return cfg


def config_to_json(cfg: Eagle3Config, fmt: str = OFFICIAL, target_name: str = '') -> dict:
    """config.json for `cfg` in format `fmt` (loadable by EAGLE/SpecForge or speculators)."""
    layer = {
        'architectures': ['LlamaForCausalLM'],
        'model_type': 'llama',
        'hidden_size': cfg.width,
        'intermediate_size': cfg.mlp_width,
        'num_attention_heads': cfg.num_heads,
        'num_key_value_heads': cfg.num_kv_heads,
        'head_dim': cfg.head_dim,
        'num_hidden_layers': 1,
        'rms_norm_eps': cfg.rms_eps,
        'vocab_size': cfg.vocab_size,
        'hidden_act': 'silu',
        'tie_word_embeddings': False,
        'rope_theta': cfg.rope_theta,
        'max_position_embeddings': 8192,
        'attention_bias': False,
        'mlp_bias': False,
        'torch_dtype': 'bfloat16',
    }
    if cfg.rope_scaling.to_hf():
        layer['rope_scaling'] = cfg.rope_scaling.to_hf()
    aux_ids = [i - 1 for i in cfg.taps]
    if fmt == OFFICIAL:
        out = dict(
            layer,
            architectures=['LlamaForCausalLMEagle3'],
            draft_vocab_size=cfg.draft_vocab_size,
            eagle_config={
                'eagle_aux_hidden_state_layer_ids': aux_ids,
                'use_aux_hidden_state': True,
            },
        )
        if cfg.target_width != cfg.width:
            out['target_hidden_size'] = cfg.target_width
        if cfg.norm_before_residual:
            out['norm_before_residual'] = True
        return out
    if fmt != SPECULATORS:
        raise ValueError(f'format must be one of {FORMATS}, got {fmt!r}')
    return {
        'architectures': ['Eagle3Speculator'],
        'speculators_model_type': 'eagle3',
        'transformer_layer_config': layer,
        'draft_vocab_size': cfg.draft_vocab_size,
        'norm_before_residual': cfg.norm_before_residual,
        'target_hidden_size': cfg.target_width,
        'eagle_aux_hidden_state_layer_ids': aux_ids,
        'embed_requires_grad': False,
        'speculators_config': {
            'algorithm': 'eagle3',
            'proposal_methods': [{'proposal_type': 'greedy', 'speculative_tokens': 5}],
            'default_proposal_method': 'greedy',
            'verifier': {'name_or_path': target_name, 'architectures': ['LlamaForCausalLM']},
        },
    }


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
    return state_to_head(cfg, state, dtype)
