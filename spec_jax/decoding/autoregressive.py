"""Plain autoregressive generation, the whole loop on device.

This is the baseline every speed-up is measured against. One jitted function runs the
prefill and a `lax.while_loop` of single-token steps; each row stops on a stop token or its
own token limit, and the loop ends when every row is done.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from spec_jax.decoding import batching, code_room
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward
from spec_jax.sampling import Sampler


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """Static settings of a generation run (hashable: a jit static argument).

    Attributes:
      max_new_tokens: size N of the output buffer; per-row limits may be smaller.
      stop_tokens: ids that end a row (the stop token is emitted, nothing after it).
      max_prompt_len: the longest prompt accepted, in tokens.
      prompt_bucket: prompt lengths are rounded up to a multiple of this.
      new_tokens_bucket: N is rounded up to a multiple of this, so changing
        max_new_tokens within a bucket does not retrace.
      pad_id: the id written after a row ends.
    """

    max_new_tokens: int = 128
    stop_tokens: tuple[int, ...] = ()
    max_prompt_len: int = 1024
    prompt_bucket: int = 64
    new_tokens_bucket: int = 64
    pad_id: int = 0

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f'max_new_tokens must be >= 1, got {self.max_new_tokens}')
        if self.max_prompt_len < 1:
            raise ValueError(f'max_prompt_len must be >= 1, got {self.max_prompt_len}')

    @property
    def buffer_len(self) -> int:
        return batching.round_up(self.max_new_tokens, self.new_tokens_bucket)


@struct.dataclass
class ARState:
    """The loop carry.

    Attributes:
      cache: the target's KV cache; lengths[b] = committed tokens of row b.
      last_b: the last emitted token of each row [B] (the next step's input).
      out_bn: emitted tokens [B, N].
      num_out_b: emitted tokens per row [B].
      limit_b: per-row token limit [B].
      done_b: finished rows [B].
      key: PRNG key.
    """

    cache: KVCache
    last_b: jax.Array
    out_bn: jax.Array
    num_out_b: jax.Array
    limit_b: jax.Array
    done_b: jax.Array
    key: jax.Array


@dataclasses.dataclass(frozen=True)
class GenerationResult:
    """Generated token ids per row (stop token included), with timing.

    Attributes:
      tokens: one list of ids per prompt.
      seconds: wall time of the call (prefill included; compilation too, the first time
        a shape runs).
      stats: speculative runs: `speculative.summarize` of the block statistics; {} for AR.
    """

    tokens: list[list[int]]
    seconds: float
    stats: dict = dataclasses.field(default_factory=dict)

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def emit(out_bn, num_out_b, token_b, live_b):
    """Appends `token_b` to the live rows of the output buffer."""
    rows_b = jnp.arange(out_bn.shape[0])
    col_b = jnp.where(live_b, num_out_b, out_bn.shape[1])  # Out of range: dropped.
    return out_bn.at[rows_b, col_b].set(token_b, mode='drop'), num_out_b + live_b


def is_stop(token_b: jax.Array, stop_tokens: tuple[int, ...]) -> jax.Array:
    if not stop_tokens:
        return jnp.zeros(token_b.shape, bool)
    return jnp.any(token_b[:, None] == jnp.asarray(stop_tokens, jnp.int32)[None, :], axis=1)


def prefill(cfg, params, cache, prompt_bp, prompt_len_b, tap_layers=()):
    """Writes the prompts into the cache and commits them.

    Returns the logits at each row's last prompt token [B, V], the taps of every prompt
    token [B, P, E, D] (or None) and the cache.
    """
    batch, bucket = prompt_bp.shape
    positions_bp = jnp.broadcast_to(jnp.arange(bucket, dtype=jnp.int32), (batch, bucket))
    logits_b1v, taps, cache = forward(
        cfg,
        params,
        prompt_bp,
        positions_bp,
        cache,
        cache.causal_mask(bucket),
        tap_layers=tap_layers,
        logits_index_bu=(prompt_len_b - 1)[:, None],
    )
    return logits_b1v[:, 0], taps, cache.set_lengths(prompt_len_b)


@partial(jax.jit, static_argnames=('cfg', 'settings'))
def ar_generate(
    cfg: ModelConfig,
    settings: DecodeSettings,
    params: dict,
    sampler: Sampler,
    prompt_bp: jax.Array,
    prompt_len_b: jax.Array,
    limit_b: jax.Array,
    key: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """The on-device AR loop: prompts [B, P] -> (tokens [B, N], lengths [B])."""
    batch, bucket = prompt_bp.shape
    cache = KVCache.init(cfg, batch, bucket + settings.buffer_len)
    logits_bv, _, cache = prefill(cfg, params, cache, prompt_bp, prompt_len_b)
    key, sub = jax.random.split(key)
    first_b, _ = sampler.sample(sub, logits_bv)
    out_bn = jnp.full((batch, settings.buffer_len), settings.pad_id, jnp.int32)
    out_bn, num_out_b = emit(out_bn, jnp.zeros((batch,), jnp.int32), first_b, limit_b > 0)
    state = ARState(
        cache=cache,
        last_b=first_b,
        out_bn=out_bn,
        num_out_b=num_out_b,
        limit_b=limit_b,
        done_b=is_stop(first_b, settings.stop_tokens) | (num_out_b >= limit_b),
        key=key,
    )

    def step(s: ARState) -> ARState:
        cache = s.cache
        logits_b1v, _, cache = forward(
            cfg, params, s.last_b[:, None], cache.positions(1), cache, cache.causal_mask(1)
        )
        live_b = ~s.done_b
        cache = cache.advance(live_b)
        key, sub = jax.random.split(s.key)
        token_b, _ = sampler.sample(sub, logits_b1v[:, 0])
        token_b = jnp.where(live_b, token_b, settings.pad_id)
        out_bn, num_out_b = emit(s.out_bn, s.num_out_b, token_b, live_b)
        done_b = s.done_b | is_stop(token_b, settings.stop_tokens) | (num_out_b >= s.limit_b)
        return s.replace(
            cache=cache, last_b=token_b, out_bn=out_bn, num_out_b=num_out_b, done_b=done_b, key=key
        )

    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done_b), step, state)
    return state.out_bn, state.num_out_b


def generate(
    cfg: ModelConfig,
    params: dict,
    prompts: Sequence[Sequence[int]],
    settings: DecodeSettings,
    sampler: Sampler | None = None,
    *,
    seed: int = 0,
    max_new_tokens: Sequence[int] | int | None = None,
) -> GenerationResult:
    """Generates continuations of token-id prompts with plain AR decoding.

    Args:
      cfg: the model config.
      params: the model parameters.
      prompts: B token-id lists (different lengths allowed).
      settings: static settings (buffer sizes, stop tokens).
      sampler: the sampling transform (None: greedy, temperature 0).
      seed: PRNG seed; the same seed and inputs give the same tokens.
      max_new_tokens: per-row (or one) token limit, at most settings.max_new_tokens.

    Returns:
      A GenerationResult; each row ends at its first stop token or its limit.
    """
    batch = batching.pack_prompts(
        prompts,
        prompt_bucket=settings.prompt_bucket,
        max_prompt_len=settings.max_prompt_len,
        pad_id=settings.pad_id,
    )
    limit_b = row_limits(max_new_tokens, len(prompts), settings.max_new_tokens)
    check_context(cfg, batch.bucket + settings.buffer_len)
    sampler = sampler or Sampler(temperature=0.0)
    code_room.ensure_room()
    start = time.perf_counter()
    out_bn, num_b = ar_generate(
        cfg,
        settings,
        params,
        sampler,
        jnp.asarray(batch.tokens),
        jnp.asarray(batch.lengths),
        jnp.asarray(limit_b),
        jax.random.PRNGKey(seed),
    )
    out_bn, num_b = jax.device_get((out_bn, num_b))
    seconds = time.perf_counter() - start
    return GenerationResult(batching.trim_rows(out_bn, num_b), seconds)


def row_limits(max_new_tokens, num_rows: int, ceiling: int) -> np.ndarray:
    """Per-row token limits as an int32 array, validated against the buffer size."""
    if max_new_tokens is None:
        max_new_tokens = ceiling
    limits = np.broadcast_to(np.asarray(max_new_tokens, np.int32), (num_rows,)).copy()
    if (limits < 1).any() or (limits > ceiling).any():
        raise ValueError(
            f'max_new_tokens {limits.tolist()} must be in [1, {ceiling}] '
            f'(settings.max_new_tokens); raise the setting for longer outputs'
        )
    return limits


def check_context(
    cfg: ModelConfig,
    slots: int,
    parts: str = 'prompt bucket + new tokens',
    model: str = 'the model',
    knobs: str = 'max_prompt_len or max_new_tokens',
) -> None:
    """Raises when a run needs more positions (`slots`, the sum of `parts`) than `model`
    supports; the message says which settings (`knobs`) to lower."""
    if slots > cfg.max_position:
        raise ValueError(
            f'{parts} needs {slots} positions but {model} supports {cfg.max_position}; '
            f'lower {knobs}'
        )
