"""The tiny world the engine tests share: a target, a draft LM and an EAGLE-3 head.

Prime sizes (V 31, U 23), so no axis can stand in for another; the same configs, prompts and
decode settings across test modules, so the programs they compile are the same ones (the
suite's persistent compilation cache then loads, rather than recompiles, what an earlier
module built). The LMs' weights are drawn with numpy (`random_params`); the head starts
from its Flax init, moved into the target's output space.

  TARGET, DRAFT, HEAD        the configs (ModelConfig, ModelConfig, Eagle3Config)
  PROMPTS, DECODE            three prompts of different lengths; 20 new tokens, buckets of 8
  target_params(), draft_params(), head(target)   the weights (the head as drafter params)
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.decoding.drafters import Eagle3Drafter
from spec_jax.decoding.state import DecodeSettings
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig
from spec_jax.testing import random_params

V, U = 31, 23
TARGET = ModelConfig.tiny(vocab_size=V)
DRAFT = ModelConfig.tiny(
    vocab_size=V, num_layers=1, width=16, num_heads=2, num_kv_heads=1, head_dim=8, mlp_width=24
)
HEAD = e3.Eagle3Config.for_target(TARGET, draft_vocab_size=U, taps=(0, 1, 2))
# The head's draft vocabulary is not a prefix of V: every other id, plus a few.
DRAFT_IDS = np.array(sorted(set(range(0, V, 2)) | {3, 7, 11, 13, 19, 23, 29}))[:U]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [7]]
DECODE = DecodeSettings(max_new_tokens=20, prompt_bucket=8, new_tokens_bucket=8)


def target_params(seed: int = 3, std: float = 0.16) -> dict:
    """The target's weights: std 0.16 gives greedy texts that repeat tokens, so drafts get
    accepted (sampling tests draw peaked ones: `random_params(TARGET, embed_scale=8.0)`)."""
    return random_params(TARGET, seed=seed, std=std)


def draft_params(seed: int = 4, std: float = 0.16) -> dict:
    """The draft LM's weights."""
    return random_params(DRAFT, seed=seed, std=std)


def head(target: dict, seed: int = 5):
    """The EAGLE-3 head as `Eagle3Drafter` params for `target`, starting in the target's
    output space (`e3.init_from_target`): it drafts the target's prediction one position
    early, which the tiny targets often accept."""
    params = e3.init_params(HEAD, jax.random.PRNGKey(seed))
    params = e3.init_from_target(HEAD, params, target, jnp.asarray(DRAFT_IDS))
    d2t, t2d = e3.vocab_maps(DRAFT_IDS, V)
    head = e3.Eagle3Head(HEAD, params, jnp.asarray(d2t), jnp.asarray(t2d))
    return Eagle3Drafter.params_for(head, target)
