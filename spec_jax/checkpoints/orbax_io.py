"""Converted parameters saved with orbax, so a large model is converted once, and restored
straight into their shardings.

Layout of a directory written by `save_orbax` or `convert_to_orbax`:

    <dir>/model_config.json      the ModelConfig (convert.config_to_dict), written last
    <dir>/params/                orbax StandardCheckpointer tree of the parameters
    <dir>/tokenizer.json         (optional) the tokenizer, with tokenizer_config.json

`convert_to_orbax` streams: each tensor is read, converted, placed in its sharding and
written before the next is read (orbax partial saves), so a model never has to fit in one
host's memory twice (docs/sharding.md, "Checkpoints"). `load_orbax(..., mesh=)` restores
every parameter straight into its NamedSharding by `spec_jax.sharding`'s rules: each host
reads only its shards.
"""

from __future__ import annotations

import json
import os
import shutil

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from orbax.checkpoint.experimental.v1 import partial as ocp_partial
from tqdm import tqdm

from spec_jax import sharding
from spec_jax.checkpoints import sources
from spec_jax.checkpoints.convert import (
    CheckpointError,
    LoadedModel,
    config_from_dict,
    config_to_dict,
    converted_tensors,
    leaf_at,
    nest,
    param_shapes,
)
from spec_jax.models.config import ModelConfig
from spec_jax.tokenizer import Tokenizer

CONFIG_FILE = sources.ORBAX_CONFIG_FILE
PARAMS_DIR = 'params'


is_orbax_dir = sources.is_orbax_dir


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
    path = _output_dir(path, overwrite)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(path, PARAMS_DIR), params, force=True)
    ckptr.wait_until_finished()
    _finish(path, cfg, tokenizer)
    return path


def convert_to_orbax(
    source: str | os.PathLike,
    path: str | os.PathLike,
    dtype: str | None = None,
    mesh: Mesh | None = None,
    rules: sharding.ShardingRules = sharding.RULES,
    overwrite: bool = False,
    progress: bool = True,
) -> str:
    """Converts a Hugging Face directory (or hub id) or a GGUF file into an orbax checkpoint,
    one tensor at a time.

    Each HF tensor is read into memory of its own (never a view of a mapped file; GGUF
    tensors are dequantized from the mapped file, see `sources.open_source`), converted
    to our layout and dtype, placed in its sharding on `mesh` (one device without one),
    written with an orbax partial save, and dropped before the next is read. So the process
    holds one tensor at a time, with the transient copies of moving it: on CPU, where
    device memory is host memory, the read buffer and the placed array while placing, and
    while writing the placed array and orbax's own (a host copy, the encoded chunk).
    tests/checkpoints/test_convert.py measures the peak on a model of a few hundred MB.

    Args:
      source: an HF model directory or hub id, or a .gguf file ('embedded': the default).
      path: the output directory (created; must be empty or absent unless `overwrite`).
      dtype: parameter dtype written; None keeps the checkpoint's (HF `torch_dtype`;
        float32 for GGUF).
      mesh: place (and write) every parameter in its sharding by `rules`; divisibility is
        checked before anything is read.
      rules: the sharding rules of the parameters.
      overwrite: replace an existing non-empty directory.
      progress: show a progress bar over the tensors (each is one orbax partial save,
        about 0.4 s of overhead on CPU: the embedded default's 272 tensors take 2 minutes).

    Returns:
      The absolute path written (read it back with `load_orbax` or `checkpoints.load`).
    """
    state = sources.open_source(source, dtype, mapped=False)
    cfg = state.cfg
    shapes = param_shapes(cfg)
    specs = sharding.checked_specs(shapes, mesh, rules)
    _check_apart(state.source, path)
    path = _output_dir(path, overwrite)
    staged = os.path.join(path, PARAMS_DIR + '.partial')
    bar = tqdm(total=len(jax.tree.leaves(shapes)), desc='convert', unit='tensor',
               disable=not progress)  # fmt: skip
    # Not `tqdm(tensors)`: its iterator keeps the previous item alive while the next is read.
    for name, w in converted_tensors(cfg, state.read, state.names, cfg.param_dtype):
        placed = _place(w, mesh, leaf_at(specs, name))
        del w
        ocp_partial.save(staged, nest(name, placed))  # Written when it returns: dropped.
        del placed
        bar.update()
    bar.close()
    ocp_partial.finalize(staged)
    # The finalized tree is `<staged>/state`, a StandardCheckpointer tree: moved in place
    # with the checkpoint's metadata file (which StandardCheckpointer keeps beside it).
    tree, meta = os.path.join(staged, 'state'), '_CHECKPOINT_METADATA'
    if not (os.path.isdir(tree) and os.path.isfile(os.path.join(staged, meta))):
        raise CheckpointError(
            f'orbax {ocp.__version__} finalized the partial saves in {staged} with another '
            f'layout than {tree} and {meta} (the orbax-checkpoint range of setup.cfg has it)'
        )
    os.replace(os.path.join(staged, meta), os.path.join(tree, meta))
    os.replace(tree, os.path.join(path, PARAMS_DIR))
    shutil.rmtree(staged)
    _finish(path, cfg, state.tokenizer)
    return path


