"""The verifier contract of rules that read the raw logits or decide a whole block
(docs/rules.md): `Raw`, what such a rule reads beside the processed laws (a rule sets
`needs_logits`), and `Block`, what a block-level rule decides for one chain block (a rule
sets `block_level` and defines `accept_block`), with the helpers that build a Block from a
number of kept drafts. Rules whose acceptance is a per-position a(x) never see either."""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jax import Array


class Raw(NamedTuple):
    """What a rule that sets `needs_logits` reads beside the processed laws.

    Attributes:
      target_logits: [B, A+1, V] the target's raw logits (before temperature or any warper):
        softmax(target_logits) is the untempered (T = 1) target law.
      draft_logits: [B, A, V] the draft's T = 1 log-probabilities up to a constant per row.
        The drafters return their processed law q only, so the engine recovers them as
        T log q (exact for a temperature-only sampler; log q at T = 0, where q is one-hot).
      context: [B, S] int32 each row's token history (prompt, committed tokens, the pending
        token), or None; read by rules that act only inside a span (`relaxed`).
      context_len: [B] int32 valid tokens of `context` per row (C + 1), or None.
    """

    target_logits: Array
    draft_logits: Array
    context: Array | None = None
    context_len: Array | None = None


class Block(NamedTuple):
    """A block-level rule's decision for one chain block (`Rule.accept_block`).

    Attributes:
      num_accepted: [B] int32 drafts kept, n in [0, A].
      dist: [B, V] the law of the token emitted after them (replacement if n < A, bonus if
        n = A).
      accept_probs: [B, A] float32 a per-position acceptance probability (the rule says
        which: a(x_i), or the block threshold h_i), for the statistics.
    """

    num_accepted: Array
    dist: Array
    accept_probs: Array


def leading_run(accept: Array) -> Array:
    """n [B]: the number of leading True entries of accept [B, A]."""
    return jnp.cumprod(accept.astype(jnp.int32), axis=1).sum(1).astype(jnp.int32)


def row_at(v: Array, n: Array) -> Array:
    """v[b, n[b]] for v [B, T, ...] and n [B] (clipped to T - 1) -> [B, ...]."""
    return v[jnp.arange(v.shape[0]), jnp.minimum(n, v.shape[1] - 1)]


def block_from(n: Array, a: int, replacement: Array, bonus: Array, accept_probs: Array) -> Block:
    """The Block of n [B] kept drafts: `replacement` [B, V] (the law at row n) where n < A,
    `bonus` [B, V] where n = A."""
    dist = jnp.where((n < a)[:, None], replacement, bonus)
    return Block(n.astype(jnp.int32), dist, accept_probs.astype(jnp.float32))
