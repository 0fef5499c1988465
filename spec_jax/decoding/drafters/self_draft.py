"""The target as its own draft (q = p): chains and the target's own top-k trees.

What the laws' floors assume (docs/laws.md §3.2, §3.3: at q = p chain truncation
verification keeps TV (1 - p(A))^2, a tree whose first sibling is argmax p keeps
1 - p_A(argmax p)): the best draft there is, so what distortion remains is the rule's.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from spec_jax import sharding
from spec_jax.decoding import trees
from spec_jax.decoding.drafters.base import (
    CONTEXT_KNOBS,
    CONTEXT_PARTS,
    ProbsFn,
    draw,
    gather_tokens,
    no_lag,
    not_deferred,
    step_keys,
)
from spec_jax.decoding.state import check_context
from spec_jax.models.cache import KVCache, tree_mask
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward


@struct.dataclass
class SelfState:
    """A `SelfDrafter`'s carry.

    Attributes:
      cache: the target's keys/values of the committed prefix and the pending token s_C
        (lengths C + 1); slots past it are scratch.
      logits_bv: the target's logits at s_C [B, V]: the law of x_1.
    """

    cache: KVCache
    logits_bv: jax.Array


@dataclasses.dataclass(frozen=True)
class SelfDrafter:
    """Drafts with the target's own weights (params: the target's), so q = p exactly up to
    float rounding: the limit of a draft that keeps improving.

    It keeps its own cache of the committed prefix. After prefill and after each
    verification (`observe`) it re-feeds a fixed window of `window` tokens from the round's
    first verified position (the pending token then), which covers every token a round
    commits and the new pending token s_C; it keeps the logits at s_C. A chain (`propose`)
    then draws x_1 from them and runs A - 1 one-token steps. A tree (`propose_tree`) is
    EAGLE's dynamic tree (`decoding.trees`) built from the target's log-probabilities
    without temperature: the top-`branch` children of each frontier node, a frontier of
    the level's `branch` best by cumulative log-probability, the M - 1 best of the pool;
    its first sibling at every node is argmax p, as the tree floor of docs/laws.md §3.3
    assumes. Level d's frontier runs at position C + d, written at scratch slots past
    s_C, seeing the prefix and its ancestors only. Deterministic: q is None.

    Attributes:
      cfg: the target's config.
      window: tokens re-fed per observation: a round may commit at most window - 1 tokens
        (chain A + 1 <= window - 1, tree path_len + 1 <= window - 1).
    """

    cfg: ModelConfig
    window: int = 8
    rules: sharding.ShardingRules = sharding.DRAFT_RULES
    tap_layers: ClassVar[tuple[int, ...]] = ()
    narrows: ClassVar[bool] = False

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def check(self, cfg, slots=None):
        if cfg.vocab_size != self.cfg.vocab_size or cfg.width != self.cfg.width:
            raise ValueError(
                f'SelfDrafter drafts with the target itself: its config (V {self.cfg.vocab_size},'
                f" D {self.cfg.width}) must be the target's (V {cfg.vocab_size}, D {cfg.width})"
            )
        if slots is not None:
            check_context(self.cfg, slots, CONTEXT_PARTS, 'the draft', CONTEXT_KNOBS)

    def draft_len(self, history_bs, committed_b, num_draft):
        return jnp.full(history_bs.shape[:1], num_draft, jnp.int32)

    def _check_round(self, commits: int, what: str) -> None:
        if commits > self.window - 1:
            raise ValueError(
                f'{what} commits up to {commits} tokens a round but SelfDrafter(window='
                f'{self.window}) re-feeds {self.window - 1}: raise window to {commits + 1}'
            )

    def _refeed(self, params, cache, history_bs, start_b, committed_b, width):
        """Feeds history[start .. start + width - 1] at their positions; keeps the logits at
        C = committed_b; the cache then holds C + 1 entries."""
        cache = cache.set_lengths(start_b)
        index_b1 = jnp.clip(committed_b - start_b, 0, width - 1)[:, None]
        logits_b1v, _, cache = forward(
            self.cfg, params, gather_tokens(history_bs, cache.positions(width)),
            cache.positions(width), cache, cache.causal_mask(width), logits_index_bu=index_b1,
        )  # fmt: skip
        return SelfState(cache.set_lengths(committed_b + 1), logits_b1v[:, 0])

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None) -> SelfState:
        del taps_bped
        batch, slots = history_bs.shape
        cache = KVCache.init(self.cfg, batch, slots, rules=self.rules)
        _, _, cache = forward(
            self.cfg, params, history_bs[:, :bucket],
            jnp.broadcast_to(jnp.arange(bucket, dtype=jnp.int32), (batch, bucket)), cache,
            cache.causal_mask(bucket), logits_index_bu=jnp.zeros((batch, 1), jnp.int32),
        )  # fmt: skip
        return self._refeed(params, cache, history_bs, prompt_len_b - 1, prompt_len_b, 2)

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        del taps_bted
        return self._refeed(params, state.cache, history_bs, start_b, committed_b, self.window)

    def follow(self, params, state, history_bs, start_b, committed_b, taps_bted):
        """An AR round committed one token: re-feed [s_start, s_C], not the whole window."""
        del taps_bted
        return self._refeed(params, state.cache, history_bs, start_b, committed_b, 2)

    lag = no_lag
    deferred = not_deferred

    def propose(
        self, params, state: SelfState, history_bs, committed_b, key_b, num_draft: int,
        probs_fn: ProbsFn, forced=None,
    ):  # fmt: skip
        """x_1 from the logits at s_C, then A - 1 steps at positions C + 1 .. C + A - 1."""
        del history_bs
        if forced is not None:
            raise ValueError('SelfDrafter does not take forced drafts (no prompt lookup)')
        self._check_round(num_draft + 1, f'a chain of {num_draft} drafts')

        def step(carry, key_b):
            cache, logits_bv = carry
            x_b, q_bv = draw(key_b, probs_fn(logits_bv))
            logits_b1v, _, cache = forward(
                self.cfg, params, x_b[:, None], cache.positions(1), cache, cache.causal_mask(1)
            )
            return (cache.advance(1), logits_b1v[:, 0]), (x_b, q_bv)

        keys_ab = step_keys(key_b, num_draft)
        (cache, logits_bv), (x_ab, q_abv) = jax.lax.scan(
            step, (state.cache.set_lengths(committed_b + 1), state.logits_bv), keys_ab[:-1]
        )
        x_last_b, q_last_bv = draw(keys_ab[-1], probs_fn(logits_bv))
        x_ba = jnp.concatenate([x_ab.T, x_last_b[:, None]], 1)
        q_bav = jnp.concatenate([q_abv.transpose(1, 0, 2), q_last_bv[:, None]], 1)
        # The steps wrote past C (`observe` re-feeds them); their cache is kept, lengths
        # as before, so XLA updates it in place instead of copying it every round.
        return state.replace(cache=cache.set_lengths(state.cache.lengths)), x_ba, q_bav

    def propose_tree(
        self, params, state: SelfState, committed_b, shape: trees.TreeShape, key_b=None,
        probs_fn: ProbsFn | None = None,
    ):  # fmt: skip
        """The target's own top-`branch` dynamic tree: (state, node tokens [B, M] (entry 0,
        the root, is the caller's), parents [B, M], None)."""
        del key_b, probs_fn
        if shape.static:
            raise ValueError(
                f'SelfDrafter builds dynamic trees (EAGLE top-k); got a {shape.describe()}'
            )
        self._check_round(shape.path_len + 1, f'a {shape.describe()}')
        base_b = committed_b + 1  # Scratch slots start past s_C.

        def expand(cache, level, offset, token_by, carry_by, seen_byz):
            del carry_by
            logits_byv, _, cache = forward(
                self.cfg, params, token_by,
                jnp.broadcast_to((committed_b + level)[:, None], token_by.shape),
                cache.set_lengths(base_b + offset), tree_mask(base_b, seen_byz, cache.max_len),
            )  # fmt: skip
            return (cache, *top_children(logits_byv, shape.branch), None)

        score_b1c, token_b1c = top_children(state.logits_bv[:, None], shape.branch)
        cache, tokens_bm, parents_bm = trees.grow(
            shape, score_b1c[:, 0], token_b1c[:, 0], None, expand, state.cache
        )
        return state.replace(cache=cache.set_lengths(base_b)), tokens_bm, parents_bm, None


def top_children(logits_byv: jax.Array, branch: int) -> tuple[jax.Array, jax.Array]:
    """The `branch` most likely children of each node under the untempered law:
    (log-probabilities <= 0 [B, Y, C], token ids [B, Y, C]), best first."""
    logp_byc, ids_byc = jax.lax.top_k(jax.nn.log_softmax(logits_byv, -1), branch)
    return jnp.minimum(logp_byc, 0.0), ids_byc.astype(jnp.int32)
