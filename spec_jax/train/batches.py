"""Training batches: padded [B, T] rows from stored examples, in a resumable order."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from spec_jax.train import shards

# Pad values of batched labels (default 0): pads get no weight in a soft-label loss.
LABEL_PAD = {'topk_logprobs': -1e9}


@dataclasses.dataclass
class TrainBatch:
    """A padded training batch.

    Attributes:
      tokens_bt: [B, T] int32 (pad 0).
      loss_mask_bt: [B, T] bool, True where the NEXT token (t+1) is a response token, i.e.
        the positions whose prediction is trained.
      valid_bt: [B, T] bool, real (non-pad) tokens.
      labels: the examples' labels padded like the tokens: [B, T, ...] each (`LABEL_PAD`).
    """

    tokens_bt: np.ndarray
    loss_mask_bt: np.ndarray
    valid_bt: np.ndarray
    labels: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def make_batch(examples: Sequence[shards.Example], seq_len: int, bucket: int = 64) -> TrainBatch:
    """Packs examples into a [B, T] batch, T = the longest (capped at seq_len) rounded up to
    a multiple of `bucket` (so only seq_len / bucket shapes are ever compiled).

    An example longer than seq_len keeps its LAST seq_len tokens (the response survives).
    The loss mask is shifted to prediction positions: position t predicts token t+1, so it
    is trained when token t+1 is a response token. Labels come along when every example
    has them (padded with `LABEL_PAD`).
    """
    b = len(examples)
    longest = max(min(len(e.tokens), seq_len) for e in examples)
    t = min(-(-longest // bucket) * bucket, max(seq_len, 1))
    tokens = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), bool)
    valid = np.zeros((b, t), bool)
    keys = set.intersection(*(set(e.labels) for e in examples))
    labels = {}
    for key in sorted(keys):
        first = examples[0].labels[key]
        dtype = np.float32 if key in LABEL_PAD else first.dtype
        labels[key] = np.full((b, t, *first.shape[1:]), LABEL_PAD.get(key, 0), dtype)
    for i, e in enumerate(examples):
        toks, lm = e.tokens[-seq_len:], e.loss_mask[-seq_len:]
        n = len(toks)
        tokens[i, :n] = toks
        valid[i, :n] = True
        mask[i, : n - 1] = lm[1:n]
        for key, a in labels.items():
            a[i, :n] = e.labels[key][-seq_len:]
    return TrainBatch(tokens, mask, valid, labels)


def epoch_batches(
    examples: Sequence[shards.Example],
    batch_size: int,
    seed: int,
    epoch: int,
    sort_window: int = 32,
) -> list[np.ndarray]:
    """The batches (index arrays) of one epoch: a seeded permutation, sorted by length in
    windows of `sort_window` batches (less padding), batch order shuffled again."""
    n = len(examples)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    if n < batch_size:
        order = np.resize(order, batch_size)
    lengths = np.array([len(examples[i].tokens) for i in order])
    w = batch_size * sort_window
    chunks = []
    for s in range(0, len(order), w):
        idx = order[s : s + w][np.argsort(lengths[s : s + w], kind='stable')]
        chunks.extend(idx[j : j + batch_size] for j in range(0, len(idx), batch_size))
    chunks = [c for c in chunks if len(c) == batch_size]
    return [chunks[i] for i in rng.permutation(len(chunks))]


def batch_stream(
    examples: Sequence[shards.Example],
    batch_size: int,
    seq_len: int,
    seed: int,
    start_step: int = 0,
    bucket: int = 64,
) -> Iterator[TrainBatch]:
    """An endless, deterministic stream of batches.

    Batch `s` depends only on (examples, seed, s), so a resumed run at `start_step` sees
    exactly the batches an uninterrupted run would.
    """
    step = start_step
    cache: dict[int, list[np.ndarray]] = {}
    per_epoch = len(epoch_batches(examples, batch_size, seed, 0))
    while True:
        epoch, j = divmod(step, per_epoch)
        if epoch not in cache:
            cache.clear()
            cache[epoch] = epoch_batches(examples, batch_size, seed, epoch)
        yield make_batch([examples[i] for i in cache[epoch][j]], seq_len, bucket)
        step += 1


def token_counts(examples: Sequence[shards.Example], vocab_size: int) -> np.ndarray:
    """Frequency of each token id over the response (loss-masked) tokens [V]."""
    counts = np.zeros(vocab_size, np.int64)
    for e in examples:
        np.add.at(counts, e.tokens[e.loss_mask], 1)
    return counts
