"""Per-row decoding statistics, accumulated on device, and their host-side summary.

Every round (an AR step is a round with nothing drafted) adds to the same counters, so AR,
chain and (later) tree runs report in one format. The counters record what the rule
decided, before a stop token or the token limit cuts a row's last block: acceptance and
block efficiency describe the draft and the rule, not where the output happened to end
(`emitted` can exceed the tokens returned by at most one block per row).

Metering (`Engine.meter_distortion`) covers every emitted position (docs/eval.md): the
accepted drafts, the replacement or bonus token of each round (width-0 rounds included) and
the first token after prefill, each with the law it was drawn from given that it was reached
(`rules.Metered`). Per-row sums are kept, so an evaluation can pool rows exactly.
"""

from __future__ import annotations

import warnings

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from spec_jax import rules

METER_FIELDS = ('tv', 'kl', 'outside', 'overshoot', 'js', 'tv_plain')
# The relative tolerance of the meter's flags: a law computed two ways agrees to a few fp32
# roundings (lossless SD's pi/p metered 1.0000001 on a GPU), far below any real overshoot or
# outside mass a rule's truncation makes (a matched baseline's 1/p(A) - 1; min-p's 1 - p(A)).
METER_RTOL = 1e-5


@struct.dataclass
class Stats:
    """Per-row counters (all [B] unless noted; T = A + 1 offsets in a block).

    Attributes:
      blocks: target forwards after prefill, one per round (AR steps included).
      drafted: drafted tokens verified (A per round, or fewer where a drafter's
        `draft_len` made the round narrower).
      accepted: accepted drafts.
      emitted: tokens emitted by rounds (accepted drafts + the replacement/bonus token).
      full_blocks: rounds that verified all A drafts of a draft not cut by a stop token or
        the row's limit (the paper's full blocks; `update`'s `full_b`).
      full_accepted: accepted drafts in those rounds.
      accepted_at_ba: [B, A] rounds whose draft at position i was accepted.
      reached_at_ba: [B, A] rounds that examined position i.
      block_accepted_bo: [B, O] accepted drafts in round o (O = output buffer length, at
        least one token a round; -1 = no such round).
      metered: emitted positions metered (0 unless metering), the first token included.
      tv, kl, outside, overshoot, js, tv_plain: sums over the metered positions of
        `rules.Metered`'s fields (TV(pi, p_A), KL(p_A || pi), pi outside A, max pi/p,
        JS(pi, p_A), TV(pi, p)); KL and overshoot over the positions where they are
        finite only.
      kl_inf, overshoot_inf: positions where KL (pi = 0 where p_A > 0: a deterministic
        draft under lenience or min-p) or the overshoot (p underflows where pi does not)
        is infinite.
      overshoot_max: the largest finite overshoot metered.
      metered_at_bt: [B, T] metered positions at block offset t (rounds only; t < A a
        drafted position or a replacement, t = A the bonus token of a round that accepted
        all its drafts, whatever its width).
      tv_at_bt: [B, T] TV summed at block offset t.
      overshoot_at_bt: [B, T] the largest finite overshoot at block offset t.
      nonfinite: rounds whose verification read a target or draft row holding a NaN or inf
        (`rules.ChainResult.nonfinite`): every rule rejects there and the emitted token is
        no law's draw; `summarize` reports them (`nonfinite_rounds`) and warns.
      overlap: sum over the drafted positions reached (`reached_at_ba`'s) of
        sum_v min(p, q), p the processed target, q the law the draft was drawn from:
        lossless SD's acceptance probability at the rule's own drafted positions, the
        frontier's reference (`rules.frontier_gap`; chain rounds when metering, else 0).
    """

    blocks: jax.Array
    drafted: jax.Array
    accepted: jax.Array
    emitted: jax.Array
    full_blocks: jax.Array
    full_accepted: jax.Array
    accepted_at_ba: jax.Array
    reached_at_ba: jax.Array
    block_accepted_bo: jax.Array
    metered: jax.Array
    tv: jax.Array
    kl: jax.Array
    outside: jax.Array
    overshoot: jax.Array
    js: jax.Array
    tv_plain: jax.Array
    kl_inf: jax.Array
    overshoot_inf: jax.Array
    overshoot_max: jax.Array
    metered_at_bt: jax.Array
    tv_at_bt: jax.Array
    overshoot_at_bt: jax.Array
    overlap: jax.Array
    nonfinite: jax.Array

    @classmethod
    def zeros(cls, batch: int, num_draft: int, max_blocks: int) -> Stats:
        z, f = jnp.zeros((batch,), jnp.int32), jnp.zeros((batch,), jnp.float32)
        ba = jnp.zeros((batch, num_draft), jnp.int32)
        bt = jnp.zeros((batch, num_draft + 1), jnp.int32)
        return cls(
            blocks=z,
            drafted=z,
            accepted=z,
            emitted=z,
            full_blocks=z,
            full_accepted=z,
            accepted_at_ba=ba,
            reached_at_ba=ba,
            block_accepted_bo=jnp.full((batch, max_blocks), -1, jnp.int32),
            metered=z,
            tv=f,
            kl=f,
            outside=f,
            overshoot=f,
            js=f,
            tv_plain=f,
            kl_inf=z,
            overshoot_inf=z,
            overshoot_max=f,
            metered_at_bt=bt,
            tv_at_bt=bt.astype(jnp.float32),
            overshoot_at_bt=bt.astype(jnp.float32),
            overlap=f,
            nonfinite=z,
        )

    def update(
        self,
        out: rules.ChainResult,
        live_b: jax.Array,
        metered: rules.Metered | None = None,
        full_b: jax.Array | None = None,
        overlap_ba: jax.Array | None = None,
    ) -> Stats:
        """Adds one round of the live rows: its verification `out` (a round of A' <= A
        drafts) and, when metering, `metered` [B, A' + 1] at each offset of the block (the
        emitted ones, offsets 0..n, are kept). `full_b` [B] bool: the rows whose draft was
        not cut (no stop token drafted, room for A + 1 tokens; `engine.chain_round`); the
        round is a full block of a row iff it verified all A drafts and full_b holds (None:
        every row's). `overlap_ba` [B, A']: sum_v min(p, q) at each drafted position (kept
        where reached, when metering)."""
        live = live_b.astype(jnp.int32)
        rows_b = jnp.arange(live_b.shape[0])
        block_col_b = jnp.where(live_b, self.blocks, self.block_accepted_bo.shape[1])
        a_round, a = out.accepted.shape[1], self.accepted_at_ba.shape[1]
        full = live * (a_round == a)
        if full_b is not None:
            full = full * full_b.astype(jnp.int32)
        st = self.replace(
            blocks=self.blocks + live,
            drafted=self.drafted + a_round * live,
            accepted=self.accepted + out.num_accepted * live,
            emitted=self.emitted + out.num_emitted * live,
            full_blocks=self.full_blocks + full,
            full_accepted=self.full_accepted + out.num_accepted * full,
            accepted_at_ba=self.accepted_at_ba + _widen(out.accepted * live[:, None], a),
            reached_at_ba=self.reached_at_ba + _widen(out.reached * live[:, None], a),
            block_accepted_bo=self.block_accepted_bo.at[rows_b, block_col_b].set(
                out.num_accepted, mode='drop'
            ),
        )
        if out.nonfinite is not None:  # NaN / inf rows: counted, never silent.
            st = st.replace(nonfinite=st.nonfinite + (out.nonfinite & live_b).astype(jnp.int32))
        if metered is None:
            return st
        offsets_t = jnp.arange(a_round + 1)
        mask_bt = (offsets_t[None, :] <= out.num_accepted[:, None]) & live_b[:, None]
        st = st.meter(metered, mask_bt)

        def by_offset(x_bt):  # [B, A' + 1] -> [B, A + 1]: drafts at 0..A'-1, the last at A.
            x_bt = jnp.where(mask_bt, x_bt, 0)
            return jnp.concatenate([_widen(x_bt[:, :-1], a), x_bt[:, -1:]], axis=1)

        finite = jnp.where(jnp.isfinite(metered.overshoot), metered.overshoot, 0.0)
        if overlap_ba is not None:
            kept_ba = out.reached.astype(bool) & live_b[:, None]
            st = st.replace(overlap=st.overlap + jnp.where(kept_ba, overlap_ba, 0.0).sum(-1))
        return st.replace(
            metered_at_bt=st.metered_at_bt + by_offset(mask_bt.astype(jnp.int32)),
            tv_at_bt=st.tv_at_bt + by_offset(metered.tv),
            overshoot_at_bt=jnp.maximum(st.overshoot_at_bt, by_offset(finite)),
        )

    def meter(self, metered: rules.Metered, mask: jax.Array) -> Stats:
        """Adds the metered positions `mask` ([B] or [B, T]) to the per-row sums (KL and
        overshoot where finite; the infinite ones are counted)."""

        def rows(x):
            return x if x.ndim == 1 else x.sum(-1)

        def total(x):
            return rows(jnp.where(mask & jnp.isfinite(x), x, 0.0))

        def infinite(x):
            return rows((mask & ~jnp.isfinite(x)).astype(jnp.int32))

        peak = jnp.where(mask & jnp.isfinite(metered.overshoot), metered.overshoot, 0.0)
        peak = peak if peak.ndim == 1 else peak.max(-1)
        return self.replace(
            metered=self.metered + rows(mask.astype(jnp.int32)),
            overshoot_max=jnp.maximum(self.overshoot_max, peak),
            kl_inf=self.kl_inf + infinite(metered.kl),
            overshoot_inf=self.overshoot_inf + infinite(metered.overshoot),
            **{
                name: getattr(self, name) + total(getattr(metered, name)) for name in METER_FIELDS
            },  # fmt: skip
        )


