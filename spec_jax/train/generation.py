"""The target writes training text: self-distillation answers and self-instruct prompts.

`generate_dataset` has the target answer training prompts (greedy) and stores each batch as
one shard (`shards.py`), resumable shard by shard; `self_instruct_prompts` has it write user
prompts of its own (Magpie). Both decode with `spec_jax.decoding` (plain AR).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

import numpy as np
from absl import logging
from tqdm import tqdm

from spec_jax import decoding
from spec_jax.sampling import Sampler
from spec_jax.train import shards
from spec_jax.train.prompts import SELF_INSTRUCT, Prompt


def generate_dataset(
    model,
    prompts: Sequence[Prompt],
    directory: str,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 192,
    max_prompt_len: int = 512,
    prompt_bucket: int = 64,
    seed: int = 0,
    deadline: float | None = None,
    progress: bool = True,
) -> dict:
    """Self-distillation: the target (greedy) answers `prompts`; resumable shard by shard.

    Args:
      model: a checkpoints.LoadedModel (cfg, params, tokenizer) — the target.
      prompts: training prompts in a fixed order.
      directory: shard directory; shards already there are skipped.
      batch_size: prompts per generate call (= per shard).
      max_new_tokens: response length cap.
      max_prompt_len: longer prompts are dropped (deterministically).
      prompt_bucket: prompt padding bucket (fewer compiled shapes).
      seed: generation seed.
      deadline: time.time() after which no new batch starts.
      progress: show a tqdm bar.

    Returns:
      Counts: shards written now, shards total, response tokens written now, seconds.
    """
    tok = model.tokenizer
    settings = decoding.DecodeSettings(
        max_new_tokens=max_new_tokens,
        stop_tokens=tok.stop_ids,
        max_prompt_len=max_prompt_len,
        prompt_bucket=prompt_bucket,
        pad_id=tok.pad_id or 0,
    )
    engine = decoding.Engine(model.cfg, settings)  # Greedy AR.
    encoded = []
    for p in prompts:
        ids = tok.encode_chat(list(p.messages))
        if len(ids) <= max_prompt_len:
            encoded.append((p.source, ids))
    # Sort windows of 16 batches by prompt length: similar lengths share a prompt bucket.
    window = batch_size * 16
    encoded = [
        x
        for i in range(0, len(encoded), window)
        for x in sorted(encoded[i : i + window], key=lambda x: len(x[1]))
    ]
    batches = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    done = shards.finished_shards(directory)
    _check_shards(directory, done, batches)
    todo = [k for k in range(len(batches)) if k not in done]
    if done:
        logging.info(
            'resuming data generation: %d of %d shards already in %s',
            len(done),
            len(batches),
            directory,
        )
    written, new_tokens, start = 0, 0, time.time()
    bar = tqdm(todo, desc='self-distill', unit='batch', disable=not progress)
    for k in bar:
        if deadline is not None and time.time() > deadline:
            break
        batch = batches[k]
        result = decoding.generate(
            engine, decoding.Params(model.params), [ids for _, ids in batch], seed=seed + k
        )
        examples = []
        for (_, ids), out in zip(batch, result.tokens, strict=True):
            tokens = np.array(list(ids) + list(out), np.int32)
            mask = np.zeros(len(tokens), bool)
            mask[len(ids) :] = True
            examples.append(shards.Example(tokens, mask))
        shards.write_shard(
            directory, k, examples, dict(sources=[s for s, _ in batch], seed=seed + k)
        )
        written += 1
        new_tokens += sum(len(o) for o in result.tokens)
        bar.set_postfix(tok_s=f'{new_tokens / (time.time() - start):.0f}')
    return dict(
        shards_written=written,
        shards_total=len(batches),
        tokens=new_tokens,
        seconds=time.time() - start,
    )


def _check_shards(directory: str, done: set[int], batches: Sequence[Sequence[tuple]]):
    """Fails loudly unless every finished shard k holds the prompts of batch k: a directory
    reused with other prompts, order or batch size would otherwise mix in stale answers."""
    if done and max(done) >= len(batches):
        raise ValueError(
            f'{shards.shard_path(directory, max(done))} exists, but these prompts make only '
            f'{len(batches)} batches: the directory was generated from other prompts or '
            'another batch size; use a new directory'
        )
    for k in sorted(done):
        stored = shards.read_shard(shards.shard_path(directory, k))
        same = len(stored) == len(batches[k]) and all(
            len(e.tokens) >= len(ids)
            and np.array_equal(e.tokens[: len(ids)], ids)
            and not e.loss_mask[: len(ids)].any()
            for e, (_, ids) in zip(stored, batches[k], strict=False)
        )
        if not same:
            raise ValueError(
                f'{shards.shard_path(directory, k)} does not hold the prompts of batch {k}: the '
                'directory was generated from other prompts, another order or another batch '
                'size; use a new directory'
            )


def self_instruct_prompts(
    model,
    num_prompts: int,
    directory: str,
    *,
    batch_size: int = 64,
    max_tokens: int = 64,
    temperature: float = 1.0,
    min_p: float = 0.02,
    seed: int = 0,
    deadline: float | None = None,
    progress: bool = True,
) -> list[Prompt]:
    """User prompts written by the target itself (Magpie: Xu et al., 2024).

    The target is given its chat template up to the start of a user turn and samples the
    user's message; an instruction-tuned model writes the kind of requests it was tuned on,
    so its answers to them cover chat text (advice, writing, explanations, code) that no
    local training split has. Only messages that end with a stop token within `max_tokens`
    are kept. Batch k uses seed + k and is stored atomically as `<directory>/prompts_k.json`,
    so a rerun continues where a crashed one stopped.

    Returns:
      The prompts of every finished batch (at most ceil(num_prompts / batch_size) batches).
    """
    tok = model.tokenizer
    marker = '\x00'
    rendered = tok.apply_chat_template(
        [{'role': 'user', 'content': marker}], add_generation_prompt=False
    )
    prefix = tok.encode(rendered.split(marker)[0])
    settings = decoding.DecodeSettings(
        max_new_tokens=max_tokens,
        stop_tokens=tok.stop_ids,
        max_prompt_len=len(prefix),
        prompt_bucket=len(prefix),
        pad_id=tok.pad_id or 0,
    )
    engine = decoding.Engine(
        model.cfg, settings, sampler=Sampler(temperature=temperature, min_p=min_p)
    )
    os.makedirs(directory, exist_ok=True)
    out = []
    num_batches = -(-num_prompts // batch_size)
    for k in tqdm(range(num_batches), desc='self-instruct', disable=not progress):
        path = os.path.join(directory, f'prompts_{k:05d}.json')
        if not os.path.exists(path):
            if deadline is not None and time.time() > deadline:
                break
            result = decoding.generate(
                engine, decoding.Params(model.params), [prefix] * batch_size, seed=seed + k
            )
            texts = [
                tok.decode(ids[:-1]).strip()
                for ids in result.tokens
                if len(ids) > 4 and ids[-1] in tok.stop_ids
            ]
            with open(path + '.tmp', 'w') as f:
                json.dump(texts, f)
            os.replace(path + '.tmp', path)
        with open(path) as f:
            out.extend(
                Prompt(SELF_INSTRUCT, ({'role': 'user', 'content': t},)) for t in json.load(f)
            )
    return out
