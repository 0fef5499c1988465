"""A checkpoint opened tensor by tensor (`convert.SourceState`), whatever its format: what
`loader.load` builds parameters from (on the host, or tensor by tensor onto a mesh) and
what `orbax_io.convert_to_orbax` streams; and parameters placed by reading only the
regions this process's devices keep (`placed_tensors`, `place_sliced`).

Regions, by format (docs/sharding.md, "Checkpoints"):
  - safetensors: `hf.SafetensorsFile.read_slice`, one `os.preadv` per contiguous run of
    the region's bytes (a block of rows is one run, a block of columns one run per row),
    into memory of its own;
  - GGUF: the rows of the region, and in each row only the quantization blocks that
    overlap its columns, copied out of the mapped file (`copy_rows`) and dequantized
    (a ggml row is a sequence of blocks of 32 or 256 values, each a fixed number of bytes,
    so rows and whole blocks of a row can be taken alone; the few values of a boundary
    block outside the region are dequantized and dropped).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import gguf as gguf_lib
import jax
import numpy as np
from etils import epath
from jax.sharding import Mesh, NamedSharding, Sharding

from spec_jax.checkpoints import gguf, hf, hub
from spec_jax.checkpoints.convert import (
    CheckpointError,
    SliceReader,
    SourceState,
    index_bounds,
    leaf_at,
    sliced_tensors,
)
from spec_jax.tokenizer import Tokenizer

EMBEDDED = 'embedded'
ORBAX_CONFIG_FILE = 'model_config.json'  # What marks an orbax directory (orbax_io).


def as_path(path: str | os.PathLike) -> epath.Path:
    """`path` as an etils path, the path layer orbax writes through: a local path made
    absolute, a URL (gs://bucket/dir: Google Cloud Storage through gcsfs) kept as it is."""
    path = os.fspath(path)
    return epath.Path(path if '://' in path else os.path.abspath(path))


def is_orbax_dir(path: str | os.PathLike) -> bool:
    """True for a directory written by `orbax_io.save_orbax` or `convert_to_orbax`, local
    or at a URL (gs://...)."""
    return (as_path(path) / ORBAX_CONFIG_FILE).is_file()


def open_source(spec: str | os.PathLike, dtype: str | None = None, mapped: bool = True):
    """A GGUF file ('embedded': the default's; or a directory holding one .gguf), or a
    Hugging Face directory or hub id, opened: nothing is read until a tensor is asked for.

    Args:
      spec: the checkpoint.
      dtype: the dtype asked for; None keeps the checkpoint's (HF `torch_dtype`; float32
        for GGUF).
      mapped: HF tensors as views of the mapped safetensors files (fast); False reads each
        into memory of its own, freed when dropped (`SafetensorsFile.read`: what a
        streaming path wants, the file's pages never staying resident). GGUF tensors are
        always dequantized from the mapped file (a quantized file is a fraction of the
        model, and its pages are cache the kernel can drop).

    Returns:
      convert.SourceState, with `slices` (read by region) for both formats.

    Raises:
      FileNotFoundError: a path that does not exist (and is not a hub id).
      CheckpointError: an orbax directory (already converted), or a bad checkpoint.
    """
    spec = os.fspath(spec)
    if spec == EMBEDDED:
        return open_gguf(gguf.embedded_default_path(), dtype or 'float32')
    if not os.path.exists(spec):
        if hub.looks_like_hub_id(spec):
            return hf.open_hf(spec, dtype, mapped)
        raise FileNotFoundError(f'checkpoint path {spec!r} does not exist')
    if os.path.isfile(spec):
        with open(spec, 'rb') as f:
            magic = f.read(4)
        if spec.endswith('.gguf') or magic == b'GGUF':
            return open_gguf(spec, dtype or 'float32')
        raise CheckpointError(
            f'{spec} is not a checkpoint spec_jax reads (a .gguf file, or a directory)'
        )
    if is_orbax_dir(spec):
        raise CheckpointError(f'{spec} is already an orbax checkpoint')
    if os.path.isfile(os.path.join(spec, 'config.json')):
        return hf.open_hf(spec, dtype, mapped)
    ggufs = sorted(f for f in os.listdir(spec) if f.endswith('.gguf'))
    if len(ggufs) == 1:
        return open_gguf(os.path.join(spec, ggufs[0]), dtype or 'float32')
    raise CheckpointError(
        f'{spec} is neither a Hugging Face model directory (config.json), a spec_jax orbax '
        f'directory ({ORBAX_CONFIG_FILE}) nor a directory with one .gguf file'
    )


def open_gguf(path: str, dtype: str) -> SourceState:
    """`gguf.open_gguf`'s state (config, tokenizer, whole-tensor reader) from one parse of
    the file, with its tensors also read by region (`gguf_slices`)."""
    f = gguf.GGUFFile(path)
    cfg = gguf.config_from_gguf(f.meta, f.tensors).replace(dtype=dtype, param_dtype=dtype)
    arch = f.meta['general.architecture']  # Checked by config_from_gguf.
    tokenizer = Tokenizer.from_gguf_fields(f.meta) if 'tokenizer.ggml.tokens' in f.meta else None
    if tokenizer is not None:
        tokenizer.check_fits(cfg.vocab_size)
    read, names = gguf.gguf_state_reader(f.tensors, cfg, arch)
    return SourceState(cfg, read, names, tokenizer, f.path, gguf_slices(f.tensors, cfg, arch))


def copy_rows(data: np.ndarray, rows: tuple[int, int], cols: tuple[int, int]) -> np.ndarray:
    """Bytes cols[0]:cols[1] of rows rows[0]:rows[1] of a GGUF tensor's [rows, row bytes]
    mapped data, copied out (the kernel pages in only the pages they lie on). Every byte a
    sliced GGUF read takes passes here (tests count them)."""
    return np.array(data[rows[0] : rows[1], cols[0] : cols[1]])


def gguf_slices(tensors: dict, cfg, arch: str | None) -> SliceReader:
    """HF-named float32 regions of GGUF tensors (`gguf.gguf_state_reader`'s, by region):
    the region's rows, and of each only the quantization blocks its columns overlap.

    llama.cpp permutes the rows of llama's q/k projections within each head; a region of
    whole heads (all that sharding asks for: heads are split whole) is un-permuted alone.
    """
    by_hf = {}
    for t in tensors.values():
        name = gguf.hf_name(t.name)
        if name is not None:
            by_hf[name] = t

    def read(name: str, index: tuple[slice, ...]) -> np.ndarray:
        t = by_hf[name]
        if len(t.shape) > 2:
            raise CheckpointError(f'tensor {t.name} has {len(t.shape)} axes; slices read 1 or 2')
        bounds = index_bounds(index, t.shape)
        rows, cols = ((0, 1), bounds[0]) if len(t.shape) == 1 else tuple(bounds)
        block, type_size = gguf_lib.GGML_QUANT_SIZES[t.qtype]
        first, last = cols[0] // block, -(-cols[1] // block)
        raw = copy_rows(t.data, rows, (first * type_size, last * type_size))
        part = gguf.GGUFTensor(t.name, (rows[1] - rows[0], (last - first) * block), t.qtype, raw)
        w = gguf.dequantize(part)[:, cols[0] - first * block : cols[1] - first * block]
        w = w[0] if len(t.shape) == 1 else w
        if arch in gguf._PERMUTED_ARCHS and name.endswith(
            ('q_proj.weight', 'q_proj.bias', 'k_proj.weight', 'k_proj.bias')
        ):
            lo, hi = bounds[0]
            h = cfg.head_dim
            if lo % h or hi % h:
                raise CheckpointError(
                    f'rows {lo}:{hi} of {t.name} are not whole heads of {h} rows (llama.cpp '
                    'permutes rows within each head)'
                )
            w = gguf.unpermute_rows(w, (hi - lo) // h)
        return w

    return SliceReader(shape=lambda name: by_hf[name].shape, read=read)


def place_sliced(
    shape: tuple[int, ...], where: Sharding, region: Callable[[tuple[slice, ...]], np.ndarray]
) -> jax.Array:
    """An array of `shape` placed by `where` from `region(index)` (the values of region
    `index`): each of this process's devices gets its region, each distinct region read
    once (devices that replicate a shard share one read), and no other process's region
    is read (`jax.make_array_from_callback` asks for this process's devices only). The
    copies are finished when it returns, so the regions read can go."""
    read: dict[tuple, np.ndarray] = {}

    def one(index):
        key = tuple(index_bounds(index, shape))
        if key not in read:
            read[key] = region(index)
        return read[key]

    return jax.make_array_from_callback(shape, where, one).block_until_ready()


def placed_tensors(
    state: SourceState, mesh: Mesh | None, specs, dtype: str
) -> Iterator[tuple[str, jax.Array]]:
    """Each parameter of `state` as (path, array placed on `mesh` by its spec in `specs`;
    the first local device without a mesh), one at a time, this process reading only its
    devices' regions (`place_sliced`; placing a whole tensor with `sharding.put` would
    read all of it on every process)."""
    if state.slices is None:
        raise CheckpointError(f'{state.source} was opened without a region reader (open_source)')
    one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
    for path, shape, region in sliced_tensors(state.cfg, state.slices, state.names, dtype):
        where = one if mesh is None else NamedSharding(mesh, leaf_at(specs, path))
        yield path, place_sliced(shape, where, region)


__all__ = [
    'EMBEDDED',
    'SourceState',
    'as_path',
    'is_orbax_dir',
    'open_source',
    'place_sliced',
    'placed_tensors',
]