def _widen(x_bt: jax.Array, width: int) -> jax.Array:
    """A narrower round's [B, T'] counts as [B, width] (zeros after)."""
    return jnp.pad(x_bt, ((0, 0), (0, width - x_bt.shape[1])))


def summarize(stats: Stats) -> dict:
    """Host-side per-row statistics and their totals (a JSON-ready dict).

    Totals: block_efficiency (tokens per target forward, the bonus counted),
    be_full_gamma (the paper's chain BE: mean of accepted + 1 over full-gamma blocks),
    accept_length (the paper's EAGLE BE: accepted drafts per forward), acceptance_rate, and
    when metered the means over metered positions of TV, KL, outside mass, overshoot and JS
    (mean_js; per row js_sum, as tv_sum), TV against the processed target itself
    (mean_tv_plain, tv_plain_sum) and the largest overshoot (KL and overshoot over
    their finite positions, with the fractions that were infinite), and two flags at the
    relative tolerance `METER_RTOL`: `overshoots` (max pi/p > 1 + METER_RTOL: pi puts more
    mass than p somewhere) and `outside` (mean outside mass > METER_RTOL: pi leaves A).
    `per_row` holds each row's raw counters and sums, so rows pool (per position too:
    `accepted_at_position` / `reached_at_position`, the conditional acceptance's counts).
    """
    s = jax.tree.map(np.asarray, stats)
    blocks = np.maximum(s.blocks, 1)
    per_row = dict(
        blocks=s.blocks.tolist(),
        accepted=s.accepted.tolist(),
        drafted=s.drafted.tolist(),
        emitted=s.emitted.tolist(),
        full_blocks=s.full_blocks.tolist(),
        full_accepted=s.full_accepted.tolist(),
        full_drafted=(s.full_blocks * s.accepted_at_ba.shape[1]).tolist(),
        reached=s.reached_at_ba.sum(-1).tolist(),
        block_efficiency=(s.emitted / blocks).tolist(),
        acceptance_rate=(s.accepted / np.maximum(s.drafted, 1)).tolist(),
        acceptance_at_position=(s.accepted_at_ba / np.maximum(s.reached_at_ba, 1)).tolist(),
        accepted_at_position=s.accepted_at_ba.tolist(),  # Counts: rows and runs pool.
        reached_at_position=s.reached_at_ba.tolist(),
        block_accepted=[row[row >= 0].tolist() for row in s.block_accepted_bo],
    )
    total_blocks = max(int(s.blocks.sum()), 1)
    full_blocks = int(s.full_blocks.sum())
    summary = dict(
        blocks=int(s.blocks.sum()),
        block_efficiency=float(s.emitted.sum() / total_blocks),
        be_full_gamma=(s.full_accepted.sum() + full_blocks) / full_blocks if full_blocks else None,
        accept_length=float(s.accepted.sum() / total_blocks),
        acceptance_rate=float(s.accepted.sum() / max(int(s.drafted.sum()), 1)),
        acceptance_at_position=(
            s.accepted_at_ba.sum(0) / np.maximum(s.reached_at_ba.sum(0), 1)
        ).tolist(),
        per_row=per_row,
    )
    if summary['be_full_gamma'] is not None:
        summary['be_full_gamma'] = float(summary['be_full_gamma'])
    summary['nonfinite_rounds'] = int(s.nonfinite.sum())
    per_row['nonfinite'] = s.nonfinite.tolist()
    if summary['nonfinite_rounds']:
        warnings.warn(
            f"{summary['nonfinite_rounds']} rounds verified a target or draft law holding a "
            'NaN or inf (rows: per_row nonfinite): their tokens are no law\'s draws',
            RuntimeWarning, stacklevel=2,
        )  # fmt: skip
    if s.metered.sum() > 0:
        count = s.metered.sum()
        finite = {'kl': count - s.kl_inf.sum(), 'overshoot': count - s.overshoot_inf.sum()}
        for name in METER_FIELDS:
            n = finite.get(name, count)
            summary[f'mean_{name}'] = float(getattr(s, name).sum() / n) if n else None
        summary['kl_inf_fraction'] = float(s.kl_inf.sum() / count)
        summary['overshoot_inf_fraction'] = float(s.overshoot_inf.sum() / count)
        summary['max_overshoot'] = float(s.overshoot_max.max())
        summary['overshoots'] = summary['max_overshoot'] > 1.0 + METER_RTOL
        summary['outside'] = (summary['mean_outside'] or 0.0) > METER_RTOL
        at_t = np.maximum(s.metered_at_bt.sum(0), 1)
        summary['tv_at_position'] = (s.tv_at_bt.sum(0) / at_t).tolist()
        summary['overshoot_at_position'] = s.overshoot_at_bt.max(0).tolist()
        per_row['metered'] = s.metered.tolist()
        for name in METER_FIELDS + ('kl_inf', 'overshoot_inf'):
            per_row[f'{name}_sum' if name in METER_FIELDS else name] = getattr(s, name).tolist()
        per_row['max_overshoot'] = s.overshoot_max.tolist()
        per_row['metered_at_offset'] = s.metered_at_bt.tolist()
        per_row['tv_at_offset'] = s.tv_at_bt.tolist()
        per_row['overlap_sum'] = s.overlap.tolist()
        # None for rows without a metered position.
        per_row['mean_tv'] = _where_none(s.metered > 0, s.tv / np.maximum(s.metered, 1))
    return summary


def _where_none(keep_b: np.ndarray, values_b: np.ndarray) -> list:
    return [float(v) if k else None for k, v in zip(keep_b, values_b)]
