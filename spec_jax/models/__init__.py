"""The model stack: a Llama-family decoder (Llama 2/3/3.x, Qwen2/2.5, Qwen3, SmolLM2) with
an explicit KV-cache pytree, and the EAGLE-3 draft head.

    from spec_jax import models
    cfg = models.preset('smollm2_135m')
    params = models.init_params(cfg, jax.random.key(0))
    logits_btv, taps, cache = models.forward(cfg, params, tokens_bt, positions_bt, cache,
                                             mask_bts)

Modules: config (ModelConfig, presets), llama (the decoder, `forward`), cache (KVCache:
write, don't commit; masks), attention (grouped-query attention on rows), rope, eagle3 (the
head, its config and vocabulary maps), quant (int8 weights: per-channel scales, dequantized
in the matmul; docs/quantization.md), precision (fp32 dots at 'highest', bf16 at the
default). Parameter names end in their axis letters
(spec_jax/axes.py), which is what their sharding follows (spec_jax/sharding.py).
"""

from spec_jax.models.cache import KVCache, attention_mask, tree_mask
from spec_jax.models.config import FAMILIES, PRESETS, ModelConfig, RopeScaling, preset
from spec_jax.models.eagle3 import Eagle3Config, Eagle3Head, eagle3_forward
from spec_jax.models.llama import causal_forward, forward, init_params

__all__ = [
    'FAMILIES',
    'PRESETS',
    'Eagle3Config',
    'Eagle3Head',
    'KVCache',
    'ModelConfig',
    'RopeScaling',
    'attention_mask',
    'causal_forward',
    'eagle3_forward',
    'forward',
    'init_params',
    'preset',
    'tree_mask',
]
