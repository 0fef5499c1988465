"""Generate with the embedded default target, SmolLM2-135M-Instruct (Q4_1 GGUF, fp32).

    python launch/generate.py --config configs/smollm2_135m.py
    python launch/generate.py --config configs/smollm2_135m.py \
        --config.prompts='("Why is the sky blue?",)' --config.sampling.temperature=0.7
    python launch/generate.py --config configs/smollm2_135m.py:tiny   # random tiny model

Expected (greedy, first prompt): "The capital of France is Paris." at roughly 30-50
tokens/s on a 2-core CPU after compilation.
"""

import ml_collections

from spec_jax.jobs.common import sampling_config


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    # 'embedded', a .gguf file, an HF directory or hub id, an orbax directory, or
    # 'random:<preset>' (random weights with the embedded tokenizer).
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'  # bf16 is 7-10x slower than fp32 under XLA:CPU; use it on TPU/GPU.
    c.seed = 0
    c.prompts = (
        'What is the capital of France?',
        'Write a Python function that checks whether a number is prime.',
        'Natalia sold clips to 48 of her friends in April, and then she sold half as many '
        'clips in May. How many clips did Natalia sell altogether in April and May?',
    )
    c.prompt_file = ''  # Text (one prompt a line) or jsonl (see prompt_field); overrides prompts.
    c.prompt_field = 'prompt'
    c.chat = True  # Wrap each prompt in the model's chat template as a user message.
    c.system_prompt = ''  # Empty: the template's own default.
    c.batch_size = 8
    c.max_new_tokens = 8 if tiny else 128
    c.max_prompt_len = 512
    c.prompt_bucket = 64
    c.sampling = sampling_config(temperature=0.0)
    return c
