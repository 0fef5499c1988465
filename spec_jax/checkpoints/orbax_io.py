"""Converted parameters saved with orbax, so a large model is converted once, and restored
straight into their shardings.

Layout of a directory written by `save_orbax` or `convert_to_orbax`:

    <dir>/model_config.json      the ModelConfig (convert.config_to_dict), written last
    <dir>/params/                orbax StandardCheckpointer tree of the parameters
    <dir>/tokenizer.json         (optional) the tokenizer, with tokenizer_config.json

`<dir>` is a local path or a URL (gs://bucket/dir): every file operation here goes through
etils.epath (`sources.as_path`), the path layer orbax itself writes through (gs:// by gcsfs;
orbax's array data by tensorstore's own gcs driver), never os.path or shutil.

`convert_to_orbax` streams: each tensor is read, converted, placed in its sharding and
written before the next is read (orbax partial saves), so a model never has to fit in one
host's memory twice; on a mesh over several processes each process reads only the regions
its devices keep and writes its own shards (docs/sharding.md, "Checkpoints").
`load_orbax(..., mesh=)` restores every parameter straight into its NamedSharding by
`spec_jax.sharding`'s rules: each host reads only its shards.
"""

from __future__ import annotations

import json
import os
import tempfile

import jax
import orbax.checkpoint as ocp
from etils import epath
from jax.sharding import Mesh, NamedSharding
from orbax.checkpoint.experimental.v1 import partial as ocp_partial
from tqdm import tqdm

from spec_jax import distributed, sharding
from spec_jax.checkpoints import sources
from spec_jax.checkpoints.convert import (
    CheckpointError,
    LoadedModel,
    config_from_dict,
    config_to_dict,
    nest,
    param_shapes,
)
from spec_jax.models.config import ModelConfig
from spec_jax.tokenizer import Tokenizer

