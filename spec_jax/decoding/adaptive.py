"""Verification sized online: each round's draft length, or tree, chosen on device.

`Engine(adaptive=Adaptive(tiers, costs))` compiles one chain round per tier (a draft length;
0 is an AR step) and, at the top of every round of the `lax.while_loop`, `Adaptive.tier`
picks the tier that would finish the batch soonest; `engine.switch_rounds` runs it
(a while loop per tier: a `lax.switch` branch copied both caches every drafting round). In
tree mode the tiers are AR's step and a few trees (`trees`, node budgets cut from the engine's
tree: `tree_tiers`), chosen from an estimate per depth and rank (decoding/adaptive_trees.py). The
choice is pure jnp on the loop carry: no host round trip, no recompile when costs or the
prior change (they are leaves of the engine pytree).

Expected tokens. The engine's own statistics (`Stats.accepted_at_ba`, `reached_at_ba`: per
row and draft position, the rounds that accepted / examined it) give each row's conditional
acceptance alpha_d at depth d, under the rule in use (a lossy rule's accepts are counted, so
the estimate is the acceptance under that rule). Counts, not an EMA: they are already in the
carry (no new state), and a row's run is a few hundred tokens, short for drift. Per row,
shrunk toward the batch: rows in one batch differ (a prompt that copies its input accepts
far more than one that reasons), and the round's tokens are the sum over its live rows, so
each row's own estimate is what the sum needs; few counts lean on the pooled one:

    pooled_d = (sum_b acc_bd + w anchor_d) / (sum_b reached_bd + w)
    alpha_bd = (acc_bd + w pooled_d) / (reached_bd + w)

(w = `weight`, in rounds; anchor_1 the prior's first rate, anchor_d pooled_{d-1} shifted
by the prior's log-odds step from depth d - 1 to d: an unseen depth borrows the depth above
it, risen as the prior's profile rises: decoding/adaptive_prior.py). A tier of k drafts
emits, for a live row with room for r more tokens, sum_{d=0}^{min(k, r-1)} prod_{j<=d}
alpha_bj tokens in expectation (d = 0 the bonus or AR's one; a lossless, greedy or lossy
round alike), and its second moment (`expected_tokens`).

Cost. `TierCosts`: seconds of one round of each tier at a few batch sizes (interpolated at
the loop's static batch), linear in the context (the mean committed length over the batch's
rows: every row is in the forward). This engine's attention reads every cache slot, so its
cost is fixed by the run's slots (static), not the filled part: a chip's calibrated model
(`decoding.build.chip_tier_costs`) is read at the run's slots with no context term; the term
is for attention that reads the filled part (a bench's table). `relative` is a model in units
of an AR step.

The choice: the tier whose rounds, run from here to the end, would finish the batch
soonest (`finish_seconds`, plus, for a drafting tier, the drafter's catch-up once: its lag
(`Drafter.lag`, the most over the rows: the catch-up feeds the batch until its last row is
caught up, done rows too) priced by `TierCosts.catch_up`; ties to the shorter tier). The loop
ends with its slowest row, so tokens a fast row gains early do not shorten it: a row's
rounds to finish are about room / mean + z sd (the spread of its tokens a round), the
batch's the most over its live rows, z the expected largest of n standard normals. At one
row this is the most tokens per second; at batch 8 the model's reading for a chain of one
draft at acceptance 0.35 is 51 rounds for 64 tokens, not 47: it must beat AR by about 7%
in mean tokens per second to pay. A long context (attention grows with each verified
token) or a large batch (a compute-bound forward) can make AR the best tier; then the
round is AR's step.

The prior. Before a row has been seen it leans on `prior`, the acceptance assumed per depth
(a profile; one rate: every depth toward the depth above): the build reads it from the
drafter's measured acceptance on held-out prompts where its directory has one
(decoding/drafters/measured.py), and a job's later batches from what its earlier ones saw
(`Adaptive.warmed`).

Exploration. Once AR wins, no depth is examined and the counts freeze. Every `explore`-th
round (by the batch's round count) may run the tier one above the choice instead: when the
look pays for itself (`look_pays`): the time it would save were the acceptance `optimism`
standard errors above the estimate (the batch's counts: per depth, per depth and rank for
trees), weighed by that reading's one-sided chance (5% at 1.645), against what the look
costs if it is not (the drafter's catch-up, the round's time beyond the choice's for the
same progress), weighed by the rest. A run that started badly can climb back, one that has
seen enough stops paying to look, and a look whose catch-up dwarfs what it could find (a
draft LM's deferred prefill over a long prompt) is not taken; 0 turns it off.

Lossless stays lossless: the tier is a function of the carry before the round (earlier
rounds' verdicts, lengths, limits), never of the round's own drafts or verdicts, and each
tier is a lossless round of its width, so given the text so far the next tokens follow the
rule's law whatever width the round had (tests/decoding/test_adaptive.py and
test_adaptive_tree.py: greedy equality with AR, Monte Carlo law checks). Per-position
rules (`tv_budget`'s cap) hold at every tier: a position's law does not depend on the width
of its round (a tree tier's node law is the rule's `induced_tree_node`, as in any tree).

The AR tier runs AR's step and keeps the drafter following the text by `Drafter.follow`: a
draft LM does nothing (its next proposal first catches its cache up over the tokens it
missed, one forward per 16), an EAGLE-3 head buffers the step's taps (after its prompt's,
where the bucket fits: up to 512 positions) and runs 16-wide windows over them before it
drafts (its lag: each row's buffered count),
DFlash reads the step's taps (one window over one token), the target as its own drafter
re-feeds two tokens; `relative` counts `follow` draft calls a step for it
(`decoding.build.FOLLOW_CALLS`). The engine runs its drafter
`deferred()`: a draft LM's prefill waits for its first proposal (the catch-up from slot
0, in wide chunks), so a run that never drafts (AR wins from the first round, as at a
large batch or a long context) never pays it; its lag is the prompt until then, and the
choice prices it like any catch-up; an EAGLE-3 head buffers (`Eagle3Drafter.capacity`),
and its catch-up is priced as its windows (`TierCosts`, `decoding.build.head_follow`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.decoding import adaptive_prior, adaptive_trees
from spec_jax.decoding.trees import TreeShape


@dataclasses.dataclass(frozen=True)
class TierCosts:
    """Seconds of one round per tier: base_kn + context x per_token_kn at batch_n, and of
    the drafter's catch-up (a pytree of arrays: a new table reuses the compiled loop).

    Attributes:
      batch_n: [N] ascending batch sizes the table holds (interpolated between, clamped).
      base_kn: [K, N] seconds of a round of tier k at context 0.
      per_token_kn: [K, N] seconds added per context token.
      catch_up_n: [N] seconds per token a lagging drafter feeds before it drafts (a draft
        LM after AR rounds, or whose prefill was deferred: `Drafter.lag`), a row each;
        negative where the AR tier's price already owes them (a head that runs a window
        whenever W are buffered: below).
      catch_up_base_n: [N] seconds any catch-up costs besides (its one forward or window).
        A catch-up of `lag` > 0 tokens costs max(0, base + lag x per token): a draft LM's
        is a `catch_up`-wide forward plus its widest chunk's price a token (an upper
        reading); a head that buffers until it drafts runs ceil(L / W) W-wide windows:
        base a window, per token a W-th of one (an upper reading by at most a window);
        one that runs a window whenever W are buffered has the AR tier pay a W-th of it a
        step, so drafting at lag L costs what the window's unused W - L positions waste:
        base a window, per token -1/W of it (`decoding.build.head_follow`).
    """

    batch_n: jax.Array
    base_kn: jax.Array
    per_token_kn: jax.Array
    catch_up_n: jax.Array
    catch_up_base_n: jax.Array

    @classmethod
    def table(cls, base_kn, per_token_kn=None, batch_n: Sequence[int] = (1,),
              catch_up_n=None, catch_up_base_n=None) -> TierCosts:  # fmt: skip
        """From nested lists ([K] or [K, N]); per_token_kn None: no context term;
        catch_up_n and catch_up_base_n ([N] or a number) None: 0."""
        base = np.asarray(base_kn, np.float32).reshape(len(base_kn), -1)
        per = np.zeros_like(base) if per_token_kn is None else np.asarray(per_token_kn, np.float32)
        batch = np.asarray(batch_n, np.float32)
        per = per.reshape(base.shape)
        catch, least = (np.full(batch.shape, 0.0 if v is None else v, np.float32)
                        for v in (catch_up_n, catch_up_base_n))
        if base.shape[1] != batch.shape[0] or (np.diff(batch) <= 0).any():
            raise ValueError(f'tier costs: {base.shape[1]} columns for batch sizes '
                             f'{batch.tolist()}: give one column per ascending batch size')
        if (not (base > 0).all() or (per < 0).any() or (least < 0).any()
                or (least + catch < 0).any()):
            raise ValueError(f'tier costs {base.tolist()} / per token {per.tolist()} / catch-up '
                             f'{catch.tolist()} a token + {least.tolist()}: give seconds > 0 '
                             'per round, >= 0 per context token, a catch-up base >= 0 and a '
                             "one-token catch-up >= 0 (base + a token's)")
        return cls(batch, base, per, catch, least)

    @classmethod
    def relative(
        cls, tiers: Sequence[int], verify: float = 0.18, draft: float = 0.15,
        context: float = 0.0, trees: Sequence[TreeShape] = (), follow: float = 1.0,
        catch_up: float = 0.0, catch_up_base: float = 0.0,
    ) -> TierCosts:  # fmt: skip
        """A model in units of an AR step at context 0: tier k costs 1 + verify k (the
        target over k + 1 tokens) + draft k (k draft calls; the AR tier `follow` calls a
        step, its drafter's `Drafter.follow`: 1 for a drafter that runs every step, 0 for a
        draft LM or a head that buffers until it drafts), plus context (k + 1) per context
        token (attention), and a catch-up of `catch_up_base` + `catch_up` a token a
        lagging drafter feeds. With `trees` (tree mode, tiers 0 and each tree's nodes M):
        k = M - 1 verified and the tree's drafted levels as its calls."""
        if trees:
            calls = [follow, *(t.levels_drafted for t in trees)]
        else:
            calls = [k or follow for k in tiers]
        verified = [0, *(t.nodes - 1 for t in trees)] if trees else list(tiers)
        base = [1.0 + verify * k + draft * n for k, n in zip(verified, calls)]
        return cls.table(base, [context * (k + 1) for k in verified], catch_up_n=catch_up,
                         catch_up_base_n=catch_up_base)  # fmt: skip

    def seconds(self, batch: int, context: jax.Array) -> jax.Array:
        """[K] seconds of a round of each tier at `batch` rows and `context` tokens."""
        at = jax.vmap(lambda row: jnp.interp(float(batch), self.batch_n, row))
        return at(self.base_kn) + context * at(self.per_token_kn)

    def catch_up(self, batch: int, lag: jax.Array) -> jax.Array:
        """Seconds a drafter lagging `lag` tokens (the most over the rows: the catch-up
        feeds every row) spends catching up before it drafts, at `batch` rows."""
        per, least = (jnp.interp(float(batch), self.batch_n, v)
                      for v in (self.catch_up_n, self.catch_up_base_n))
        return jnp.where(lag > 0, jnp.maximum(least + lag * per, 0.0), 0.0)


jax.tree_util.register_dataclass(
    TierCosts,
    data_fields=['batch_n', 'base_kn', 'per_token_kn', 'catch_up_n', 'catch_up_base_n'],
    meta_fields=[],
)


def acceptance(accepted_ba, reached_ba, prior, weight) -> jax.Array:
    """Each row's conditional acceptance per draft position [B, A] from the run's counts,
    shrunk toward the batch's pooled rate, which shrinks toward the depth above shifted by
    the prior's profile (module docstring, `adaptive_prior`; depth 1 toward the prior's
    first rate)."""
    acc_ba, seen_ba = accepted_ba.astype(jnp.float32), reached_ba.astype(jnp.float32)
    pooled_a = adaptive_prior.pooled(acc_ba.sum(0), seen_ba.sum(0), prior, weight)
    return (acc_ba + weight * pooled_a) / (seen_ba + weight)


def expected_tokens(alpha_ba, tiers: Sequence[int], room_b) -> jax.Array:
    """[2, B, K] each row's tokens from a round of each tier, first and second moments: a
    row emits N = 1 + its accepted drafts, P(N > d) = prod_{j <= d} alpha_j (d = 0 the
    bonus or AR's one), capped by its room: E N = sum_{d <= min(k, room - 1)} P(N > d),
    E N^2 = the same sum weighted by 2d + 1."""
    batch = alpha_ba.shape[0]
    reach_bt = jnp.concatenate([jnp.ones((batch, 1)), jnp.cumprod(alpha_ba, axis=1)], axis=1)
    depth_t = jnp.arange(reach_bt.shape[1])
    reach_bt = jnp.where(depth_t[None, :] < room_b[:, None], reach_bt, 0.0)
    moments_2bt = jnp.stack([reach_bt, reach_bt * (2 * depth_t + 1)[None, :]])
    return jnp.cumsum(moments_2bt, axis=2)[:, :, np.asarray(tiers)]


def finish_seconds(moments_2bk, live_b, room_b, seconds_k) -> jax.Array:
    """[K] seconds the batch needs to finish if every round from here ran tier k.

    The loop runs until its last row is done, so what a round is worth is how much it
    brings that end nearer, not the tokens it adds to rows that will wait for it. A row of
    room r whose rounds emit N tokens (mean m, variance v) needs about r / m + z sqrt(r v /
    m^3) rounds (the renewal approximation; at most r), and the batch the most of its rows:
    z = the expected largest of n standard normals (Blom: Phi^-1((n - 3/8) / (n + 1/4)),
    0 for one row, 1.43 for 8), taken over each row's mean + z sd, an upper reading when
    rows differ. Within 5% of a simulated batch (tests/decoding/test_adaptive.py); at batch 8
    and acceptance 0.35, a chain of one draft needs 51 rounds for 64 tokens, not the 47 its
    tokens per round suggest. At one row it is room / mean: the most tokens per second."""
    mean_bk, square_bk = moments_2bk[0], moments_2bk[1]
    mean_bk = jnp.maximum(mean_bk, 1.0)  # A done row (room 0) emits nothing; it is masked.
    var_bk = jnp.maximum(square_bk - mean_bk**2, 0.0)
    room_b1 = room_b.astype(jnp.float32)[:, None]
    n = jnp.maximum(live_b.sum(), 1).astype(jnp.float32)
    z = jax.scipy.special.ndtri((n - 0.375) / (n + 0.25))
    rounds_bk = room_b1 / mean_bk + z * jnp.sqrt(room_b1 * var_bk / mean_bk**3)
    rounds_bk = jnp.minimum(rounds_bk, room_b1)  # A round emits at least one token.
    return jnp.where(live_b[:, None], rounds_bk, 0.0).max(0) * seconds_k


def choose(finish_k: jax.Array) -> jax.Array:
    """The tier that finishes soonest (int32 scalar; ties go to the shorter tier)."""
    return jnp.argmin(finish_k).astype(jnp.int32)


def optimistic(p, seen, weight, z) -> jax.Array:
    """Acceptance z standard errors above `p`, seen + weight rounds behind it (at most 1)."""
    sd = jnp.sqrt(p * (1.0 - p) / (seen + weight))
    return jnp.minimum(jnp.where(sd > 0, p + z * sd, p), 1.0)  # z inf: 1 where unsure.


# ---- tree tiers ------------------------------------------------------------------------------
def tree_tiers(tree: TreeShape, text: str) -> tuple[TreeShape, ...]:
    """The trees of tree mode's tiers, ascending in nodes, the last `tree` itself: node
    budgets n, 'auto' (path_len + 1: as many drafts as the longest path, a tree of half
    the nodes, at least one more, then tree.nodes) or '0,4,8' (0 AR, the last
    tree.nodes), each tree the first n nodes of a static tree (a prefix is a tree: parents
    precede children) or the dynamic tree of n nodes, depth min(depth, n - 1), the same
    branch (its n - 1 best candidates)."""
    def of(n: int) -> TreeShape:
        if tree.static:
            return TreeShape.fixed(tree.parents[:n], tree.sampled)
        return TreeShape(n, min(tree.depth, n - 1), tree.branch)

    if text == 'auto':
        chain = tree.path_len + 1
        budgets = (chain, max(chain + 1, tree.nodes // 2), tree.nodes)
    else:
        budgets = Adaptive.parse_tiers(text, tree.nodes)[1:]
    budgets = sorted({n for n in budgets if 1 < n <= tree.nodes} | {tree.nodes})
    return tuple(tree if n == tree.nodes else of(n) for n in budgets)


@dataclasses.dataclass(frozen=True)
class Adaptive:
    """An engine's online draft length (module docstring).

    A pytree: `costs`, `prior`, `weight`, `explore` and `optimism` are leaves (new values
    reuse the compiled loop); `tiers` and `trees` are static.

    Attributes:
      tiers: ascending distinct draft lengths, each a compiled round (0: an AR step); the
        largest is the engine's `num_draft`. Tree mode: 0, then each tree's node budget.
      costs: `TierCosts` with one row per tier.
      prior: acceptance assumed before any round: a rate, or [P] rates for depths 1..P
        (`adaptive_prior`: deeper depths anchor on the depth above, shifted by the
        profile's log-odds steps; past P unshifted).
      weight: rounds the prior (and, per row, the pooled rate) counts as.
      explore: every explore-th round runs the tier above the choice (0: never) when the
        look pays (`look_pays`) at an acceptance `optimism` standard errors above the
        estimate (the default 1.645: one-sided 95%; inf: whenever the tier above would
        finish sooner at acceptance 1).
      trees: tree mode's tier trees (`tree_tiers`), ascending in nodes, the last the
        engine's tree (the `Engine` sets (tree,) when empty).
    """

    tiers: tuple[int, ...]
    costs: TierCosts
    prior: float | np.ndarray = 0.7
    weight: float = 4.0
    explore: int = 16
    optimism: float = 1.645
    trees: tuple[TreeShape, ...] = ()

    def __post_init__(self):
        object.__setattr__(self, 'tiers', tuple(int(k) for k in self.tiers))
        object.__setattr__(self, 'trees', tuple(self.trees))

    @property
    def width(self) -> int:
        """The rank counts' width: the widest tier tree's branch."""
        return max((t.branch for t in self.trees), default=1)

    def warmed(self, per_row: dict) -> Adaptive:
        """These settings with the prior learned from an earlier batch of the same job (its
        `Result.stats['per_row']`): the acceptance its rows saw at each of the prior's depths,
        pooled and shrunk toward the old prior's anchors (`adaptive_prior.learned`; tree
        mode: the top candidate's under the geometric prior, 1 - (1 - a)^(1 / width), a the
        rate any candidate was taken), in its shape (a rate stays a rate) and `PRIOR_RANGE`;
        unchanged where that batch drafted nothing. A job's next batch then starts from what
        its drafter was seen to accept instead of a guess (a draft LM's first drafting round
        pays its deferred prefill: at the 0.7 default its first round on a 769-token article
        drafted, on a CPU where AR was the best tier there); `weight` stays, so a new
        batch's counts still move it. Prior and weight are leaves: the compiled loop is
        reused. Greedy tokens do not change; sampled ones follow the same law with other
        draws (the tiers a row runs decide which noise its tokens read, as the batch's other
        rows already do)."""
        accepted = np.asarray(per_row['accepted_at_position'], np.float64).sum(0)
        reached = np.asarray(per_row['reached_at_position'], np.float64).sum(0)
        if not reached.size or reached[0] <= 0:
            return self
        rates = adaptive_prior.learned(self.prior, accepted, reached, float(self.weight),
                                       self.width if self.trees else 1)
        prior = float(rates[0]) if np.ndim(self.prior) == 0 else rates
        return dataclasses.replace(self, prior=prior)

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
        if tree is not None:
            self._check_trees(tree)
            num_draft = tree.nodes
        if len(t) < 2 or list(t) != sorted(set(t)) or t[0] < 0 or t[-1] != num_draft:
            raise ValueError(f'adaptive tiers {t}: give at least two ascending distinct draft '
                             f'lengths >= 0, the last one num_draft ({num_draft})')
        rows = np.shape(self.costs.base_kn)[0]
        if rows != len(t):
            raise ValueError(f'adaptive costs have {rows} rows for tiers {t}: one per tier')
        adaptive_prior.profile(self.prior)
        if float(self.weight) <= 0 or int(self.explore) < 0 or not float(self.optimism) >= 0:
            raise ValueError(f'adaptive weight {self.weight} (> 0), explore {self.explore} '
                             f'(>= 0), optimism {self.optimism} (>= 0)')

    def _check_trees(self, tree: TreeShape) -> None:
        nodes = (0, *(s.nodes for s in self.trees))
        if not self.trees or self.trees[-1] != tree or self.tiers != nodes:
            raise ValueError(f'adaptive tiers {self.tiers} with trees '
                             f'{[s.describe() for s in self.trees]} in tree mode: give tiers '
                             f'(0, each tree\'s nodes), the last tree the engine\'s '
                             f'({tree.describe()}): `tree_tiers`')
        for s in self.trees:
            if s.room > tree.room or s.path_len > tree.path_len or s.mode != tree.mode:
                raise ValueError(f'adaptive tier tree {s.describe()}: give trees within '
                                 f'{tree.describe()} (room, depth) of its sibling mode')

    def tier(self, state, lag_b=None) -> jax.Array:
        """The index into `tiers` of the round to run on `state` (a `DecodeState`), from
        the rounds before it only; `lag_b` [B]: tokens the drafter must catch up on before
        it drafts (`Drafter.lag`; None: none), paid once by a drafting tier."""
        st = state.stats
        live_b, room_b = ~state.done_b, state.limit_b - state.num_out_b
        if self.trees:  # The batch's acceptance per depth and rank (state.ranks).
            p_dc = adaptive_trees.rank_acceptance(state.ranks, self.prior, self.weight)
            high_dc = optimistic(p_dc, state.ranks[1], self.weight, self.optimism)
            high_dc = high_dc / jnp.maximum(high_dc.sum(1, keepdims=True), 1.0)
            moments, high = (adaptive_trees.tree_tokens(self.trees, p, room_b)
                             for p in (p_dc, high_dc))
        else:
            alpha_ba = acceptance(st.accepted_at_ba, st.reached_at_ba, self.prior, self.weight)
            seen_a = st.reached_at_ba.sum(0).astype(jnp.float32)
            high_ba = optimistic(alpha_ba, seen_a[None, :], self.weight, self.optimism)
            moments, high = (expected_tokens(a, self.tiers, room_b) for a in (alpha_ba, high_ba))
        batch = state.committed_b.shape[0]
        context = state.committed_b.astype(jnp.float32).mean()
        seconds_k = self.costs.seconds(batch, context)
        lag = 0 if lag_b is None else jnp.max(lag_b)  # The catch-up feeds every row.
        drafts_k = jnp.asarray(self.tiers) > 0
        catch_up_k = jnp.where(drafts_k, self.costs.catch_up(batch, lag), 0.0)
        finish_k = finish_seconds(moments, live_b, room_b, seconds_k)
        k = choose(finish_k + catch_up_k)
        up = jnp.minimum(k + 1, len(self.tiers) - 1)
        hopeful_k = finish_seconds(high, live_b, room_b, seconds_k) + catch_up_k
        every = jnp.asarray(self.explore, jnp.int32)
        due = (every > 0) & ((jnp.max(st.blocks) + 1) % jnp.maximum(every, 1) == 0)
        pays = look_pays(finish_k, hopeful_k, seconds_k, catch_up_k, k, up, self.optimism)
        return jnp.where(due & pays, up, k)


def look_pays(finish_k, hopeful_k, seconds_k, catch_up_k, k, up, z) -> jax.Array:
    """Whether a round of tier `up` instead of the choice `k` is worth its price (a bool).

    Two readings of the acceptance: the estimate, and `hopeful` z standard errors above
    it; the truth is at or above the hopeful one with chance Phi(-z) (0.05 at 1.645). If
    it is, the look finds it and the run saves at least `hopeful_k[k] - hopeful_k[up]`
    seconds (the tiers' finish at that acceptance, catch-up included; the saving grows
    with the acceptance, so this is a lower reading); if not, the look wasted its price:
    up's catch-up beyond k's, and its round's seconds beyond what tier k needs for the
    same progress (a round of tier j brings the end 1 / rounds_j nearer: seconds_up (1 -
    finish_k / finish_up)). It pays when Phi(-z) saving > (1 - Phi(-z)) price; z inf: when
    up finishes sooner at acceptance 1 (the look as a test's switch)."""
    saving = hopeful_k[k] - hopeful_k[up]
    progress = jnp.where(finish_k[up] > 0, finish_k[k] / jnp.maximum(finish_k[up], 1e-30), 1.0)
    price = catch_up_k[up] - catch_up_k[k] + seconds_k[up] * (1.0 - progress)
    tail = jax.scipy.special.ndtr(-jnp.asarray(z, jnp.float32))
    return jnp.where(jnp.isinf(z), saving > 0, (up != k) & (tail * saving > (1 - tail) * price))


jax.tree_util.register_dataclass(
    Adaptive,
    data_fields=['costs', 'prior', 'weight', 'explore', 'optimism'],
    meta_fields=['tiers', 'trees'],
)