def _place(w: np.ndarray, mesh: Mesh | None, spec) -> jax.Array:
    """A host array on one device, or on `mesh` by `spec` (each device copies its slice),
    the copy finished (so the host array can go)."""
    if mesh is None:
        return jax.device_put(w, jax.local_devices()[0]).block_until_ready()
    return sharding.put(w, NamedSharding(mesh, spec)).block_until_ready()


def _check_apart(source: str, out: str | os.PathLike) -> None:
    """CheckpointError when the output would hold or be inside the source (overwriting
    the output would delete what is read)."""
    a, b = os.path.realpath(source), os.path.realpath(os.fspath(out))
    if os.path.commonpath([a, b]) in (a, b):
        raise CheckpointError(f'output {b} overlaps the source {a}: write elsewhere')


def _output_dir(path: str | os.PathLike, overwrite: bool) -> str:
    """`path` absolute and created empty (an existing non-empty one is replaced only with
    `overwrite`, else CheckpointError)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.exists(path) and os.listdir(path):
        if not overwrite:
            raise CheckpointError(
                f'{path} exists and is not empty (pass overwrite=True to replace)'
            )
        shutil.rmtree(path)
    os.makedirs(path, exist_ok=True)
    return path


def _finish(path: str, cfg: ModelConfig, tokenizer: Tokenizer | None) -> None:
    """The tokenizer, then the config: a directory is a checkpoint once its config is there
    (`is_orbax_dir`), so a conversion killed midway never passes for one."""
    if tokenizer is not None:
        tokenizer.save(path)
    with open(os.path.join(path, CONFIG_FILE), 'w') as f:
        json.dump(config_to_dict(cfg), f, indent=2)


def load_orbax(
    path: str | os.PathLike,
    dtype: str | None = None,
    mesh: Mesh | None = None,
    rules: sharding.ShardingRules = sharding.RULES,
):
    """Reads a directory written by `save_orbax` or `convert_to_orbax`.

    Args:
      path: the directory.
      dtype: cast parameters (and the config's dtypes) to this dtype as they are read;
        None keeps them.
      mesh: restore every parameter straight into its NamedSharding on `mesh` by `rules`
        (each device reads its slice; divisibility checked first, a ValueError naming the
        array, the axis and the sizes); None: the first local device.
      rules: the sharding rules of the parameters.

    Returns:
      LoadedModel(cfg, params, tokenizer); tokenizer is None when none was saved.
    """
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
    if mesh is None or not mesh.is_multi_process:
        # This process's own restore: with several processes each may load at another
        # time (or not at all, its share done), so orbax must not wait for the others.
        own = jax.process_index()
        options = ocp.options.MultiprocessingOptions(primary_host=own, active_processes={own})
    else:  # A mesh over every host: every process restores its slices together.
        options = ocp.options.MultiprocessingOptions()
    ckptr = ocp.StandardCheckpointer(multiprocessing_options=options)
    try:
        saved = ckptr.metadata(params_dir).item_metadata.tree
    except Exception as e:  # orbax raises many types for missing/corrupt trees.
        raise CheckpointError(f'cannot restore the orbax params in {path}: {e}') from None
    # The saved tree must be the one `cfg` describes; dtypes are kept as saved.
    expected = param_shapes(cfg)
    got_shapes = jax.tree.map(lambda m: tuple(m.shape), saved)
    want_shapes = jax.tree.map(lambda s: tuple(s.shape), expected)
    if got_shapes != want_shapes:
        raise CheckpointError(
            f'the orbax params in {path} do not match its {CONFIG_FILE} '
            f'(saved {got_shapes}, config wants {want_shapes})'
        )
    if mesh is None:
        device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
        placement = jax.tree.map(lambda _: device, expected)
    else:
        specs = sharding.checked_specs(expected, mesh, rules)
        placement = jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=_is_spec)
    target = jax.tree.map(
        lambda m, where: jax.ShapeDtypeStruct(m.shape, dtype or m.dtype, sharding=where),
        saved, placement,
    )  # fmt: skip
    try:
        params = ckptr.restore(params_dir, target)
    except Exception as e:
        raise CheckpointError(f'cannot restore the orbax params in {path}: {e}') from None
    if dtype is not None and dtype != cfg.param_dtype:
        cfg = cfg.replace(dtype=dtype, param_dtype=dtype)
    tokenizer = None
    if os.path.isfile(os.path.join(path, 'tokenizer.json')):
        tokenizer = Tokenizer.from_dir(path)
        tokenizer.check_fits(cfg.vocab_size)
    return LoadedModel(cfg, params, tokenizer, source=path)


def _is_spec(x) -> bool:
    """True for a PartitionSpec (a leaf of a tree of specs: specs are tuples)."""
    return isinstance(x, jax.sharding.PartitionSpec)
