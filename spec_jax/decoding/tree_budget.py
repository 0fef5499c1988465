"""Trees sized for the hardware and the batch: the dynamic tree (nodes, depth, branch) that
maximizes expected tokens per second, from the chip's verify-cost curve and the head's
acceptance per depth (Sequoia's positional acceptance, EAGLE-2's selection).

The acceptance profile: `Acceptance.by_depth[d - 1][k - 1]` is the probability that the
target's token at depth d is the head's k-th ranked candidate there, given the path to its
parent was accepted (the last depth's vector holds deeper). A node's path probability is the
product of its ranks' probabilities along its path; a round accepts, in expectation, the sum
of its drafted nodes' path probabilities, plus one token (the bonus, or AR's one).

The tree is the engine's dynamic tree (spec_jax/decoding/trees.py): `branch` children of
each of a `branch`-node frontier for `depth` levels, the M - 1 best of the pool kept. Here a
candidate's score is its path probability (EAGLE-2's premise: the head's confidence tracks
acceptance), so the kept nodes are the pool's M - 1 most likely and the expected tokens of
(M, depth, branch) follow exactly from the profile.

A round costs `verify_s(T = M)` (the target over the M nodes, at the batch in question)
plus `draft_s(levels, branch)` (the head's calls; none for AR). Tokens per second of a
round: batch x expected tokens / round seconds. Given the run's `new_tokens` a row, the
batch's instead: batch x new_tokens / its seconds to finish, which wait for its slowest
row (`finish_rounds`: the adaptive engine's reading, decoding/adaptive.py; at batch 8 a
tree must beat AR by several percent in mean tokens per second to finish sooner). One node
(M = 1: plain AR, no draft) is an allowed answer, so the choice is never predicted below
AR; a chain is branch 1.

The costs come from a bench's measured curve (`launch/bench.py --config
configs/bench_accel.py`: `bench_accel.verify_costs`, then `interpolated`) or the calibrated
model (`spec_jax.costs.calibration.tree_costs`); the profile is given (`Acceptance.parse`)
or its top rank per depth read from a chain run's statistics (`Acceptance.from_chain`);
the engine measures every rank online and picks among a few compiled trees each round
(`spec.adaptive` in tree mode: decoding/adaptive.py, tree tiers). Paper setups
keep EAGLE's fixed tree for fidelity; a tree block's `sized` asks for this one
(`decoding.build.tree_of`), at the block's batch_size on a calibrated chip.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import math
import statistics
from collections.abc import Callable

import numpy as np

from spec_jax.decoding.trees import TreeShape


@dataclasses.dataclass(frozen=True)
class Acceptance:
    """The head's acceptance per depth and rank (module docstring)."""

    by_depth: tuple[tuple[float, ...], ...]

    def __post_init__(self):
        if not self.by_depth or any(not v for v in self.by_depth):
            raise ValueError(f'acceptance {self.by_depth}: give at least one rank probability')
        for v in self.by_depth:
            if any(p < 0 for p in v) or sum(v) > 1 + 1e-9:
                raise ValueError(f'acceptance {v}: probabilities >= 0 summing to at most 1')

    @classmethod
    def parse(cls, text: str) -> Acceptance:
        """'0.6,0.1;0.5,0.1': rank probabilities per depth, depths separated by ';'."""
        try:
            by_depth = tuple(tuple(float(p) for p in d.split(',')) for d in text.split(';'))
        except ValueError:
            raise ValueError(
                f"acceptance {text!r}: give rank probabilities per depth as '0.6,0.1;0.5,0.1'"
            ) from None
        return cls(by_depth)

    @classmethod
    def from_chain(cls, accepted_at, reached_at, others: tuple[float, ...] = ()) -> Acceptance:
        """The top-ranked candidate's acceptance per depth from a chain run of the head
        (`Stats.accepted_at_ba` and `reached_at_ba`, summed over rows or not): depth d's is
        the rounds that accepted position d over those that examined it; `others` gives
        ranks 2, 3, ... (a chain does not see them: without them the sizing is cautious)."""
        acc = np.asarray(accepted_at, np.float64).reshape(-1, np.shape(accepted_at)[-1]).sum(0)
        seen = np.asarray(reached_at, np.float64).reshape(-1, np.shape(reached_at)[-1]).sum(0)
        if not seen.any():
            raise ValueError('a chain run with no examined drafts gives no acceptance')
        first = [float(a / r) for a, r in zip(acc, seen) if r > 0]
        return cls(tuple((min(p, 1.0 - sum(others)), *others) for p in first))

    def rank(self, depth: int, k: int) -> float:
        """P(the k-th ranked candidate at `depth` is accepted | its parent was), 1-based."""
        v = self.by_depth[min(depth, len(self.by_depth)) - 1]
        return v[k - 1] if k <= len(v) else 0.0


