"""The drafter protocol, the helpers every drafter shares, and `NoDrafter` (AR).

A drafter proposes A tokens per row after the committed prefix and returns the processed
probabilities q it sampled them from ([B, A, V], V the target's vocabulary): verifiers need
exactly that q (HF #47932: using unwarped q breaks losslessness). Deterministic proposals
(greedy drafting, n-gram lookup) have one-hot q. docs/engine.md describes how a round uses
a drafter. Every drafter reads the engine's token history `history_bs` (prompt, committed
tokens and the pending token at `committed_b`), so none keeps its own copy of the text.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar, Protocol

import jax
import jax.numpy as jnp

from spec_jax import categorical, sharding
from spec_jax.models.config import ModelConfig

CONTEXT_PARTS = 'prompt bucket + new tokens + num_draft + 1'
CONTEXT_KNOBS = 'max_prompt_len, max_new_tokens or num_draft'
ProbsFn = Callable[[jax.Array], jax.Array]  # logits [..., V] -> processed probs [..., V]

# Logit of target ids a draft cannot propose (outside an EAGLE-3 head's draft vocabulary,
# or past a draft LM's padded vocabulary): probability exactly 0 after any temperature, and
# finite (no inf - inf in truncation samplers).
OUTSIDE_DRAFT_VOCAB = -1e9


class Drafter(Protocol):
    """What the engine needs of a proposer (frozen, hashable: part of the engine's static
    half). Keys are one per row ([B, 2]) so a row's drafts depend on its own key only.

    Attributes:
      tap_layers: the target's hidden-state taps the drafter reads (() for most).
      vocab_size: the V its q covers (the target's).
      narrows: True when `draft_len` can be below `num_draft` (prompt lookup): the engine
        then picks each round's width from the longest live row's draft (`switch_rounds`
        over A + 1 compiled widths; 0 = a plain one-token step).
      rules: how its weights and cache rows split on a mesh (`sharding.DRAFT_RULES` by
        default: weights on every device, rows over 'data'); `decoding.build` places the
        draft's weights by them.
    """

    tap_layers: tuple[int, ...]
    vocab_size: int
    narrows: ClassVar[bool]
    rules: sharding.ShardingRules

    def check(self, cfg: ModelConfig, slots: int | None = None) -> None:
        """Raises a ValueError when the drafter does not fit target `cfg` or a run of
        `slots` cache positions (called on the host before anything compiles)."""

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None) -> Any:
        """The drafter's state after prefill."""

    def propose(
        self, params, state, history_bs, committed_b, key_b, num_draft: int, probs_fn,
        forced=None,
    ) -> tuple[Any, jax.Array, jax.Array]:  # fmt: skip
        """(state, tokens [B, A], q [B, A, V]). `forced` = (tokens [B, A], use [B, A])
        makes a model drafter take the given token (one-hot q) where `use` holds and go on
        from it (`PromptLookup` passes it)."""

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted) -> Any:
        """The state after a verification of positions start_b .. start_b + T - 1, with
        C = committed_b now (taps_bted: the target's taps there, or None)."""

    def follow(self, params, state, history_bs, start_b, committed_b, taps_bted) -> Any:
        """`observe` after a round that drafted nothing (the adaptive AR tier), as cheap as
        the drafter allows: a state `propose` can still draft from (a draft LM does nothing
        and catches up when it next proposes; a head that needs the target's taps reads
        them here)."""

    def draft_len(self, history_bs, committed_b, num_draft: int) -> jax.Array:
        """[B] how many of the next `num_draft` proposals are real."""

    def lag(self, state, committed_b) -> jax.Array:
        """[B] tokens the drafter must catch up on before its next proposal (a draft LM
        after rounds that drafted nothing, or whose prefill was deferred; 0 for drafters
        that follow every round): what `adaptive` prices a drafting tier's first round."""

    def deferred(self) -> Drafter:
        """This drafter as the adaptive engine runs it: one that can catch up from nothing
        (a draft LM) leaves its prefill to its first proposal, so a run that never drafts
        never pays it (`lag` prices it); the others return themselves."""


