"""Converted parameters saved with orbax, so a large model is converted once.

Layout of a directory written by `save_orbax`:

    <dir>/model_config.json      the ModelConfig (convert.config_to_dict)
    <dir>/params/                orbax StandardCheckpointer tree of the parameters
    <dir>/tokenizer.json         (optional) the tokenizer, with tokenizer_config.json
"""

from __future__ import annotations

import json
import os

import jax

from spec_jax.checkpoints.convert import CheckpointError, config_from_dict, config_to_dict
from spec_jax.models.config import ModelConfig
from spec_jax.tokenizer import Tokenizer

CONFIG_FILE = 'model_config.json'
PARAMS_DIR = 'params'


def is_orbax_dir(path: str | os.PathLike) -> bool:
    """True for a directory written by `save_orbax`."""
    return os.path.isfile(os.path.join(path, CONFIG_FILE))


def save_orbax(
    path: str | os.PathLike,
    cfg: ModelConfig,
    params: dict,
    tokenizer: Tokenizer | None = None,
    overwrite: bool = False,
) -> str:
    """Writes params (orbax), the config (JSON) and optionally the tokenizer under `path`.

    Args:
      path: the output directory (created; must be empty or absent unless `overwrite`).
      cfg: the model config.
      params: the parameter pytree.
      tokenizer: saved beside the params when given.
      overwrite: replace an existing non-empty directory.

    Returns:
      The absolute path written.
    """
    import orbax.checkpoint as ocp

    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and os.listdir(path) and not overwrite:
        raise CheckpointError(f'{path} exists and is not empty (pass overwrite=True to replace)')
    os.makedirs(path, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(path, PARAMS_DIR), params, force=True)
    ckptr.wait_until_finished()
    with open(os.path.join(path, CONFIG_FILE), 'w') as f:
        json.dump(config_to_dict(cfg), f, indent=2)
    if tokenizer is not None:
        tokenizer.save(path)
    return path


def load_orbax(path: str | os.PathLike, dtype: str | None = None):
    """Reads a directory written by `save_orbax`.

    Args:
      path: the directory.
      dtype: cast parameters (and the config's dtypes) to this dtype; None keeps them.

    Returns:
      LoadedModel(cfg, params, tokenizer); tokenizer is None when none was saved.
    """
    import orbax.checkpoint as ocp

    from spec_jax.checkpoints.loader import LoadedModel
    from spec_jax.models.llama import init_params

    path = os.path.abspath(os.fspath(path))
    if not os.path.exists(path):
        raise FileNotFoundError(f'checkpoint path {path!r} does not exist')
    config_path = os.path.join(path, CONFIG_FILE)
    if not os.path.isfile(config_path):
        raise CheckpointError(f'{path} is not a spec_jax orbax checkpoint (no {CONFIG_FILE})')
    try:
        with open(config_path) as f:
            cfg = config_from_dict(json.load(f))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise CheckpointError(f'bad {config_path}: {e}') from None
    params_dir = os.path.join(path, PARAMS_DIR)
    ckptr = ocp.StandardCheckpointer()
    try:
        saved = ckptr.metadata(params_dir).item_metadata.tree
    except Exception as e:  # orbax raises many types for missing/corrupt trees.
        raise CheckpointError(f'cannot restore the orbax params in {path}: {e}') from None
    # The saved tree must be the one `cfg` describes; dtypes are kept as saved.
    expected = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    got_shapes = jax.tree.map(lambda m: tuple(m.shape), saved)
    want_shapes = jax.tree.map(lambda s: tuple(s.shape), expected)
    if got_shapes != want_shapes:
        raise CheckpointError(
            f'the orbax params in {path} do not match its {CONFIG_FILE} '
            f'(saved {got_shapes}, config wants {want_shapes})'
        )
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(m.shape, m.dtype, sharding=device), saved)
    try:
        params = ckptr.restore(params_dir, target)
    except Exception as e:
        raise CheckpointError(f'cannot restore the orbax params in {path}: {e}') from None
    if dtype is not None and dtype != cfg.param_dtype:
        params = jax.tree.map(lambda x: x.astype(dtype), params)
        cfg = cfg.replace(dtype=dtype, param_dtype=dtype)
    tokenizer = None
    if os.path.isfile(os.path.join(path, 'tokenizer.json')):
        tokenizer = Tokenizer.from_dir(path)
        tokenizer.check_fits(cfg.vocab_size)
    return LoadedModel(cfg, params, tokenizer, source=path)
