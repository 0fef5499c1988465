"""Draft training: a distilled draft LM and an EAGLE-3 head for a target (docs/training.md;
the job wiring the stages is spec_jax/jobs/train_draft.py).

Modules, in the order the stages use them:
  prompts     training prompts: built-in sources (MBPP/MBPP+ never trained on), chat
              datasets, summarization prompts, the datasets' own answers
  generation  the target writes text: self-distillation answers, self-instruct prompts
  shards      examples on disk: numbered shards, sidecar names, reading them back
  teacher     the target's top-k law and feature taps stored once per token (sidecars)
  batches     padded training batches in a resumable, deterministic order
  core        optimizer, the resumable loop, checkpoints, teacher forwards
  distill     the draft LM's losses and steps
  eagle3      the head's training-time test, its losses and steps
"""

from spec_jax.train import (
    batches,
    core,
    distill,
    eagle3,
    generation,
    prompts,
    shards,
    teacher,
)
from spec_jax.train.core import Checkpointer, apply_gradients, make_optimizer, train_loop

__all__ = [
    'Checkpointer',
    'apply_gradients',
    'batches',
    'core',
    'distill',
    'eagle3',
    'generation',
    'make_optimizer',
    'prompts',
    'shards',
    'teacher',
    'train_loop',
]
