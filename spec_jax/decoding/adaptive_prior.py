"""The adaptive engine's prior: acceptance per draft depth assumed before a round is seen.

A drafter's conditional acceptance is not one number: behind the first draft it rises with
depth (the shipped draft LM behind lookup 2, measured on held-out prompts: 0.31, 0.43, 0.69,
0.81 at depths 1-4), because a round reaches depth d only where the text is easy to guess.
One number at every depth prices a chain of 4 at 1.44 tokens a round where the measured
profile gives 1.60 (both computed from those rates): it undervalues the longer tiers, which
matters on chips where they pay. So the prior is a profile, `[P]` rates for depths 1..P
(deeper depths repeat the last), and the engine (`adaptive.acceptance`,
`adaptive_trees.rank_acceptance`) shrinks each depth's counts toward the anchor

    anchor_1 = prior_1,  logit anchor_d = logit pooled_{d-1} + (logit prior_d - logit prior_{d-1})

(pooled_{d-1} what the run's batch saw at the depth above, itself shrunk): the profile's
rise from depth to depth, carried from the run's own level. A run that accepts far more
than the held-out prompts (a prompt that copies its input) lifts every deeper anchor with
its first depth, as the single number did; where nothing is seen the anchors are the
profile. A profile of one rate (a configured `spec.adaptive.prior`) is the old rule: each
depth toward the depth above. The shift is an assumption (the profile's log-odds steps hold
at other levels), an estimate's starting point the counts outweigh after `weight` rounds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

# A prior is kept within these (`Adaptive.warmed`, `drafters.measured.prior`): never sure.
PRIOR_RANGE = (0.01, 0.99)


def profile(prior) -> np.ndarray:
    """A prior (a rate or rates for depths 1..P) as a float32 array [P], P >= 1.

    Raises:
      ValueError: empty, not 1-D, or a rate outside (0, 1)."""
    p = np.atleast_1d(np.asarray(prior, np.float32))
    if p.ndim != 1 or not p.size or not ((p > 0) & (p < 1)).all():
        raise ValueError(f'adaptive prior {np.asarray(prior).tolist()}: give an acceptance rate '
                         'in (0, 1), or one for each draft depth from 1')
    return p


def anchor(above, prior_p: jax.Array, d: int) -> jax.Array:
    """Depth d's anchor (0-based d >= 1), the depth above's estimate `above` (any shape,
    rates in [0, 1]) shifted by the profile's log-odds step from index d - 1 to d; exactly
    `above` where the step is 0 or d is past the profile (no ops: a rate's case)."""
    if d >= prior_p.shape[0]:
        return above
    shift = _logit(prior_p[d]) - _logit(prior_p[d - 1])
    p = jnp.clip(above, 1e-6, 1.0 - 1e-6)
    return jnp.where(shift == 0, above, jax.nn.sigmoid(_logit(p) + shift))


def pooled(accepted_a, reached_a, prior, weight) -> jax.Array:
    """The batch's rate per depth [A] from its counts (summed over rows), each depth shrunk
    toward its anchor by `weight` rounds (depth 1 toward the prior's first rate)."""
    prior_p = jnp.atleast_1d(jnp.asarray(prior, jnp.float32))
    rates, above = [], prior_p[0]
    for d in range(accepted_a.shape[0]):
        hold = above if d == 0 else anchor(above, prior_p, d)
        above = (accepted_a[d] + weight * hold) / (reached_a[d] + weight)
        rates.append(above)
    return jnp.stack(rates) if rates else jnp.zeros((0,), jnp.float32)


def learned(prior, accepted_a, reached_a, weight: float, width: int = 1) -> np.ndarray:
    """The profile an earlier batch's counts give ([P] as `prior`'s, so a compiled loop is
    reused): its `pooled` rates, the estimate the engine read at the batch's end; a depth
    the batch never reached keeps its anchor. Tree counts (width > 1: the rate any of
    `width` candidates was taken) are read as the top candidate's under the geometric
    prior, 1 - (1 - a)^(1 / width), before the shrink. In `PRIOR_RANGE`."""
    prior_p = profile(prior)
    acc, seen = np.zeros((2, prior_p.size), np.float64)
    n = min(len(accepted_a), prior_p.size)
    acc[:n], seen[:n] = np.asarray(accepted_a, np.float64)[:n], np.asarray(reached_a)[:n]
    top = 1.0 - (1.0 - acc / np.maximum(seen, 1.0)) ** (1.0 / width)
    rates = pooled(seen * top, seen, prior_p, weight)
    return np.clip(np.asarray(rates, np.float32), *PRIOR_RANGE)


def _logit(p):
    return jnp.log(p) - jnp.log1p(-p)
