"""Draft training: a distilled draft LM and an EAGLE-3 head for a target (docs/training.md;
the job wiring the stages is spec_jax/jobs/train_draft.py).

Modules: data (training prompts, self-distillation shards, teacher sidecars, batches),
core (optimizer, the resumable loop, checkpoints, teacher forwards), distill (the draft
LM's losses and steps), eagle3 (the head's training-time test, its losses, steps and
held-out acceptance).
"""

from spec_jax.train import core, data, distill, eagle3
from spec_jax.train.core import Checkpointer, apply_gradients, make_optimizer, train_loop

__all__ = [
    'Checkpointer',
    'apply_gradients',
    'core',
    'data',
    'distill',
    'eagle3',
    'make_optimizer',
    'train_loop',
]
