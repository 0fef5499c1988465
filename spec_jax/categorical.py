"""Drawing tokens from probability vectors, with one key per batch or one key per row.

Depends on jax only. `sample(key, probs)` draws a token by inverse CDF with one uniform per
row (or Gumbel-max on log-probabilities); both are exact argmax for one-hot vectors.
`sample_rows(keys, probs)` does the same with one key per row, so that a row's draw does not
depend on the other rows of the batch; `map_rows` maps any per-row function so (a vmap for
threefry keys, a loop for rbg keys, whose vmap draws every row from the first key).
`top_k` is `jax.lax.top_k` in the form XLA:CPU runs fast (the top tokens of a vocabulary row).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

__all__ = ['is_key_batch', 'map_rows', 'sample', 'sample_rows', 'upcast']

_BLOCK = 256


def upcast(x: Any) -> Any:
    """x as float32 when it is a float array narrower than 32 bits (bf16, fp16), else x
    itself. Rules and samplers compute in float32: a law computed in bf16 sums to 1 only to
    bf16's ~4e-3 (tv_budget at eps 0.05: sum pi 1.0007, TV 0.0502). No op (and no op in the
    program) on float32 inputs."""
    dtype = getattr(x, 'dtype', None)
    if dtype is not None and jnp.issubdtype(dtype, jnp.floating) and jnp.finfo(dtype).bits < 32:
        return jnp.asarray(x, jnp.float32)
    return x


def sample(key: Array, probs: Array, method: str = 'cdf') -> Array:
    """Draws one token per row of probs [..., V] -> [...] int32.

    Rows need not be normalised. Tokens with probability 0 are never drawn, so a one-hot row
    returns its argmax exactly.

    Args:
      key: PRNG key.
      probs: [..., V] non-negative weights.
      method: 'cdf' (default): inverse-CDF with ONE uniform per row, searched in two levels
        (block sums of 256 tokens, then a cumulative sum inside the chosen block), so the
        cost is one pass over probs; 'gumbel': Gumbel-max on log probs
        (`jax.random.categorical`), which draws V random numbers per row (~10x slower on CPU
        at V = 49152).

    Returns:
      [...] int32 token ids.
    """
    probs = upcast(probs)
    if method == 'gumbel':
        logp = jnp.where(probs > 0, jnp.log(jnp.where(probs > 0, probs, 1.0)), -jnp.inf)
        return jax.random.categorical(key, logp, axis=-1).astype(jnp.int32)
    if method != 'cdf':
        raise ValueError(f"sample: method={method!r} must be 'cdf' or 'gumbel'")
    lead, v = probs.shape[:-1], probs.shape[-1]
    rows = int(np.prod(lead)) if lead else 1
    blk = v if v <= 4 * _BLOCK else _BLOCK
    nb = -(-v // blk)
    x = jnp.asarray(probs, jnp.float32).reshape(rows, v)
    if nb * blk != v:
        x = jnp.pad(x, ((0, 0), (0, nb * blk - v)))
    x = x.reshape(rows, nb, blk)
    block_tot = x.sum(-1)  # [R, nb]
    block_cum = jnp.cumsum(block_tot, -1)
    target = jax.random.uniform(key, (rows,), jnp.float32) * block_cum[:, -1]  # [0, total)
    last_block = jnp.max(jnp.where(block_tot > 0, jnp.arange(nb), 0), -1)
    bi = jnp.minimum((block_cum <= target[:, None]).sum(-1), last_block)  # [R]
    r = jnp.arange(rows)
    local = target - (block_cum[r, bi] - block_tot[r, bi])
    row = x[r, bi]  # [R, blk]
    last_in = jnp.max(jnp.where(row > 0, jnp.arange(blk), 0), -1)
    j = jnp.minimum((jnp.cumsum(row, -1) <= local[:, None]).sum(-1), last_in)
    return (bi * blk + j).astype(jnp.int32).reshape(lead)


def is_key_batch(key: Any) -> bool:
    """Whether `key` is a batch of PRNG keys [B] rather than one key.

    A typed key array (`jax.random.key`) is one key when its shape is () and a batch when it
    is [B]; a raw uint32 key (`jax.random.PRNGKey`) is one key when its shape is [K] (K = 2
    for threefry) and a batch when it is [B, K] (what `jax.random.split(k, B)` returns).

    Raises:
      ValueError: any other shape.
    """
    dtype = getattr(key, 'dtype', None)
    typed = dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key)
    ndim = len(np.shape(key))
    single = 0 if typed else 1
    if ndim not in (single, single + 1):
        kind = 'typed key array' if typed else 'raw uint32 key'
        raise ValueError(
            f'PRNG key of shape {np.shape(key)} ({kind}): expected one key or a batch [B] of keys'
        )
    return ndim == single + 1


def _vmap_keeps_rows(keys: Array) -> bool:
    """Whether vmap over these keys draws row b from keys[b] alone (threefry: yes).

    JAX batches the rbg / unsafe_rbg generators (`lax.rng_bit_generator`) by drawing every
    row from keys[0], so for those (and any other non-threefry implementation) the rows are
    mapped sequentially instead.
    """
    if jax.dtypes.issubdtype(keys.dtype, jax.dtypes.prng_key):
        impl = str(jax.random.key_impl(keys))
    else:
        impl = str(jax.config.jax_default_prng_impl)
    return impl.startswith('threefry')


def map_rows(fn, keys: Array, *xs: Any) -> Any:
    """fn(keys[b], *(x[b] for x in xs)) for every row b, stacked along a new leading axis.

    Row b's result depends on keys[b] and the x[b] only. For threefry keys (JAX's default)
    this is `jax.vmap`; for other key implementations (rbg, unsafe_rbg), whose vmap draws
    every row from keys[0], it is `jax.lax.map` (a loop over rows).

    Args:
      fn: (key, *row_args) -> pytree.
      keys: a batch of B keys (see `is_key_batch`).
      *xs: pytrees of arrays with leading axis B.
    """
    if not is_key_batch(keys):
        raise ValueError(f'map_rows: keys of shape {np.shape(keys)} are not a batch of keys')
    if _vmap_keeps_rows(keys):
        return jax.vmap(fn)(keys, *xs)
    return jax.lax.map(lambda args: fn(*args), (keys, *xs))


def sample_rows(keys: Array, probs: Array, method: str = 'cdf') -> Array:
    """Draws one token per row with one key per row: probs [B, ..., V] -> [B, ...] int32.

    Row b is `sample(keys[b], probs[b], method)` (`map_rows`: a vmap of `sample` for threefry
    keys), so its draw depends on keys[b] and probs[b] only, not on the other rows or on B.

    Args:
      keys: B PRNG keys: a raw uint32 array [B, 2] (as `jax.random.split(k, B)` returns) or
        a typed key array [B] (`jax.random.split(jax.random.key(s), B)`).
      probs: [B, ..., V] non-negative weights.
      method: 'cdf' or 'gumbel', as in `sample`.

    Returns:
      [B, ...] int32 token ids.

    Raises:
      ValueError: `keys` is not a batch of keys, or its size is not B.
    """
    if not is_key_batch(keys):
        raise ValueError(f'sample_rows: keys of shape {np.shape(keys)} are not a batch of keys')
    if probs.ndim < 2 or keys.shape[0] != probs.shape[0]:
        raise ValueError(
            f'sample_rows: {keys.shape[0]} keys for probs of shape {probs.shape} (need [B, ..., V])'
        )
    return map_rows(lambda k, pr: sample(k, pr, method), keys, probs)


def top_k(x: Array, k: int) -> tuple[Array, Array]:
    """`jax.lax.top_k(x, k)` (values and indices [..., k], ties by lower index), its outputs
    behind an optimization barrier.

    XLA:CPU runs top-k as its TopK kernel only when nothing fuses into the outputs; when a
    consumer does (a ratio, a compare, a gather), it falls back to a stable sort of the whole
    row: on [6, 3, 49152] logits 247 ms against 1.6 ms with the barrier (a chain round of
    relaxed acceptance or MARS on the embedded default: 2.5-3x lossless SD's decode cost).
    The values are the same either way; the barrier only stops the fusion. Used by the rules
    that read the target's top k tokens (relaxed, FLy; MARS's top 2: `top_two`), not on paths
    that run sharded:
    with the EAGLE-3 tree drafter's top-k behind the barrier, XLA aborted the process
    compiling the tree loop on a 1 x 8 mesh of fake CPU devices (tests/mesh).
    """
    return jax.lax.optimization_barrier(jax.lax.top_k(x, k))


def top_two(x: Array) -> tuple[Array, Array]:
    """The two largest entries of x [..., V] and their indices, [..., 2] each, ties by lower
    index: `jax.lax.top_k(x, 2)`'s values, from four max-reductions and no sort (V >= 2).

    XLA:CPU's TopK kernel needs its outputs behind a barrier to avoid a sort (`top_k`);
    reductions need neither, fuse with their consumers and shard like any reduction. MARS's
    gate reads the top 2 of every verified row several times a round (its test, its law,
    its baseline's set, the meter's)."""
    v = x.shape[-1]
    iota = jax.lax.broadcasted_iota(jnp.int32, x.shape, x.ndim - 1)

    def first_max(y, allowed):  # The first index of the largest y among the allowed.
        top = jnp.max(jnp.where(allowed, y, -jnp.inf), -1, keepdims=True)
        return top[..., 0], v - jnp.max(jnp.where(allowed & (y == top), v - iota, 0), -1)

    z1, i1 = first_max(x, True)
    z2, i2 = first_max(x, iota != i1[..., None])
    return jnp.stack([z1, z2], -1), jnp.stack([i1, i2], -1)
