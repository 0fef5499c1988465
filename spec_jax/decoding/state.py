"""Decode settings, the loop's state, and the per-row bookkeeping every round shares.

The state is one frozen pytree (`DecodeState`) carried through `lax.while_loop`: the
target's KV cache, the drafter's state, the token history, per-row counters, keys and
statistics. A round never mutates it; it returns a new one (docs/engine.md).

Token history. `history_bs` holds each row's prompt, its committed tokens and the pending
token s_C (emitted, not yet in the caches) at index C = `committed_b`. Generated tokens are
read back from it after the loop, so AR and speculative rounds commit the same way.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from spec_jax.decoding import batching
from spec_jax.decoding.stats import Stats
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward


@dataclasses.dataclass(frozen=True)
class DecodeSettings:
    """Buffer sizes and stop handling of a run (hashable: part of the engine's static half).

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
        object.__setattr__(self, 'stop_tokens', tuple(int(t) for t in self.stop_tokens))

    @property
    def buffer_len(self) -> int:
        return batching.round_up(self.max_new_tokens, self.new_tokens_bucket)


@struct.dataclass
class DecodeState:
    """The loop carry.

    Attributes:
      cache: the target's KV cache (lengths = committed_b).
      draft: the drafter's state (a KVCache for a draft LM, Eagle3State for an EAGLE-3
        head, None for prompt lookup and AR).
      history_bs: prompt, committed tokens and the pending token per row [B, S].
      committed_b: C, committed tokens per row; history[b, C] is the pending token.
      prompt_len_b: prompt lengths [B].
      limit_b: per-row limits on generated tokens [B].
      done_b: finished rows [B].
      key_b: one PRNG key per row [B, 2], a function of the run's seed and the row's sample
        id only, so a row's tokens do not depend on the batch it runs in.
      stats: per-row counters (`spec_jax.decoding.stats`).
      ranks: an adaptive tree's acceptance counts per depth and rank [2, A, C] (None
        otherwise; `decoding.adaptive_trees.rank_counts`).
    """

    cache: KVCache
    draft: Any
    history_bs: jax.Array
    committed_b: jax.Array
    prompt_len_b: jax.Array
    limit_b: jax.Array
    done_b: jax.Array
    key_b: jax.Array
    stats: Stats
    ranks: jax.Array | None = None

    @property
    def num_out_b(self) -> jax.Array:
        """Generated tokens per row (the pending token included)."""
        return self.committed_b + 1 - self.prompt_len_b

    def split_keys(self, num: int) -> tuple[jax.Array, ...]:
        """(the next state's keys, then num - 1 fresh keys), each [B, 2], row by row."""
        keys = jax.vmap(lambda k: jax.random.split(k, num))(self.key_b)  # [B, num, 2]
        return tuple(keys[:, i] for i in range(num))

    def commit(self, tokens_bt, num_b, stop_tokens) -> DecodeState:
        """Appends each live row's first `num_b` of `tokens_bt` after its pending token,
        cut just after a stop token and at the row's limit; C advances by the kept count
        (the pending token's keys/values, written by this round's forward, are committed
        with it). Rows that stop or reach their limit are done."""
        live_b = ~self.done_b
        room_b = self.limit_b - self.num_out_b
        kept_b, stopped_b = cut_block(tokens_bt, num_b, stop_tokens, room_b)
        kept_b = jnp.where(live_b, kept_b, 0)
        t, slots = tokens_bt.shape[1], self.history_bs.shape[1]
        cols_bt = self.committed_b[:, None] + 1 + jnp.arange(t)[None, :]
        cols_bt = jnp.where(jnp.arange(t)[None, :] < kept_b[:, None], cols_bt, slots)
        rows_b1 = jnp.arange(tokens_bt.shape[0])[:, None]
        history_bs = self.history_bs.at[rows_b1, cols_bt].set(tokens_bt, mode='drop')
        committed_b = self.committed_b + kept_b
        full_b = committed_b + 1 - self.prompt_len_b >= self.limit_b
        return self.replace(
            cache=self.cache.set_lengths(committed_b),
            history_bs=history_bs,
            committed_b=committed_b,
            done_b=self.done_b | (live_b & (stopped_b | full_b)),
        )

    def pending_b(self) -> jax.Array:
        """The pending token s_C of each row [B]."""
        return jnp.take_along_axis(self.history_bs, self.committed_b[:, None], 1)[:, 0]

    def outputs(self, buffer_len: int) -> tuple[jax.Array, jax.Array]:
        """(generated tokens [B, N] read from the history, their counts [B])."""
        slots = self.history_bs.shape[1]
        cols_bo = self.prompt_len_b[:, None] + jnp.arange(buffer_len)[None, :]
        tokens_bo = jnp.take_along_axis(self.history_bs, jnp.minimum(cols_bo, slots - 1), 1)
        return tokens_bo, self.num_out_b


def is_stop(token_b: jax.Array, stop_tokens: tuple[int, ...]) -> jax.Array:
    if not stop_tokens:
        return jnp.zeros(token_b.shape, bool)
    return jnp.any(token_b[..., None] == jnp.asarray(stop_tokens, jnp.int32), axis=-1)


def cut_block(tokens_bt, num_b, stop_tokens, room_b):
    """How many of a block's tokens a row keeps: up to and including its first stop
    token, at most `room_b`. Returns (kept [B], hit a stop [B])."""
    t = tokens_bt.shape[1]
    stop_bt = is_stop(tokens_bt, stop_tokens) & (jnp.arange(t)[None, :] < num_b[:, None])
    first_stop_b = jnp.where(stop_bt.any(1), jnp.argmax(stop_bt, axis=1) + 1, t + 1)
    kept_b = jnp.minimum(jnp.minimum(num_b, first_stop_b), room_b)
    return kept_b, first_stop_b <= kept_b


def uncut_draft(drafts_ba, stop_tokens, room_b, num_draft: int) -> jax.Array:
    """[B] bool: the rows whose draft of a round no stop token and no limit cut, as the
    paper's drafter would have proposed it whole (Fast-HSD's draft stops at an end token or
    where the token limit leaves no room): no drafted token is a stop token and `room_b`
    (tokens the row may still emit) holds all `num_draft` drafts and the bonus. With all
    A drafts verified, such a round is a full block (`Stats.update`'s `full_b`)."""
    return ~is_stop(drafts_ba, stop_tokens).any(-1) & (room_b >= num_draft + 1)


def prefill(cfg: ModelConfig, params, cache: KVCache, prompt_bp, prompt_len_b, tap_layers=()):
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
