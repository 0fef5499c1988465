"""Prompt lookup: n-gram drafting from the row's own history, alone (`NgramDrafter`) or in
front of a model drafter (`PromptLookup`)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp

from spec_jax import sharding
from spec_jax.decoding.drafters.base import (
    Drafter,
    ProbsFn,
    gather_tokens,
    no_lag,
    not_deferred,
)


@dataclasses.dataclass(frozen=True)
class NgramDrafter:
    """Prompt lookup decoding: find the latest earlier occurrence of the last `n` tokens in
    the row's history and propose the A tokens that followed it (one-hot q). Falls back to
    shorter n-grams, and to repeating the pending token when nothing matches; `draft_len`
    tells the engine how many proposals are matched, so it verifies no more than that."""

    n: int = 3
    vocab_size: int = 0  # The target's V (q is one-hot over it); required.

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f'ngram size n={self.n} must be >= 1')
        if self.vocab_size < 1:
            raise ValueError(
                f"NgramDrafter needs the target's vocabulary size, got vocab_size="
                f'{self.vocab_size}: pass vocab_size=cfg.vocab_size'
            )

    tap_layers: ClassVar[tuple[int, ...]] = ()
    narrows: ClassVar[bool] = True
    rules: ClassVar[sharding.ShardingRules] = sharding.DRAFT_RULES  # No weights, no cache.

    def check(self, cfg, slots=None):
        if self.vocab_size != cfg.vocab_size:
            raise ValueError(
                f"NgramDrafter(vocab_size={self.vocab_size}) does not match the target's "
                f'vocabulary of {cfg.vocab_size}'
            )

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None):
        return None

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        return state

    follow = observe
    lag = no_lag
    deferred = not_deferred

    def propose(
        self, params, state, history_bs, committed_b, key_b, num_draft: int,
        probs_fn: ProbsFn, forced=None,
    ):  # fmt: skip
        del params, key_b, probs_fn, forced
        x_ba, _ = lookup(history_bs, committed_b, num_draft, self.n)
        return state, x_ba, jax.nn.one_hot(x_ba, self.vocab_size, dtype=jnp.float32)

    def draft_len(self, history_bs, committed_b, num_draft: int):
        """[B] how many of the `num_draft` proposals are a matched continuation (the rest
        would repeat the pending token): the engine verifies only as many as some row has."""
        _, known_ba = lookup(history_bs, committed_b, num_draft, self.n)
        return known_ba.sum(1)


def lookup(history_bs, end_b, num_draft: int, max_n: int, min_n: int = 1):
    """Prompt lookup: the tokens that followed the latest earlier occurrence of the row's
    last n tokens (those ending at index `end_b`), for the longest n in [min_n, max_n] that
    occurs.

    Returns:
      (tokens [B, A], known [B, A]): known is False where nothing matched or the
      continuation runs past `end_b` (its tokens are unknown; `tokens` holds the token at
      `end_b` there). Known positions form a prefix of each row.
    """
    batch, slots = history_bs.shape
    starts_s = jnp.arange(slots)
    best_b = jnp.full((batch,), -1)
    for n in range(max_n, min_n - 1, -1):  # Longest n-gram first; shorter only if none.
        match_bs = jnp.ones((batch, slots), bool)
        for k in range(n):  # Window ending at s matches the suffix ending at end_b.
            suffix_b = gather_tokens(history_bs, (end_b - k)[:, None])
            window_bs = jnp.roll(history_bs, k, axis=1)
            match_bs &= (window_bs == suffix_b) & (starts_s[None, :] >= k)
        match_bs &= (starts_s[None, :] < end_b[:, None]) & (end_b[:, None] >= n - 1)
        last_b = jnp.max(jnp.where(match_bs, starts_s[None, :], -1), axis=1)
        best_b = jnp.where(best_b >= 0, best_b, last_b)
    follow_ba = best_b[:, None] + 1 + jnp.arange(num_draft)[None, :]
    known_ba = (best_b[:, None] >= 0) & (follow_ba <= end_b[:, None])
    pending_b = gather_tokens(history_bs, end_b[:, None])
    return jnp.where(known_ba, gather_tokens(history_bs, follow_ba), pending_b), known_ba


@dataclasses.dataclass(frozen=True)
class PromptLookup:
    """Prompt lookup first, a model drafter for the rest (REST / suffix-decoding style).

    Where the row's last n tokens (n from `n` down to `min_n`) occurred earlier, the tokens
    that followed are drafted with one-hot q; `base` (an LMDrafter or Eagle3Drafter) drafts
    the positions after the known continuation, and every position when nothing matches,
    going on from the looked-up tokens. Each position's proposal is a function of the
    committed text and the drafts before it, so `q` is still the law each draft was drawn
    from and every rule keeps its guarantees. Copying spans (summaries, quoted names and
    numbers, repeated code) are where a small draft is weakest; there a 3- or 2-gram match
    proposes the target's next token about three times in four (the embedded default on
    the held-out speed prompts; see the EAGLE-3 head's card).
    """

    base: Drafter  # An LMDrafter or Eagle3Drafter.
    n: int = 3
    min_n: int = 2
    narrows: ClassVar[bool] = False  # The model drafts every position lookup leaves.

    def __post_init__(self):
        if not 1 <= self.min_n <= self.n:
            raise ValueError(
                f'prompt lookup needs 1 <= min_n <= n, got n={self.n}, min_n={self.min_n}'
            )

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return tuple(self.base.tap_layers)

    @property
    def vocab_size(self) -> int:
        return self.base.vocab_size

    @property
    def rules(self) -> sharding.ShardingRules:
        return self.base.rules

    def check(self, cfg, slots=None):
        self.base.check(cfg, slots)

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None):
        return self.base.init(params, history_bs, prompt_len_b, bucket, taps_bped)

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        return self.base.observe(params, state, history_bs, start_b, committed_b, taps_bted)

    def follow(self, params, state, history_bs, start_b, committed_b, taps_bted):
        return self.base.follow(params, state, history_bs, start_b, committed_b, taps_bted)

    def lag(self, state, committed_b):
        return self.base.lag(state, committed_b)

    def deferred(self) -> PromptLookup:
        return dataclasses.replace(self, base=self.base.deferred())

    def propose(
        self, params, state, history_bs, committed_b, key_b, num_draft: int,
        probs_fn: ProbsFn, forced=None,
    ):  # fmt: skip
        del forced
        found = lookup(history_bs, committed_b, num_draft, self.n, self.min_n)
        return self.base.propose(
            params, state, history_bs, committed_b, key_b, num_draft, probs_fn, forced=found
        )

    def draft_len(self, history_bs, committed_b, num_draft):
        return self.base.draft_len(history_bs, committed_b, num_draft)
