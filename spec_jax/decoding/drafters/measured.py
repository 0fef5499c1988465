"""What a drafter was measured to accept, stored beside its weights: the adaptive prior.

An adaptive engine (decoding/adaptive.py) chooses its first rounds before it has seen any,
from `prior`: the acceptance it assumes per draft depth (decoding/adaptive_prior.py). A
guess drafts where drafting does not pay (at the 0.7 default a draft LM's first round on a
769-token article drafted and paid its deferred prefill, on a CPU where AR was the best tier
there) or holds back where it does. A drafter directory may carry `FILE` (acceptance.json),
written by `launch/bench.py --config configs/bench_prior.py` (spec_jax/jobs/bench_prior.py):
the chain engine's counts per draft position on held-out prompts, per prompt-lookup setting,
with where and how they were measured. `prior` reads the one the engine runs (the drafter
kind and its lookup): the conditional acceptance at each depth, accepted / reached pooled
over the sets, down to the last depth reached in at least `MIN_REACHED` rounds (a thinner
depth is left to the engine, which anchors it on the depth above).

    {"kind": "eagle3", "target": "embedded", "measured": {sets, start, prompts, ...},
     "by_lookup": {"0": {"depth_1": 0.41, "accepted_at_position": [...],
                         "reached_at_position": [...], "by_set": {...}}, "2": {...}},
     "commit": ..., "jax": ..., "machine": ..., "date": ...}

It is what the drafter accepts under the lossless rule at the measured temperature: a
lossy rule accepts more (a lower reading), a workload unlike the held-out prompts may
accept less or more; the engine's own counts outweigh it after `weight` rounds.
"""

from __future__ import annotations

import json
import os

import numpy as np

from spec_jax.decoding.adaptive_prior import PRIOR_RANGE

FILE = 'acceptance.json'
# Rounds a depth must have been reached in to enter the profile: a rate's standard error
# at most 0.11 (sqrt(1/4 / 20)); the shipped drafts' depth 4 was reached 34-118 times.
MIN_REACHED = 20


class MeasuredPriorError(ValueError):
    """A drafter's acceptance.json that cannot be read as this module writes it."""


def prior(draft: str, kind: str, lookup: int) -> tuple[tuple[float, ...], str] | None:
    """(conditional acceptance per depth from 1, where it was measured) of the drafter
    `draft` (a directory) of `kind` behind prompt lookup `lookup` (0: none), from its `FILE`,
    within `PRIOR_RANGE`; None where `draft` is no directory, has no `FILE`, or the file
    holds no record of this lookup setting. Depth 1 is the record's `depth_1`; deeper
    depths its counts, while reached in `MIN_REACHED` rounds or more.

    Raises:
      MeasuredPriorError: the file is there but not JSON of this form, or names another
        drafter kind.
    """
    path = os.path.join(draft, FILE) if draft and os.path.isdir(draft) else ''
    if not path or not os.path.exists(path):
        return None
    try:
        with open(path) as f:
            card = json.load(f)
        record = card['by_lookup'].get(str(int(lookup)))
        value = None if record is None else float(record['depth_1'])
        said = None if record is None else describe(path, card, int(lookup))
        deeper = [] if record is None else _deeper(record)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise MeasuredPriorError(f'{path}: not a measured acceptance record ({e!r}); rewrite '
                                 'it with configs/bench_prior.py or remove it') from None
    if card.get('kind') != kind:
        raise MeasuredPriorError(f'{path} measured a {card.get("kind")!r} drafter; this engine '
                                 f'drafts with {kind!r}')
    if value is None:
        return None
    if not 0.0 <= value <= 1.0:
        raise MeasuredPriorError(f'{path}: depth_1 {value} at lookup {lookup}: give a rate in '
                                 '[0, 1]')
    rates = np.clip([value, *deeper], *PRIOR_RANGE)
    return tuple(round(float(r), 4) for r in rates), said


def _deeper(record: dict) -> list[float]:
    """Depths 2.. of a record: accepted / reached while reached >= `MIN_REACHED` (none
    where it holds no counts: depth 1 alone)."""
    acc = record.get('accepted_at_position', [])
    seen = record.get('reached_at_position', [])
    if len(acc) != len(seen):
        raise ValueError(f'{len(acc)} accepted counts for {len(seen)} reached')
    rates = []
    for a, n in zip(acc[1:], seen[1:]):
        if not 0 <= float(a) <= float(n):
            raise ValueError(f'{a} accepted of {n} reached')
        if float(n) < MIN_REACHED:
            break
        rates.append(float(a) / float(n))
    return rates


def describe(path: str, card: dict, lookup: int) -> str:
    """One line: what was measured, on what, at which commit."""
    m = card['measured']
    sets = ', '.join(m.get('sets', ()))
    return (f'{path}: behind lookup {lookup} '
            f'with target {card.get("target")}, {m.get("prompts")} held-out prompts of {sets} '
            f'(from prompt {int(m.get("start", 0)) + 1} of each), chain of {m.get("chain")}, '
            f'{m.get("rule")} rule at T {m.get("temperature")}, measured at commit '
            f'{str(card.get("commit", "unknown"))[:12]}')
