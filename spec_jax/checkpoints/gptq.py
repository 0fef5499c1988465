"""GPTQ checkpoints (AutoGPTQ / optimum / GPTQModel layout; Qwen2.5-*-GPTQ-Int8 is one):
read with safetensors + numpy, dequantized per tensor and requantized to spec_jax's
per-output-channel int8 (spec_jax.models.quant) as they load.

A GPTQ Linear of `in` inputs and `out` outputs is stored as (bits b in {2, 4, 8}, p = 32/b
values per int32, groups of `group_size` input rows; -1: one group):

    qweight [in / p, out]  int32   row r packs input rows r*p + j (j = 0..p-1) at bits b*j
    qzeros  [G, out / p]   int32   column c packs output columns c*p + j at bits b*j
    scales  [G, out]       float16
    g_idx   [in]           int32   the group of each input row (arbitrary with desc_act)
    bias    [out]          float16 (optional)

and means W[o, i] = scales[g, o] * (q[i, o] - zero[g, o]) with g = g_idx[i], where the
stored zero is `zero - 1` in the original format (`checkpoint_format` 'gptq', AutoGPTQ's
packing quirk) and `zero` itself in GPTQModel's 'gptq_v2'. The layout is read from the
checkpoint's `quantization_config` (config.json; older AutoGPTQ directories: a separate
quantize_config.json). Nothing here needs torch or a GPTQ kernel.

`dequantizing(state)` wraps an opened HF directory (`sources.open_source`): its reader
serves `X.weight` for every `X.qweight` (float32, HF layout [out, in]), so the common
conversion (`convert.converted_tensors`) and `quant.quantized_tensors` run unchanged.
Requantizing a group-quantized weight to one scale per output channel adds at most half a
step of the new grid (scale = the channel's largest |W| / 127) to each element: exact
where a channel's GPTQ values already sit on that grid (one group, max |q - zero| = 127),
otherwise a second rounding (tests/models/test_quant.py measures it). Keeping GPTQ's
per-group scales would avoid it at the price of a [.., G, out] product per matmul; not done.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from spec_jax.checkpoints.convert import CheckpointError, SourceState, expected_names

FORMATS = ('gptq', 'gptq_v2')
BITS = (2, 4, 8)
_PARTS = ('qweight', 'qzeros', 'scales', 'g_idx')
_BLOCK_ROWS = 4096  # Input rows dequantized at a time (bounds the transient arrays).


@dataclasses.dataclass(frozen=True)
class GptqLayout:
    """A GPTQ checkpoint's packing (its `quantization_config`)."""

    bits: int
    group_size: int
    checkpoint_format: str = 'gptq'
    desc_act: bool = False
    sym: bool = True

    def __post_init__(self):
        if self.bits not in BITS:
            raise CheckpointError(
                f'GPTQ bits={self.bits} is not supported; valid: {BITS} (3-bit packs values '
                f'across int32 words)'
            )
        if self.checkpoint_format not in FORMATS:
            raise CheckpointError(
                f'GPTQ checkpoint_format {self.checkpoint_format!r} is not supported; valid: '
                f'{FORMATS}'
            )

    @property
    def zero_offset(self) -> int:
        """What to add to a stored zero point (1 in the original 'gptq' format)."""
        return 1 if self.checkpoint_format == 'gptq' else 0


def layout_of(directory: str) -> GptqLayout | None:
    """The GPTQ layout of an HF directory, or None when it is not a GPTQ checkpoint."""
    config_path = os.path.join(directory, 'config.json')
    config = {}
    if os.path.isfile(config_path):
        with open(config_path) as f:
            config = json.load(f)
    q = config.get('quantization_config')
    legacy = os.path.join(directory, 'quantize_config.json')
    if q is None and os.path.isfile(legacy):
        with open(legacy) as f:
            q = dict(json.load(f), quant_method='gptq')
    if not q:
        return None
    method = q.get('quant_method', 'gptq')
    if method != 'gptq':
        raise CheckpointError(
            f'{directory}: quantization method {method!r} is not supported (only gptq); '
            f'use an unquantized checkpoint and checkpoints.load(quantize="int8")'
        )
    try:
        return GptqLayout(
            bits=int(q['bits']),
            group_size=int(q.get('group_size', -1)),
            checkpoint_format=q.get('checkpoint_format', 'gptq'),
            desc_act=bool(q.get('desc_act', False)),
            sym=bool(q.get('sym', True)),
        )
    except KeyError as e:
        raise CheckpointError(f'{directory}: quantization_config lacks {e.args[0]!r}') from None


