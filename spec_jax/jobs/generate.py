"""The generate job: prompts (plain or chat) in, text out, with tokens/s.

Outputs go to stdout and, with a workdir, to `<workdir>/generations.jsonl`, one line per
prompt. A rerun with the same workdir skips the prompts already there, so an interrupted
run loses no finished batch.
"""

from __future__ import annotations

import json
import os

import ml_collections
from absl import logging
from tqdm import tqdm

from spec_jax import decoding, sharding
from spec_jax.jobs import profile, runtime


def default_config(tiny: bool = False) -> ml_collections.ConfigDict:
    """The generate job's config with every field and its default (configs/ build on it)."""
    c = ml_collections.ConfigDict()
    # 'embedded', a .gguf file, an HF directory or hub id, an orbax directory, or
    # 'random:<preset>' (random weights with the embedded tokenizer).
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'  # bf16 is 7-10x slower than fp32 under XLA:CPU; use it on TPU/GPU.
    c.seed = 0
    # '' keeps the checkpoint's weights; 'int8' quantizes the projections per output channel
    # as they are read, 'float' dequantizes an int8 or GPTQ checkpoint (docs/quantization.md).
    c.weights = ''
    c.scan_layers = False  # One scan over stacked layers (TPU/GPU compile time; not on CPU).
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
    c.sampling = decoding.sampling_config(temperature=0.0)
    c.spec = decoding.spec_config(mode='ar')  # configs/smollm2_135m_chain.py: 'chain'.
    # Devices: (data, model) sizes, one may be -1 (docs/sharding.md); 1 x 1: one device.
    c.mesh = sharding.mesh_config()
    # A jax.profiler trace of profile_rounds rounds (AR and the mode's) on the first batch,
    # after the generation (spec_jax/jobs/profile.py); '' = none.
    c.profile_dir = ''
    c.profile_rounds = 5
    return c


def read_prompts(c: ml_collections.ConfigDict) -> list[str]:
    """The prompts of a config: `prompts` (a list) or `prompt_file` (text or jsonl)."""
    if c.prompt_file:
        with open(c.prompt_file) as f:
            lines = [line.rstrip('\n') for line in f if line.strip()]
        if c.prompt_file.endswith('.jsonl'):
            return [json.loads(line)[c.prompt_field] for line in lines]
        return lines
    return list(c.prompts)


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> list[dict]:
    """Generates a continuation of every prompt of config `c` (see configs/smollm2_135m.py).

    Returns:
      One record per prompt: prompt, text, tokens, seconds of its batch (and the round
      statistics of its row in speculative modes).
    """
    runtime.log_devices()
    built = decoding.build(c)
    tok = built.tokenizer
    prompts = read_prompts(c)
    out_path = os.path.join(workdir, 'generations.jsonl') if workdir else None
    records = _read_records(out_path)
    todo = [i for i in range(len(prompts)) if i not in {r['index'] for r in records}]
    if len(todo) < len(prompts):
        logging.info(
            'resuming: %d of %d prompts already in %s',
            len(prompts) - len(todo),
            len(prompts),
            out_path,
        )

    batches = [todo[i : i + c.batch_size] for i in range(0, len(todo), c.batch_size)]
    for batch in tqdm(batches, desc='generate', unit='batch', disable=len(batches) < 2):
        ids = [decoding.encode(tok, prompts[i], c.chat, c.system_prompt) for i in batch]
        # A short last batch is padded to the compiled batch size with rows that stop after
        # one token, so it reuses the compiled loop instead of compiling another.
        pad = c.batch_size - len(ids) if len(batches) > 1 else 0
        limits = [c.max_new_tokens] * len(ids) + [1] * pad
        # Each prompt's noise is a function of the run's seed and its index in the prompt
        # list, so a resumed or re-batched run gives the same text for it (an adaptive
        # engine's sampled text only where its rounds' tiers repeat: they are chosen from
        # the batch's acceptance; greedy text always).
        result = decoding.generate(
            built.engine,
            built.params,
            ids + ids[-1:] * pad,
            seed=c.seed,
            max_new_tokens=limits,
            sample_ids=list(batch) + [len(prompts)] * pad,
        )
        new = [
            dict(
                index=i,
                prompt=prompts[i],
                text=tok.decode(out, skip_special=True),
                num_tokens=len(out),
                seconds=result.seconds,
            )
            for i, out in zip(batch, result.tokens)
        ]
        if built.engine.mode != 'ar':
            for row, r in enumerate(new):
                r.update({k: v[row] for k, v in result.stats['per_row'].items()})
        _append_records(out_path, new)
        records += new
        n = sum(r['num_tokens'] for r in new)
        summary = spec_summary(result.stats) if built.engine.mode != 'ar' else ''
        print(
            f'[batch of {len(batch)}] {n} tokens in {result.seconds:.2f} s = '
            f'{n / result.seconds:.1f} tokens/s (first batch includes compilation){summary}'
        )
        for r in new:
            print(f'--- prompt {r["index"]}: {r["prompt"]!r}\n{r["text"]}')
    if c.get('profile_dir'):
        ids = [decoding.encode(tok, p, c.chat, c.system_prompt) for p in prompts[: c.batch_size]]
        profile.profile_rounds(profile.with_ar(built.engine), built.params, ids, c.profile_dir,
                               c.profile_rounds)  # fmt: skip
    return sorted(records, key=lambda r: r['index'])


def spec_summary(stats: dict) -> str:
    text = (
        f'; block efficiency {stats["block_efficiency"]:.2f}, acceptance '
        f'{stats["acceptance_rate"]:.2f}'
    )
    if 'mean_tv' in stats:
        text += f', mean TV {stats["mean_tv"]:.3f}, max overshoot {stats["max_overshoot"]:.2f}'
    return text


def _read_records(path: str | None) -> list[dict]:
    if not path or not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _append_records(path: str | None, records: list[dict]) -> None:
    if not path:
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'a') as f:
        for r in records:
            f.write(json.dumps(r) + '\n')
