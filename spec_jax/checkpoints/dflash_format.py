"""DFlash drafters on disk, as released (z-lab `DFlashDraftModel`; vLLM and SGLang read the
same files): config.json + safetensors (spec_jax.models.dflash describes the model).

config.json is a Qwen3 config (`hidden_size`, `num_hidden_layers`, heads, `head_dim`,
`intermediate_size`, `rms_norm_eps`, `rope_theta` or `rope_parameters`, `vocab_size`) with
`architectures: ["DFlashDraftModel"]` and `dflash_config: {block_size, mask_token_id,
target_layer_ids}` (older files put these three at the top level; the optional
`input_embedding_scale`, `output_multiplier`, `final_logit_softcapping` too).
`target_layer_ids` are layer OUTPUT ids: HF hidden_states index id + 1 (spec_jax taps).
`is_causal` true makes the block causal; sliding-window layers and DFlash2 (dynamic
convolutions, candidate selector) are refused.

Tensors (torch Linear [out, in]; an optional `model.` prefix is ignored): `fc.weight
[D, E * D]`, `hidden_norm.weight`, `norm.weight`, and per layer i `layers.{i}.`
`input_layernorm.weight`, `post_attention_layernorm.weight`, `self_attn.{q,k,v,o}_proj.weight`,
`self_attn.{q,k}_norm.weight [H]`, `mlp.{gate,up,down}_proj.weight`. No embedding and no lm
head: the drafter reads the target's. A missing, extra or misshapen tensor raises
`CheckpointError` naming it.
"""

from __future__ import annotations

import json
import os

import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from spec_jax.checkpoints.convert import CheckpointError
from spec_jax.checkpoints.eagle_config import _rope_from
from spec_jax.checkpoints.hf import open_safetensors
from spec_jax.models.config import ModelConfig
from spec_jax.models.dflash import DFlashConfig

ARCHITECTURE = 'DFlashDraftModel'
_OPTIONAL = {  # dflash_config key -> DFlashConfig field
    'input_embedding_scale': 'embed_scale',
    'output_multiplier': 'output_multiplier',
    'final_logit_softcapping': 'logit_softcap',
}


def _value(config: dict, name: str, default=None):
    return (config.get('dflash_config') or {}).get(name, config.get(name, default))


