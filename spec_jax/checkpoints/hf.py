"""Hugging Face model directories: config.json + safetensors (single or sharded) + tokenizer.

Supported architectures are listed in ARCHITECTURES. Safetensors are read with a small
memory-mapped reader (numpy + ml_dtypes), so bf16/fp16 checkpoints load without torch and
a corrupt file fails with its name and the reason.
"""

from __future__ import annotations

import glob
import itertools
import json
import logging
import math
import os

import ml_dtypes
import numpy as np
from safetensors.numpy import save_file

from spec_jax.checkpoints import hub
from spec_jax.checkpoints.convert import (
    CheckpointError,
    LoadedModel,
    SliceReader,
    SourceState,
    index_bounds,
    params_to_state,
    state_to_params,
)
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.tokenizer import Tokenizer

log = logging.getLogger(__name__)

# HF `architectures[0]` -> our ModelConfig.family.
ARCHITECTURES = {
    'LlamaForCausalLM': 'llama',
    'Qwen2ForCausalLM': 'qwen2',
    'Qwen3ForCausalLM': 'qwen3',
}
_MODEL_TYPES = {'llama': 'llama', 'qwen2': 'qwen2', 'qwen3': 'qwen3'}

_ST_DTYPES = {
    'F64': np.float64,
    'F32': np.float32,
    'F16': np.float16,
    'BF16': ml_dtypes.bfloat16,
    'F8_E4M3': ml_dtypes.float8_e4m3fn,
    'F8_E5M2': ml_dtypes.float8_e5m2,
    'I64': np.int64,
    'I32': np.int32,
    'I16': np.int16,
    'I8': np.int8,
    'U8': np.uint8,
    'BOOL': np.bool_,
}
_MAX_HEADER = 100 << 20


class SafetensorsFile:
    """A memory-mapped .safetensors file: `keys()` and `get(name) -> np.ndarray` (read-only)."""

    def __init__(self, path: str):
        self.path = path
        size = os.path.getsize(path)

        def corrupt(why):
            return CheckpointError(f'corrupt safetensors file {path}: {why}')

        with open(path, 'rb') as f:
            head = f.read(8)
            if len(head) < 8:
                raise corrupt(f'only {size} bytes, too short for a header')
            n = int.from_bytes(head, 'little')
            if n > min(size - 8, _MAX_HEADER):
                raise corrupt(f'header length {n} does not fit in a {size}-byte file')
            try:
                header = json.loads(f.read(n).decode('utf-8'))
            except (UnicodeDecodeError, json.JSONDecodeError) as e:
                raise corrupt(f'header is not JSON ({e})') from None
        if not isinstance(header, dict):
            raise corrupt('header is not a JSON object')
        header.pop('__metadata__', None)
        data_size = size - 8 - n
        self._entries = {}
        for name, e in header.items():
            try:
                dtype = np.dtype(_ST_DTYPES[e['dtype']])
                shape = tuple(int(s) for s in e['shape'])
                start, end = (int(o) for o in e['data_offsets'])
            except (KeyError, TypeError, ValueError) as err:
                raise corrupt(f'bad header entry for {name!r}: {e!r} ({err!r})') from None
            if (
                not 0 <= start <= end <= data_size
                or end - start != math.prod(shape) * dtype.itemsize
            ):
                raise corrupt(f'tensor {name!r} data offsets {start}..{end} are out of bounds')
            self._entries[name] = (dtype, shape, start, end)
        self._offset = 8 + n
        self._data = np.memmap(path, np.uint8, 'r', offset=8 + n) if data_size else None

    def keys(self) -> list[str]:
        return list(self._entries)

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only view of the mapped file (no copy)."""
        dtype, shape, start, end = self._entries[name]
        return self._data[start:end].view(dtype).reshape(shape)

    def read(self, name: str) -> np.ndarray:
        """The tensor read into memory of its own: freed when dropped, and the file is never
        mapped (a streaming conversion holds one tensor, not the pages of every one read)."""
        dtype, shape, start, _ = self._entries[name]
        with open(self.path, 'rb') as f:
            return np.fromfile(f, dtype, math.prod(shape), offset=self._offset + start).reshape(
                shape
            )

    def shape(self, name: str) -> tuple[int, ...]:
        """The tensor's shape, from the header (nothing read)."""
        return self._entries[name][1]

    def read_slice(self, name: str, index: tuple[slice, ...]) -> np.ndarray:
        """Only the region `index` (a slice per leading axis, step 1) of the tensor, read
        into memory of its own with one `read_at` per contiguous run of its bytes: one for
        a block of rows, one per row for a block of columns. What a host reads of the
        tensors its devices hold a slice of (`sources.place_sliced`)."""
        dtype, shape, start, _ = self._entries[name]
        if not shape:  # A scalar: nothing to slice.
            return self.read(name)
        bounds = index_bounds(index, shape)
        sizes = [hi - lo for lo, hi in bounds]
        out = np.empty(math.prod(sizes) * dtype.itemsize, np.uint8)
        if out.size == 0:
            return out.view(dtype).reshape(sizes)
        # Axes after `cut` are whole: each index of the axes before it is one contiguous run.
        cut = max([i for i, (lo, hi) in enumerate(bounds) if (lo, hi) != (0, shape[i])] or [0])
        strides = [math.prod(shape[i + 1 :]) * dtype.itemsize for i in range(len(shape))]
        run = sizes[cut] * strides[cut]
        base = self._offset + start + bounds[cut][0] * strides[cut]
        with open(self.path, 'rb', buffering=0) as f:
            outer = itertools.product(*(range(lo, hi) for lo, hi in bounds[:cut]))
            for j, at in enumerate(outer):
                offset = base + sum(i * s for i, s in zip(at, strides))
                read_at(f.fileno(), out[j * run : (j + 1) * run], offset, self.path)
        return out.view(dtype).reshape(sizes)


