"""The host side of the engine: `generate(engine, params, prompts) -> Result`, and `chat`.

Every caller (the generate job, training-data generation, evaluation, benches, notebooks)
goes through `generate`: prompts are packed into bucketed arrays, the engine is checked
against the target before anything compiles, one jitted loop runs on device, and the rows
come back trimmed at their first stop token or limit.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from spec_jax import sharding
from spec_jax.decoding import batching, code_room
from spec_jax.decoding.engine import Engine, prefill_call, rounds_call
from spec_jax.decoding.state import row_limits
from spec_jax.decoding.stats import summarize


class Params(NamedTuple):
    """The weights a run reads: the target's, and the drafter's (None for AR and n-gram;
    `Eagle3Drafter.params_for(head, target)` for an EAGLE-3 head)."""

    target: dict
    draft: Any = None


@dataclasses.dataclass(frozen=True)
class Result:
    """Generated token ids per row (stop token included), statistics and timing.

    Attributes:
      tokens: one list of ids per prompt.
      stats: `stats.summarize` of the round counters (AR runs too: one round per token).
      seconds: wall time of the call (prefill included; compilation too, the first time
        a shape runs), on the clock `generate` was given.
      prefill_seconds: the part of `seconds` spent in the prefill call (the prompts' forward,
        the first token, the drafter's init), up to its results being ready.
    """

    tokens: list[list[int]]
    stats: dict
    seconds: float
    prefill_seconds: float = 0.0

    @property
    def num_tokens(self) -> int:
        return sum(len(t) for t in self.tokens)


def generate(
    engine: Engine,
    params: Params,
    prompts: Sequence[Sequence[int]],
    *,
    seed: int = 0,
    max_new_tokens: Sequence[int] | int | None = None,
    sample_ids: Sequence[int] | None = None,
    clock: Callable[[], float] = time.perf_counter,
) -> Result:
    """Generates a continuation of each token-id prompt with `engine`.

    Args:
      engine: what to decode with (target config, drafter, rule, sampler, buffers).
      params: the target's and the drafter's weights.
      prompts: B token-id lists (different lengths allowed).
      seed: the run's PRNG seed.
      max_new_tokens: per-row (or one) token limit, at most engine.decode.max_new_tokens.
      sample_ids: one id per prompt (default 0..B-1): prompt b's noise is a function of
        (seed, sample_ids[b]) only, so giving each prompt its index in the whole run makes
        a resumed or re-batched run produce the same tokens for it.
      clock: read three times: before the prefill call, once its state is ready, and once
        the rounds' results are on the host (`Result.seconds`, `Result.prefill_seconds`).

    Returns:
      A Result; each row ends at its first stop token or its limit.

    Raises:
      ValueError: bad prompts or limits, a drafter that does not fit the target, or a run
        longer than the models' context (before anything compiles).
    """
    mesh = sharding.mesh_of(params)  # Computation follows the weights' placement.
    rows = loop_rows(engine, prompts, max_new_tokens, sample_ids, sharding.data_size(mesh))
    num = len(prompts)
    code_room.ensure_room()
    with sharding.use_mesh(mesh):
        args = (*(sharding.place_rows(x, mesh) for x in rows), jax.random.PRNGKey(seed))
        start = clock()
        state = jax.block_until_ready(prefill_call(engine, params.target, params.draft, *args))
        prefilled = clock()
        *out, _ = rounds_call(engine, params.target, params.draft, state)
    tokens_bo, num_b, stats = sharding.to_host(tuple(out))
    ended = clock()
    tokens_bo, num_b, stats = jax.tree.map(lambda x: x[:num], (tokens_bo, num_b, stats))
    return Result(batching.trim_rows(tokens_bo, num_b), summarize(stats), ended - start,
                  prefilled - start)  # fmt: skip


def loop_rows(
    engine: Engine,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: Sequence[int] | int | None = None,
    sample_ids: Sequence[int] | None = None,
    multiple: int = 1,
) -> tuple[np.ndarray, ...]:
    """The decode loop's host inputs for `prompts` (see `generate`): prompt tokens [B, P],
    lengths [B], limits [B] and sample ids [B], checked against the engine (ValueError
    before anything compiles), with copies of row 0 that stop at once (limit 1) appended
    so that `multiple` (the mesh's data axis) divides B; the caller drops those rows."""
    dec = engine.decode
    batch = batching.pack_prompts(
        prompts,
        prompt_bucket=dec.prompt_bucket,
        max_prompt_len=dec.max_prompt_len,
        pad_id=dec.pad_id,
    )
    limit_b = row_limits(max_new_tokens, len(prompts), dec.max_new_tokens)
    if sample_ids is None:
        sample_ids = range(len(prompts))
    ids_b = np.asarray(sample_ids, np.int64)
    if ids_b.shape != (len(prompts),) or (ids_b < 0).any() or (ids_b >= 2**31).any():
        raise ValueError(
            f'sample_ids must be {len(prompts)} ids in [0, 2**31), one per prompt; got '
            f'{list(sample_ids)[:8]}'
        )
    engine.check(batch.bucket)
    rows = (batch.tokens, batch.lengths, limit_b, ids_b.astype(np.int32))
    pad = -len(prompts) % multiple
    if pad:
        rows = tuple(np.concatenate([x, np.repeat(x[:1], pad, 0)]) for x in rows)
        rows[2][len(prompts) :] = 1
    return rows


def encode(tokenizer, prompt: str, chat: bool = True, system_prompt: str | None = None):
    """Token ids of one prompt: raw text, or a user turn in the chat template."""
    if not chat:
        return tokenizer.encode(prompt)
    messages = [{'role': 'system', 'content': system_prompt}] if system_prompt else []
    return tokenizer.encode_chat(messages + [{'role': 'user', 'content': prompt}])


def chat(
    engine: Engine,
    params: Params,
    tokenizer,
    conversations: Sequence[Sequence[dict] | str],
    **kwargs,
) -> list[str]:
    """Text in, text out, for notebooks: each conversation (a list of {'role', 'content'}
    messages, or one user message as a string) is rendered with the chat template and
    answered; returns the answers without special tokens. `kwargs` go to `generate`.

        engine, params, tok = decoding.build(config)
        decoding.chat(engine, params, tok, ['What is the capital of France?'])
    """
    ids = [
        tokenizer.encode_chat([{'role': 'user', 'content': c}] if isinstance(c, str) else list(c))
        for c in conversations
    ]
    result = generate(engine, params, ids, **kwargs)
    return [tokenizer.decode(row, skip_special=True) for row in result.tokens]