def config_from_json(config: dict) -> DFlashConfig:
    """The DFlashConfig of a released config.json dict (CheckpointError when unsupported)."""
    archs = config.get('architectures') or []
    if archs != [ARCHITECTURE]:
        raise CheckpointError(
            f'DFlash config.json architectures {archs}: only [{ARCHITECTURE!r}] is supported '
            '(DFlash2DraftModel adds dynamic convolutions and a candidate selector)'
        )
    if any(t != 'full_attention' for t in config.get('layer_types') or ()):
        raise CheckpointError(
            f'DFlash layer_types {config["layer_types"]}: only full_attention is supported'
        )
    if config.get('attention_bias') or config.get('hidden_act', 'silu') != 'silu':
        raise CheckpointError('DFlash drafters with attention_bias or a non-silu MLP are not '
                              'supported')  # fmt: skip
    ids = _value(config, 'target_layer_ids')
    if not ids:
        raise CheckpointError('DFlash config.json has no dflash_config.target_layer_ids')
    if _value(config, 'mask_token_id') is None:
        raise CheckpointError('DFlash config.json has no dflash_config.mask_token_id')
    theta, scaling = _rope_from(config)
    try:
        width, heads = int(config['hidden_size']), int(config['num_attention_heads'])
        extra = {
            field: float(_value(config, key))
            for key, field in _OPTIONAL.items()
            if _value(config, key) is not None
        }
        return DFlashConfig(
            width=width,
            num_layers=int(config['num_hidden_layers']),
            num_heads=heads,
            num_kv_heads=int(config.get('num_key_value_heads', heads)),
            head_dim=int(config.get('head_dim') or width // heads),
            mlp_width=int(config['intermediate_size']),
            vocab_size=int(config['vocab_size']),
            taps=tuple(int(i) + 1 for i in ids),
            block_size=int(_value(config, 'block_size', 16)),
            mask_token_id=int(_value(config, 'mask_token_id')),
            causal=bool(config.get('is_causal') or False),
            rms_eps=float(config.get('rms_norm_eps', 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            **extra,
        )
    except KeyError as e:
        raise CheckpointError(f'DFlash config.json lacks {e.args[0]!r}') from None
    except ValueError as e:
        raise CheckpointError(f'DFlash config.json: {e}') from None


def config_to_json(cfg: DFlashConfig) -> dict:
    """The released config.json of `cfg`."""
    out = {
        'architectures': [ARCHITECTURE],
        'model_type': 'qwen3',
        'hidden_size': cfg.width,
        'num_hidden_layers': cfg.num_layers,
        'num_attention_heads': cfg.num_heads,
        'num_key_value_heads': cfg.num_kv_heads,
        'head_dim': cfg.head_dim,
        'intermediate_size': cfg.mlp_width,
        'vocab_size': cfg.vocab_size,
        'rms_norm_eps': cfg.rms_eps,
        'rope_theta': cfg.rope_theta,
        'hidden_act': 'silu',
        'attention_bias': False,
        'layer_types': ['full_attention'] * cfg.num_layers,
        'dflash_config': {
            'block_size': cfg.block_size,
            'mask_token_id': cfg.mask_token_id,
            'target_layer_ids': [t - 1 for t in cfg.taps],
            'output_multiplier': cfg.output_multiplier,
            'input_embedding_scale': cfg.embed_scale,
        },
    }
    if cfg.causal:
        out['is_causal'] = True
    if cfg.logit_softcap > 0:
        out['dflash_config']['final_logit_softcapping'] = cfg.logit_softcap
    if cfg.rope_scaling.to_hf():
        out['rope_scaling'] = cfg.rope_scaling.to_hf()
    return out


def _layout(cfg: DFlashConfig):
    """(HF name, params path, HF shape, to-params transform) of every tensor."""
    d, n, k, h, f = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_width
    rows = [
        ('fc.weight', ('fc_xd',), (d, len(cfg.taps) * d), lambda w: w.T),
        ('hidden_norm.weight', ('hidden_norm_d',), (d,), None),
        ('norm.weight', ('norm_d',), (d,), None),
    ]
    for i in range(cfg.num_layers):
        p, lay = f'layers.{i}.', f'layer_{i}'
        rows += [
            (p + 'input_layernorm.weight', (lay, 'attn_norm_d'), (d,), None),
            (p + 'post_attention_layernorm.weight', (lay, 'mlp_norm_d'), (d,), None),
            (p + 'self_attn.q_proj.weight', (lay, 'q_dnh'), (n * h, d),
             lambda w: w.T.reshape(d, n, h)),
            (p + 'self_attn.k_proj.weight', (lay, 'k_dkh'), (k * h, d),
             lambda w: w.T.reshape(d, k, h)),
            (p + 'self_attn.v_proj.weight', (lay, 'v_dkh'), (k * h, d),
             lambda w: w.T.reshape(d, k, h)),
            (p + 'self_attn.o_proj.weight', (lay, 'o_nhd'), (d, n * h),
             lambda w: w.T.reshape(n, h, d)),
            (p + 'self_attn.q_norm.weight', (lay, 'q_norm_h'), (h,), None),
            (p + 'self_attn.k_norm.weight', (lay, 'k_norm_h'), (h,), None),
            (p + 'mlp.gate_proj.weight', (lay, 'gate_df'), (f, d), lambda w: w.T),
            (p + 'mlp.up_proj.weight', (lay, 'up_df'), (f, d), lambda w: w.T),
            (p + 'mlp.down_proj.weight', (lay, 'down_fd'), (d, f), lambda w: w.T),
        ]  # fmt: skip
    return rows


def state_to_params(cfg: DFlashConfig, state: dict, dtype: str = 'float32') -> dict:
    """Drafter params from HF-named tensors; CheckpointError naming a missing, extra or
    misshapen tensor."""
    if state and all(name.startswith('model.') for name in state):
        state = {name[len('model.') :]: w for name, w in state.items()}
    layout = _layout(cfg)
    missing = [name for name, *_ in layout if name not in state]
    if missing:
        raise CheckpointError(f'DFlash checkpoint lacks tensors {missing[:5]}'
                              f'{" ..." if len(missing) > 5 else ""}')  # fmt: skip
    extra = sorted(set(state) - {name for name, *_ in layout})
    if extra:
        raise CheckpointError(
            f'DFlash checkpoint has tensors this {cfg.num_layers}-layer DFlashDraftModel does '
            f'not use: {extra[:5]} (another architecture, or a config.json that does not match)'
        )
    params: dict = {}
    for name, path, shape, to_params in layout:
        w = np.asarray(state[name])
        if w.shape != shape:
            raise CheckpointError(
                f'DFlash tensor {name} has shape {w.shape}; the config says {shape}'
            )
        if not np.issubdtype(w.dtype, np.floating) and w.dtype.name != 'bfloat16':
            raise CheckpointError(f'DFlash tensor {name} has dtype {w.dtype}, not a float')
        w = w.astype(np.float32)
        value = jnp.asarray(w if to_params is None else to_params(w), dtype)
        node = params
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return params


def params_to_state(cfg: DFlashConfig, params: dict) -> dict[str, np.ndarray]:
    """HF-named float32 tensors of drafter params (the inverse of `state_to_params`)."""
    out = {}
    for name, path, shape, _ in _layout(cfg):
        w = params
        for key in path:
            w = w[key]
        w = np.asarray(w, np.float32)
        out[name] = np.ascontiguousarray(w if w.ndim == 1 else w.reshape(-1, shape[0]).T)
    return out


def save(directory: str, cfg: DFlashConfig, params: dict, dtype: str = 'float32') -> None:
    """Writes config.json + model.safetensors of a drafter in the released format, its
    tensors in `dtype` ('float32' or 'bfloat16', the released models')."""
    if dtype not in ('float32', 'bfloat16'):
        raise ValueError(f"dtype={dtype!r}: valid are 'float32', 'bfloat16'")
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == 'bfloat16' else np.dtype(np.float32)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, 'config.json'), 'w') as f:
        json.dump(config_to_json(cfg), f, indent=2)
    state = {k: v.astype(np_dtype) for k, v in params_to_state(cfg, params).items()}
    save_file(state, os.path.join(directory, 'model.safetensors'), metadata={'format': 'pt'})


def load(
    directory: str, target: ModelConfig | None = None, dtype: str = 'float32'
) -> tuple[DFlashConfig, dict]:
    """(config, params) of a released DFlash drafter directory, checked against `target`
    when given (CheckpointError, a ValueError, naming what does not fit)."""
    path = os.path.join(directory, 'config.json')
    if not os.path.isfile(path):
        raise CheckpointError(f'{directory} has no config.json (a DFlash drafter directory)')
    with open(path) as f:
        cfg = config_from_json(json.load(f))
    cfg = DFlashConfig(**{**cfg.__dict__, 'dtype': dtype})
    if target is not None:
        cfg.check_target(target)
    where, _ = open_safetensors(directory)
    state = {name: np.array(st.get(name)) for name, st in where.items()}
    return cfg, state_to_params(cfg, state, dtype)
