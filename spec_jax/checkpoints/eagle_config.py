"""EAGLE-3 heads' config.json in either layout (docs/eagle3.md §3): read and write.

Official (SafeAILab/EAGLE, SpecForge): a one-layer LlamaConfig plus `draft_vocab_size` and
`eagle_config.eagle_aux_hidden_state_layer_ids`. Speculators: `speculators_model_type: eagle3`
with the layer's config nested as `transformer_layer_config`. EAGLE-3.1 heads add two
booleans, `fc_norm` and `norm_output` (top level, or inside `eagle_config`); absent means
false, so EAGLE-3 heads read as before (`fc_norm` is also inferred from its tensors when the
head's state is read, `eagle_formats.state_to_head`).
"""

from __future__ import annotations

from spec_jax.checkpoints.convert import CheckpointError
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.models.eagle3 import Eagle3Config

OFFICIAL = 'official'
SPECULATORS = 'speculators'
FORMATS = (OFFICIAL, SPECULATORS)
EAGLE31_FLAGS = ('fc_norm', 'norm_output')


def flag(config: dict, name: str) -> bool | None:
    """An EAGLE-3.1 boolean of config.json (top level, `eagle_config` or the nested layer
    config), None where no place states it; a non-boolean value is a CheckpointError."""
    places = (
        config,
        config.get('eagle_config') or {},
        config.get('transformer_layer_config') or {},
    )
    values = [p[name] for p in places if p.get(name) is not None]
    if not values:
        return None
    bad = [v for v in values if not isinstance(v, bool)]
    if bad:
        raise CheckpointError(f'EAGLE-3 config {name} must be true or false, got {bad[0]!r}')
    if len(set(values)) > 1:
        raise CheckpointError(f'EAGLE-3 config sets {name} both true and false')
    return values[0]


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
        fc_norm=bool(flag(config, 'fc_norm')),
        norm_output=bool(flag(config, 'norm_output')),
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
        out.update({name: True for name in EAGLE31_FLAGS if getattr(cfg, name)})
        return out
    if fmt != SPECULATORS:
        raise ValueError(f'format must be one of {FORMATS}, got {fmt!r}')
    return {
        'architectures': ['Eagle3Speculator'],
        'speculators_model_type': 'eagle3',
        'transformer_layer_config': layer,
        'draft_vocab_size': cfg.draft_vocab_size,
        'norm_before_residual': cfg.norm_before_residual,
        **{name: True for name in EAGLE31_FLAGS if getattr(cfg, name)},
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
