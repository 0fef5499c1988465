"""Verification sized online: each chain round's draft length chosen on device.

`Engine(adaptive=Adaptive(tiers, costs))` compiles one chain round per tier (a draft length;
0 is an AR step) and, at the top of every round of the `lax.while_loop`, `Adaptive.tier`
picks the tier that maximizes expected tokens per second; `lax.switch` runs it. In tree
mode the tiers are (0, path_len): AR's step or the engine's tree (its node budget is not
sized online: that needs acceptance per rank, which the statistics do not keep). The choice
is pure jnp on the loop carry: no host round trip, no recompile when costs or the prior
change (they are leaves of the engine pytree).

Expected tokens. The engine's own statistics (`Stats.accepted_at_ba`, `reached_at_ba`: per
row and draft position, the rounds that accepted / examined it) give each row's conditional
acceptance alpha_d at depth d, under the rule in use (a lossy rule's accepts are counted, so
the estimate is the acceptance under that rule). Counts, not an EMA: they are already in the
carry (no new state), and a row's run is a few hundred tokens, short for drift. Per row,
shrunk toward the batch: rows in one batch differ (a prompt that copies its input accepts
far more than one that reasons), and the round's tokens are the sum over its live rows, so
each row's own estimate is what the sum needs; few counts lean on the pooled one:

    pooled_d = (sum_b acc_bd + w pooled_{d-1}) / (sum_b reached_bd + w),  pooled_0 = prior
    alpha_bd = (acc_bd + w pooled_d) / (reached_bd + w)

(w = `weight`, in rounds; an unseen depth borrows the depth above it). A tier of k drafts
emits, for a live row with room for r more tokens, sum_{d=0}^{min(k, r-1)} prod_{j<=d}
alpha_bj tokens in expectation (d = 0 the bonus or AR's one; a lossless, greedy or lossy
round alike), summed over the live rows.

Cost. `TierCosts`: seconds of one round of each tier at a few batch sizes (interpolated at
the loop's static batch), linear in the context (the mean committed length over the batch's
rows: every row is in the forward). This engine's attention reads every cache slot, so its
cost is fixed by the run's slots (static), not the filled part: a chip's calibrated model
(`decoding.build.chip_tier_costs`) is read at the run's slots with no context term; the term
is for attention that reads the filled part (a bench's table). `relative` is a model in units
of an AR step. The choice: argmax over tiers of tokens / seconds, ties to the shorter tier.
A long context (attention grows with each verified token) or a large batch (a compute-bound
forward) can make AR the best tier; then the round is AR's step.

Exploration. Once AR wins, no depth is examined and the counts freeze. Every `explore`-th
round (by the batch's round count) runs the tier one above the choice instead, so a run that
started badly can climb back; 0 turns it off.

Lossless stays lossless: the tier is a function of the carry before the round (earlier
rounds' verdicts, lengths, limits), never of the round's own drafts or verdicts, and each
tier is a lossless round of its width, so given the text so far the next tokens follow the
rule's law whatever width the round had (tests/decoding/test_adaptive.py: greedy equality
with AR, a Monte Carlo law check). Per-position rules (`tv_budget`'s cap) hold at every tier:
a position's law does not depend on the width of its round.

The AR tier keeps the drafter's state following the text: the drafter is asked for one draft
(which is discarded), so a draft LM re-feeds its 2-token window (one draft forward) and an
EAGLE-3 head draws from the output it already holds (no call); `relative` counts it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class TierCosts:
    """Seconds of one round per tier: base_kn + context x per_token_kn at batch_n (a pytree
    of arrays: a new table reuses the compiled loop).

    Attributes:
      batch_n: [N] ascending batch sizes the table holds (interpolated between, clamped).
      base_kn: [K, N] seconds of a round of tier k at context 0.
      per_token_kn: [K, N] seconds added per context token.
    """

    batch_n: jax.Array
    base_kn: jax.Array
    per_token_kn: jax.Array

    @classmethod
    def table(cls, base_kn, per_token_kn=None, batch_n: Sequence[int] = (1,)) -> TierCosts:
        """From nested lists ([K] or [K, N]); per_token_kn None: no context term."""
        base = np.asarray(base_kn, np.float32).reshape(len(base_kn), -1)
        per = np.zeros_like(base) if per_token_kn is None else np.asarray(per_token_kn, np.float32)
        batch = np.asarray(batch_n, np.float32)
        per = per.reshape(base.shape)
        if base.shape[1] != batch.shape[0] or (np.diff(batch) <= 0).any():
            raise ValueError(f'tier costs: {base.shape[1]} columns for batch sizes '
                             f'{batch.tolist()}: give one column per ascending batch size')
        if not (base > 0).all() or (per < 0).any():
            raise ValueError(f'tier costs {base.tolist()} / per token {per.tolist()}: give '
                             'seconds > 0 per round and >= 0 per context token')
        return cls(batch, base, per)

    @classmethod
    def relative(
        cls, tiers: Sequence[int], verify: float = 0.18, draft: float = 0.15,
        context: float = 0.0,
    ) -> TierCosts:  # fmt: skip
        """A model in units of an AR step at context 0: tier k costs 1 + verify k (the
        target over k + 1 tokens) + draft max(k, 1) (k draft calls; the AR tier keeps the
        drafter up with one), plus context (k + 1) per context token (attention)."""
        base = [1.0 + verify * k + draft * max(k, 1) for k in tiers]
        return cls.table(base, [context * (k + 1) for k in tiers])

    def seconds(self, batch: int, context: jax.Array) -> jax.Array:
        """[K] seconds of a round of each tier at `batch` rows and `context` tokens."""
        at = jax.vmap(lambda row: jnp.interp(float(batch), self.batch_n, row))
        return at(self.base_kn) + context * at(self.per_token_kn)


jax.tree_util.register_dataclass(
    TierCosts, data_fields=['batch_n', 'base_kn', 'per_token_kn'], meta_fields=[]
)


def acceptance(accepted_ba, reached_ba, prior, weight) -> jax.Array:
    """Each row's conditional acceptance per draft position [B, A] from the run's counts,
    shrunk toward the batch's pooled rate, which shrinks toward the depth above (module
    docstring; depth 1 toward `prior`)."""
    acc_ba, seen_ba = accepted_ba.astype(jnp.float32), reached_ba.astype(jnp.float32)
    pooled, above = [], prior
    for d in range(acc_ba.shape[1]):
        above = (acc_ba[:, d].sum() + weight * above) / (seen_ba[:, d].sum() + weight)
        pooled.append(above)
    pooled_a = jnp.stack(pooled) if pooled else jnp.zeros((0,), jnp.float32)
    return (acc_ba + weight * pooled_a) / (seen_ba + weight)


def expected_tokens(alpha_ba, tiers: Sequence[int], live_b, room_b) -> jax.Array:
    """[K] tokens a round of each tier emits in expectation, summed over the live rows: a
    row's sum_{d <= min(k, room - 1)} prod_{j <= d} alpha_j (d = 0: the bonus or AR's one)."""
    batch = alpha_ba.shape[0]
    reach_bt = jnp.concatenate([jnp.ones((batch, 1)), jnp.cumprod(alpha_ba, axis=1)], axis=1)
    depth_t = jnp.arange(reach_bt.shape[1])
    fits_bt = (depth_t[None, :] < room_b[:, None]) & live_b[:, None]
    reach_bt = jnp.where(fits_bt, reach_bt, 0.0)
    return jnp.stack([reach_bt[:, : k + 1].sum() for k in tiers])


def choose(tokens_k: jax.Array, seconds_k: jax.Array) -> jax.Array:
    """The tier of most tokens per second (int32 scalar; ties go to the shorter tier)."""
    return jnp.argmax(tokens_k / seconds_k).astype(jnp.int32)


@dataclasses.dataclass(frozen=True)
class Adaptive:
    """An engine's online draft length (module docstring).

    A pytree: `costs`, `prior`, `weight` and `explore` are leaves (new values reuse the
    compiled loop); `tiers` is static.

    Attributes:
      tiers: ascending distinct draft lengths, each a compiled round (0: an AR step); the
        largest is the engine's `num_draft`.
      costs: `TierCosts` with one row per tier.
      prior: acceptance assumed at depth 1 before any round (deeper: the depth above).
      weight: rounds the prior (and, per row, the pooled rate) counts as.
      explore: every explore-th round runs the tier above the choice (0: never).
    """

    tiers: tuple[int, ...]
    costs: TierCosts
    prior: float = 0.7
    weight: float = 4.0
    explore: int = 16

    def __post_init__(self):
        object.__setattr__(self, 'tiers', tuple(int(k) for k in self.tiers))

    @classmethod
    def parse_tiers(cls, text: str, num_draft: int) -> tuple[int, ...]:
        """'auto': 0 and the powers of two below num_draft, then num_draft; else '0,1,3'."""
        if text == 'auto':
            return (0, *(2**i for i in range(8) if 2**i < num_draft), num_draft)
        try:
            return tuple(int(v) for v in text.split(','))
        except ValueError:
            raise ValueError(f"spec.adaptive.tiers={text!r}: give 'auto' or draft lengths "
                             "as comma-separated ints ('0,1,2,4')") from None

    def check(self, num_draft: int, drafter, tree) -> None:
        """ValueErrors for tiers, costs or settings the engine cannot run (`num_draft`: the
        tree's path_len in tree mode)."""
        t = self.tiers
        if getattr(drafter, 'narrows', False):
            raise ValueError('adaptive draft lengths need a drafter that drafts every position '
                             f'(lm, eagle3, self, lookup > 0); got {type(drafter).__name__}')
        if tree is not None and t != (0, num_draft):
            raise ValueError(f'adaptive tiers {t} in tree mode: give (0, {num_draft}), AR and '
                             f'the tree (its path_len {num_draft})')
        if len(t) < 2 or list(t) != sorted(set(t)) or t[0] < 0 or t[-1] != num_draft:
            raise ValueError(f'adaptive tiers {t}: give at least two ascending distinct draft '
                             f'lengths >= 0, the last one num_draft ({num_draft})')
        rows = np.shape(self.costs.base_kn)[0]
        if rows != len(t):
            raise ValueError(f'adaptive costs have {rows} rows for tiers {t}: one per tier')
        if not 0 < float(self.prior) < 1 or float(self.weight) <= 0 or int(self.explore) < 0:
            raise ValueError(f'adaptive prior {self.prior} (in (0, 1)), weight {self.weight} '
                             f'(> 0), explore {self.explore} (>= 0)')

    def tier(self, state) -> jax.Array:
        """The index into `tiers` of the round to run on `state` (a `DecodeState`), from
        the rounds before it only."""
        st = state.stats
        alpha_ba = acceptance(st.accepted_at_ba, st.reached_at_ba, self.prior, self.weight)
        room_b = state.limit_b - state.num_out_b
        tokens_k = expected_tokens(alpha_ba, self.tiers, ~state.done_b, room_b)
        context = state.committed_b.astype(jnp.float32).mean()
        k = choose(tokens_k, self.costs.seconds(state.committed_b.shape[0], context))
        every = jnp.asarray(self.explore, jnp.int32)
        due = (every > 0) & ((jnp.max(st.blocks) + 1) % jnp.maximum(every, 1) == 0)
        return jnp.where(due, jnp.minimum(k + 1, len(self.tiers) - 1), k)


jax.tree_util.register_dataclass(
    Adaptive, data_fields=['costs', 'prior', 'weight', 'explore'], meta_fields=['tiers']
)
