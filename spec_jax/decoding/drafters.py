"""Chain proposers: a draft LM, and prompt lookup (n-gram) drafting.

A drafter proposes A tokens per row after the committed prefix and returns the processed
probabilities q it sampled them from ([B, A, V]): verifiers need exactly that q (HF
#47932: using unwarped q breaks losslessness). Deterministic proposals (greedy drafting,
n-gram lookup) have one-hot q.

Both drafters read the engine's token history `history_bs` (prompt, committed tokens and
the pending token at `committed_b`), so neither keeps its own copy of the text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp

from spec_jax import sampling
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward

ProbsFn = Callable[[jax.Array], jax.Array]  # logits [..., V] -> processed probs [..., V]


def gather_tokens(history_bs: jax.Array, index_bt: jax.Array) -> jax.Array:
    return jnp.take_along_axis(history_bs, jnp.clip(index_bt, 0, history_bs.shape[1] - 1), 1)


@dataclasses.dataclass(frozen=True)
class LMDrafter:
    """A small decoder LM that shares the target's tokenizer.

    Its cache mirrors the target's committed prefix. Each round feeds a fixed 2-token window
    [s_{C-1}, s_C] at positions C-1, C (C = committed tokens, s_C the pending token): when
    the last round accepted every draft, the draft never consumed its last draft token,
    which now sits at C-1; otherwise slot C-1 is rewritten with the value it already holds.
    One static shape covers both cases. Then A-1 single-token steps follow.
    """

    cfg: ModelConfig

    def init(self, params, prompt_bp, prompt_len_b, slots: int) -> KVCache:
        batch, bucket = prompt_bp.shape
        cache = KVCache.init(self.cfg, batch, slots)
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
        self,
        params,
        cache: KVCache,
        history_bs,
        committed_b,
        key,
        num_draft: int,
        probs_fn: ProbsFn,
    ):
        cache = cache.set_lengths(committed_b - 1)
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
        keys = jax.random.split(key, num_draft)

        def draw(carry, key):
            cache, logits_bv = carry
            q_bv = probs_fn(logits_bv)
            x_b = sampling.sample(key, q_bv)
            logits_b1v, _, cache = forward(
                self.cfg, params, x_b[:, None], cache.positions(1), cache, cache.causal_mask(1)
            )
            return (cache.advance(1), logits_b1v[:, 0]), (x_b, q_bv)

        (cache, logits_bv), (x_ab, q_abv) = jax.lax.scan(draw, (cache, logits_b2v[:, 0]), keys[:-1])
        q_last_bv = probs_fn(logits_bv)  # The last draft needs no forward of its own.
        x_ba = jnp.concatenate([x_ab.T, sampling.sample(keys[-1], q_last_bv)[:, None]], 1)
        q_bav = jnp.concatenate([q_abv.transpose(1, 0, 2), q_last_bv[:, None]], 1)
        return cache, x_ba, q_bav


@dataclasses.dataclass(frozen=True)
class NgramDrafter:
    """Prompt lookup decoding: find the latest earlier occurrence of the last `n` tokens in
    the row's history and propose the A tokens that followed it (one-hot q). Falls back to
    shorter n-grams, and to repeating the pending token when nothing matches."""

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

    def init(self, params, prompt_bp, prompt_len_b, slots: int):
        return None

    def propose(
        self, params, state, history_bs, committed_b, key, num_draft: int, probs_fn: ProbsFn
    ):
        del params, key, probs_fn
        batch, slots = history_bs.shape
        end_b = committed_b  # The pending token's index: the suffix ends here.
        starts_s = jnp.arange(slots)
        best_b = jnp.full((batch,), -1)
        for n in range(self.n, 0, -1):  # Longest n-gram first; shorter only if none.
            match_bs = jnp.ones((batch, slots), bool)
            for k in range(n):  # Window ending at s matches the suffix ending at end_b.
                suffix_b = gather_tokens(history_bs, (end_b - k)[:, None])
                window_bs = jnp.roll(history_bs, k, axis=1)
                match_bs &= (window_bs == suffix_b) & (starts_s[None, :] >= k)
            match_bs &= (starts_s[None, :] < end_b[:, None]) & (end_b[:, None] >= n - 1)
            last_b = jnp.max(jnp.where(match_bs, starts_s[None, :], -1), axis=1)
            best_b = jnp.where(best_b >= 0, best_b, last_b)
        follow_ba = best_b[:, None] + 1 + jnp.arange(num_draft)[None, :]
        # Tokens past the committed text are unknown: propose the pending token instead.
        known_ba = (best_b[:, None] >= 0) & (follow_ba <= end_b[:, None])
        pending_b = gather_tokens(history_bs, end_b[:, None])
        x_ba = jnp.where(known_ba, gather_tokens(history_bs, follow_ba), pending_b)
        return state, x_ba, jax.nn.one_hot(x_ba, self.vocab_size, dtype=jnp.float32)
