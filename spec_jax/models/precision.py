"""Matmul precision from the compute dtype: fp32 runs 'highest', bf16 the platform default.

An fp32 model is what the project runs where it promises exactness (greedy equality of
chain, tree and EAGLE-3 decoding with AR, the distortion meter's checks, the TTT law): XLA
on a GPU computes an fp32 dot in reduced precision by default (TF32-like; measured on an
H200: relative error 2.9e-4 against 2.9e-7 at 'highest', docs/performance.md), so every dot
of the models passes `Precision.HIGHEST` when its operands are fp32. On CPU fp32 dots are
exact anyway (the flag changes nothing there); a bf16 model (what accelerators serve) keeps
the default (`None`: also what `jax.default_matmul_precision` sets). The precision is an
argument of each dot, so it shows in the jaxpr and the lowered program (`precision_config`)
and does not depend on a config scope around the call.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

# The absolute difference allowed between two laws (probabilities) that a model computes
# by different but equivalent programs (say a batched call against an unbatched one), by
# compute dtype at the precision `matmul_precision` gives it: fp32 at 'highest' is a few
# hundred roundings of 6e-8 through the tiny models' layers; bf16 (8 mantissa bits) ~1e-2.
LAW_ATOL = {'float32': 2e-5, 'bfloat16': 3e-2}


def matmul_precision(dtype) -> jax.lax.Precision | None:
    """`HIGHEST` for fp32 operands, None (the platform's default) for any other dtype."""
    return jax.lax.Precision.HIGHEST if jnp.dtype(dtype) == jnp.float32 else None


def einsum(spec: str, x: jax.Array, y: jax.Array) -> jax.Array:
    """`jnp.einsum(spec, x, y)` at x's dtype's precision (`matmul_precision`)."""
    return jnp.einsum(spec, x, y, precision=matmul_precision(x.dtype))


def law_atol(dtype) -> float:
    """`LAW_ATOL` of a compute dtype (ValueError for one without a stated tolerance)."""
    name = jnp.dtype(dtype).name
    if name not in LAW_ATOL:
        raise ValueError(f'law_atol: no tolerance for dtype {name!r}; known: {sorted(LAW_ATOL)}')
    return LAW_ATOL[name]