CONFIG_FILE = sources.ORBAX_CONFIG_FILE
PARAMS_DIR = 'params'
# What Tokenizer.save writes and Tokenizer.from_dir reads (copied through a local folder
# when the checkpoint is at a URL).
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'chat_template.jinja',
                   'generation_config.json')  # fmt: skip


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
      path: the output directory, local or a URL (gs://...; created; must be empty or
        absent unless `overwrite`). Params on a mesh over several processes are saved by
        all of them together (call it on every process), each writing its own shards.
      cfg: the model config.
      params: the parameter pytree.
      tokenizer: saved beside the params when given.
      overwrite: replace an existing non-empty directory.

    Returns:
      The path written (absolute, or the URL).
    """
    together = _spans_processes(params)
    out = _output_dir(path, overwrite, together)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(out / PARAMS_DIR, params, force=True)
    ckptr.wait_until_finished()
    _finish(out, cfg, tokenizer, together)
    return os.fspath(out)


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

    Each tensor is placed in its sharding on `mesh` (one device without one) from the
    regions of it this process's devices keep, each read into memory of its own
    (`sources.placed_tensors`: safetensors by `os.preadv` of the region's bytes, GGUF rows
    and quantization blocks copied from the mapped file and dequantized), converted to our
    layout and dtype, written with an orbax partial save, and dropped before the next is
    read. On a mesh over several processes (`hosts='all'`) every process runs this with
    the same arguments: each reads only its devices' regions and orbax writes each
    process's own shards (a replicated shard by one of its holders); process 0 alone
    creates the directory and writes the config and tokenizer, after barriers. The process
    holds one tensor at a time, with the transient copies of moving it: on CPU, where
    device memory is host memory, the regions read and the placed array while placing, and
    while writing the placed array and orbax's own (a host copy, the encoded chunk).
    tests/checkpoints/test_convert.py measures the peak on a model of a few hundred MB.

    Args:
      source: an HF model directory or hub id, or a .gguf file ('embedded': the default).
      path: the output directory, local or a URL (gs://...; created; must be empty or
        absent unless `overwrite`; on several hosts, one they all see).
      dtype: parameter dtype written; None keeps the checkpoint's (HF `torch_dtype`;
        float32 for GGUF).
      mesh: place (and write) every parameter in its sharding by `rules`; divisibility is
        checked before anything is read.
      rules: the sharding rules of the parameters.
      overwrite: replace an existing non-empty directory.
      progress: show a progress bar over the tensors (process 0; each is one orbax partial
        save, about 0.4 s of overhead on CPU: the embedded default's 272 tensors take 2
        minutes).

    Returns:
      The path written (read it back with `load_orbax` or `checkpoints.load`).

    Raises:
      ValueError: several processes without a mesh over all of them (each would write the
        whole checkpoint to the same place).
    """
    together = mesh is not None and mesh.is_multi_process
    if jax.process_count() > 1 and not together:
        raise ValueError(
            f'convert_to_orbax in a job of {jax.process_count()} processes needs a mesh over '
            "all of them (sharding.mesh_config(..., hosts='all')), which they convert "
            f'together; got {"no mesh" if mesh is None else "a mesh of this process alone"}. '
            'Or convert in one process.'
        )
    state = sources.open_source(source, dtype, mapped=False)
    cfg = state.cfg
    shapes = param_shapes(cfg)
    specs = sharding.checked_specs(shapes, mesh, rules)
    _check_apart(state.source, path)
    out = _output_dir(path, overwrite, together)
    staged = out / (PARAMS_DIR + '.partial')
    main = distributed.is_main()
    bar = tqdm(total=len(jax.tree.leaves(shapes)), desc='convert', unit='tensor',
               disable=not (progress and main))  # fmt: skip
    # Not `tqdm(tensors)`: its iterator keeps the previous item alive while the next is read.
    for name, placed in sources.placed_tensors(state, mesh, specs, cfg.param_dtype):
        ocp_partial.save(staged, nest(name, placed))  # Written when it returns: dropped.
        del placed
        bar.update()
    bar.close()
    ocp_partial.finalize(staged)  # With several processes: together, process 0 merges.
    # The finalized tree is `<staged>/state`, a StandardCheckpointer tree: moved in place
    # with the checkpoint's metadata file (which StandardCheckpointer keeps beside it).
    tree, meta = staged / 'state', staged / '_CHECKPOINT_METADATA'
    laid_out = tree.is_dir() and meta.is_file()
    if together:  # Process 0's view, taken by all before it moves anything (a collective).
        laid_out = distributed.from_main(laid_out)
    if not laid_out:
        raise CheckpointError(
            f'orbax {ocp.__version__} finalized the partial saves in {staged} with another '
            f'layout than {tree} and {meta} (the orbax-checkpoint range of setup.cfg has it)'
        )
    if main or not together:
        meta.rename(tree / meta.name)
        tree.rename(out / PARAMS_DIR)
        staged.rmtree()
    if together:
        distributed.barrier(f'convert_to_orbax params:{out}')
    _finish(out, cfg, state.tokenizer, together)
    return os.fspath(out)


def _spans_processes(tree) -> bool:
    """True when some array of `tree` has shards on other processes."""
    return any(not getattr(x, 'is_fully_addressable', True) for x in jax.tree.leaves(tree))


def _check_apart(source: str, out: str | os.PathLike) -> None:
    """CheckpointError when the output would hold or be inside the source (overwriting
    the output would delete what is read); a URL output never overlaps a local source."""
    out = os.fspath(out)
    if '://' in out:
        return
    a, b = os.path.realpath(source), os.path.realpath(out)
    if os.path.commonpath([a, b]) in (a, b):
        raise CheckpointError(f'output {b} overlaps the source {a}: write elsewhere')


