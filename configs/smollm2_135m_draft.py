"""Distil a small draft LM from the embedded default (SmolLM2-135M-Instruct).

    python launch/train_draft.py --config configs/smollm2_135m_draft.py --workdir runs/draft
    python launch/train_draft.py --config configs/smollm2_135m_draft.py:tiny --workdir /tmp/d

Stages (each resumable in the workdir): self-distillation data (the target writes user
prompts itself, then answers them and GSM8K-train / unevaluated MBPP prompts, greedy),
distillation on response tokens (hard-label CE, optionally KL to the target's logits),
held-out acceptance on the speed prompts, export as an HF directory (bf16
safetensors + tokenizer). `:tiny` runs in about a minute on a random tiny target (a smoke
test of every stage).
"""

import ml_collections

from spec_jax.jobs import train_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    return train_config.default_config('draft_lm', tiny=arg == 'tiny')
