"""A dry run of memory: what one device holds for a decoding plan, before anything loads or
compiles (launch/aot.py --dry_run; checked against XLA's own numbers in tests/jobs).

Per device under a (data, model) mesh, by the sharding rules (spec_jax/sharding.py):

- weights: every parameter of `checkpoints.param_shapes` in its own dtype, split over the
  mesh axis of its letters (N, K, F, V over 'model'); a letter the axis does not divide is
  held whole. The target is sized as `checkpoints.load` holds it (`held`): a model axis
  larger than K (a multiple of it) holds each KV head model / K times, split one a device
  (Qwen2.5-72B's 8 KV heads at model 16: K' = 16). `quant` 'int8' sizes the model stack's int8
  weights (`ModelConfig.weights`, spec_jax/models/quant.py: projections and an untied LM
  head in one byte a parameter plus a float32 scale per output channel; the embedding,
  norms and biases in the compute dtype).
- KV cache: keys and values of every layer, [rows, heads, slots, head dim], rows = the
  batch over 'data', heads K / model per device, or one where the model axis is a multiple
  of K larger than it (each head held model / K times: `sharding.kv_repeat`).
- drafts (a draft LM, an EAGLE-3 head with its copy of the target's embedding) and their
  caches, their rows over 'data', by the plan's `draft_sharding`
  (`sharding.DRAFT_SHARDINGS`): 'batch' holds them whole on every device, 'heads' splits
  their attention (N and K) over 'model' as the target's.
- activations: the largest call's transients, one layer at a time (XLA reuses a layer's
  buffers in the next): prefill of the longest prompt bucket (the target's, then the
  draft's over the same prompt), or a round's verification, whichever is largest: the
  residual stream and norms (4 x [rows, T, D]), q/k/v, attention scores and probabilities
  in fp32 (3 x [rows, N, T', S]: scores, their concatenation with the diagonal block, the
  softmax; T' the tokens of one of attention's query blocks, at most
  `attention.QUERY_BLOCK`), the MLP (3 x [rows, T, F]), the mask [rows, T', S], and the
  processed laws of a round (4 x [rows, T, V] fp32: logits, p, its transform, q); EAGLE-3
  adds the taps of the prefill ([rows, P, 3, D]). A draft's prefill with its heads whole
  is what a replicated EAGLE-3 head costs: 6 GiB a chip for Llama-3.1-8B's over 2,048
  tokens at batch 8 (24 GiB before attention ran in query blocks).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import numpy as np

from spec_jax import sharding
from spec_jax.checkpoints.convert import param_shapes
from spec_jax.costs.chips import GIB, Chip
from spec_jax.models import attention
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig

QUANTS = ('', 'int8')
# Parameter shapes of a config, once (an 80-layer init traced abstractly takes seconds).
shapes = functools.lru_cache(maxsize=16)(param_shapes)


@functools.lru_cache(maxsize=16)
def head_shapes(head: e3.Eagle3Config):
    """An EAGLE-3 head's parameters in shapes (its own dtype), once a config."""
    return jax.eval_shape(lambda: e3.init_params(head, jax.random.PRNGKey(0)))


@dataclasses.dataclass(frozen=True)
class Plan:
    """What a decoding run holds, in shapes.

    Attributes:
      target: the target's ModelConfig (its param_dtype: the stored weights' dtype).
      batch: rows per batch (padded to a multiple of the data axis by `estimate`).
      prompt_len: P, the longest prompt bucket.
      slots: S, cache slots per row (`Engine.slots`).
      width: T of a round's verification: 1 (AR), A + 1 (chain), M (tree nodes).
      mesh: (data, model) sizes.
      quant: '' (the target's own `weights`) or 'int8' (see the module).
      draft: a draft LM's ModelConfig, or None.
      head: an EAGLE-3 head's Eagle3Config, or None.
      draft_sharding: how the draft (or head) splits (`sharding.DRAFT_SHARDINGS`).
      draft_calls: tokens a row of each call of the draft (or head) in a round (the
        roofline's, spec_jax/costs/roofline.py; none for n-grams and prompt lookup).
    """

    target: ModelConfig
    batch: int
    prompt_len: int
    slots: int
    width: int = 1
    mesh: tuple[int, int] = (1, 1)
    quant: str = ''
    draft: ModelConfig | None = None
    head: e3.Eagle3Config | None = None
    draft_sharding: str = 'batch'
    draft_calls: tuple[int, ...] = ()

    def __post_init__(self):
        if self.quant not in QUANTS:
            raise ValueError(f'quant={self.quant!r} is not one of {QUANTS}')
        sharding.draft_rules(self.draft_sharding)  # A ValueError naming the valid ones.
        if self.quant:
            object.__setattr__(self, 'target', self.target.replace(weights=self.quant))


