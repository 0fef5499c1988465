"""The timing design: in which order the methods decode each batch of a task group
(docs/eval.md, timing), and the units its randomisation is drawn in.

  design(m, n, seed, group)  orders[k][p]: the method at place p of the group's k-th batch
  unit(number, group_size)   a batch's design unit (the triple, then one per pair)
  design_seed(seed, group)   the entropy the relabellings are drawn from (recorded: the run
                             seed and the group name's hash)

Estimand: none printed here; the speedups whose bias the design removes are in
`spec_jax.eval.stats.paired` (the geometric mean of per-batch tokens/s ratios, over the
design's units from `paired.MIN_UNITS` on), simulated in tests/eval/test_timing_design.py.
"""

from __future__ import annotations

import hashlib

import numpy as np


def _shifted(m: int, shift: int) -> list[int]:
    """Labels 1 .. m - 1 rotated by `shift`, with label 0 inserted at the middle place
    (m - 1) // 2: a template order (`design` relabels it at random)."""
    others = [1 + (p + shift) % (m - 1) for p in range(m - 1)] if m > 1 else []
    middle = (m - 1) // 2
    return others[:middle] + [0] + others[middle:]


def _triple(m: int) -> list[list[int]]:
    """Three template orders whose place sums differ little between labels: two rotations
    half apart, then the labels sorted by their two places' sum, the largest sum first (a
    3 x m near-magic rectangle)."""
    first, second = _shifted(m, 0), _shifted(m, (m - 1) // 2)
    place = [[o.index(i) for i in range(m)] for o in (first, second)]
    third = sorted(range(m), key=lambda i: (-(place[0][i] + place[1][i]), i))
    return [first, second, third]


def design_seed(seed: int, group: str) -> list[int]:
    """The entropy the design of (seed, group) draws its relabellings from: the run's seed
    and the first 8 hex digits of the group name's SHA-256 (`numpy.random.SeedSequence`),
    so a resumed run draws the same orders and another group other ones."""
    return [int(seed) % 2**32, int(hashlib.sha256(group.encode()).hexdigest()[:8], 16)]


def design(m: int, n: int, seed: int = 0, group: str = '') -> list[list[int]]:
    """The method orders of a task group of n batches and m methods: orders[k][p] is the
    index (in the plan) of the method at place p of the group's k-th batch.

    Template orders come in units: an order and its reverse (places p and m - 1 - p: every
    label's places sum to m - 1 over the pair, so a drift linear in time over the pair
    lands on every method alike), and, when n is odd, a near-magic triple first (`_triple`:
    place sums within 2 of each other). Each unit is relabelled by its own uniformly random
    permutation of the methods (AR included), drawn from `design_seed(seed, group)`: a
    relabelling keeps every unit's balance, and no method holds a fixed place, so a load
    periodic in rounds meets every method's places at random instead of one method's place
    always (docs/eval.md, timing: what the simulation measured). One batch (n 1) is one
    relabelled order: it cannot balance (and gets no interval).

    Raises:
      ValueError: m < 1 or n < 1.
    """
    if m < 1 or n < 1:
        raise ValueError(f'a design needs methods >= 1 and batches >= 1; got {m} and {n}')
    if n == 1:
        templates = [_shifted(m, 0)]
    else:
        odd = n % 2
        templates = (_triple(m) if odd else []) + [list(range(m)), list(range(m))[::-1]] * (
            (n - 3 * odd) // 2)  # fmt: skip
    units = [unit(k, n) for k in range(n)]
    rng = np.random.default_rng(design_seed(seed, group) + [m, n])
    labels = rng.permuted(np.tile(np.arange(m), (units[-1] + 1, 1)), axis=1)  # A row a unit.
    return np.take_along_axis(labels[units], np.asarray(templates), axis=1).tolist()


def unit(number: int, group_size: int) -> int:
    """The design unit of a group's batch `number` (`design`): 0 for the triple (batches
    0-2 of an odd group), then one per order-and-reverse pair. The units are the design's
    independent draws: speedup intervals from enough of them are taken over their means
    (`spec_jax.eval.stats.paired.ratio_interval`)."""
    if not 0 <= number < group_size:
        raise ValueError(f'batch number {number} is outside a group of {group_size}')
    odd = group_size % 2 and group_size > 1
    return 0 if odd and number < 3 else (number - 3) // 2 + 1 if odd else number // 2
