"""The analytic roofline of a decoding round, per chip, for any chip of `chips.CHIPS`
(GPUs included, where nothing compiles here); beside the compiled program's own count
(`aot.round_cost`, TPU only).

A call of T new tokens a row through a model on one chip:

- reads every weight the chip holds once (an untied input embedding is read by rows
  only, and an EAGLE-3 head's copy of the target's embedding too: not counted) and every
  KV-cache slot it holds once (static shapes: attention reads all S slots whatever is
  filled);
- computes 2 FLOPs a multiply-add: 2 x rows x T x (matmul parameters on the chip) for
  the projections, MLP and LM head, and 4 x rows x T x (query heads on the chip) x S x H
  a layer for attention's scores and weighted sum.

A round (`memory.Plan.width`, `Plan.draft_calls`): AR is the target over one token; a
chain round the target over A + 1 tokens and the draft's calls (a draft LM: one of 2
tokens, then A - 1 of one; an EAGLE-3 head: its window, then A - 1 steps; n-grams and
prompt lookup: none); a tree round the target over the M nodes and the head's window
over the accepted path and its calls on each drafted level's frontier. An EAGLE-3 head's
window runs its layer over the window's tokens and keeps no logits; the first draft's law
is its LM head at one token (`Eagle3Drafter.root_logits`): two calls (`head_window`).

`round_calls` lists the calls one by one (the calibrated estimate times each:
spec_jax/costs/calibration.py) with the bytes each all-reduces under tensor parallelism.

Not counted: activations' traffic (at decode widths small beside the weights), sampling
and the laws (vocabulary-wide, rows x T x V), collectives (counted apart: `Call.all_reduce`),
launches and the host; compute
and memory traffic overlap perfectly at the chip's published peaks (`chips.Chip.seconds`).
So it is the floor a well-fused program approaches: XLA's `cost_analysis()` of the
compiled round counts each fusion's operands (a weight read by two fusions twice) and
sits several times above it (docs/performance.md).
"""

from __future__ import annotations

import dataclasses

from spec_jax import sharding
from spec_jax.costs import memory
from spec_jax.costs.chips import Chip
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig


@dataclasses.dataclass(frozen=True)
class Cost:
    """FLOPs and bytes read on one chip."""

    flops: float = 0.0
    bytes_accessed: float = 0.0

    def __add__(self, other: Cost) -> Cost:
        return Cost(self.flops + other.flops, self.bytes_accessed + other.bytes_accessed)

    def on(self, chip: Chip) -> dict:
        """The roofline on `chip`: {flops, bytes_accessed, seconds, bound}."""
        seconds = chip.seconds(self.flops, self.bytes_accessed)
        return dict(flops=self.flops, bytes_accessed=self.bytes_accessed, seconds=seconds,
                    bound=chip.bound(self.flops, self.bytes_accessed))  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Call:
    """One model call of a round on one chip: what it is ('target', 'draft', 'head'), its
    tokens a row (T), rows (B per chip), cost, the bytes it all-reduces over the model
    axis (`all_reduce_bytes`) and that axis' size."""

    what: str
    tokens: int
    rows: int
    cost: Cost
    all_reduce: float = 0.0
    model: int = 1


def round_cost(plan: memory.Plan) -> Cost:
    """One round of `plan` on one chip (module docstring)."""
    return sum((call.cost for call in round_calls(plan)), Cost())