def read_at(fd: int, into: np.ndarray, offset: int, path: str) -> None:
    """Fills the byte array `into` with the file's bytes from `offset` (os.preadv, no copy
    beyond the kernel's); CheckpointError when the file ends first. Every byte a sliced read
    takes from a safetensors file passes here (tests count them)."""
    view, done = memoryview(into), 0
    while done < len(view):
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0:
            raise CheckpointError(f'{path} ends at byte {offset + done}, inside a tensor')
        done += got


def _read_json(path: str, what: str) -> dict:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as e:
        raise CheckpointError(f'{what} {path} is not valid JSON: {e}') from None


def open_safetensors(directory: str) -> tuple[dict[str, SafetensorsFile], list[str]]:
    """Opens the weights of `directory`: (tensor name -> the file holding it, file paths)."""
    index_path = os.path.join(directory, 'model.safetensors.index.json')
    if os.path.isfile(index_path):
        weight_map = _read_json(index_path, 'safetensors index').get('weight_map')
        if not isinstance(weight_map, dict):
            raise CheckpointError(f'safetensors index {index_path} has no "weight_map"')
        files = sorted(set(weight_map.values()))
        missing = [f for f in files if not os.path.isfile(os.path.join(directory, f))]
        if missing:
            raise CheckpointError(f'safetensors index {index_path} names missing shards {missing}')
    elif os.path.isfile(os.path.join(directory, 'model.safetensors')):
        files = ['model.safetensors']
    else:
        files = sorted(
            os.path.basename(p) for p in glob.glob(os.path.join(directory, '*.safetensors'))
        )
        if not files:
            raise CheckpointError(
                f'no safetensors weights in {directory} (model.safetensors or '
                f'model.safetensors.index.json; .bin/.pt weights are not supported)'
            )
    opened = [SafetensorsFile(os.path.join(directory, f)) for f in files]
    where = {}
    for st in opened:
        for name in st.keys():
            where[name] = st
    return where, [st.path for st in opened]


