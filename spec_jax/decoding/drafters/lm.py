"""A draft LM: a small decoder sharing the target's tokenizer."""

from __future__ import annotations

import dataclasses
from functools import partial
from typing import ClassVar

import jax
import jax.numpy as jnp

from spec_jax import sharding
from spec_jax.decoding.drafters.base import (
    CONTEXT_KNOBS,
    CONTEXT_PARTS,
    ProbsFn,
    draw,
    fit_vocab,
    forced_steps,
    gather_tokens,
    step_keys,
)
from spec_jax.decoding.state import check_context
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward

# A deferred draft LM's catch-up widths above `catch_up` (a 1,536-token prompt: 3 forwards
# of 512, then at most 7 of 64 and 3 of 16).
PREFILL_CHUNKS = (512, 64)


@dataclasses.dataclass(frozen=True)
class LMDrafter:
    """A small decoder LM that shares the target's tokenizer.

    Its cache mirrors the target's committed prefix: its `lengths` mark how far (slots
    below them hold the text's keys/values). Each round feeds a fixed 2-token window
    [s_{C-1}, s_C] at positions C-1, C (C = committed tokens, s_C the pending token): when
    the last round accepted every draft, the draft never consumed its last draft token,
    which now sits at C-1; otherwise slot C-1 is rewritten with the value it already holds.
    One static shape covers both cases. Then A-1 single-token steps follow; `observe` marks
    the cache valid below the new C - 1.

    A round that drafts nothing (the adaptive AR tier: `follow`) costs the draft nothing;
    the next `propose` first catches the cache up over the tokens it missed, `catch_up`
    tokens a forward (`lax.while_loop`: one forward for a gap of up to `catch_up`, none
    when there is no gap). `deferred()` (the adaptive engine's) sets `prefill_chunks`: its
    `init` then leaves the cache empty and the first proposal feeds the prompt, each chunk
    width while the batch's widest gap is at least that wide, so a run that never drafts
    never pays the draft's prefill (on this CPU 4% of a call at batch 8 over articles of up
    to 769 tokens, docs/performance.md); `lag` is what `adaptive` prices for it.

    `vocab_size` is the target's V (default: the draft's own). A draft whose embedding
    table differs from the target's only by padding rows (the same tokenizer, e.g.
    Qwen2.5-0.5B's 151,936 rows against Qwen2.5-72B's 152,064) drafts over the target's
    ids: q is 0 on ids the draft lacks (`fit_vocab`); `make` checks the tokenizers.

    On a mesh its cache rows split by `rules` (default `sharding.DRAFT_RULES`: over 'data'
    only, its weights on every device); `decoding.build` places its weights by the same
    rules.
    """

    cfg: ModelConfig
    vocab_size: int = 0
    rules: sharding.ShardingRules = sharding.DRAFT_RULES
    catch_up: int = 16
    prefill_chunks: tuple[int, ...] = ()
    tap_layers: ClassVar[tuple[int, ...]] = ()
    narrows: ClassVar[bool] = False

    def __post_init__(self):
        if not self.vocab_size:
            object.__setattr__(self, 'vocab_size', self.cfg.vocab_size)
        if self.catch_up < 1:
            raise ValueError(
                f'LMDrafter(catch_up={self.catch_up}): tokens a catch-up forward feeds must be >= 1'
            )
        chunks = tuple(int(w) for w in self.prefill_chunks)
        if list(chunks) != sorted(set(chunks), reverse=True) or any(w <= self.catch_up
                                                                      for w in chunks):
            raise ValueError(f'LMDrafter(prefill_chunks={self.prefill_chunks}): give '
                             f'descending distinct widths above catch_up ({self.catch_up})')
        object.__setattr__(self, 'prefill_chunks', chunks)

    def check(self, cfg, slots=None):
        if self.vocab_size != cfg.vocab_size:
            raise ValueError(
                f"the draft LM drafts over {self.vocab_size} ids but the target's vocabulary "
                f'has {cfg.vocab_size}: draft and target must share one tokenizer (for a '
                f'draft whose embedding table is the same tokenizer with other padding, '
                f'pass LMDrafter(draft_cfg, vocab_size={cfg.vocab_size}))'
            )
        if slots is not None:  # Its cache has the target's slots.
            check_context(self.cfg, slots, CONTEXT_PARTS, 'the draft', CONTEXT_KNOBS)

    def deferred(self) -> LMDrafter:
        return self if self.prefill_chunks else dataclasses.replace(
            self, prefill_chunks=PREFILL_CHUNKS)

    def lag(self, cache: KVCache, committed_b) -> jax.Array:
        return jnp.maximum(committed_b - 1 - cache.lengths, 0)

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None) -> KVCache:
        del taps_bped
        batch, slots = history_bs.shape
        prompt_bp = history_bs[:, :bucket]
        cache = KVCache.init(self.cfg, batch, slots, rules=self.rules)
        if self.prefill_chunks:  # Deferred: the first proposal catches up from slot 0.
            return cache
        positions = jnp.broadcast_to(jnp.arange(bucket, dtype=jnp.int32), (batch, bucket))
        _, _, cache = forward(
            self.cfg,
            params,
            prompt_bp,
            positions,
            cache,
            cache.causal_mask(bucket),
            logits_index_bu=jnp.zeros((batch, 1), jnp.int32),  # Logits unused: keep one.
        )
        return cache.set_lengths(prompt_len_b)

    def propose(
        self, params, cache: KVCache, history_bs, committed_b, key_b, num_draft: int,
        probs_fn: ProbsFn, forced=None,
    ):  # fmt: skip
        def probs(logits_bv):
            return probs_fn(fit_vocab(logits_bv, self.vocab_size))

        cache = self._catch_up(params, cache, history_bs, committed_b).set_lengths(committed_b - 1)
        window_b2 = gather_tokens(history_bs, cache.positions(2))
        logits_b2v, _, cache = forward(
            self.cfg,
            params,
            window_b2,
            cache.positions(2),
            cache,
            cache.causal_mask(2),
            logits_index_bu=jnp.ones((history_bs.shape[0], 1), jnp.int32),
        )
        cache = cache.advance(2)
        keys_ab = step_keys(key_b, num_draft)
        forced_scan, forced_last = forced_steps(forced)

        def step(carry, inputs):
            cache, logits_bv = carry
            key_b, forced_step = inputs
            x_b, q_bv = draw(key_b, probs(logits_bv), forced_step)
            logits_b1v, _, cache = forward(
                self.cfg, params, x_b[:, None], cache.positions(1), cache, cache.causal_mask(1)
            )
            return (cache.advance(1), logits_b1v[:, 0]), (x_b, q_bv)

        steps = (keys_ab[:-1], forced_scan)
        (cache, logits_bv), (x_ab, q_abv) = jax.lax.scan(step, (cache, logits_b2v[:, 0]), steps)
        # The last draft needs no forward of its own.
        x_last_b, q_last_bv = draw(keys_ab[-1], probs(logits_bv), forced_last)
        x_ba = jnp.concatenate([x_ab.T, x_last_b[:, None]], 1)
        q_bav = jnp.concatenate([q_abv.transpose(1, 0, 2), q_last_bv[:, None]], 1)
        return cache, x_ba, q_bav

    def _catch_up(self, params, cache: KVCache, history_bs, committed_b) -> KVCache:
        """The cache valid below C - 1: the tokens from its `lengths` on fed each width of
        `prefill_chunks` while the widest gap is at least that wide, then `catch_up` at a
        time (rows with a shorter gap feed the text past C - 1 too: the window and the
        steps overwrite those slots before any reads them; slots past the cache are
        dropped)."""
        target_b = committed_b - 1

        def chunk(width, cache):
            tokens_bw = gather_tokens(history_bs, cache.positions(width))
            _, _, cache = forward(
                self.cfg, params, tokens_bw, cache.positions(width), cache,
                cache.causal_mask(width), logits_index_bu=jnp.zeros_like(target_b)[:, None],
            )  # fmt: skip
            return cache.set_lengths(jnp.minimum(cache.lengths + width, target_b))

        for width in self.prefill_chunks:
            cache = jax.lax.while_loop(lambda c, w=width: jnp.max(target_b - c.lengths) >= w,
                                       partial(chunk, width), cache)  # fmt: skip
        return jax.lax.while_loop(lambda c: jnp.any(c.lengths < target_b),
                                  partial(chunk, self.catch_up), cache)  # fmt: skip

    def observe(self, params, cache, history_bs, start_b, committed_b, taps_bted):
        return cache.set_lengths(committed_b - 1)  # `propose` re-feeds its 2-token window.

    def follow(self, params, cache, history_bs, start_b, committed_b, taps_bted):
        return cache  # Still valid below its lengths: `propose` catches it up.

    def draft_len(self, history_bs, committed_b, num_draft):
        return jnp.full(history_bs.shape[:1], num_draft, jnp.int32)
