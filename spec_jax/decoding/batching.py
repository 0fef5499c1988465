"""Host-side batching: prompts -> padded, bucketed device arrays; device results -> rows.

Shapes that reach a jitted loop come from a few buckets only, so prompts of different
content or length within a bucket never retrace: the prompt axis is rounded up to a
multiple of `prompt_bucket`, and the cache holds that plus `max_new_tokens` plus the
room a verifier needs.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np


def round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


def prompt_bucket_of(length: int, prompt_bucket: int, max_prompt_len: int) -> int:
    """The prompt axis a batch whose longest prompt has `length` tokens is padded to."""
    return min(round_up(length, prompt_bucket), max_prompt_len)


@dataclasses.dataclass(frozen=True)
class PromptBatch:
    """Right-padded prompts.

    Attributes:
      tokens: [B, P] int32, row b holds its prompt in [0, lengths[b]) and pad after.
      lengths: [B] int32 prompt lengths (>= 1).
    """

    tokens: np.ndarray
    lengths: np.ndarray

    @property
    def bucket(self) -> int:
        return self.tokens.shape[1]


def pack_prompts(
    prompts: Sequence[Sequence[int]], *, prompt_bucket: int, max_prompt_len: int, pad_id: int = 0
) -> PromptBatch:
    """Pads token-id prompts into one [B, P] array: P is the longest prompt rounded up to a
    multiple of `prompt_bucket`, capped at `max_prompt_len`.

    Raises:
      ValueError: on an empty batch, an empty prompt, or a prompt longer than
        `max_prompt_len` (naming the row and both lengths).
    """
    if not prompts:
        raise ValueError('no prompts given: pass at least one prompt')
    lengths = np.array([len(p) for p in prompts], np.int32)
    for row, n in enumerate(lengths):
        if n == 0:
            raise ValueError(f'prompt {row} is empty: every prompt needs at least one token')
        if n > max_prompt_len:
            raise ValueError(
                f'prompt {row} has {n} tokens, longer than the configured maximum of '
                f'{max_prompt_len}; raise max_prompt_len or shorten the prompt'
            )
    bucket = prompt_bucket_of(int(lengths.max()), prompt_bucket, max_prompt_len)
    tokens = np.full((len(prompts), bucket), pad_id, np.int32)
    for row, p in enumerate(prompts):
        tokens[row, : len(p)] = p
    return PromptBatch(tokens, lengths)


def trim_rows(tokens_bo: np.ndarray, lengths_b: np.ndarray) -> list[list[int]]:
    """Device output [B, N] with per-row lengths -> one token list per row."""
    return [row[:n].tolist() for row, n in zip(tokens_bo, lengths_b)]
