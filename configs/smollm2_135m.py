"""Generate with the embedded default target, SmolLM2-135M-Instruct (Q4_1 GGUF, fp32).

    python launch/generate.py --config configs/smollm2_135m.py
    python launch/generate.py --config configs/smollm2_135m.py \
        --config.prompts='("Why is the sky blue?",)' --config.sampling.temperature=0.7
    python launch/generate.py --config configs/smollm2_135m.py:tiny   # random tiny model

Expected (greedy, first prompt): "The capital of France is Paris." at roughly 30-50
tokens/s on a 2-core CPU after compilation.
"""

import ml_collections

from spec_jax.jobs import generate


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    return generate.default_config(tiny=arg == 'tiny')
