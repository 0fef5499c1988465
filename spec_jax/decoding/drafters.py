"""Chain proposers: a draft LM, an EAGLE-3 head, prompt lookup (n-gram), and lookup first
with a model drafter for the rest.

A drafter proposes A tokens per row after the committed prefix and returns the processed
probabilities q it sampled them from ([B, A, V]): verifiers need exactly that q (HF
#47932: using unwarped q breaks losslessness). Deterministic proposals (greedy drafting,
n-gram lookup) have one-hot q.

The contract (a frozen, hashable dataclass; the engine's static argument):
  tap_layers: the target's hidden-state taps the drafter reads (() for most);
  vocab_size: the V its q covers (the target's);
  init(params, history_bs, prompt_len_b, bucket, taps_bped) -> state, after prefill;
  propose(params, state, history_bs, committed_b, key, num_draft, probs_fn, forced=None)
      -> (state, tokens [B, A], q [B, A, V]); `forced` = (tokens [B, A], use [B, A]) makes
      the drafter take the given token (one-hot q) where `use` holds, and go on from it
      (model drafters; `PromptLookup` passes it);
  observe(params, state, history_bs, start_b, committed_b, taps_bted) -> state, after each
      verification at positions start_b .. start_b + A with C = committed_b now;
  draft_len(history_bs, committed_b, num_draft) -> [B] (optional): how many of its next
      proposals are real; the engine then verifies only as many as the longest live row's
      (0: a plain one-token step), since a narrower target forward costs less.
Every drafter reads the engine's token history `history_bs` (prompt, committed tokens and
the pending token at `committed_b`), so none keeps its own copy of the text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import struct

from spec_jax import sampling
from spec_jax.models import eagle3 as e3
from spec_jax.models.cache import KVCache, attention_mask, empty_layer
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward

ProbsFn = Callable[[jax.Array], jax.Array]  # logits [..., V] -> processed probs [..., V]


def gather_tokens(history_bs: jax.Array, index_bt: jax.Array) -> jax.Array:
    return jnp.take_along_axis(history_bs, jnp.clip(index_bt, 0, history_bs.shape[1] - 1), 1)


def _draw(key, q_bv, forced=None):
    """x ~ q, or, with `forced` = (tokens [B], use [B]), the forced token where `use` (its
    q one-hot): (x [B], q [B, V])."""
    x_b = sampling.sample(key, q_bv)
    if forced is None:
        return x_b, q_bv
    forced_b, use_b = forced
    one_hot_bv = jax.nn.one_hot(forced_b, q_bv.shape[-1], dtype=q_bv.dtype)
    return jnp.where(use_b, forced_b, x_b), jnp.where(use_b[:, None], one_hot_bv, q_bv)


def _forced_steps(forced):
    """`forced` per draft step ([A, B] each; None stays None): (scan inputs for steps
    1..A-1, the last step's)."""
    if forced is None:
        return None, None
    tokens_ab, use_ab = forced[0].T, forced[1].T
    return (tokens_ab[:-1], use_ab[:-1]), (tokens_ab[-1], use_ab[-1])


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
    tap_layers = ()

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None) -> KVCache:
        del taps_bped
        batch, slots = history_bs.shape
        prompt_bp = history_bs[:, :bucket]
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
        forced=None,
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
        forced_steps, forced_last = _forced_steps(forced)

        def draw(carry, inputs):
            cache, logits_bv = carry
            key, forced_step = inputs
            x_b, q_bv = _draw(key, probs_fn(logits_bv), forced_step)
            logits_b1v, _, cache = forward(
                self.cfg, params, x_b[:, None], cache.positions(1), cache, cache.causal_mask(1)
            )
            return (cache.advance(1), logits_b1v[:, 0]), (x_b, q_bv)

        steps = (keys[:-1], forced_steps)
        (cache, logits_bv), (x_ab, q_abv) = jax.lax.scan(draw, (cache, logits_b2v[:, 0]), steps)
        # The last draft needs no forward of its own.
        x_last_b, q_last_bv = _draw(keys[-1], probs_fn(logits_bv), forced_last)
        x_ba = jnp.concatenate([x_ab.T, x_last_b[:, None]], 1)
        q_bav = jnp.concatenate([q_abv.transpose(1, 0, 2), q_last_bv[:, None]], 1)
        return cache, x_ba, q_bav

    def observe(self, params, cache, history_bs, start_b, committed_b, taps_bted):
        return cache  # `propose` re-feeds its 2-token window; nothing to do here.