def no_lag(self, state, committed_b) -> jax.Array:
    """`Drafter.lag` of a drafter that follows every round (assign it in the class body)."""
    del self, state
    return jnp.zeros_like(committed_b)


def not_deferred(self):
    """`Drafter.deferred` of a drafter with nothing to defer (assign it in the class body)."""
    return self


class TreeDrafter(Drafter, Protocol):
    """A drafter that also builds draft trees (tree rounds; docs/engine.md, "Tree rounds")."""

    def propose_tree(
        self, params, state, committed_b, shape, key_b=None, probs_fn=None
    ) -> tuple[Any, jax.Array, jax.Array, jax.Array | None]:  # fmt: skip
        """(state, node tokens [B, M] (entry 0, the root, is the caller's), parents [B, M],
        q [B, M, V] or None) for a tree of `shape` (`decoding.trees.TreeShape`) after each
        row's pending token; parents precede children, and a node's children in index order
        are its draft order. A sampled tree draws children from the processed law
        (`probs_fn`, one key per row) that q holds per node; a deterministic one has q None."""


def gather_tokens(history_bs: jax.Array, index_bt: jax.Array) -> jax.Array:
    return jnp.take_along_axis(history_bs, jnp.clip(index_bt, 0, history_bs.shape[1] - 1), 1)


def draw(key_b, q_bv, forced=None):
    """x ~ q row by row, or, with `forced` = (tokens [B], use [B]), the forced token where
    `use` (its q one-hot): (x [B], q [B, V])."""
    x_b = categorical.sample_rows(key_b, q_bv)
    if forced is None:
        return x_b, q_bv
    forced_b, use_b = forced
    one_hot_bv = jax.nn.one_hot(forced_b, q_bv.shape[-1], dtype=q_bv.dtype)
    return jnp.where(use_b, forced_b, x_b), jnp.where(use_b[:, None], one_hot_bv, q_bv)


def forced_steps(forced):
    """`forced` per draft step ([A, B] each; None stays None): (scan inputs for steps
    1..A-1, the last step's)."""
    if forced is None:
        return None, None
    tokens_ab, use_ab = forced[0].T, forced[1].T
    return (tokens_ab[:-1], use_ab[:-1]), (tokens_ab[-1], use_ab[-1])


def step_keys(key_b, num_draft: int) -> jax.Array:
    """One key per draft step and row: [A, B, 2]."""
    return jax.vmap(lambda k: jax.random.split(k, num_draft), out_axes=1)(key_b)


def fit_vocab(logits_bv: jax.Array, vocab_size: int) -> jax.Array:
    """Draft logits over the target's `vocab_size` ids: a draft whose embedding table is
    the same tokenizer with more padding rows is cut; one with fewer gets
    `OUTSIDE_DRAFT_VOCAB` for the ids it lacks (q = 0 there)."""
    v = logits_bv.shape[-1]
    if v >= vocab_size:
        return logits_bv[..., :vocab_size]
    pad = [(0, 0)] * (logits_bv.ndim - 1) + [(0, vocab_size - v)]
    return jnp.pad(logits_bv, pad, constant_values=OUTSIDE_DRAFT_VOCAB)


@dataclasses.dataclass(frozen=True)
class NoDrafter:
    """Plain autoregressive decoding: nothing is drafted, every round is a one-token step."""

    vocab_size: int = 0
    tap_layers: tuple[int, ...] = ()
    narrows: ClassVar[bool] = False
    rules: ClassVar[sharding.ShardingRules] = sharding.DRAFT_RULES

    def check(self, cfg, slots=None):
        del cfg, slots

    def init(self, params, history_bs, prompt_len_b, bucket, taps_bped=None):
        return None

    def propose(self, *args, **kwargs):
        raise ValueError('NoDrafter proposes nothing: run it with num_draft=0')

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        return state

    follow = observe
    lag = no_lag
    deferred = not_deferred

    def draft_len(self, history_bs, committed_b, num_draft):
        return jnp.zeros(history_bs.shape[:1], jnp.int32)
