"""Teacher outputs stored once per token beside the shards (sidecars): the target's top-k
next-token law (soft labels) and its EAGLE-3 feature taps, so training reuses them every
epoch without a target forward per step."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

import numpy as np
from tqdm import tqdm

from spec_jax.train import batches, core, shards


def write_sidecar(
    directory: str,
    name: str,
    compute,
    *,
    batch_size: int = 8,
    bucket: int = 64,
    progress: bool = True,
) -> dict:
    """Runs `compute(tokens_bt, valid_bt) -> {key: [B, T, ...] array}` over every finished
    shard and stores the per-position results as sidecar `name` (`read_examples` attaches
    them as `Example.labels`).

    One teacher forward per token, once, instead of one per training step. Each shard's
    sidecar is written atomically, so a rerun skips finished shards. Every position is
    stored, in the shard's token order. The teacher sees each whole example, so a row that
    `batches.make_batch` left-truncates keeps labels computed with its full context.

    Returns:
      Counts: shards written now, shards total, tokens, seconds.
    """
    shard_ids = sorted(shards.finished_shards(directory))
    todo = [k for k in shard_ids if not os.path.exists(shards.sidecar_path(directory, name, k))]
    written, tokens, start = 0, 0, time.time()
    for k in tqdm(todo, desc=name, unit='shard', disable=not progress):
        examples = shards.read_shard(shards.shard_path(directory, k))
        rows_out: list[dict] = [{} for _ in examples]
        order = np.argsort([len(e.tokens) for e in examples], kind='stable')
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            # Whole examples, padded to a multiple of `bucket`: few compiled shapes.
            padded = -(-max(len(examples[i].tokens) for i in rows) // bucket) * bucket
            b = batches.make_batch([examples[i] for i in rows], padded, bucket)
            arrays = {key: np.asarray(a) for key, a in compute(b.tokens_bt, b.valid_bt).items()}
            for r, i in enumerate(rows):
                n = len(examples[i].tokens)
                rows_out[i] = {key: a[r, :n] for key, a in arrays.items()}
            tokens += int(b.valid_bt.sum())
        tmp = shards.sidecar_path(directory, name, k) + '.tmp.npz'
        np.savez(tmp, **{key: np.concatenate([r[key] for r in rows_out]) for key in rows_out[0]})
        os.replace(tmp, shards.sidecar_path(directory, name, k))
        written += 1
    return dict(
        shards_written=written,
        shards_total=len(shard_ids),
        tokens=tokens,
        seconds=time.time() - start,
    )


def teacher_topk(model, directory: str, top_k: int, **kw) -> dict:
    """Stores the target's top-`top_k` next-token law of every position as sidecar
    `top<k>`: labels 'topk_ids' [T, k] int32 and 'topk_logprobs' [T, k] float16, the soft
    labels of `distill.make_topk_step` and of cached EAGLE-3 training."""

    def compute(tokens_bt, valid_bt):
        lp, ids = core.teacher_topk_logprobs(model.cfg, model.params, tokens_bt, valid_bt, top_k)
        return dict(topk_ids=np.asarray(ids, np.int32), topk_logprobs=np.float16(lp))

    return write_sidecar(directory, shards.topk_name(top_k), compute, **kw)


def teacher_taps(model, directory: str, tap_layers: Sequence[int], **kw) -> dict:
    """Stores the target's hidden-state taps of every position as sidecar `taps<i-j-k>`:
    label 'taps' [T, E, D] float16 (about 3.5 KB a token for the embedded default), the
    features of cached EAGLE-3 training (no target forward per step).

    Raises:
      ValueError: a tap leaves float16's range (|x| > 65,000).
    """
    tap_layers = tuple(tap_layers)

    def compute(tokens_bt, valid_bt):
        taps = np.asarray(
            core.teacher_taps(model.cfg, model.params, tokens_bt, valid_bt, tap_layers)
        )
        if np.abs(taps).max() > 65000:
            raise ValueError(
                f'a tap of layers {tap_layers} reaches {np.abs(taps).max():.3g}, past float16 '
                'range: train this target without stored taps (train.teacher_topk=0)'
            )
        return dict(taps=taps.astype(np.float16))

    return write_sidecar(directory, shards.taps_name(tap_layers), compute, **kw)
