"""int8 weight-only quantization: per-output-channel scales, dequantized inside the matmul.

`ModelConfig.weights = 'int8'` stores every projection (q/k/v/o, gate/up/down) and an untied
LM head as int8 with one float32 scale per output channel; the embedding (and so a tied LM
head), the norms and the biases stay in `param_dtype`. A projection then runs as

    out = einsum(x, w_int8.astype(x.dtype)) * scale     (scale over the output channels)

so the convert is an operand of the dot: a v5e compile (libtpu) reads the int8 weight in
the convolution itself, the scale in the same fusion; XLA:CPU converts each weight in a
kernel of its own, one weight-sized buffer per dot (docs/quantization.md, "Measured").

Names keep their axis letters, so sharding follows them (spec_jax.sharding): `q_dnh` (int8
[D, N, H]) has its scale `q_scale_nh` [N, H] split over the heads like it; `o_nhd`'s scale
is `o_scale_d` [D] (replicated), `gate_df`'s `gate_scale_f`, `down_fd`'s `down_scale_d`,
`lm_head_vd`'s `lm_head_scale_v`. Bytes: 1 per weight plus 4 per output channel (scales are
float32 whatever `param_dtype` is: the 72B's scales are 0.02 % of its weights).

The scheme is symmetric absmax: scale = max |w| over a channel's inputs / 127, q =
round(w / scale) in [-127, 127], so |w - q * scale| <= scale / 2 element-wise (a channel of
zeros gets scale 1 and q = 0). Quantizing happens once, on the host tensor by tensor while
a checkpoint loads (`checkpoints.load(spec, quantize='int8')`) or on device for params
already in memory (`quantize_params`).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.models import precision

QMAX = 127

# Quantized parameter -> (its scale's name, the axes it reduces: its input channels).
QUANTIZED = {
    'q_dnh': ('q_scale_nh', (0,)),
    'k_dkh': ('k_scale_kh', (0,)),
    'v_dkh': ('v_scale_kh', (0,)),
    'o_nhd': ('o_scale_d', (0, 1)),
    'gate_df': ('gate_scale_f', (0,)),
    'up_df': ('up_scale_f', (0,)),
    'down_fd': ('down_scale_d', (0,)),
    'lm_head_vd': ('lm_head_scale_v', (1,)),
}
SCALES = {scale for scale, _ in QUANTIZED.values()}
_INIT_STD = 0.02  # The float init's std (models/llama.py); int8 init matches it.


def scale_name(name: str) -> str:
    """The scale parameter of quantized parameter `name` ('q_dnh' -> 'q_scale_nh')."""
    if name not in QUANTIZED:
        raise ValueError(f'{name!r} is not a quantized parameter; valid: {sorted(QUANTIZED)}')
    return QUANTIZED[name][0]


def _reduce_axes(name: str, ndim: int) -> tuple[int, ...]:
    """The input axes of `name` for an array of `ndim` axes (a leading stacked layer axis,
    spec_jax.models.llama.stack_layers, shifts them by one)."""
    base = QUANTIZED[name][1]
    shift = ndim - len(name.rsplit('_', 1)[-1])
    if shift not in (0, 1):
        raise ValueError(f'{name} has {ndim} axes; its letters say {ndim - shift}')
    return tuple(a + shift for a in base)


def scale_shape(name: str, shape: tuple[int, ...]) -> tuple[int, ...]:
    """The shape of `name`'s scale for a weight of `shape` (the output channels)."""
    axes = _reduce_axes(name, len(shape))
    return tuple(s for i, s in enumerate(shape) if i not in axes)


def quantize(name: str, w):
    """(int8 weights, float32 per-output-channel scales) of weight `name` (numpy in, numpy
    out: a loader's host tensors; a jax array in, jax arrays out)."""
    xp = np if isinstance(w, np.ndarray) else jnp
    axes = _reduce_axes(name, w.ndim)
    w32 = w.astype(xp.float32)
    amax = xp.max(xp.abs(w32), axis=axes, keepdims=True)
    scale = xp.where(amax > 0, amax / QMAX, xp.float32(1.0)).astype(xp.float32)
    q = xp.clip(xp.round(w32 / scale), -QMAX, QMAX).astype(xp.int8)
    return q, xp.squeeze(scale, axis=axes)


