"""Per-row decoding statistics, accumulated on device, and their host-side summary.

Every round (an AR step is a round with nothing drafted) adds to the same counters, so AR,
chain and (later) tree runs report in one format. The counters record what the rule
decided, before a stop token or the token limit cuts a row's last block: acceptance and
block efficiency describe the draft and the rule, not where the output happened to end
(`emitted` can exceed the tokens returned by at most one block per row).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from spec_jax import rules


@struct.dataclass
class Stats:
    """Per-row counters (all [B] unless noted).

    Attributes:
      blocks: target forwards after prefill, one per round (AR steps included).
      drafted: drafted tokens verified (A per round, or fewer where a drafter's
        `draft_len` made the round narrower).
      accepted: accepted drafts.
      emitted: tokens emitted by rounds (accepted drafts + the replacement/bonus token).
      accepted_at_ba: [B, A] rounds whose draft at position i was accepted.
      reached_at_ba: [B, A] rounds that examined position i.
      block_accepted_bk: [B, K] accepted drafts in round k (K = output buffer length;
        -1 = no such round).
      tv_at_ba: [B, A] sum over the rounds that examined draft position i of TV(pi,
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
    def zeros(cls, batch: int, num_draft: int, max_blocks: int) -> Stats:
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

    def update(
        self,
        out: rules.ChainResult,
        live_b: jax.Array,
        distortion: rules.Distortion | None = None,
    ) -> Stats:
        """Adds one round of the live rows: its verification `out` (a round of A' <= A
        drafts) and, when metered, the distortion [B, A'] at each drafted position."""
        live = live_b.astype(jnp.int32)
        rows_b = jnp.arange(live_b.shape[0])
        block_col_b = jnp.where(live_b, self.blocks, self.block_accepted_bk.shape[1])
        a_round, a = out.accepted.shape[1], self.accepted_at_ba.shape[1]

        def widen(x_ba):  # A narrower round's [B, A'] counts as [B, A] (zeros after).
            return jnp.pad(x_ba, ((0, 0), (0, a - a_round)))

        st = self.replace(
            blocks=self.blocks + live,
            drafted=self.drafted + a_round * live,
            accepted=self.accepted + out.num_accepted * live,
            emitted=self.emitted + out.num_emitted * live,
            accepted_at_ba=self.accepted_at_ba + widen(out.accepted * live[:, None]),
            reached_at_ba=self.reached_at_ba + widen(out.reached * live[:, None]),
            block_accepted_bk=self.block_accepted_bk.at[rows_b, block_col_b].set(
                out.num_accepted, mode='drop'
            ),
        )
        if distortion is None or a_round == 0:
            return st
        mask_ba = out.reached & live_b[:, None]
        return st.replace(
            tv_at_ba=st.tv_at_ba + widen(jnp.where(mask_ba, distortion.tv, 0.0)),
            overshoot_at_ba=jnp.maximum(
                st.overshoot_at_ba, widen(jnp.where(mask_ba, distortion.overshoot, 0.0))
            ),
            metered=st.metered + mask_ba.sum(1),
        )


def summarize(stats: Stats) -> dict:
    """Host-side per-row statistics and their totals (a JSON-ready dict)."""
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
