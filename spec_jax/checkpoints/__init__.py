"""Checkpoint loading: GGUF, Hugging Face safetensors, orbax; one entry point `load`.

    from spec_jax import checkpoints
    model = checkpoints.load('embedded')          # SmolLM2-135M-Instruct Q4_1 GGUF
    model = checkpoints.load('/models/Qwen3-0.6B')  # HF directory (or a hub id)
    checkpoints.save_orbax('/ckpt/qwen3', model.cfg, model.params, model.tokenizer)
    checkpoints.save_hf('/out/draft', cfg, params, tokenizer)  # an HF directory
    model = checkpoints.load('/ckpt/qwen3')       # converted once, restored fast
    checkpoints.convert_to_orbax('/models/Llama-3.1-8B', '/ckpt/llama', 'bfloat16', mesh)
    model = checkpoints.load('/ckpt/llama', mesh=mesh)  # each device reads its shards

Every format becomes HF-named numpy tensors first (a *state reader*), and
`convert.state_to_params` builds the parameter tree from those. A GPTQ directory (gptq) is
served dequantized and loads as int8; `load(spec, quantize='int8')` quantizes any source and
`load(spec, scan_layers=True)` stacks the layers (docs/quantization.md).
"""

import os

from spec_jax.checkpoints.convert import (
    CheckpointError,
    HubUnreachableError,
    config_from_dict,
    config_to_dict,
    params_to_state,
    state_to_params,
)
from spec_jax.checkpoints.gguf import embedded_default_path, load_gguf, load_gguf_tokenizer
from spec_jax.checkpoints.hf import ARCHITECTURES, config_from_hf, load_hf, save_hf
from spec_jax.checkpoints.loader import EMBEDDED, LoadedModel, load
from spec_jax.checkpoints.orbax_io import convert_to_orbax, load_orbax, save_orbax

# The drafts shipped in the package for the embedded default (each with its README.md).
SHIPPED_DRAFTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'assets', 'drafts')
DRAFT_LM = os.path.join(SHIPPED_DRAFTS, 'smollm2_135m_draft')  # A distilled draft LM.
EAGLE3_HEAD = os.path.join(SHIPPED_DRAFTS, 'smollm2_135m_eagle3')  # An EAGLE-3 head.
# A DFlash block drafter (`checkpoints.dflash_format.load`), trained briefly (its card).
DFLASH_DRAFTER = os.path.join(SHIPPED_DRAFTS, 'smollm2_135m_dflash')

__all__ = [
    'ARCHITECTURES',
    'DFLASH_DRAFTER',
    'DRAFT_LM',
    'EAGLE3_HEAD',
    'SHIPPED_DRAFTS',
    'EMBEDDED',
    'CheckpointError',
    'HubUnreachableError',
    'LoadedModel',
    'config_from_dict',
    'config_from_hf',
    'config_to_dict',
    'convert_to_orbax',
    'embedded_default_path',
    'load',
    'load_gguf',
    'load_gguf_tokenizer',
    'load_hf',
    'load_orbax',
    'params_to_state',
    'save_hf',
    'save_orbax',
    'state_to_params',
]