def unpack_rows(packed: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] int32 -> [rows * 32/bits, cols] uint8 values (qweight: along inputs)."""
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, :, None]
    words = packed.view(np.uint32)[:, None, :]
    values = (words >> shifts) & np.uint32((1 << bits) - 1)
    return values.astype(np.uint8).reshape(-1, packed.shape[1])


def unpack_cols(packed: np.ndarray, bits: int) -> np.ndarray:
    """[rows, cols] int32 -> [rows, cols * 32/bits] uint8 values (qzeros: along outputs)."""
    per = 32 // bits
    shifts = (np.arange(per, dtype=np.uint32) * bits)[None, None, :]
    words = packed.view(np.uint32)[:, :, None]
    values = (words >> shifts) & np.uint32((1 << bits) - 1)
    return values.astype(np.uint8).reshape(packed.shape[0], -1)


def dequantize(
    layout: GptqLayout,
    qweight: np.ndarray,
    qzeros: np.ndarray,
    scales: np.ndarray,
    g_idx: np.ndarray | None,
) -> np.ndarray:
    """One GPTQ Linear's float32 weight in HF layout [out, in] (module docstring)."""
    per = 32 // layout.bits
    num_in, num_out = qweight.shape[0] * per, qweight.shape[1]
    groups = scales.shape[0]
    if scales.shape[1] != num_out or qzeros.shape != (groups, num_out // per):
        raise CheckpointError(
            f'GPTQ tensors disagree: qweight {qweight.shape} ({layout.bits}-bit: {num_in} '
            f'inputs x {num_out} outputs), qzeros {qzeros.shape}, scales {scales.shape}'
        )
    if g_idx is None:
        size = num_in if layout.group_size == -1 else layout.group_size
        g_idx = np.arange(num_in) // size
    g_idx = np.asarray(g_idx, np.int64)
    if g_idx.shape != (num_in,) or g_idx.min() < 0 or g_idx.max() >= groups:
        raise CheckpointError(
            f'GPTQ g_idx {g_idx.shape} (groups {g_idx.min()}..{g_idx.max()}) does not index '
            f'the {groups} groups of {num_in} inputs'
        )
    zeros = unpack_cols(np.asarray(qzeros), layout.bits).astype(np.float32) + layout.zero_offset
    scales = np.asarray(scales, np.float32)
    out = np.empty((num_in, num_out), np.float32)
    rows_per_word = _BLOCK_ROWS // per
    for start in range(0, qweight.shape[0], rows_per_word):
        q = unpack_rows(np.asarray(qweight[start : start + rows_per_word]), layout.bits)
        lo = start * per
        g = g_idx[lo : lo + q.shape[0]]
        out[lo : lo + q.shape[0]] = (q.astype(np.float32) - zeros[g]) * scales[g]
    return out.T


def dequantizing(state: SourceState, layout: GptqLayout) -> SourceState:
    """`state` (an opened GPTQ HF directory) with `X.weight` served for every `X.qweight`
    (dequantized float32, HF layout), the packed parts hidden. A bias the model does not
    have (GPTQ exporters write zeros for every Linear) must be zero (CheckpointError)."""
    names = set(state.names)
    quantized = sorted(n[: -len('.qweight')] for n in names if n.endswith('.qweight'))
    if not quantized:
        raise CheckpointError(f'{state.source}: a GPTQ config but no *.qweight tensors')
    for base in quantized:
        lacking = [p for p in _PARTS[:3] if f'{base}.{p}' not in names]
        if lacking:
            raise CheckpointError(f'{state.source}: GPTQ tensor {base} lacks {lacking}')
    wanted = set(expected_names(state.cfg))
    served = {f'{base}.weight': base for base in quantized}
    read_raw = state.read

    def read(name):
        base = served.get(name)
        if base is None:
            return read_raw(name)
        bias = f'{base}.bias'
        if bias in names and bias not in wanted and np.any(np.asarray(read_raw(bias))):
            raise CheckpointError(
                f'{state.source}: {bias} is non-zero but the {state.cfg.family} model has '
                f'no bias there'
            )
        g_idx = read_raw(f'{base}.g_idx') if f'{base}.g_idx' in names else None
        return dequantize(
            layout,
            read_raw(f'{base}.qweight'),
            read_raw(f'{base}.qzeros'),
            read_raw(f'{base}.scales'),
            g_idx,
        )

    hidden = {f'{base}.{p}' for base in quantized for p in _PARTS}
    visible = sorted((names - hidden) | set(served))
    changes = dict(read=read, names=visible)
    if any(f.name == 'slices' for f in dataclasses.fields(state)):
        changes['slices'] = None  # Packed tensors are read whole.
    return dataclasses.replace(state, **changes)
