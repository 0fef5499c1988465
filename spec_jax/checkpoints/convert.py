"""Hugging Face-named tensors -> the spec_jax parameter tree, shared by every format.

Every checkpoint format is first presented as a *state reader*: a function from an HF tensor
name (`model.layers.3.self_attn.q_proj.weight`) to a numpy array in HF layout ([out, in] for
Linear weights, rotate-half q/k rows). `state_to_params` turns that into the pytree of
`spec_jax.models.llama.init_params`, stacking layers on a leading L axis.

Also here: the errors every loader raises, the ModelConfig <-> JSON helpers, and the two
records every format passes around: `SourceState` (a checkpoint opened tensor by tensor)
and `LoadedModel` (what `checkpoints.load` returns).
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes  # noqa: F401  (registers bfloat16 & co with numpy)
import numpy as np

from spec_jax.models import quant
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.models.llama import LAYERS, init_params, unstack_layers

StateReader = Callable[[str], np.ndarray]

CONFIG_FORMAT = 'spec_jax.ModelConfig/1'


class CheckpointError(ValueError):
    """A checkpoint is missing, corrupt, or does not describe a supported model."""


class HubUnreachableError(CheckpointError, OSError):
    """A hub id was given and the Hugging Face hub cannot be reached."""


@dataclasses.dataclass(frozen=True)
class SliceReader:
    """A checkpoint's tensors read by region, so that a host reads only the slices its
    devices keep (`sources.place_sliced`).

    Attributes:
      shape: HF tensor name -> its shape in HF layout (from the header: nothing read).
      read: (HF tensor name, a slice per axis with step 1) -> that region as a numpy array
        of memory of its own (float32 for GGUF, the file's dtype for safetensors).
    """

    shape: Callable[[str], tuple[int, ...]]
    read: Callable[[str, tuple[slice, ...]], np.ndarray]


def index_bounds(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """[(start, stop)] per axis of `shape` for `index` (slices of step 1, as
    `jax.make_array_from_callback` passes them; missing trailing axes are whole)."""
    if len(index) > len(shape):
        raise ValueError(f'index {index} has more axes than shape {shape}')
    out = []
    for i, size in enumerate(shape):
        s = index[i] if i < len(index) else slice(None)
        if not isinstance(s, slice):
            raise ValueError(f'index {index}: axis {i} is {s!r}, not a slice')
        lo, hi, step = s.indices(size)
        if step != 1:
            raise ValueError(f'index {index}: axis {i} has step {step}; only step 1 is read')
        out.append((lo, max(lo, hi)))
    return out


@dataclasses.dataclass
class SourceState:
    """A checkpoint opened tensor by tensor (nothing read yet): what `state_to_params` and the
    streaming `orbax_io.convert_to_orbax` take.

    Attributes:
      cfg: its config, dtypes set to the dtype asked for.
      read: HF tensor name -> numpy array in HF layout.
      names: the names `read` serves.
      tokenizer: its tokenizer (a spec_jax.tokenizer.Tokenizer), or None.
      source: the file or directory it was opened from.
      slices: the same tensors read by region (None: a format read only whole).
    """

    cfg: ModelConfig
    read: StateReader
    names: list[str]
    tokenizer: Any
    source: str
    slices: SliceReader | None = None


@dataclasses.dataclass
class LoadedModel:
    """A loaded checkpoint.

    Attributes:
      cfg: the model config (static; pass it to spec_jax.models.llama.forward).
      params: the parameter pytree.
      tokenizer: the checkpoint's tokenizer, or None when it ships none.
      source: where it was loaded from (a file or directory path).
    """

    cfg: ModelConfig
    params: dict
    tokenizer: Any  # A spec_jax.tokenizer.Tokenizer, or None.
    source: str = ''


# ---- naming -----------------------------------------------------------------------------


def layer_names(i: int, cfg: ModelConfig) -> dict[str, str]:
    """Our per-layer parameter path ('attn/q_dnh') -> the HF tensor name of layer i."""
    p = f'model.layers.{i}.'
    names = {
        'attn_norm/scale': p + 'input_layernorm.weight',
        'mlp_norm/scale': p + 'post_attention_layernorm.weight',
        'attn/q_dnh': p + 'self_attn.q_proj.weight',
        'attn/k_dkh': p + 'self_attn.k_proj.weight',
        'attn/v_dkh': p + 'self_attn.v_proj.weight',
        'attn/o_nhd': p + 'self_attn.o_proj.weight',
        'mlp/gate_df': p + 'mlp.gate_proj.weight',
        'mlp/up_df': p + 'mlp.up_proj.weight',
        'mlp/down_fd': p + 'mlp.down_proj.weight',
    }
    if cfg.qkv_bias:
        names['attn/q_bias_nh'] = p + 'self_attn.q_proj.bias'
        names['attn/k_bias_kh'] = p + 'self_attn.k_proj.bias'
        names['attn/v_bias_kh'] = p + 'self_attn.v_proj.bias'
    if cfg.qk_norm:
        names['attn/q_norm_h'] = p + 'self_attn.q_norm.weight'
        names['attn/k_norm_h'] = p + 'self_attn.k_norm.weight'
    return names


def expected_names(cfg: ModelConfig) -> list[str]:
    """Every HF tensor name `state_to_params` reads for `cfg`."""
    names = ['model.embed_tokens.weight', 'model.norm.weight']
    if not cfg.tie_embeddings:
        names.append('lm_head.weight')
    for i in range(cfg.num_layers):
        names += list(layer_names(i, cfg).values())
    return names


def _layer_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    d, n, k, h, f = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_width
    return {
        'attn_norm/scale': (d,),
        'mlp_norm/scale': (d,),
        'attn/q_dnh': (d, n, h),
        'attn/k_dkh': (d, k, h),
        'attn/v_dkh': (d, k, h),
        'attn/o_nhd': (n, h, d),
        'mlp/gate_df': (d, f),
        'mlp/up_df': (d, f),
        'mlp/down_fd': (f, d),
        'attn/q_bias_nh': (n, h),
        'attn/k_bias_kh': (k, h),
        'attn/v_bias_kh': (k, h),
        'attn/q_norm_h': (h,),
        'attn/k_norm_h': (h,),
    }


def _hf_to_ours(path: str, w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    """One HF tensor (HF layout) -> our layout for parameter `path`."""
    d, n, k, h = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    if path == 'attn/q_dnh':  # [N*H, D] -> [N, H, D] -> [D, N, H]
        return w.reshape(n, h, d).transpose(2, 0, 1)
    if path in ('attn/k_dkh', 'attn/v_dkh'):
        return w.reshape(k, h, d).transpose(2, 0, 1)
    if path == 'attn/o_nhd':  # [D, N*H] -> [D, N, H] -> [N, H, D]
        return w.reshape(d, n, h).transpose(1, 2, 0)
    if path in ('mlp/gate_df', 'mlp/up_df', 'mlp/down_fd'):
        return w.T
    if path == 'attn/q_bias_nh':
        return w.reshape(n, h)
    if path in ('attn/k_bias_kh', 'attn/v_bias_kh'):
        return w.reshape(k, h)
    return w


def _check_shape(name: str, shape: tuple[int, ...], want: tuple[int, ...]) -> None:
    if tuple(shape) != tuple(want):
        raise CheckpointError(
            f'tensor {name} has shape {tuple(shape)}, expected {tuple(want)} from the config'
        )


def check_available(cfg: ModelConfig, available: Iterable[str]) -> None:
    """CheckpointError naming the tensors `cfg` needs that `available` lacks."""
    available = set(available)
    missing = [name for name in expected_names(cfg) if name not in available]
    if missing:
        shown = ', '.join(missing[:6]) + (' ...' if len(missing) > 6 else '')
        raise CheckpointError(
            f'checkpoint lacks {len(missing)} tensor(s) the {cfg.family} config needs: {shown}'
        )


def _plan(cfg: ModelConfig) -> list[tuple[str, str, str, tuple[int, ...], tuple[int, ...]]]:
    """Every parameter in reading order: (our path 'layer_3/attn/q_dnh', its kind (the
    path within a layer, or the path itself at the top), HF tensor name, HF shape, our
    shape)."""
    v, d, h = cfg.vocab_size, cfg.width, cfg.head_dim
    n, k = cfg.num_heads * h, cfg.num_kv_heads * h
    ours = _layer_shapes(cfg)
    hf_shapes = {
        'attn/q_dnh': (n, d),
        'attn/k_dkh': (k, d),
        'attn/v_dkh': (k, d),
        'attn/o_nhd': (d, n),
        'mlp/gate_df': (cfg.mlp_width, d),
        'mlp/up_df': (cfg.mlp_width, d),
        'mlp/down_fd': (d, cfg.mlp_width),
        'attn/q_bias_nh': (n,),
        'attn/k_bias_kh': (k,),
        'attn/v_bias_kh': (k,),
    }
    plan = [('embed_vd', 'embed_vd', 'model.embed_tokens.weight', (v, d), (v, d)),
            ('final_norm/scale', 'final_norm/scale', 'model.norm.weight', (d,), (d,))]  # fmt: skip
    if not cfg.tie_embeddings:
        plan.append(('lm_head_vd', 'lm_head_vd', 'lm_head.weight', (v, d), (v, d)))
    for i in range(cfg.num_layers):
        for kind, name in layer_names(i, cfg).items():
            plan.append((f'layer_{i}/{kind}', kind, name, hf_shapes.get(kind, ours[kind]),
                         ours[kind]))  # fmt: skip
    return plan


def converted_tensors(
    cfg: ModelConfig, read: StateReader, available: Iterable[str], dtype: str = 'float32'
) -> Iterator[tuple[str, np.ndarray]]:
    """Each parameter of `cfg` as ('layer_3/attn/q_dnh', numpy array in our layout and
    `dtype`), read and converted one tensor at a time (what a streaming conversion holds).

    Every name is checked against `available` before the first read, and every tensor's
    shape against the config as it is read (CheckpointError).
    """
    check_available(cfg, available)
    np_dtype = np.dtype(jnp.dtype(dtype))

    def get(name, shape):
        w = np.asarray(read(name))
        _check_shape(name, w.shape, shape)
        return w

    for path, kind, name, raw_shape, _ in _plan(cfg):
        # No tensor bound to a local: the paused frame keeps none alive.
        yield path, _hf_to_ours(kind, get(name, raw_shape), cfg).astype(np_dtype, copy=False)


def sliced_tensors(
    cfg: ModelConfig, slices: SliceReader, available: Iterable[str], dtype: str = 'float32'
) -> Iterator[tuple[str, tuple[int, ...], Callable[[tuple[slice, ...]], np.ndarray]]]:
    """Each parameter of `cfg` as (path, its shape in our layout, `region(index)`): the
    region `index` (slices of our layout, as `jax.make_array_from_callback` passes them) in
    our layout and `dtype`, reading only the HF tensor's part that `index` covers.

    Our layouts are HF's transposed and with heads split out, so a region of ours is one
    region of HF's: heads n0:n1 of q_dnh [D, N, H] are rows n0*H:n1*H of q_proj [N*H, D],
    of o_nhd [N, H, D] the columns n0*H:n1*H of o_proj [D, N*H]; F of gate_df [D, F] rows
    of gate_proj [F, D], of down_fd [F, D] columns of down_proj [D, F]; vocabulary rows are
    rows. Names are checked against `available` and every HF shape against the config before
    anything is read (CheckpointError).
    """
    check_available(cfg, available)
    plan = _plan(cfg)
    for _, _, name, raw_shape, _ in plan:
        _check_shape(name, slices.shape(name), raw_shape)
    np_dtype = np.dtype(jnp.dtype(dtype))
    for path, kind, name, _, shape in plan:
        yield path, shape, functools.partial(
            _read_region, cfg, kind, name, shape, slices.read, np_dtype
        )


def _read_region(cfg, kind, name, shape, read, np_dtype, index) -> np.ndarray:
    """Region `index` of parameter `kind` ([`shape`], our layout) from HF tensor `name`."""
    b = index_bounds(index, shape)
    h = cfg.head_dim

    def heads(lo, hi):  # Heads lo:hi of an axis of N * H (or K * H) rows or columns.
        return slice(lo * h, hi * h)

    def size(i):
        return b[i][1] - b[i][0]

    if kind in ('attn/q_dnh', 'attn/k_dkh', 'attn/v_dkh'):  # [N*H, D] -> [D, N, H]
        w = read(name, (heads(*b[1]), slice(*b[0])))
        w = w.reshape(size(1), h, size(0)).transpose(2, 0, 1)[:, :, slice(*b[2])]
    elif kind == 'attn/o_nhd':  # [D, N*H] -> [N, H, D]
        w = read(name, (slice(*b[2]), heads(*b[0])))
        w = w.reshape(size(2), size(0), h).transpose(1, 2, 0)[:, slice(*b[1]), :]
    elif kind in ('mlp/gate_df', 'mlp/up_df', 'mlp/down_fd'):  # Transposed.
        w = read(name, (slice(*b[1]), slice(*b[0]))).T
    elif kind in ('attn/q_bias_nh', 'attn/k_bias_kh', 'attn/v_bias_kh'):  # [N*H] -> [N, H]
        w = read(name, (heads(*b[0]),)).reshape(size(0), h)[:, slice(*b[1])]
    else:  # The same layout.
        w = read(name, tuple(slice(*x) for x in b))
    return np.asarray(w).astype(np_dtype, copy=False)


def param_shapes(cfg: ModelConfig) -> dict:
    """The parameter tree of `cfg` as ShapeDtypeStructs (nothing computed)."""
    return jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))


def leaf_at(tree: dict, path: str):
    """The value at the '/'-separated `path` of the nested dict `tree`."""
    for key in path.split('/'):
        tree = tree[key]
    return tree


def nest(path: str, value, tree: dict | None = None) -> dict:
    """`value` put at the '/'-separated `path` of the nested dict `tree` (new if None)."""
    tree = {} if tree is None else tree
    *groups, leaf = path.split('/')
    node = tree
    for g in groups:
        node = node.setdefault(g, {})
    node[leaf] = value
    return tree


def state_to_params(
    cfg: ModelConfig, read: StateReader, available: Iterable[str], dtype: str = 'float32'
) -> dict:
    """Builds the parameter pytree of `cfg` from HF-named tensors.

    Args:
      cfg: the model config (its sizes are checked against every tensor).
      read: HF tensor name -> numpy array in HF layout (any float dtype).
      available: the names `read` can serve (checked up front, so a missing tensor fails
        before anything is converted).
      dtype: parameter dtype of the result.

    Returns:
      The nested dict of jax arrays that `spec_jax.models.llama.forward` takes.
    """
    params: dict = {}
    for path, w in converted_tensors(cfg, read, available, dtype):
        nest(path, jnp.asarray(w), params)
    return params


def params_to_state(cfg: ModelConfig, params: dict) -> dict[str, np.ndarray]:
    """The inverse of `state_to_params`: HF-named numpy tensors in HF layout.

    Useful to export a spec_jax model (e.g. for a transformers parity check). Int8 weights
    are dequantized (HF float tensors; `cfg.param_dtype`) and stacked layers unstacked
    first, so every saver writes the float, per-layer checkpoint a reader expects.
    """
    if LAYERS in params:
        params = unstack_layers(params)
    if cfg.weights == 'int8':
        params = quant.dequantize_params(params, cfg.param_dtype)
    d, n, k, h = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
    state = {
        'model.embed_tokens.weight': np.asarray(params['embed_vd']),
        'model.norm.weight': np.asarray(params['final_norm']['scale']),
    }
    if not cfg.tie_embeddings:
        state['lm_head.weight'] = np.asarray(params['lm_head_vd'])
    inverse = {
        'attn/q_dnh': lambda w: w.transpose(1, 2, 0).reshape(n * h, d),
        'attn/k_dkh': lambda w: w.transpose(1, 2, 0).reshape(k * h, d),
        'attn/v_dkh': lambda w: w.transpose(1, 2, 0).reshape(k * h, d),
        'attn/o_nhd': lambda w: w.transpose(2, 0, 1).reshape(d, n * h),
        'mlp/gate_df': lambda w: w.T,
        'mlp/up_df': lambda w: w.T,
        'mlp/down_fd': lambda w: w.T,
        'attn/q_bias_nh': lambda w: w.reshape(n * h),
        'attn/k_bias_kh': lambda w: w.reshape(k * h),
        'attn/v_bias_kh': lambda w: w.reshape(k * h),
    }
    for i in range(cfg.num_layers):
        for path, name in layer_names(i, cfg).items():
            group, leaf = path.split('/')
            w = np.asarray(params[f'layer_{i}'][group][leaf])
            state[name] = np.ascontiguousarray(inverse.get(path, lambda w: w)(w))
    return state


# ---- config JSON ------------------------------------------------------------------------


def config_to_dict(cfg: ModelConfig) -> dict:
    """A JSON-ready dict of `cfg` (with a format tag)."""
    return {'format': CONFIG_FORMAT, **dataclasses.asdict(cfg)}


def config_from_dict(d: dict) -> ModelConfig:
    """Inverse of `config_to_dict`; unknown keys are an error (a config from the future)."""
    d = dict(d)
    fmt = d.pop('format', CONFIG_FORMAT)
    if fmt != CONFIG_FORMAT:
        raise CheckpointError(f'config format {fmt!r} is not {CONFIG_FORMAT!r}')
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise CheckpointError(f'config has unknown fields {unknown}')
    d['rope_scaling'] = RopeScaling(**d.get('rope_scaling', {}))
    return ModelConfig(**d)