@dataclasses.dataclass(frozen=True)
class Choice:
    """A sized tree: `shape` (None: AR), expected tokens a round a row, round seconds,
    tokens/s of the batch, and AR's tokens/s beside it."""

    shape: TreeShape | None
    expected_tokens: float
    round_s: float
    tokens_per_s: float
    ar_tokens_per_s: float

    @property
    def nodes(self) -> int:
        return self.shape.nodes if self.shape else 1

    def describe(self) -> str:
        what = self.shape.describe() if self.shape else 'AR (one node)'
        over_ar = self.tokens_per_s / self.ar_tokens_per_s
        return (f'{what}: {self.expected_tokens:.2f} tokens a round, {self.round_s * 1e3:.3f} '
                f'ms, predicted {self.tokens_per_s:,.0f} tokens/s ({over_ar:.2f}x AR)')  # fmt: skip


def interpolated(points: dict[int, float]) -> Callable[[int], float]:
    """A measured cost curve {T: seconds} as `verify_s`: linear in T between measured points,
    the last segment's slope beyond the largest T, the smallest T's cost below it (one
    point: that cost at every T)."""
    ts = sorted(points)
    if not ts:
        raise ValueError('a measured cost curve needs at least one point {T: seconds}')

    def cost(t: int) -> float:
        if t <= ts[0] or len(ts) == 1:
            return points[ts[0]]
        hi = next((i for i, x in enumerate(ts) if x >= t), len(ts) - 1)
        t0, t1 = ts[hi - 1], ts[hi]
        return points[t0] + (points[t1] - points[t0]) * (t - t0) / (t1 - t0)

    return cost


def pool(acceptance: Acceptance, depth: int, branch: int) -> list[float]:
    """Path probabilities of the dynamic tree's candidate pool, best first."""
    return [score for score, _ in pool_depths(acceptance, depth, branch)]


def pool_depths(acceptance: Acceptance, depth: int, branch: int) -> list[tuple[float, int]]:
    """`pool` with each candidate's depth: (path probability, depth), best first."""
    scores, frontier = [], [1.0]
    for d in range(1, depth + 1):
        level = [p * acceptance.rank(d, k) for p in frontier for k in range(1, branch + 1)]
        scores += [(p, d) for p in level]
        frontier = heapq.nlargest(branch, level)
    return sorted(scores, key=lambda sd: -sd[0])


def finish_rounds(new_tokens: int, mean: float, square: float, batch: int) -> float:
    """Rounds a batch needs for `new_tokens` a row when a row's round emits N tokens (E N
    `mean`, E N^2 `square`): the most over `batch` rows of new / mean + z sd (z the
    expected largest of `batch` standard normals, Blom's), at most new_tokens
    (decoding/adaptive.py's `finish_seconds`, on the host)."""
    z = statistics.NormalDist().inv_cdf((batch - 0.375) / (batch + 0.25))
    var = max(square - mean * mean, 0.0)
    return min(new_tokens / mean + z * math.sqrt(new_tokens * var / mean**3), new_tokens)


def choose(
    acceptance: Acceptance,
    verify_s: Callable[[int], float],
    draft_s: Callable[[int, int], float],
    batch: int,
    max_nodes: int = 64,
    max_depth: int = 8,
    max_branch: int = 10,
    new_tokens: int = 0,
) -> Choice:
    """The (nodes, depth, branch) of most expected tokens per second (module docstring).

    Args:
      acceptance: the head's profile.
      verify_s: T -> seconds of the target's forward over T tokens a row at this batch.
      draft_s: (levels, branch) -> seconds of the head's calls of a round at this batch.
      batch: rows (B).
      max_nodes, max_depth, max_branch: the search's limits (M, depth, branch).
      new_tokens: the run's tokens a row: tokens/s of the batch to its end (it waits for
        its slowest row); 0: a round's mean tokens/s (rows that never wait).

    Returns:
      the best Choice; AR (shape None) when no tree beats it. Ties keep the smaller tree.
    """
    verify = functools.lru_cache(maxsize=None)(verify_s)

    def rate(mean: float, square: float, seconds: float) -> float:
        if not new_tokens:
            return batch * mean / seconds
        return batch * new_tokens / (seconds * finish_rounds(new_tokens, mean, square, batch))

    ar = rate(1.0, 1.0, verify(1))
    best = Choice(None, 1.0, verify(1), ar, ar)
    for depth in range(1, max_depth + 1):
        for branch in range(1, max_branch + 1):
            scores = pool_depths(acceptance, depth, branch)
            draft = draft_s(depth, branch)
            expected = square = 1.0
            for m in range(2, min(len(scores) + 1, max_nodes) + 1):
                score, at = scores[m - 2]
                expected, square = expected + score, square + (2 * at + 1) * score
                if m - 1 < depth:  # Shallower than `depth`: a smaller depth's tree.
                    continue
                seconds = verify(m) + draft
                rate_m = rate(expected, square, seconds)
                if rate_m > best.tokens_per_s * (1 + 1e-12):
                    best = Choice(TreeShape(m, depth, branch), expected, seconds, rate_m, ar)
    return best