@dataclasses.dataclass(frozen=True)
class Estimate:
    """Bytes one device holds (see the module for what each part counts)."""

    plan: Plan
    weights: int
    draft_weights: int
    kv_cache: int
    draft_cache: int
    activations: int
    notes: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return (
            self.weights + self.draft_weights + self.kv_cache + self.draft_cache + self.activations
        )

    def as_dict(self) -> dict:
        parts = ('weights', 'draft_weights', 'kv_cache', 'draft_cache', 'activations', 'total')
        return dict({k: int(getattr(self, k)) for k in parts}, notes=list(self.notes))

    def table(self, chip: Chip | None = None) -> str:
        parts = ('weights', 'draft_weights', 'kv_cache', 'draft_cache', 'activations', 'total')
        rows = [(k.replace('_', ' '), getattr(self, k)) for k in parts]
        lines = [f'  {name:14s} {n / GIB:8.2f} GiB' for name, n in rows]
        if chip is not None:
            lines.append(f'  {"HBM " + chip.name:14s} {chip.hbm_bytes / GIB:8.2f} GiB '
                         f'({self.total / chip.hbm_bytes:.0%} used)')  # fmt: skip
        return '\n'.join(lines + [f'  note: {n}' for n in self.notes])


def estimate(plan: Plan) -> Estimate:
    """Per-device bytes of `plan` (module docstring)."""
    data, model = plan.mesh
    t = plan.target
    notes = []
    rows = -(-plan.batch // data)  # The batch is padded to a multiple of the data axis.
    item = dtype_bytes(t.dtype)
    k, t = t.num_kv_heads, held(t, model)
    if t.num_kv_heads > k:
        notes.append(f'{k} KV heads over model {model}: each held {t.num_kv_heads // k} '
                     'times, one a device (sharding.kv_repeat)')  # fmt: skip
    weights = split_bytes(shapes(t), model, sharding.RULES, notes)
    heads = _kv_heads(t.num_kv_heads, model, sharding.RULES, notes)
    kv = 2 * t.num_layers * rows * heads * plan.slots * t.head_dim * item
    calls = [_call(plan, t, rows, heads, plan.prompt_len, prefill=True),
             _call(plan, t, rows, heads, plan.width, prefill=False)]  # fmt: skip
    draft_weights = draft_cache = 0
    split = sharding.draft_rules(plan.draft_sharding)
    draft = plan.draft or plan.head
    if draft is not None:
        draft_heads = _kv_heads(draft.num_kv_heads, model, split, notes, 'the draft')
        # Its prefill over the same prompt (the head reads the target's taps: no laws).
        calls.append(_call(plan, draft, rows, draft_heads, plan.prompt_len, True, split))
    if plan.draft is not None:
        d = plan.draft
        draft_weights = split_bytes(shapes(d), model, split, notes, item)
        draft_cache = 2 * d.num_layers * rows * draft_heads * plan.slots * d.head_dim * item
    if plan.head is not None:
        h = plan.head
        # Head weights in the compute dtype, its copy of the target's embedding (whole
        # beside the target's own split one), the draft-id map.
        draft_weights = split_bytes(head_shapes(h), model, split, notes, item)
        draft_weights += t.vocab_size * t.width * item + 4 * (h.draft_vocab_size + h.vocab_size)
        draft_cache = 2 * rows * draft_heads * plan.slots * h.head_dim * item
    return Estimate(plan, weights, draft_weights, kv, draft_cache, max(calls), tuple(notes))


def held(cfg: ModelConfig, model: int) -> ModelConfig:
    """The target as `checkpoints.load` holds it on a model axis of `model`: where the axis
    is a multiple of K larger than it, each KV head held model / K times (K' = model:
    `sharding.kv_repeat`, `llama.repeat_kv_heads`), so that attention splits one head a
    device. ValueError when neither divides the other."""
    times = sharding.kv_repeat(cfg.num_kv_heads, {'model': model})
    return cfg if times == 1 else cfg.replace(num_kv_heads=cfg.num_kv_heads * times)


def _kv_heads(k: int, model: int, rules: sharding.ShardingRules, notes: list,
              what: str = 'the target') -> int:  # fmt: skip
    """KV heads a device holds: K / model where `rules` split K over 'model' and it
    divides, else K (noted)."""
    kept = per_device(k, model, rules, 'k')
    if kept == k and model > 1 and rules.axis('k') == 'model':
        notes.append(f'{k} KV heads of {what} do not split over model {model}: every head '
                     'on each device')  # fmt: skip
    return kept


def per_device(n: int, model: int, rules: sharding.ShardingRules, letter: str) -> int:
    """Of an axis of size n and letter `letter` ('n', 'k', 'f', ...), what one device holds:
    n / model where `rules` split the letter over 'model' and it divides n, else n."""
    ways = model if rules.axis(letter) == 'model' else 1
    return n // ways if n % ways == 0 else n


class OverHBM(ValueError):
    """A plan or compiled program over the chip's HBM: the message is one line with the
    numbers (launch/aot.py prints it alone); `parts` the table behind it, which the AOT
    job printed before refusing."""

    def __init__(self, message: str, parts: str = ''):
        super().__init__(message)
        self.parts = parts


def check_fits(total: int, chip: Chip, what: str, parts: str = '') -> None:
    """`OverHBM` when `total` bytes per device exceed the chip's HBM, with the numbers."""
    if total > chip.hbm_bytes:
        raise OverHBM(
            f'{what} needs {total / GIB:.2f} GiB per {chip.name} chip, over its '
            f'{chip.hbm_bytes / GIB:.2f} GiB HBM: use a larger model axis (weights and KV '
            'heads split further), more data shards for the batch, int8 weights, a smaller '
            'batch or fewer cache slots',
            parts,
        )


def split_bytes(shapes, model: int, rules: sharding.ShardingRules, notes: list,
                itemsize: int = 0) -> int:  # fmt: skip
    """Per-device bytes of a parameter tree in shapes split by `rules` over a model axis of
    `model` (each in its own dtype, or `itemsize` bytes an element)."""
    total = 0
    flat = jax.tree_util.tree_flatten_with_path(shapes)[0]
    split_notes = set()
    for path, x in flat:
        name = sharding._key(path[-1])
        letters = sharding.letters_of(name, len(x.shape))
        ways_of = []
        for letter, size in zip(letters or '.' * len(x.shape), x.shape):
            ways = model if rules.axis(letter) == 'model' else 1
            if size % ways or (letter == 'k' and ways > size):
                split_notes.add(f'{letter.upper()} {size} held whole (model {model})')
                ways = 1
            ways_of.append(ways)
        item = itemsize or np.dtype(x.dtype).itemsize
        total += math.prod(s // w for s, w in zip(x.shape, ways_of)) * item
    notes.extend(sorted(split_notes))
    return total


def _call(
    plan: Plan, cfg, rows: int, kv_heads: int, width: int, prefill: bool,
    rules: sharding.ShardingRules = sharding.RULES,
) -> int:  # fmt: skip
    """Transient bytes of one layer of a call of `width` tokens of the target, or of a
    draft (`cfg` a ModelConfig or an Eagle3Config, split by `rules`; module docstring)."""
    t, (_, model) = plan.target, plan.mesh
    item = dtype_bytes(t.dtype)

    heads = per_device(cfg.num_heads, model, rules, 'n')
    qkv = rows * width * (heads + 2 * kv_heads) * cfg.head_dim * item
    block = attention.block_tokens(width)  # A long prompt attends in blocks of tokens.
    scores = 3 * rows * heads * block * plan.slots * 4
    mlp = 3 * rows * width * per_device(cfg.mlp_width, model, rules, 'f') * item
    stream = 4 * rows * width * cfg.width * item
    mask = rows * block * plan.slots
    if cfg is not t:  # A draft's prefill: its layer alone (the head's taps are the target's).
        return qkv + scores + mlp + stream + mask
    laws = (1 if prefill else 4) * rows * (1 if prefill else width) * t.vocab_size * 4
    taps = 3 * rows * plan.prompt_len * t.width * item if (plan.head and prefill) else 0
    return qkv + scores + mlp + stream + mask + laws + taps


def dtype_bytes(dtype: str) -> int:
    """Bytes an element of `dtype` (a name: 'bfloat16', 'float32')."""
    return np.dtype(jax.numpy.dtype(dtype)).itemsize
