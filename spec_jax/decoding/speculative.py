"""Chain speculative decoding: draft A tokens, verify A + 1 positions, any rule, on device.

One round (a "block"), for every row at once:
  1. the drafter proposes x_1..x_A with the processed q it sampled them from;
  2. the target scores [s_C, x_1..x_A] in one forward (T = A + 1) at positions C..C+A;
  3. `spec_jax.rules.verify_chain` accepts n drafts and draws the replacement/bonus token;
  4. the n + 1 emitted tokens are appended (cut at a stop token or the row's limit) and
     C advances by n + 1: the target cache already holds the accepted keys/values, the
     rejected ones are past the new length and are overwritten later;
  5. the drafter observes the round (an EAGLE-3 head reads the taps of the verified
     positions; a drafter without `tap_layers` gets none and the target computes none).
A drafter with `draft_len` (prompt lookup) says how many of its A drafts are real; each
round is then only as wide as the longest live row's (0: a plain one-token step).

The token history `history_bs` holds each row's prompt, committed tokens and the pending
token s_C (emitted, not yet in the caches) at index C = `committed_b`.

Probabilities: p = transform(sampler.probs(target logits)), q likewise for the draft,
where `transform` is the matched baseline's truncation when running a baseline
(PAPER.md §5: applied to target and draft in chain mode) and the identity otherwise, so a
lossy rule's gate reads the temperature-processed target.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from functools import partial
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from spec_jax import rules, sampling
from spec_jax.decoding import autoregressive as ar
from spec_jax.decoding import batching, code_room
from spec_jax.decoding.drafters import Drafter, Eagle3Drafter, LMDrafter, PromptLookup
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward
from spec_jax.sampling import Sampler


@dataclasses.dataclass(frozen=True)
class SpecSettings:
    """Static settings of a chain speculative run (hashable: a jit static argument).

    Attributes:
      decode: buffer sizes, stop tokens, buckets (as for AR decoding).
      num_draft: A (gamma), drafted tokens per block.
      rule: the verification rule.
      baseline: run `rules.matched_baseline(rule)` instead: truncate p and q with its
        transform and verify losslessly.
      meter_distortion: also measure, at every verified position, the TV distance and the
        overshoot ratio of the rule's induced law from the matched baseline's law.
    """

    decode: ar.DecodeSettings
    num_draft: int
    rule: rules.Rule = rules.Lossless()
    baseline: bool = False
    meter_distortion: bool = False

    def __post_init__(self):
        if self.num_draft < 1:
            raise ValueError(f'num_draft (gamma) must be >= 1, got {self.num_draft}')

    @property
    def verifier(self) -> rules.Rule:
        return rules.matched_baseline(self.rule).rule if self.baseline else self.rule

    def transform(self, probs: jax.Array) -> jax.Array:
        return rules.matched_baseline(self.rule).transform(probs) if self.baseline else probs


@struct.dataclass
class SpecStats:
    """Per-row counters (all [B] unless noted), accumulated on device.

    They count what the rule decided, before a stop token or the token limit cuts a row's
    last block: acceptance and block efficiency describe the draft and the rule, not where
    the output happened to end (so `emitted` can exceed the tokens returned by at most one
    block per row).

    Attributes:
      blocks: target forwards, one per block (rounds with nothing drafted included).
      drafted: drafted tokens verified (A per block, or fewer where the drafter's
        `draft_len` made the round narrower).
      accepted: accepted drafts.
      emitted: tokens emitted by blocks (accepted drafts + replacement/bonus tokens).
      accepted_at_ba: [B, A] blocks whose draft at position i was accepted.
      reached_at_ba: [B, A] blocks that examined position i.
      block_accepted_bk: [B, K] accepted drafts in block k (K = output buffer length).
      tv_at_ba: [B, A] sum over the blocks that examined draft position i of TV(pi,
        baseline law) there; 0 unless metered.
      overshoot_at_ba: [B, A] max over the same of max_x pi(x) / p_A(x).
      metered: verified positions that were metered.
    """

    blocks: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    emitted: jax.Array
    accepted_at_ba: jax.Array
    reached_at_ba: jax.Array
    block_accepted_bk: jax.Array
    tv_at_ba: jax.Array
    overshoot_at_ba: jax.Array
    metered: jax.Array

    @classmethod
    def zeros(cls, batch: int, num_draft: int, max_blocks: int) -> SpecStats:
        z = jnp.zeros((batch,), jnp.int32)
        return cls(
            blocks=z,
            drafted=z,
            accepted=z,
            emitted=z,
            accepted_at_ba=jnp.zeros((batch, num_draft), jnp.int32),
            reached_at_ba=jnp.zeros((batch, num_draft), jnp.int32),
            block_accepted_bk=jnp.full((batch, max_blocks), -1, jnp.int32),
            tv_at_ba=jnp.zeros((batch, num_draft), jnp.float32),
            overshoot_at_ba=jnp.zeros((batch, num_draft), jnp.float32),
            metered=z,
        )


@struct.dataclass
class SpecState:
    """The loop carry.

    Attributes:
      cache: the target's KV cache (lengths = committed_b).
      draft: the drafter's state (a KVCache for an LM drafter, Eagle3State for an EAGLE-3
        head, None for n-gram).
      history_bs: prompt, committed tokens and the pending token per row [B, S].
      committed_b: C, committed tokens per row; history[b, C] is the pending token.
      prompt_len_b: prompt lengths [B].
      limit_b: per-row limits on generated tokens [B].
      done_b: finished rows [B].
      key: PRNG key.
      stats: SpecStats.
    """

    cache: KVCache
    draft: Any
    history_bs: jax.Array
    committed_b: jax.Array
    prompt_len_b: jax.Array
    limit_b: jax.Array
    done_b: jax.Array
    key: jax.Array
    stats: SpecStats

    @property
    def num_out_b(self) -> jax.Array:
        """Generated tokens per row (the pending token included)."""
        return self.committed_b + 1 - self.prompt_len_b


def cut_block(tokens_bk, num_b, stop_tokens, room_b):
    """How many of a block's tokens a row keeps: up to and including its first stop
    token, at most `room_b`. Returns (kept [B], hit a stop [B])."""
    k = tokens_bk.shape[1]
    stop_bk = ar.is_stop(tokens_bk.reshape(-1), stop_tokens).reshape(tokens_bk.shape)
    stop_bk &= jnp.arange(k)[None, :] < num_b[:, None]
    first_stop_b = jnp.where(stop_bk.any(1), jnp.argmax(stop_bk, axis=1) + 1, k + 1)
    kept_b = jnp.minimum(jnp.minimum(num_b, first_stop_b), room_b)
    return kept_b, first_stop_b <= kept_b


@partial(jax.jit, static_argnames=('cfg', 'drafter', 'settings'))
def spec_generate(
    cfg: ModelConfig,
    drafter: Drafter,
    settings: SpecSettings,
    params: dict,
    draft_params: dict | None,
    sampler: Sampler,
    prompt_bp: jax.Array,
    prompt_len_b: jax.Array,
    limit_b: jax.Array,
    key: jax.Array,
) -> tuple[jax.Array, jax.Array, SpecStats]:
    """The on-device chain loop: prompts [B, P] -> (tokens [B, N], lengths [B], stats)."""
    dec = settings.decode
    a = settings.num_draft
    batch, bucket = prompt_bp.shape
    n_out = dec.buffer_len
    slots = bucket + n_out + a + 1  # Room for a verify write past the last kept token.
    rows_b = jnp.arange(batch)

    def probs_fn(logits):
        return settings.transform(sampler.probs(logits))

    cache = KVCache.init(cfg, batch, slots)
    taps = drafter.tap_layers  # The target's hidden-state taps the drafter reads, if any.
    logits_bv, taps_bped, cache = ar.prefill(cfg, params, cache, prompt_bp, prompt_len_b, taps)
    key, k_first = jax.random.split(key)
    first_b = sampling.sample(k_first, probs_fn(logits_bv))  # The bonus of an empty draft.
    history_bs = jnp.zeros((batch, slots), jnp.int32).at[:, :bucket].set(prompt_bp)
    history_bs = history_bs.at[rows_b, prompt_len_b].set(first_b)
    state = SpecState(
        cache=cache,
        draft=drafter.init(draft_params, history_bs, prompt_len_b, bucket, taps_bped),
        history_bs=history_bs,
        committed_b=prompt_len_b,
        prompt_len_b=prompt_len_b,
        limit_b=limit_b,
        done_b=ar.is_stop(first_b, dec.stop_tokens) | (limit_b <= 1),
        key=key,
        stats=SpecStats.zeros(batch, a, n_out),
    )

    def block(s: SpecState, a_round: int = a) -> SpecState:
        """One round with `a_round` drafts (a_round = 0: a plain one-token step)."""
        key, k_draft, k_verify = jax.random.split(s.key, 3)
        live_b = ~s.done_b
        if a_round:
            draft, x_ba, q_bav = drafter.propose(
                draft_params, s.draft, s.history_bs, s.committed_b, k_draft, a_round, probs_fn
            )
        else:
            draft = s.draft
            x_ba = jnp.zeros((batch, 0), jnp.int32)
            q_bav = jnp.zeros((batch, 0, cfg.vocab_size), jnp.float32)
        pending_b = jnp.take_along_axis(s.history_bs, s.committed_b[:, None], 1)[:, 0]
        verify_bt = jnp.concatenate([pending_b[:, None], x_ba], axis=1)
        cache = s.cache
        logits_btv, taps_bted, cache = forward(
            cfg,
            params,
            verify_bt,
            cache.positions(a_round + 1),
            cache,
            cache.causal_mask(a_round + 1),
            tap_layers=taps,
        )
        p_btv = probs_fn(logits_btv)
        out = rules.verify_chain(settings.verifier, k_verify, p_btv, q_bav, x_ba)

        room_b = s.limit_b - s.num_out_b
        kept_b, stopped_b = cut_block(out.tokens, out.num_emitted, dec.stop_tokens, room_b)
        kept_b = jnp.where(live_b, kept_b, 0)
        cols_bt = s.committed_b[:, None] + 1 + jnp.arange(a_round + 1)[None, :]
        cols_bt = jnp.where(jnp.arange(a_round + 1)[None, :] < kept_b[:, None], cols_bt, slots)
        history_bs = s.history_bs.at[rows_b[:, None], cols_bt].set(out.tokens, mode='drop')
        committed_b = s.committed_b + kept_b
        done_b = s.done_b | (live_b & (stopped_b | (committed_b + 1 - s.prompt_len_b >= s.limit_b)))
        stats = update_stats(s.stats, settings, out, live_b, p_btv, q_bav)
        draft = drafter.observe(
            draft_params, draft, history_bs, s.committed_b, committed_b, taps_bted
        )
        return s.replace(
            cache=cache.set_lengths(committed_b),
            draft=draft,
            history_bs=history_bs,
            committed_b=committed_b,
            done_b=done_b,
            key=key,
            stats=stats,
        )

    def sized_block(s: SpecState) -> SpecState:
        # A drafter that knows how many of its drafts are real (prompt lookup: the matched
        # continuation) gets a verification as wide as the longest of the live rows': a
        # narrower forward costs less (on 2 CPU cores T = 2 costs 1.45x a one-token step,
        # T = 8 2.31x), and a round with nothing to verify is a plain AR step.
        n_b = jnp.where(s.done_b, 0, drafter.draft_len(s.history_bs, s.committed_b, a))
        return jax.lax.switch(jnp.max(n_b), [partial(block, a_round=k) for k in range(a + 1)], s)

    body = sized_block if hasattr(drafter, 'draft_len') else block
    state = jax.lax.while_loop(lambda s: ~jnp.all(s.done_b), body, state)
    out_cols = state.prompt_len_b[:, None] + jnp.arange(n_out)[None, :]
    tokens_bn = jnp.take_along_axis(state.history_bs, jnp.minimum(out_cols, slots - 1), 1)
    return tokens_bn, state.num_out_b, state.stats


def update_stats(
    st: SpecStats, settings: SpecSettings, out: rules.ChainResult, live_b, p_btv, q_bav
) -> SpecStats:
    live = live_b.astype(jnp.int32)
    rows_b = jnp.arange(live_b.shape[0])
    block_col_b = jnp.where(live_b, st.blocks, st.block_accepted_bk.shape[1])
    a_round, a = out.accepted.shape[1], st.accepted_at_ba.shape[1]

    def widen(x_ba):  # A narrower round's [B, a_round] counts as [B, A] (zeros after).
        return jnp.pad(x_ba, ((0, 0), (0, a - a_round)))

    st = st.replace(
        blocks=st.blocks + live,
        drafted=st.drafted + a_round * live,
        accepted=st.accepted + out.num_accepted * live,
        emitted=st.emitted + out.num_emitted * live,
        accepted_at_ba=st.accepted_at_ba + widen(out.accepted * live[:, None]),
        reached_at_ba=st.reached_at_ba + widen(out.reached * live[:, None]),
        block_accepted_bk=st.block_accepted_bk.at[rows_b, block_col_b].set(
            out.num_accepted, mode='drop'
        ),
    )
    if not settings.meter_distortion or a_round == 0:
        return st
    # The rule that verified (the lossy rule on temperature-processed p and q, or the
    # lossless rule of a baseline run, whose distortion is 0) against the matched
    # baseline's law of the same p (spec_jax.rules.measure).
    d = rules.measure(settings.verifier, p_btv[:, :-1], q_bav)
    mask_ba = out.reached & live_b[:, None]
    return st.replace(
        tv_at_ba=st.tv_at_ba + widen(jnp.where(mask_ba, d.tv, 0.0)),
        overshoot_at_ba=jnp.maximum(
            st.overshoot_at_ba, widen(jnp.where(mask_ba, d.overshoot, 0.0))
        ),
        metered=st.metered + mask_ba.sum(1),
    )


def summarize(stats: SpecStats) -> dict:
    """Host-side per-row statistics and their totals."""
    s = jax.tree.map(np.asarray, stats)
    blocks = np.maximum(s.blocks, 1)
    per_row = dict(
        blocks=s.blocks.tolist(),
        accepted=s.accepted.tolist(),
        drafted=s.drafted.tolist(),
        block_efficiency=(s.emitted / blocks).tolist(),
        acceptance_rate=(s.accepted / np.maximum(s.drafted, 1)).tolist(),
        acceptance_at_position=(s.accepted_at_ba / np.maximum(s.reached_at_ba, 1)).tolist(),
        block_accepted=[row[row >= 0].tolist() for row in s.block_accepted_bk],
    )
    total_blocks = max(int(s.blocks.sum()), 1)
    summary = dict(
        blocks=int(s.blocks.sum()),
        block_efficiency=float(s.emitted.sum() / total_blocks),
        acceptance_rate=float(s.accepted.sum() / max(int(s.drafted.sum()), 1)),
        acceptance_at_position=(
            s.accepted_at_ba.sum(0) / np.maximum(s.reached_at_ba.sum(0), 1)
        ).tolist(),
        per_row=per_row,
    )
    if s.metered.sum() > 0:  # Metered positions are the reached ones.
        summary['mean_tv'] = float(s.tv_at_ba.sum() / s.metered.sum())
        summary['max_overshoot'] = float(s.overshoot_at_ba.max())
        summary['tv_at_position'] = (
            s.tv_at_ba.sum(0) / np.maximum(s.reached_at_ba.sum(0), 1)
        ).tolist()
        summary['overshoot_at_position'] = s.overshoot_at_ba.max(0).tolist()
        # None for rows without a metered position (stopped at their first token).
        metered = s.metered > 0
        per_row['mean_tv'] = _where_none(metered, s.tv_at_ba.sum(1) / np.maximum(s.metered, 1))
        per_row['max_overshoot'] = _where_none(metered, s.overshoot_at_ba.max(1))
    return summary


def _where_none(keep_b: np.ndarray, values_b: np.ndarray) -> list:
    return [float(v) if k else None for k, v in zip(keep_b, values_b)]


def generate(
    cfg: ModelConfig,
    params: dict,
    drafter: Drafter,
    draft_params: dict | None,
    prompts: Sequence[Sequence[int]],
    settings: SpecSettings,
    sampler: Sampler | None = None,
    *,
    seed: int = 0,
    max_new_tokens: Sequence[int] | int | None = None,
) -> ar.GenerationResult:
    """Generates continuations with chain speculative decoding.

    Args:
      cfg, params: the target.
      drafter, draft_params: the proposer (LMDrafter with its params, Eagle3Drafter with
        `Eagle3Drafter.params_for(head, params)`, NgramDrafter with None; PromptLookup
        with its base drafter's).
      prompts: B token-id lists.
      settings: static settings (draft length, rule, baseline, buffers).
      sampler: applied to target and draft logits alike (None: greedy).
      seed: PRNG seed.
      max_new_tokens: per-row (or one) limit, at most settings.decode.max_new_tokens.

    Returns:
      A GenerationResult with tokens, wall time and `summarize`d statistics.
    """
    dec = settings.decode
    batch = batching.pack_prompts(
        prompts,
        prompt_bucket=dec.prompt_bucket,
        max_prompt_len=dec.max_prompt_len,
        pad_id=dec.pad_id,
    )
    limit_b = ar.row_limits(max_new_tokens, len(prompts), dec.max_new_tokens)
    check_drafter(cfg, drafter, batch.bucket + dec.buffer_len + settings.num_draft + 1)
    sampler = sampler or Sampler(temperature=0.0)
    code_room.ensure_room()
    start = time.perf_counter()
    tokens_bn, num_b, stats = spec_generate(
        cfg,
        drafter,
        settings,
        params,
        draft_params,
        sampler,
        jnp.asarray(batch.tokens),
        jnp.asarray(batch.lengths),
        jnp.asarray(limit_b),
        jax.random.PRNGKey(seed),
    )
    tokens_bn, num_b, stats = jax.device_get((tokens_bn, num_b, stats))
    seconds = time.perf_counter() - start
    return ar.GenerationResult(batching.trim_rows(tokens_bn, num_b), seconds, summarize(stats))


def check_drafter(cfg: ModelConfig, drafter, slots: int | None = None) -> None:
    """Draft and target must share the vocabulary, a head must fit the target's features,
    and, given the cache `slots` a run needs, target and draft LM must reach that far
    (clear errors before any compile)."""
    if isinstance(drafter, PromptLookup):
        drafter = drafter.base
    if isinstance(drafter, Eagle3Drafter):
        drafter.cfg.check_target(cfg)
    vocab = drafter.vocab_size
    if vocab != cfg.vocab_size:
        raise ValueError(
            f"draft vocabulary size {vocab} differs from the target's {cfg.vocab_size}: "
            'draft and target must share one tokenizer'
        )
    if slots is None:
        return
    parts = 'prompt bucket + new tokens + num_draft + 1'
    knobs = 'max_prompt_len, max_new_tokens or num_draft'
    ar.check_context(cfg, slots, parts, 'the target', knobs)
    if isinstance(drafter, LMDrafter):  # Its cache has the target's slots.
        ar.check_context(drafter.cfg, slots, parts, 'the draft', knobs)
