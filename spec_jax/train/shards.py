"""Self-distillation examples on disk: numbered shards and their teacher sidecars.

Every example is stored as

    tokens = chat-template prompt ids + response ids,   loss_mask = 1 on the response only

in numbered shards `<dir>/shard_00000.npz`, each written atomically (tmp file + rename);
shard k always holds batch k of a fixed prompt order (`generation.generate_dataset`), so a
crashed run continues at the first missing shard. Teacher outputs that training reuses every
epoch (top-k soft labels, EAGLE-3 feature taps; `teacher.py`) are stored once per token in
sidecars `<dir>/<name>_00000.npz` beside the shards, and `read_examples` attaches them.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
from collections.abc import Sequence

import numpy as np


@dataclasses.dataclass
class Example:
    """One stored example.

    Attributes:
      tokens: [T] int32.
      loss_mask: [T] bool, True on response tokens.
      labels: per-position teacher outputs read from sidecars (`write_sidecar`), axis 0
        aligned with `tokens`: 'topk_ids' [T, k] int32 and 'topk_logprobs' [T, k] (row t is
        the target's law of token t+1 given tokens[:t+1]; `teacher_topk`), 'taps' [T, E, D]
        (the target's EAGLE-3 feature taps at position t; `teacher_taps`).
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    labels: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def shard_path(directory: str, k: int) -> str:
    return os.path.join(directory, f'shard_{k:05d}.npz')


def write_shard(directory: str, k: int, examples: Sequence[Example], meta: dict) -> None:
    """Writes shard k atomically: a crash never leaves a half-written shard."""
    os.makedirs(directory, exist_ok=True)
    lengths = np.array([len(e.tokens) for e in examples], np.int32)
    tmp = shard_path(directory, k) + '.tmp.npz'
    np.savez(
        tmp,
        tokens=np.concatenate([e.tokens for e in examples]).astype(np.int32),
        loss_mask=np.concatenate([e.loss_mask for e in examples]).astype(bool),
        lengths=lengths,
        meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
    )
    os.replace(tmp, shard_path(directory, k))


def read_shard(path: str) -> list[Example]:
    with np.load(path) as z:
        tokens, mask, lengths = z['tokens'], z['loss_mask'], z['lengths']
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [
        Example(tokens[s : s + n], mask[s : s + n]) for s, n in zip(starts, lengths, strict=True)
    ]


def read_examples(directory: str, sidecars: Sequence[str] = ()) -> list[Example]:
    """Every example of every finished shard of `directory`, in shard order, with the
    labels of the named sidecars attached (e.g. `topk_name(16)`, `taps_name(taps)`; each
    must have been written for every shard)."""
    out = []
    for k in sorted(finished_shards(directory)):
        examples = read_shard(shard_path(directory, k))
        for name in sidecars:
            path = sidecar_path(directory, name, k)
            if not os.path.exists(path):
                raise ValueError(
                    f'no {name!r} labels {path}: run teacher_topk / teacher_taps on '
                    f'{directory!r} first'
                )
            with np.load(path) as z:
                arrays = {key: z[key] for key in z.files}
            start = 0
            for e in examples:
                end = start + len(e.tokens)
                e.labels.update({key: a[start:end] for key, a in arrays.items()})
                start = end
        out.extend(examples)
    return out


def read_sources(directory: str) -> list[str]:
    """The source of each example of `read_examples(directory)`, from the shards' meta
    ('?' where a shard does not record them)."""
    out = []
    for k in sorted(finished_shards(directory)):
        with np.load(shard_path(directory, k)) as z:
            meta = json.loads(bytes(z['meta']).decode())
            out += meta.get('sources', ['?'] * len(z['lengths']))
    return out


def finished_shards(directory: str) -> set[int]:
    paths = glob.glob(os.path.join(directory, 'shard_[0-9][0-9][0-9][0-9][0-9].npz'))
    return {int(os.path.basename(p)[6:11]) for p in paths}


def sidecar_path(directory: str, name: str, k: int) -> str:
    """Sidecar `name` of shard k: `<dir>/<name>_<k>.npz` next to `shard_<k>.npz`."""
    return os.path.join(directory, f'{name}_{k:05d}.npz')


def topk_name(top_k: int) -> str:
    return f'top{top_k}'


def taps_name(tap_layers: Sequence[int]) -> str:
    return 'taps' + '-'.join(str(i) for i in tap_layers)