def dequantize(name: str, q, scale):
    """float32 weights q * scale of quantized parameter `name`."""
    xp = np if isinstance(q, np.ndarray) else jnp
    axes = _reduce_axes(name, q.ndim)
    return q.astype(xp.float32) * xp.expand_dims(scale.astype(xp.float32), axes)


def matmul(spec: str, x: jax.Array, w_int8: jax.Array, scale: jax.Array) -> jax.Array:
    """einsum(spec, x, w) for int8 `w`, dequantized inside the dot: the int8 operand is
    converted to x's dtype as the dot's input, and the scale (over the output's trailing
    axes, the weight's output channels) multiplies the product, never the weight.

    The optimization barrier ties the weight to the activation it multiplies, so the
    convert cannot run before that activation exists: without it XLA hoists every
    weight's convert out of a decode loop (each is loop-invariant) and holds a float copy
    of the whole model across the loop (measured on XLA:CPU: temp bytes 95 % of the fp32
    weights, against one weight with the barrier; tests/models/test_quant.py)."""
    x, w_int8 = jax.lax.optimization_barrier((x, w_int8))
    out = precision.einsum(spec, x, w_int8.astype(x.dtype))
    return out * scale.astype(x.dtype)


def int8_init(key: jax.Array, shape, dtype=jnp.int8) -> jax.Array:
    """Random int8 weights, uniform on [-127, 127] (with `init_scale`: std 0.02)."""
    return jax.random.randint(key, shape, -QMAX, QMAX + 1, jnp.int32).astype(dtype)


def init_scale(key: jax.Array, shape, dtype=jnp.float32) -> jax.Array:
    """The scale that gives `int8_init` weights the float init's std (uniform: amax / sqrt 3)."""
    del key
    return jnp.full(shape, _INIT_STD * math.sqrt(3.0) / QMAX, dtype)


def quantized_tensors(tensors):
    """Streams (path, array) pairs (`checkpoints.convert.converted_tensors`), replacing each
    quantized weight by its int8 array and adding its scale ('layer_0/attn/q_scale_nh');
    one tensor at a time, on the host."""
    for path, w in tensors:
        group, _, leaf = path.rpartition('/')
        if leaf in QUANTIZED:
            q, scale = quantize(leaf, np.asarray(w))
            del w
            yield path, q
            yield (f'{group}/' if group else '') + QUANTIZED[leaf][0], scale
        else:
            yield path, w


def quantize_params(params: dict) -> dict:
    """A float parameter tree (`weights='float'`) -> the `weights='int8'` tree of the same
    model (layers unrolled or stacked). Jitted per tree structure; on a mesh each result
    keeps its weight's sharding (scales: their names' specs, spec_jax.sharding)."""
    return _quantize_tree(params)


@jax.jit
def _quantize_tree(params: dict) -> dict:
    def walk(tree):
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                out[key] = walk(value)
            elif key in QUANTIZED:
                out[key], out[QUANTIZED[key][0]] = quantize(key, value)
            else:
                out[key] = value
        return out

    return walk(params)


def dequantize_params(params: dict, dtype='float32') -> dict:
    """The inverse of `quantize_params` up to rounding: float weights in `dtype`, scales
    dropped (what `weights='float'` code, a save or a comparison takes)."""

    def walk(tree):
        out = {}
        for key, value in tree.items():
            if isinstance(value, dict):
                out[key] = walk(value)
            elif key in QUANTIZED:
                out[key] = dequantize(key, value, tree[QUANTIZED[key][0]]).astype(dtype)
            elif key not in SCALES:
                out[key] = value
        return out

    return walk(params)