@struct.dataclass
class Eagle3State:
    """An EAGLE-3 drafter's carry.

    Attributes:
      cache_k, cache_v: the head's keys/values [R, S, H] (R = B * K, as the target's cache);
        slot t holds the entry of position t (taps f_t with token x_{t+1}); slots below C
        (committed) are final.
      hidden_bd: the head's output at position C - 1 (the input of its next step) [B, D].
      logits_bu: its logits there over the draft vocabulary [B, U]: the law of x_1.
    """

    cache_k: jax.Array
    cache_v: jax.Array
    hidden_bd: jax.Array
    logits_bu: jax.Array


# Logit of target ids outside the head's draft vocabulary: probability exactly 0 after any
# temperature, and finite (no inf - inf in truncation samplers).
OUTSIDE_DRAFT_VOCAB = -1e9


@dataclasses.dataclass(frozen=True)
class Eagle3Drafter:
    """An EAGLE-3 head drafting a chain from the target's feature taps (EAGLE3.md §1.6).

    The head's entry at position t pairs the target's taps f_t with token x_{t+1} and
    predicts x_{t+2}. With C committed tokens and s_C pending, f_t exists for t <= C - 1
    (the target has processed those tokens), so the entry at C - 1 drafts x_1, the token
    after s_C. After prefill and after every verification (`observe`) the head runs one
    window over the positions the target just processed, [start, start + T), writing their
    entries into its cache: those below the new C are committed; those at or past it pair
    rejected drafts and are overwritten later. Its output at C - 1 is kept in the state.
    `propose` draws x_1 from it, then runs A - 1 steps that feed the head its own output
    with the drafted token (x_j at position C - 1 + j), exactly the training-time test's
    steps (tests/models/test_eagle3.py). The head's logits over its draft vocabulary U are
    scattered into V (`OUTSIDE_DRAFT_VOCAB` elsewhere), so q is a law over V.

    Params: {'head': head params, 'embed_vd': the target's input embeddings, 'draft_ids_u':
    the target id of each draft id} (`params_for`).
    """

    cfg: e3.Eagle3Config

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.taps)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    @staticmethod
    def params_for(head: e3.Eagle3Head, target_params: dict) -> dict:
        return dict(
            head=head.params, embed_vd=target_params['embed_vd'], draft_ids_u=head.draft_ids_u
        )

    def _window(self, params, cache_k, cache_v, tokens_bt, taps_bted, start_b, committed_b):
        """Head entries of positions start_b + t with tokens x_{start+t+1}; keeps the output
        at committed_b - 1."""
        t, slots = tokens_bt.shape[1], cache_k.shape[1]
        # A finished row can have committed nothing this round: any in-range index will do.
        last_b1 = jnp.clip(committed_b - 1 - start_b, 0, t - 1)[:, None]
        logits_b1u, hidden_btd, (cache_k, cache_v, _) = e3.eagle3_forward(
            self.cfg,
            params['head'],
            e3.embed(self.cfg, params['head'], params['embed_vd'], tokens_bt),
            taps_bted,
            start_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :],
            attention_mask(start_b, t, slots),
            kv=(cache_k, cache_v, start_b),
            logits_index_bu=last_b1,
        )
        hidden_bd = jnp.take_along_axis(hidden_btd, last_b1[:, :, None], 1)[:, 0]
        return Eagle3State(cache_k, cache_v, hidden_bd, logits_b1u[:, 0])

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None):
        batch, slots = history_bs.shape
        cfg = self.cfg
        zeros = empty_layer(batch, cfg.num_kv_heads, slots, cfg.head_dim, jnp.dtype(cfg.dtype))
        tokens_bp = gather_tokens(history_bs, jnp.arange(1, bucket + 1)[None, :])
        start_b = jnp.zeros((batch,), jnp.int32)
        return self._window(params, zeros, zeros, tokens_bp, taps_bped, start_b, prompt_len_b)

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        t = taps_bted.shape[1]
        tokens_bt = gather_tokens(history_bs, start_b[:, None] + 1 + jnp.arange(t)[None, :])
        return self._window(
            params, state.cache_k, state.cache_v, tokens_bt, taps_bted, start_b, committed_b
        )

    def _probs(self, params, logits_bu, probs_fn):
        batch = logits_bu.shape[0]
        logits_bv = jnp.full((batch, self.vocab_size), OUTSIDE_DRAFT_VOCAB, jnp.float32)
        return probs_fn(logits_bv.at[:, params['draft_ids_u']].set(logits_bu))

    def propose(
        self,
        params,
        state: Eagle3State,
        history_bs,
        committed_b,
        key,
        num_draft: int,
        probs_fn: ProbsFn,
        forced=None,
    ):
        del history_bs
        slots = state.cache_k.shape[1]
        keys = jax.random.split(key, num_draft)
        forced_steps, forced_last = _forced_steps(forced)

        def draw(carry, inputs):
            kv, hidden_bd, logits_bu = carry
            key, forced_step, j = inputs
            x_b, q_bv = _draw(key, self._probs(params, logits_bu, probs_fn), forced_step)
            pos_b = committed_b - 1 + j  # x_j's step, at position C - 1 + j.
            logits_b1u, hidden_b1d, kv = e3.eagle3_forward(
                self.cfg,
                params['head'],
                e3.embed(self.cfg, params['head'], params['embed_vd'], x_b[:, None]),
                hidden_bd[:, None],
                pos_b[:, None],
                attention_mask(pos_b, 1, slots),
                kv=(*kv[:2], pos_b),
                apply_fc=False,
            )
            return (kv, hidden_b1d[:, 0], logits_b1u[:, 0]), (x_b, q_bv)

        carry = ((state.cache_k, state.cache_v, committed_b), state.hidden_bd, state.logits_bu)
        steps = (keys[:-1], forced_steps, jnp.arange(1, num_draft, dtype=jnp.int32))
        (_, _, logits_bu), (x_ab, q_abv) = jax.lax.scan(draw, carry, steps)
        # No forward for the last one.
        q_last_bv = self._probs(params, logits_bu, probs_fn)
        x_last_b, q_last_bv = _draw(keys[-1], q_last_bv, forced_last)
        x_ba = jnp.concatenate([x_ab.T, x_last_b[:, None]], 1)
        q_bav = jnp.concatenate([q_abv.transpose(1, 0, 2), q_last_bv[:, None]], 1)
        # The steps' cache writes sit at or past C: the next window overwrites them.
        return state, x_ba, q_bav


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

    tap_layers = ()

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None):
        return None

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        return state

    def propose(
        self,
        params,
        state,
        history_bs,
        committed_b,
        key,
        num_draft: int,
        probs_fn: ProbsFn,
        forced=None,
    ):
        del params, key, probs_fn, forced
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

    base: LMDrafter | Eagle3Drafter
    n: int = 3
    min_n: int = 2

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

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None):
        return self.base.init(params, history_bs, prompt_len_b, bucket, taps_bped)

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        return self.base.observe(params, state, history_bs, start_b, committed_b, taps_bted)

    def propose(
        self,
        params,
        state,
        history_bs,
        committed_b,
        key,
        num_draft: int,
        probs_fn: ProbsFn,
        forced=None,
    ):
        del forced
        found = lookup(history_bs, committed_b, num_draft, self.n, self.min_n)
        return self.base.propose(
            params, state, history_bs, committed_b, key, num_draft, probs_fn, forced=found
        )


Drafter = LMDrafter | Eagle3Drafter | NgramDrafter | PromptLookup