def config_from_hf(config: dict, lm_head_present: bool = False) -> ModelConfig:
    """Our ModelConfig from an HF config.json dict (Llama, Qwen2, Qwen3).

    Args:
      config: the parsed config.json.
      lm_head_present: whether the weights hold `lm_head.weight` (used only when the config
        does not say `tie_word_embeddings`).
    """
    archs = config.get('architectures') or []
    if archs:
        arch = archs[0]
        if arch not in ARCHITECTURES:
            raise CheckpointError(
                f'architecture {arch!r} is not supported; supported architectures: '
                f'{sorted(ARCHITECTURES)}'
            )
        family = ARCHITECTURES[arch]
    else:
        model_type = config.get('model_type')
        if model_type not in _MODEL_TYPES:
            raise CheckpointError(
                f'model_type {model_type!r} (no "architectures") is not supported; supported '
                f'architectures: {sorted(ARCHITECTURES)}'
            )
        family = _MODEL_TYPES[model_type]
    act = config.get('hidden_act', 'silu')
    if act != 'silu':
        raise CheckpointError(f'hidden_act {act!r} is not supported (only silu)')
    if family != 'qwen2' and config.get('attention_bias'):
        raise CheckpointError(f'{family} checkpoints with attention_bias are not supported')
    if config.get('mlp_bias'):
        raise CheckpointError('checkpoints with mlp_bias are not supported')
    if config.get('use_sliding_window'):
        raise CheckpointError('sliding-window attention (use_sliding_window) is not supported')

    try:
        width = int(config['hidden_size'])
        heads = int(config['num_attention_heads'])
        rope = config.get('rope_parameters') or config.get('rope_scaling') or {}
        theta = float(rope.get('rope_theta', config.get('rope_theta', 10000.0)))
        kind = rope.get('rope_type', rope.get('type', 'default'))
        if kind == 'default':
            scaling = RopeScaling()
        elif kind == 'linear':
            scaling = RopeScaling('linear', float(rope['factor']))
        elif kind == 'llama3':
            scaling = RopeScaling(
                'llama3',
                float(rope['factor']),
                float(rope.get('low_freq_factor', 1.0)),
                float(rope.get('high_freq_factor', 4.0)),
                int(rope.get('original_max_position_embeddings', 8192)),
            )
        else:
            raise CheckpointError(
                f'rope type {kind!r} is not supported; supported: default, linear, llama3'
            )
        tie = config.get('tie_word_embeddings')
        return ModelConfig(
            family=family,
            vocab_size=int(config['vocab_size']),
            width=width,
            num_layers=int(config['num_hidden_layers']),
            num_heads=heads,
            num_kv_heads=int(config.get('num_key_value_heads') or heads),
            head_dim=int(config.get('head_dim') or width // heads),
            mlp_width=int(config['intermediate_size']),
            rms_eps=float(config.get('rms_norm_eps', 1e-6)),
            rope_theta=theta,
            rope_scaling=scaling,
            tie_embeddings=(not lm_head_present) if tie is None else bool(tie),
            qkv_bias=family == 'qwen2',
            qk_norm=family == 'qwen3',
            max_position=int(config.get('max_position_embeddings', 8192)),
        )
    except KeyError as e:
        raise CheckpointError(f'config.json lacks the field {e.args[0]!r}') from None


def config_to_hf(cfg: ModelConfig) -> dict:
    """An HF config.json dict (transformers v5 layout, `rope_parameters`) describing `cfg`:
    the inverse of `config_from_hf` (for a float32 checkpoint)."""
    rope = {'rope_type': cfg.rope_scaling.kind, 'rope_theta': cfg.rope_theta}
    if cfg.rope_scaling.kind != 'default':
        rope['factor'] = cfg.rope_scaling.factor
    if cfg.rope_scaling.kind == 'llama3':
        rope.update(
            low_freq_factor=cfg.rope_scaling.low_freq_factor,
            high_freq_factor=cfg.rope_scaling.high_freq_factor,
            original_max_position_embeddings=cfg.rope_scaling.original_max_position,
        )
    return {
        'architectures': [next(a for a, f in ARCHITECTURES.items() if f == cfg.family)],
        'model_type': cfg.family,
        'vocab_size': cfg.vocab_size,
        'hidden_size': cfg.width,
        'num_hidden_layers': cfg.num_layers,
        'num_attention_heads': cfg.num_heads,
        'num_key_value_heads': cfg.num_kv_heads,
        'head_dim': cfg.head_dim,
        'intermediate_size': cfg.mlp_width,
        'rms_norm_eps': cfg.rms_eps,
        'rope_parameters': rope,
        'tie_word_embeddings': cfg.tie_embeddings,
        'max_position_embeddings': cfg.max_position,
        'hidden_act': 'silu',
        'dtype': 'float32',
    }


def save_hf(
    directory: str, cfg: ModelConfig, params, tokenizer: Tokenizer | None, dtype='bfloat16'
) -> dict:
    """Writes `params` as an HF directory (config.json, model.safetensors in `dtype`, the
    tokenizer) that `load_hf` and transformers read; the shipped draft LMs are written so.

    config.json uses the layout both transformers 4 and 5 read: `rope_theta` and, for a
    scaled RoPE, `rope_scaling` (not v5's `rope_parameters`), and `torch_dtype`.

    Returns:
      {'dir': directory, 'bytes': the size of model.safetensors}.
    """
    os.makedirs(directory, exist_ok=True)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == 'bfloat16' else np.dtype(dtype)
    state = params_to_state(cfg, params)
    state = {k: np.asarray(v, np.float32).astype(np_dtype) for k, v in state.items()}
    weights = os.path.join(directory, 'model.safetensors')
    save_file(state, weights, metadata={'format': 'pt'})
    config = config_to_hf(cfg)
    config.pop('dtype')
    config['rope_theta'] = config.pop('rope_parameters')['rope_theta']
    if cfg.rope_scaling.to_hf():
        config['rope_scaling'] = cfg.rope_scaling.to_hf()
    config.update(attention_bias=cfg.qkv_bias, mlp_bias=False, torch_dtype=dtype)
    if tokenizer is not None:
        for key in ('bos', 'eos'):
            token = getattr(tokenizer, f'{key}_token')
            config[f'{key}_token_id'] = tokenizer.token_to_id(token) if token else None
        tokenizer.save(directory)
    with open(os.path.join(directory, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)
    return dict(dir=directory, bytes=os.path.getsize(weights))


def checkpoint_dtype(config: dict) -> str:
    """The dtype the checkpoint was saved in (config `dtype` / `torch_dtype`), else float32."""
    dt = config.get('dtype') or config.get('torch_dtype') or 'float32'
    return dt if dt in ('float32', 'bfloat16', 'float16') else 'float32'


def resolve(path_or_id: str | os.PathLike) -> str:
    """An existing local path as is; a hub id through the hub; otherwise FileNotFoundError."""
    spec = os.fspath(path_or_id)
    if os.path.exists(spec):
        return spec
    if hub.looks_like_hub_id(spec):
        return hub.snapshot(spec)
    raise FileNotFoundError(f'checkpoint path {spec!r} does not exist')


def open_hf(path_or_id: str | os.PathLike, dtype: str | None = 'float32', mapped: bool = True):
    """A Hugging Face model directory (or hub id) opened tensor by tensor.

    Args:
      path_or_id: a directory with config.json + safetensors (+ tokenizer.json), or a hub id.
      dtype: parameter and compute dtype; None keeps the checkpoint's `torch_dtype`.
      mapped: read tensors as views of the mapped files (fast; the pages read stay mapped)
        rather than into memory of their own (`SafetensorsFile.read`).

    Returns:
      convert.SourceState; its tokenizer is None when the directory has no tokenizer.json.
    """
    directory = resolve(path_or_id)
    if not os.path.isdir(directory):
        raise CheckpointError(f'{directory} is not a Hugging Face model directory')
    config_path = os.path.join(directory, 'config.json')
    if not os.path.isfile(config_path):
        raise CheckpointError(f'no config.json in {directory}')
    config = _read_json(config_path, 'config')
    where, _ = open_safetensors(directory)
    cfg = config_from_hf(config, lm_head_present='lm_head.weight' in where)
    dtype = dtype or checkpoint_dtype(config)
    cfg = cfg.replace(dtype=dtype, param_dtype=dtype)

    tokenizer = None
    if os.path.isfile(os.path.join(directory, 'tokenizer.json')):
        tokenizer = Tokenizer.from_dir(directory)
        tokenizer.check_fits(cfg.vocab_size)
    else:
        log.warning('no tokenizer.json in %s: loading the model without a tokenizer', directory)

    def read(name):
        return where[name].get(name) if mapped else where[name].read(name)

    slices = SliceReader(
        shape=lambda name: where[name].shape(name),
        read=lambda name, index: where[name].read_slice(name, index),
    )
    return SourceState(cfg, read, list(where), tokenizer, directory, slices)


def load_hf(path_or_id: str | os.PathLike, dtype: str | None = 'float32'):
    """Loads a Hugging Face model directory (or hub id) into spec_jax.

    Args:
      path_or_id: a directory with config.json + safetensors (+ tokenizer.json), or a hub id.
      dtype: parameter and compute dtype; None keeps the checkpoint's `torch_dtype`.

    Returns:
      LoadedModel(cfg, params, tokenizer); tokenizer is None when the directory has no
      tokenizer.json.
    """
    state = open_hf(path_or_id, dtype)
    params = state_to_params(state.cfg, state.read, state.names, state.cfg.param_dtype)
    return LoadedModel(state.cfg, params, state.tokenizer, source=state.source)
