"""Train an EAGLE-3 head for the embedded default (SmolLM2-135M-Instruct).

    python launch/train_draft.py --config configs/smollm2_135m_eagle3.py --workdir runs/e3
    python launch/train_draft.py --config configs/smollm2_135m_eagle3.py:tiny --workdir /tmp/e

One decoder layer over fc(concat of the target's taps [2, L//2, L-3]), a reduced draft
vocabulary (the most frequent response tokens), the training-time test with 7 unrolled
steps and weights 0.8**j; exported in the official EAGLE-3 layout (bf16 safetensors).
"""

import ml_collections

from spec_jax.jobs import train_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    return train_config.default_config('eagle3', tiny=arg == 'tiny')
