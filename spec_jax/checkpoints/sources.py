"""A checkpoint opened tensor by tensor (`convert.SourceState`), whatever its format: what
`loader.load` builds parameters from (on the host, or tensor by tensor onto a mesh) and
what `orbax_io.convert_to_orbax` streams."""

from __future__ import annotations

import os

from spec_jax.checkpoints import gguf, hf, hub
from spec_jax.checkpoints.convert import CheckpointError, SourceState

EMBEDDED = 'embedded'
ORBAX_CONFIG_FILE = 'model_config.json'  # What marks an orbax directory (orbax_io).


def is_orbax_dir(path: str | os.PathLike) -> bool:
    """True for a directory written by `orbax_io.save_orbax` or `convert_to_orbax`."""
    return os.path.isfile(os.path.join(path, ORBAX_CONFIG_FILE))


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
      convert.SourceState.

    Raises:
      FileNotFoundError: a path that does not exist (and is not a hub id).
      CheckpointError: an orbax directory (already converted), or a bad checkpoint.
    """
    spec = os.fspath(spec)
    if spec == EMBEDDED:
        return gguf.open_gguf(gguf.embedded_default_path(), dtype or 'float32')
    if not os.path.exists(spec):
        if hub.looks_like_hub_id(spec):
            return hf.open_hf(spec, dtype, mapped)
        raise FileNotFoundError(f'checkpoint path {spec!r} does not exist')
    if os.path.isfile(spec):
        with open(spec, 'rb') as f:
            magic = f.read(4)
        if spec.endswith('.gguf') or magic == b'GGUF':
            return gguf.open_gguf(spec, dtype or 'float32')
        raise CheckpointError(
            f'{spec} is not a checkpoint spec_jax reads (a .gguf file, or a directory)'
        )
    if is_orbax_dir(spec):
        raise CheckpointError(f'{spec} is already an orbax checkpoint')
    if os.path.isfile(os.path.join(spec, 'config.json')):
        return hf.open_hf(spec, dtype, mapped)
    ggufs = sorted(f for f in os.listdir(spec) if f.endswith('.gguf'))
    if len(ggufs) == 1:
        return gguf.open_gguf(os.path.join(spec, ggufs[0]), dtype or 'float32')
    raise CheckpointError(
        f'{spec} is neither a Hugging Face model directory (config.json), a spec_jax orbax '
        f'directory ({ORBAX_CONFIG_FILE}) nor a directory with one .gguf file'
    )


__all__ = ['EMBEDDED', 'SourceState', 'is_orbax_dir', 'open_source']