def round_calls(plan: memory.Plan) -> list[Call]:
    """The model calls of one round of `plan` on one chip, in order (module docstring)."""
    data, model = plan.mesh
    rows = -(-plan.batch // data)
    target = memory.held(plan.target, model)
    item = memory.dtype_bytes(target.dtype)  # Drafts are held in the compute dtype.
    run = dict(model=model, rows=rows, slots=plan.slots, item=item)
    calls = _calls('target', target, memory.shapes(target), sharding.RULES, (plan.width,),
                   target.num_layers, 0, **run)  # fmt: skip
    split = sharding.draft_rules(plan.draft_sharding)
    if plan.draft is not None:
        d = plan.draft
        calls += _calls('draft', d, memory.shapes(d), split, plan.draft_calls, d.num_layers,
                        item, **run)  # fmt: skip
    if plan.head is not None and plan.draft_calls:
        window, *steps = plan.draft_calls
        calls += head_window(plan.head, split, window, **run)
        calls += _calls('head', plan.head, memory.head_shapes(plan.head), split, tuple(steps),
                        1, item, **run)  # fmt: skip
    return calls


def head_window(head: e3.Eagle3Config, rules: sharding.ShardingRules, tokens: int,
                logits: int = 1, **run) -> list[Call]:  # fmt: skip
    """An EAGLE-3 head's window over `tokens` a row: its layer over them (no logits), then
    its LM head at `logits` tokens (0: none, as when it follows an AR step). `run`: model,
    rows, slots, item."""
    shapes = memory.head_shapes(head)
    body = {k: v for k, v in shapes.items() if k != 'lm_head_ud'}
    calls = _calls('head', head, body, rules, (tokens,), 1, run['item'], **run)
    if logits:
        lm_head = {'lm_head_ud': shapes['lm_head_ud']}
        calls += _calls('head', head, lm_head, rules, (logits,), 0, run['item'], **run)
    return calls


def all_reduce_bytes(cfg, rules: sharding.ShardingRules, model: int, rows: int, tokens: int,
                     layers: int, item: int) -> float:  # fmt: skip
    """Bytes a call all-reduces over a model axis of `model` under tensor parallelism: the
    attention output and the MLP output of every layer, [rows, T, D] each (0 when nothing
    is split: one chip, or `rules` holding the model whole)."""
    split = memory.per_device(cfg.num_heads, model, rules, 'n') < cfg.num_heads
    if model <= 1 or not split:
        return 0.0
    return 2.0 * layers * rows * tokens * cfg.width * item


def _calls(what: str, cfg, shapes, rules, calls, layers, weight_item, *, model, rows, slots,
           item) -> list[Call]:  # fmt: skip
    """`calls_cost` call by call, as `Call`s."""
    run = dict(model=model, rows=rows, slots=slots, item=item)
    return [Call(what, t, rows, calls_cost(cfg, shapes, rules, (t,), layers, weight_item, **run),
                 all_reduce_bytes(cfg, rules, model, rows, t, layers, item), model)
            for t in calls]  # fmt: skip


def calls_cost(
    cfg: ModelConfig | e3.Eagle3Config, shapes, rules: sharding.ShardingRules,
    calls: tuple[int, ...], layers: int, weight_item: int, *, model: int, rows: int,
    slots: int, item: int,
) -> Cost:  # fmt: skip
    """Calls of `calls[i]` tokens a row through a model of `layers` layers, config `cfg`
    and parameter `shapes`, split by `rules` over a model axis of `model`; its weights
    `weight_item` bytes an element (0: their own dtypes), activations and cache `item`."""
    if not calls:
        return Cost()
    if 'lm_head_vd' in shapes:  # Untied: the input embedding is read by rows.
        shapes = {k: v for k, v in shapes.items() if k != 'embed_vd'}
    weights = memory.split_bytes(shapes, model, rules, [], weight_item)
    params = memory.split_bytes(shapes, model, rules, [], 1)
    heads = memory.per_device(cfg.num_heads, model, rules, 'n')
    kv_heads = memory.per_device(cfg.num_kv_heads, model, rules, 'k')
    cache = 2 * layers * rows * kv_heads * slots * cfg.head_dim * item
    total = Cost()
    for tokens in calls:
        flops = 2 * rows * tokens * params
        flops += 4 * rows * tokens * heads * slots * cfg.head_dim * layers
        total += Cost(flops, weights + cache)
    return total
