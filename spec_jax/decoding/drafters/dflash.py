"""A DFlash block drafter (spec_jax.models.dflash): chains from one block call, and DDTree
trees from the same call's per-position marginals (docs/engine.md, "Drafters")."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import struct

from spec_jax import sharding
from spec_jax.decoding import trees
from spec_jax.decoding.drafters.base import (
    ProbsFn,
    draw,
    gather_tokens,
    no_lag,
    not_deferred,
    step_keys,
)
from spec_jax.models import dflash as df
from spec_jax.models.attention import Rows
from spec_jax.models.cache import empty_layer


@struct.dataclass
class DFlashState:
    """A DFlash drafter's carry.

    Attributes:
      cache_k, cache_v: per layer, the context keys/values [R, S, H] (R = B * K); slot t
        holds position t's (the target's taps there); slots below C are final.
      pending_b: s_C, the block's first token [B].
    """

    cache_k: tuple[jax.Array, ...]
    cache_v: tuple[jax.Array, ...]
    pending_b: jax.Array


@dataclasses.dataclass(frozen=True)
class DFlashDrafter:
    """DFlash: one block forward drafts every position of the block.

    After prefill and after every verification (`observe`) the target's taps at the
    positions it just processed become context keys/values in the drafter's cache (those
    below the new C are final; those past it are overwritten later). `propose` runs the
    block [s_C, mask, ..., mask] at positions C .. C + A once: draft j is drawn from the
    processed law of block position j, and that law is its q (the drafter's marginal
    there; the drafts do not condition on each other, so q_j is exactly the law x_j was
    drawn from). `forced` tokens (prompt lookup) replace the mask at their positions, with
    one-hot q, so the other positions condition on them. A = num_draft <= block_size - 1.

    `propose_tree` is DDTree (arXiv 2604.12989): the same call's marginals, untempered,
    score every prefix by the sum of its tokens' log-marginals; `trees.grow` keeps the best
    under the node budget (a dynamic `TreeShape`; exactly the best-first tree's M - 1 best
    prefixes when branch >= M - 1, since a prefix's score is below its parent's and its
    better siblings'). q is None: the tree is verified by the target-only walk
    (`rules.verify_tree`'s deterministic mode), which is lossless for the lossless rule.

    Params: {'dflash': drafter params, 'embed_vd': the target's input embeddings,
    'head_vd': the target's lm head (its embeddings when tied)} (`params_for`).
    """

    cfg: df.DFlashConfig
    rules: sharding.ShardingRules = sharding.DRAFT_RULES
    narrows: ClassVar[bool] = False

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.taps)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def check(self, cfg, slots=None):
        del slots
        self.cfg.check_target(cfg)

    def draft_len(self, history_bs, committed_b, num_draft):
        return jnp.full(history_bs.shape[:1], num_draft, jnp.int32)

    @staticmethod
    def params_for(params: dict, target_params: dict) -> dict:
        head_vd = target_params.get('lm_head_vd', target_params['embed_vd'])
        if not jnp.issubdtype(jnp.asarray(head_vd).dtype, jnp.floating):
            raise ValueError(
                f"a DFlash drafter reads the target's lm head; it is {head_vd.dtype} "
                '(quantized): load the target with float weights'
            )
        return dict(dflash=params, embed_vd=target_params['embed_vd'], head_vd=head_vd)

    def _write(self, params, state, taps_bted, start_b, history_bs, committed_b):
        t = taps_bted.shape[1]
        positions_bt = start_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :]
        kv_l = df.context(self.cfg, params['dflash'], taps_bted, positions_bt)
        ck, cv = [], []
        for (k_btkh, v_btkh), cache_k, cache_v in zip(kv_l, state.cache_k, state.cache_v):
            ck.append(_write_rows(self, cache_k, k_btkh, start_b))
            cv.append(_write_rows(self, cache_v, v_btkh, start_b))
        pending_b = gather_tokens(history_bs, committed_b[:, None])[:, 0]
        return DFlashState(tuple(ck), tuple(cv), pending_b)

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None):
        batch, slots = history_bs.shape
        cfg = self.cfg
        zeros = empty_layer(
            batch, cfg.num_kv_heads, slots, cfg.head_dim, jnp.dtype(cfg.dtype), self.rules
        )
        empty = DFlashState((zeros,) * cfg.num_layers, (zeros,) * cfg.num_layers,
                            jnp.zeros((batch,), jnp.int32))  # fmt: skip
        start_b = jnp.zeros((batch,), jnp.int32)
        return self._write(params, empty, taps_bped, start_b, history_bs, prompt_len_b)

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        return self._write(params, state, taps_bted, start_b, history_bs, committed_b)

    follow = observe  # Its context entries need the target's taps of every position.
    lag = no_lag
    deferred = not_deferred

    def block_logits(self, params, state: DFlashState, committed_b, num_draft: int,
                     forced_ba=None):  # fmt: skip
        """The block's logits at positions C + 1 .. C + A [B, A, V] and the caches.
        `forced_ba` = (tokens [B, A], use [B, A]) puts tokens in place of the mask."""
        if not 1 <= num_draft <= self.cfg.max_drafts:
            raise ValueError(
                f'num_draft={num_draft} drafts do not fit a DFlash block of size '
                f'{self.cfg.block_size}: use 1 .. {self.cfg.max_drafts}'
            )
        cfg, batch = self.cfg, committed_b.shape[0]
        slots = state.cache_k[0].shape[1]
        drafts_ba = jnp.full((batch, num_draft), cfg.mask_token_id, jnp.int32)
        if forced_ba is not None:
            drafts_ba = jnp.where(forced_ba[1], forced_ba[0], drafts_ba)
        tokens_bt = jnp.concatenate([state.pending_b[:, None], drafts_ba], 1)
        t = num_draft + 1
        embeds_btd = params['embed_vd'][tokens_bt].astype(jnp.dtype(cfg.dtype)) * cfg.embed_scale
        hidden_btd, kv = df.block_forward(
            cfg, params['dflash'], embeds_btd,
            committed_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :],
            (state.cache_k, state.cache_v, committed_b),
            df.block_mask(cfg, committed_b, t, slots), self.rules,
        )  # fmt: skip
        return df.logits(cfg, hidden_btd[:, 1:], params['head_vd']), kv

    def propose(
        self, params, state: DFlashState, history_bs, committed_b, key_b, num_draft: int,
        probs_fn: ProbsFn, forced=None,
    ):  # fmt: skip
        del history_bs
        logits_bav, kv = self.block_logits(params, state, committed_b, num_draft, forced)
        q_bav = probs_fn(logits_bav)
        keys_ab = step_keys(key_b, num_draft)
        x_cols, q_cols = [], []
        for j in range(num_draft):
            forced_j = None if forced is None else (forced[0][:, j], forced[1][:, j])
            x_b, q_bv = draw(keys_ab[j], q_bav[:, j], forced_j)
            x_cols.append(x_b)
            q_cols.append(q_bv)
        # The block's cache writes sit at or past C: the next `observe` overwrites them.
        state = state.replace(cache_k=kv[0], cache_v=kv[1])
        return state, jnp.stack(x_cols, 1), jnp.stack(q_cols, 1)

    def propose_tree(
        self, params, state: DFlashState, committed_b, shape: trees.TreeShape, key_b=None,
        probs_fn: ProbsFn | None = None,
    ):  # fmt: skip
        """DDTree (class docstring): (state, node tokens [B, M] (entry 0, the root, is the
        caller's), parents [B, M], None)."""
        del key_b, probs_fn
        if shape.static:
            raise ValueError(
                'DDTree builds dynamic trees (best-first under a node budget); got a '
                f'{shape.describe()}'
            )
        levels = shape.levels_drafted
        logits_bav, kv = self.block_logits(params, state, committed_b, levels)
        logp_bav = jax.nn.log_softmax(logits_bav, -1)
        logp_bac, ids_bac = jax.lax.top_k(logp_bav, shape.branch)
        logp_bac, ids_bac = jnp.minimum(logp_bac, 0.0), ids_bac.astype(jnp.int32)
        k = shape.branch

        def expand(kv, level, offset, token_by, carry_by, seen_byz):
            del offset, token_by, carry_by, seen_byz  # Marginals: no parent conditioning.
            logp_byc = jnp.broadcast_to(logp_bac[:, level, None], (*logp_bac.shape[:1], k, k))
            return kv, logp_byc, jnp.broadcast_to(ids_bac[:, level, None], logp_byc.shape), None

        kv, tokens_bm, parents_bm = trees.grow(shape, logp_bac[:, 0], ids_bac[:, 0], None,
                                               expand, kv)  # fmt: skip
        return state.replace(cache_k=kv[0], cache_v=kv[1]), tokens_bm, parents_bm, None


def _write_rows(drafter: DFlashDrafter, cache_rsh, new_btkh, start_b):
    """Writes [B, T, K, H] at slots start_b + t of one cache array in its row order."""
    rows = Rows.on_mesh(new_btkh.shape[0], drafter.cfg.num_kv_heads, drafter.rules)
    t = new_btkh.shape[1]
    rows_r1 = jnp.arange(rows.size)[:, None]
    slots_rt = rows.per_row(start_b)[:, None] + jnp.arange(t)[None, :]
    return cache_rsh.at[rows_r1, slots_rt].set(rows.keys(new_btkh).astype(cache_rsh.dtype))
