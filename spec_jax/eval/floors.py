"""The truncation floors at q = p (docs/laws.md §3.2, §3.3), derived on a run's own text.

With the target as its own draft (`decoding.drafters.SelfDrafter`) min-p verification's
emitted law at a position depends on p there only, so its TV against the matched baseline
p_A is a function of p (A = {v : p(v) >= rho max p}):

  chain, a drafted position (accepted or replaced)   (1 - p(A))^2
  tree, a node with children (its first child is argmax p, which always passes: the walk
        emits it)                                     1 - p_A(argmax p) = 1 - max p / p(A)
  the first token, a chain round's bonus, a tree round's leaf (drawn from the full p)
                                                      1 - p(A)

`position_kinds` reads which of these each emitted position was from the rounds' accepted
counts; `derived` evaluates the floors on the target's p at the emitted positions
(teacher-forced over prompt + output, `teacher_probs`); the job compares their mean with
the metered TV per prompt. The meter also counts the positions of a last round past a row's
limit (`decoding.stats`), which the output and so the derivation lack: at most one round
per prompt.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.models.llama import causal_forward
from spec_jax.sampling import Sampler, min_p_mask


def position_kinds(block_accepted: Sequence[int], num_draft: int, tree: bool) -> np.ndarray:
    """[T] bool per emitted position, True where its law is the full p (the first token,
    a chain round's bonus after all `num_draft` drafts passed, every tree round's last
    token: at q = p its walk always ends at a leaf), False at a drafted position."""
    kinds = [True]
    for n in block_accepted:
        kinds += [False] * int(n) + [bool(tree or n == num_draft)]
    return np.asarray(kinds, bool)


def derived(p_tv: np.ndarray, rho: float, full_t: np.ndarray, tree: bool) -> np.ndarray:
    """[T] the floor of each position: p_tv [T, V] the processed target there, `full_t`
    its `position_kinds`."""
    p = jnp.asarray(p_tv, jnp.float32)
    mass = jnp.where(min_p_mask(p, rho), p, 0.0).sum(-1)
    drafted = 1.0 - p.max(-1) / mass if tree else (1.0 - mass) ** 2
    return np.asarray(jnp.where(jnp.asarray(full_t), 1.0 - mass, drafted))


@partial(jax.jit, static_argnums=(0,))
def _probs(cfg, params, sampler: Sampler, tokens_bt):
    return sampler.probs(causal_forward(cfg, params, tokens_bt)[0])


def teacher_probs(
    cfg, params, sampler: Sampler, prompts: Sequence[Sequence[int]],
    outputs: Sequence[Sequence[int]], length: int,
) -> list[np.ndarray]:  # fmt: skip
    """The processed target law [T_b, V] at each of row b's emitted positions (the law
    output token t was drawn from: p after prompt + output[:t]), rows padded to `length`
    (one compiled shape per batch size)."""
    tokens = np.zeros((len(prompts), length), np.int32)
    for b, (pr, out) in enumerate(zip(prompts, outputs)):
        seq = list(pr) + list(out)
        tokens[b, : len(seq)] = seq[:length]
    p_btv = np.asarray(_probs(cfg, params, sampler, jnp.asarray(tokens)))
    return [p_btv[b, len(pr) - 1 : len(pr) - 1 + len(out)] for b, (pr, out) in
            enumerate(zip(prompts, outputs))]  # fmt: skip