def _output_dir(path: str | os.PathLike, overwrite: bool, together: bool) -> epath.Path:
    """`path` (`sources.as_path`) created empty; an existing non-empty one is replaced only
    with `overwrite`, else CheckpointError. `together` (every process of a job writes
    one checkpoint): all take process 0's view of the directory and raise alike, process 0
    alone changes it, and all wait until it has."""
    out = sources.as_path(path)
    busy = out.exists() and any(True for _ in out.iterdir())
    if together:
        busy = distributed.from_main(busy)
    if busy and not overwrite:
        raise CheckpointError(f'{out} exists and is not empty (pass overwrite=True to replace)')
    if distributed.is_main() or not together:
        if busy:
            out.rmtree()
        out.mkdir(parents=True, exist_ok=True)
    if together:
        distributed.barrier(f'orbax output:{out}')
    return out


def _finish(out: epath.Path, cfg: ModelConfig, tokenizer: Tokenizer | None, together: bool):
    """The tokenizer, then the config: a directory is a checkpoint once its config is there
    (`is_orbax_dir`), so a conversion killed midway never passes for one. `together`:
    process 0 writes them and every process returns once they are written."""
    if distributed.is_main() or not together:
        if tokenizer is not None:
            _save_tokenizer(tokenizer, out)
        (out / CONFIG_FILE).write_text(json.dumps(config_to_dict(cfg), indent=2))
    if together:
        distributed.barrier(f'orbax config:{out}')


def _save_tokenizer(tokenizer: Tokenizer, out: epath.Path) -> None:
    """`Tokenizer.save` into `out` (written locally, then copied through epath)."""
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        for name in sorted(os.listdir(tmp)):
            with open(os.path.join(tmp, name), 'rb') as f:
                (out / name).write_bytes(f.read())


def _load_tokenizer(path: epath.Path) -> Tokenizer:
    """`Tokenizer.from_dir` of the checkpoint's tokenizer files (copied to a local folder
    first: the tokenizers library reads local files only)."""
    with tempfile.TemporaryDirectory() as tmp:
        for name in TOKENIZER_FILES:
            if (path / name).is_file():
                with open(os.path.join(tmp, name), 'wb') as f:
                    f.write((path / name).read_bytes())
        return Tokenizer.from_dir(tmp)


def load_orbax(
    path: str | os.PathLike,
    dtype: str | None = None,
    mesh: Mesh | None = None,
    rules: sharding.ShardingRules = sharding.RULES,
):
    """Reads a directory written by `save_orbax` or `convert_to_orbax`.

    Args:
      path: the directory, local or a URL (gs://...).
      dtype: cast parameters (and the config's dtypes) to this dtype as they are read;
        None keeps them.
      mesh: restore every parameter straight into its NamedSharding on `mesh` by `rules`
        (each device reads its slice; divisibility checked first, a ValueError naming the
        array, the axis and the sizes); None: the first local device.
      rules: the sharding rules of the parameters.

    Returns:
      LoadedModel(cfg, params, tokenizer); tokenizer is None when none was saved.
    """
    path = sources.as_path(path)
    if not path.exists():
        raise FileNotFoundError(f'checkpoint path {os.fspath(path)!r} does not exist')
    config_path = path / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointError(f'{path} is not a spec_jax orbax checkpoint (no {CONFIG_FILE})')
    try:
        cfg = config_from_dict(json.loads(config_path.read_text()))
    except (json.JSONDecodeError, TypeError, ValueError) as e:
        raise CheckpointError(f'bad {config_path}: {e}') from None
    params_dir = path / PARAMS_DIR
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
    if (path / 'tokenizer.json').is_file():
        tokenizer = _load_tokenizer(path)
        tokenizer.check_fits(cfg.vocab_size)
    return LoadedModel(cfg, params, tokenizer, source=os.fspath(path))


def _is_spec(x) -> bool:
    """True for a PartitionSpec (a leaf of a tree of specs: specs are tuples)."""
    return isinstance(x, jax.sharding.PartitionSpec)
