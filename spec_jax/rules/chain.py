"""Chain verification: one drafted block of A tokens against A + 1 target positions."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from spec_jax import categorical
from spec_jax.rules import base, contract


class ChainResult(NamedTuple):
    """Outcome of `verify_chain` (a pytree of fixed-shape arrays).

    Attributes:
      num_accepted: [B] int32, accepted drafts n in [0, A].
      tokens: [B, A+1] int32, the n accepted drafts, then the replacement (n < A) or bonus
        (n = A) token, then `pad_id`.
      accepted: [B, A] bool, position i was reached and accepted (i < n).
      num_emitted: [B] int32, n + 1.
      accept_probs: [B, A] float32, a(x_i) at every position (also past the first
        rejection; mask with `reached` for metrics).
      reached: [B, A] bool, position i was examined (i <= n).
      final_token: [B] int32, the replacement or bonus token.
      nonfinite: [B] bool, the row's target or draft probabilities held a NaN or inf: every
        rule then rejects and the final token is not a draw of any law (the engine counts
        these rounds, `decoding.stats.Stats.nonfinite`); None where not computed.
    """

    num_accepted: jax.Array
    tokens: jax.Array
    accepted: jax.Array
    num_emitted: jax.Array
    accept_probs: jax.Array
    reached: jax.Array
    final_token: jax.Array
    nonfinite: jax.Array | None = None


def nonfinite_rows(*laws: jax.Array | None) -> jax.Array:
    """[B] bool: row b of any of the laws [B, ..., V] holds a NaN or inf."""
    bad = None
    for law in laws:
        if law is None:
            continue
        row = ~jnp.isfinite(law).reshape(law.shape[0], -1).all(-1)
        bad = row if bad is None else bad | row
    return bad


def uniform_open_closed(key: jax.Array, shape) -> jax.Array:
    """u ~ U(0, 1]: accepting on u <= a accepts with probability exactly a (a=0 never)."""
    return 1.0 - jax.random.uniform(key, shape, jnp.float32)


@functools.partial(jax.jit, static_argnames=('pad_id',))
def verify_chain(
    rule: base.Rule,
    key: jax.Array,
    target_probs_bav1: jax.Array,
    draft_probs_bav: jax.Array,
    draft_tokens_ba: jax.Array,
    pad_id: int = 0,
    raw: contract.Raw | None = None,
    uniforms: jax.Array | None = None,
) -> ChainResult:
    """Verifies a chain of drafted tokens with `rule` (docs/laws.md §6).

    For positions i < A: a_i = rule.a(x_i) from the gathered p_i(x_i), q_i(x_i) and the
    rule's per-row statistics; u_i ~ U(0, 1]; accept on u_i <= a_i; n = number of leading
    accepts. One token is then drawn from rule.replacement(p_n, q_n) if n < A, else from
    rule.bonus(p_A). Only the row n is materialised as a [B, V] residual.

    The rule is a pytree argument: its float parameters are traced, so calls that differ only
    in a parameter's value share one compilation; its static fields (a deferral, a mode) and
    its class select the trace.

    Randomness. With one key, the uniforms [B, A] and the final samples [B] are drawn from
    it for the whole batch at once (so row b's draws depend on B). With B keys (one per row:
    a raw uint32 array [B, 2] as `jax.random.split(k, B)` returns, or a typed key array
    [B]), row b splits its own key into a uniform key and a sampling key and draws its A
    uniforms and its final token from them only (`categorical.map_rows`, `categorical.sample_rows`:
    a vmap for threefry keys, a loop over rows for rbg keys, which vmap does not keep per
    row): row b's result is then the same whichever other rows share the batch, and equals
    verify_chain on row b alone with the single key keys[b].

    Args:
      rule: a rules.Rule (a pytree; its float parameters may be traced).
      key: one PRNG key, or B keys (one per row), see above.
      target_probs_bav1: [B, A+1, V] processed target probabilities; row i is the law of
        the token after the prefix and x_1..x_i.
      draft_probs_bav: [B, A, V] processed draft probabilities the drafts were sampled from.
      draft_tokens_ba: [B, A] int drafted tokens.
      pad_id: token written after the emitted ones (static).
      raw: the raw logits (`contract.Raw`), required by rules that set `needs_logits`.
      uniforms: [B, A] the acceptance uniforms u_i in (0, 1] to use instead of drawing them
        from `key` (`rules.audit` puts them at their bounds); the final draw still uses key.

    A rule that sets `block_level` decides the block itself (`rule.accept_block` on the same
    uniforms; docs/rules.md, "Logits and block decisions"); the other rules take the path
    above, whose program does not change with the block-level contract.

    Returns:
      ChainResult.

    Raises:
      ValueError: the shapes do not match, the number of keys is not B, or a rule that needs
        logits is given none.
    """
    b, a1, _ = target_probs_bav1.shape
    a = a1 - 1
    target_probs_bav1 = categorical.upcast(target_probs_bav1)  # bf16 / fp16 laws in float32.
    draft_probs_bav = categorical.upcast(draft_probs_bav)
    if draft_probs_bav.shape[:2] != (b, a) or draft_tokens_ba.shape != (b, a):
        raise ValueError(
            f'verify_chain: shapes target {target_probs_bav1.shape}, draft '
            f'{draft_probs_bav.shape}, tokens {draft_tokens_ba.shape} do not match [B, A+1, V], '
            '[B, A, V], [B, A]'
        )
    if uniforms is not None and uniforms.shape != (b, a):
        raise ValueError(f'verify_chain: uniforms of shape {uniforms.shape}, want [B, A] {(b, a)}')
    if getattr(rule, 'block_level', False):
        return _verify_block(rule, key, target_probs_bav1, draft_probs_bav, draft_tokens_ba,
                             pad_id, raw, uniforms)  # fmt: skip
    per_row, key_u, key_s = _split_keys(key, b)
    rows = jnp.arange(b)
    x = draft_tokens_ba.astype(jnp.int32)
    if a > 0:
        p_draft = target_probs_bav1[:, :a]
        px = base.gather(p_draft, x)
        qx = base.gather(draft_probs_bav, x)
        if rule.stats_need_q:
            stats = rule.stats(p_draft, draft_probs_bav)
        else:  # Reduce over the whole target and drop the bonus row: no [B, A, V] copy.
            stats = jax.tree_util.tree_map(lambda s: s[:, :a], rule.stats(target_probs_bav1, None))
        accept_probs = rule.accept_from(px, qx, x, stats)
        accept_probs = accept_probs.astype(jnp.float32)
        if uniforms is not None:
            u = jnp.asarray(uniforms, jnp.float32)
        elif per_row:
            u = categorical.map_rows(lambda k: uniform_open_closed(k, (a,)), key_u)
        else:
            u = uniform_open_closed(key_u, (b, a))
        accept = u <= accept_probs
        accepted = jnp.cumprod(accept.astype(jnp.int32), axis=1).astype(bool)
        n = accepted.sum(1).astype(jnp.int32)
        p_n = target_probs_bav1[rows, n]  # [B, V]
        q_n = draft_probs_bav[rows, jnp.minimum(n, a - 1)]  # [B, V]
        dist = jnp.where((n < a)[:, None], rule.replacement(p_n, q_n), rule.bonus(p_n))
    else:
        accept_probs = jnp.zeros((b, 0), jnp.float32)
        accepted = jnp.zeros((b, 0), bool)
        n = jnp.zeros((b,), jnp.int32)
        dist = rule.bonus(target_probs_bav1[:, 0])
    final = categorical.sample_rows(key_s, dist) if per_row else categorical.sample(key_s, dist)
    pos = jnp.arange(a + 1)[None, :]
    x_pad = jnp.concatenate([x, jnp.full((b, 1), pad_id, jnp.int32)], axis=1)
    tokens = jnp.where(
        pos < n[:, None], x_pad, jnp.where(pos == n[:, None], final[:, None], pad_id)
    )
    reached = jnp.arange(a)[None, :] <= n[:, None]
    return ChainResult(
        num_accepted=n,
        tokens=tokens.astype(jnp.int32),
        accepted=accepted,
        num_emitted=n + 1,
        accept_probs=accept_probs,
        reached=reached,
        final_token=final,
        nonfinite=nonfinite_rows(target_probs_bav1, draft_probs_bav),
    )


def _verify_block(rule, key, target_probs_bav1, draft_probs_bav, draft_tokens_ba, pad_id, raw,
                  uniforms=None):
    """verify_chain for a block-level rule: the same shapes, keys and uniforms as the token-level
    path (shapes checked by the caller); n and the final law come from `rule.accept_block`."""
    b, a1, _ = target_probs_bav1.shape
    a = a1 - 1
    if getattr(rule, 'needs_logits', False) and raw is None:
        raise ValueError(
            f'verify_chain: rule {rule.name!r} reads the raw logits; pass raw=rules.Raw(...)'
        )
    per_row, key_u, key_s = _split_keys(key, b)
    x = draft_tokens_ba.astype(jnp.int32)
    if a > 0:
        if uniforms is not None:
            u = jnp.asarray(uniforms, jnp.float32)
        elif per_row:
            u = categorical.map_rows(lambda k: uniform_open_closed(k, (a,)), key_u)
        else:
            u = uniform_open_closed(key_u, (b, a))
        block = rule.accept_block(u, target_probs_bav1, draft_probs_bav, x, raw)
        n, dist, accept_probs = block.num_accepted, block.dist, block.accept_probs
    else:
        n = jnp.zeros((b,), jnp.int32)
        dist = rule.bonus(target_probs_bav1[:, 0])
        accept_probs = jnp.zeros((b, 0), jnp.float32)
    final = categorical.sample_rows(key_s, dist) if per_row else categorical.sample(key_s, dist)
    pos = jnp.arange(a + 1)[None, :]
    x_pad = jnp.concatenate([x, jnp.full((b, 1), pad_id, jnp.int32)], axis=1)
    tokens = jnp.where(
        pos < n[:, None], x_pad, jnp.where(pos == n[:, None], final[:, None], pad_id)
    )
    kept = jnp.arange(a)[None, :] < n[:, None]
    return ChainResult(
        num_accepted=n,
        tokens=tokens.astype(jnp.int32),
        accepted=kept,
        num_emitted=n + 1,
        accept_probs=accept_probs.astype(jnp.float32),
        reached=jnp.arange(a)[None, :] <= n[:, None],
        final_token=final,
        nonfinite=nonfinite_rows(target_probs_bav1, draft_probs_bav),
    )


def _split_keys(key: jax.Array, b: int) -> tuple[bool, jax.Array, jax.Array]:
    """(per_row, key of the uniforms, key of the final draw): one key, or one per row."""
    per_row = categorical.is_key_batch(key)
    if not per_row:
        return per_row, *jax.random.split(key)
    if key.shape[0] != b:
        raise ValueError(f'verify_chain: {key.shape[0]} keys for a batch of {b} rows')
    return per_row, *categorical.map_rows(lambda k: tuple(jax.random.split(k)), key)
