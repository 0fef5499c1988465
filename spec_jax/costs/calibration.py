"""Calibrated chips, and the cost of a tier (AR, a chain, a tree) at batch B, T verified
tokens a row and a context of S cache slots on a chip: what the adaptive engine, the tree
sizer, the AOT job and the accelerator bench read.

The API (H47A's adaptive engine reads it):

    from spec_jax.costs import calibration as cal
    m = cal.for_chip('h200', target_cfg, head=head_cfg)  # or draft=; a Chip; 'cpu' too
    m.round_s(cal.Tier.ar(), batch=8, context=4096)       # seconds of one AR round
    m.round_s(cal.Tier.chain(5, 'eagle3'), 8, 4096)       # a chain of A 5 (T 6); 'lm', 'ngram'
    m.round_s(cal.Tier.tree(TreeShape(17, 6, 4)), 8, 4096)  # a dynamic tree (T 17)
    m.verify_s(8, 17, 4096); m.draft_s(tier, 8, 4096); m.engine_s('tree')  # its parts
    m.unknown   # what the chip's fit could not identify, and what it assumed instead

A round costs the target's call over T tokens a row (its laws included), the drafter's calls
(`Tier.draft_calls`: tokens a row of each), their all-reduces on a mesh, and the engine's own
work of a round of its mode (spec_jax/costs/efficiency.py: the form and the fractions).
`context` is S, the cache slots attention reads: the engine's static shapes read all of
them (`Engine.slots`), so within a run the cost does not change as the context fills; a
caller whose attention reads only the filled part passes the context length. Costs are
cached per (model, tier, batch, context): microseconds a call after its first.

A chip is calibrated when `CALIBRATED` names its measurement file (spec_jax/assets/costs/,
each with its source; fitted by spec_jax/costs/fit.py); `for_chip` refuses another, naming
the calibrated ones. The upper bound at a chip's peaks needs no calibration (`predict`).
"""

from __future__ import annotations

import dataclasses
import functools

from spec_jax import sharding
from spec_jax.costs import chips, fit, memory, points, roofline
from spec_jax.costs.efficiency import Calibration, collective_seconds
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig

# chip -> its measurement file in spec_jax/assets/costs/ (with the form its held-out errors
# chose: `fit.compare_forms`; tests/jobs/test_calibration.py checks the choice).
CALIBRATED = {'h200': 'h200_2026-12-04', 'cpu': 'cpu_2026-12-07'}
DRAFTERS = ('eagle3', 'lm', 'ngram')


@functools.cache
def calibration(name: str) -> Calibration | None:
    """The calibration of chip `name` from its measurement file, or None (uncalibrated)."""
    if name not in CALIBRATED:
        return None
    meta, pts = points.load(CALIBRATED[name])
    shapes = f'{meta["preset"]} {meta["dtype"]}, {len(pts)} points'
    timed = [p for p in pts if p.role == 'test' and p.engine_ms is not None]
    return fit.fit(chips.CHIPS[name], [p for p in pts if p.role == 'fit'], meta['form'],
                   meta['date'], meta['jax'], shapes, timed, meta.get('matvec', False))  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Tier:
    """A round's size: `mode` ('ar', 'chain', 'tree'), T verified a row (`tokens`), and the
    drafter's calls (tokens a row of each)."""

    mode: str
    tokens: int = 1
    draft_calls: tuple[int, ...] = ()

    @classmethod
    def ar(cls) -> Tier:
        return cls('ar')

    @classmethod
    def chain(cls, num_draft: int, drafter: str = 'eagle3') -> Tier:
        """A chain of A = `num_draft`: an EAGLE-3 head's window over the A + 1 tokens the
        target processed, then A - 1 steps; a draft LM's 2-token window and A - 1 steps;
        n-grams and prompt lookup nothing."""
        if drafter not in DRAFTERS or num_draft < 1:
            raise ValueError(f'chain tier ({num_draft}, {drafter!r}): give num_draft >= 1 and '
                             f'a drafter of {DRAFTERS}')  # fmt: skip
        first = {'eagle3': num_draft + 1, 'lm': 2}.get(drafter)
        calls = () if first is None else (first,) + (1,) * (num_draft - 1)
        return cls('chain', num_draft + 1, calls)

    @classmethod
    def tree(cls, shape) -> Tier:
        """A dynamic tree (`decoding.trees.TreeShape`: nodes, path_len, branch,
        levels_drafted): the head's window over the accepted path, then a call on each
        further drafted level's frontier."""
        calls = (shape.path_len + 1,) + (shape.branch,) * (shape.levels_drafted - 1)
        return cls('tree', shape.nodes, calls)


@dataclasses.dataclass(frozen=True)
class CostModel:
    """A target (and its drafter) on one calibrated chip (module docstring)."""

    cal: Calibration
    target: ModelConfig
    head: e3.Eagle3Config | None = None
    draft: ModelConfig | None = None
    mesh: tuple[int, int] = (1, 1)

    @property
    def chip(self) -> chips.Chip:
        return self.cal.chip

    @property
    def unknown(self) -> tuple[str, ...]:
        return self.cal.unknown

    def plan(self, tier: Tier, batch: int, context: int) -> memory.Plan:
        drafted = dict(head=self.head, draft=self.draft, draft_calls=tier.draft_calls)
        return memory.Plan(self.target, batch, 1, context, tier.tokens, self.mesh,
                           **(drafted if tier.draft_calls else {}))  # fmt: skip

    def round_s(self, tier: Tier, batch: int, context: int) -> float:
        """Seconds of one round of `tier` at `batch` rows and `context` slots."""
        return _round_s(self, tier, batch, context)

    def verify_s(self, batch: int, tokens: int, context: int) -> float:
        """Seconds of the target's call over `tokens` a row inside a round (laws included)."""
        return _round_s(self, Tier('', tokens), batch, context)

    def draft_s(self, tier: Tier, batch: int, context: int) -> float:
        """Seconds of the drafter's calls of a round of `tier`."""
        return (_round_s(self, tier, batch, context) - self.engine_s(tier.mode)
                - self.verify_s(batch, tier.tokens, context))  # fmt: skip

    def engine_s(self, mode: str) -> float:
        """The engine's own work of a round of `mode` (fitted, or 0 where not measured)."""
        return self.cal.engine_s(mode)

    def feed_s(self, batch: int, tokens: int, context: int) -> float:
        """Seconds of a draft LM's forward over `tokens` a row that keeps one row of logits
        (`LMDrafter`'s deferred prefill and catch-up): its layers over every token, its LM
        head over one (a drafting call's head runs over all its tokens: at 512 tokens the
        head is most of the embedded default's draft FLOPs; counted so, the price was 3.5-6x
        what this CPU measures)."""
        d = self.draft
        if d is None:
            raise ValueError('feed_s prices a draft LM: give for_chip(..., draft=cfg)')
        rows = -(-batch // self.mesh[0])
        shapes = memory.shapes(d)
        head = {k: v for k, v in shapes.items() if k in ('embed_vd', 'lm_head_vd')}
        body = {k: v for k, v in shapes.items() if k not in head}
        run = dict(model=1, rows=rows, slots=context, item=memory.dtype_bytes(d.dtype))
        costs = [roofline.calls_cost(d, body, sharding.DRAFT_RULES, (tokens,), d.num_layers, 0,
                                     **run),
                 roofline.calls_cost(d, head, sharding.DRAFT_RULES, (1,), 0, 0, **run)]
        calls = [(roofline.Call('draft', tokens, rows, c), 1.0, 0) for c in costs]
        return self.cal.calls_seconds(calls, '')

    def follow_s(self, batch: int, context: int, tokens: int = 1) -> float:
        """Seconds of an EAGLE-3 head following AR steps (`Eagle3Drafter.follow`): its layer
        over `tokens` positions a row (one step's, or the W a buffering head runs at once),
        without its draft-vocabulary head (the logits wait for the next proposal:
        `Eagle3Drafter.root_logits`)."""
        if self.head is None:
            raise ValueError('follow_s prices an EAGLE-3 head: give for_chip(..., head=cfg)')
        rows = -(-batch // self.mesh[0])
        item = memory.dtype_bytes(self.target.dtype)  # Drafts run in the compute dtype.
        calls = roofline.head_window(self.head, sharding.DRAFT_RULES, tokens, 0, model=1,
                                     rows=rows, slots=context, item=item)  # fmt: skip
        return self.cal.calls_seconds([(c, 1.0, 0) for c in calls], '')


@functools.lru_cache(maxsize=4096)
def _round_s(m: CostModel, tier: Tier, batch: int, context: int) -> float:
    plan = m.plan(tier, batch, context)
    vocab = dict(target=m.target.vocab_size, draft=m.draft.vocab_size if m.draft else 0,
                 head=m.head.draft_vocab_size if m.head else 0)  # fmt: skip
    calls = [(c, 1.0, vocab[c.what]) for c in roofline.round_calls(plan)]
    return m.cal.calls_seconds(calls, tier.mode or 'verify')


def for_chip(
    chip: str | chips.Chip, target: ModelConfig, *, head: e3.Eagle3Config | None = None,
    draft: ModelConfig | None = None, mesh: tuple[int, int] = (1, 1),
) -> CostModel:  # fmt: skip
    """The cost model of `target` with its EAGLE-3 `head` or draft LM `draft` on `chip` (a
    name or a Chip). ValueError for an uncalibrated chip, naming the calibrated ones."""
    name = chip if isinstance(chip, str) else chip.name
    chips.chip(name)  # A ValueError naming the known chips first.
    cal = calibration(name)
    if cal is None:
        raise ValueError(f'chip {name!r} is uncalibrated; calibrated chips: {sorted(CALIBRATED)}')
    return CostModel(cal, target, head, draft, mesh)


def predict(plan: memory.Plan, chip: chips.Chip, collective_bytes: float | None = None,
            mode: str = '') -> dict:  # fmt: skip
    """Both predictions of one round of `plan` (a round of `mode`: `Calibration.round_seconds`)
    on `chip`: {upper_bound_s, calibrated_s (None: uncalibrated), collectives_s, label}."""
    upper = roofline.round_cost(plan).on(chip)['seconds']
    cal = calibration(chip.name)
    if cal is None:
        coll = collective_seconds(chip, plan, roofline.round_calls(plan), collective_bytes)
        return dict(upper_bound_s=upper, calibrated_s=None, collectives_s=coll,
                    label=f'{chip.name} uncalibrated')  # fmt: skip
    r = cal.round_seconds(plan, mode, collective_bytes)
    return dict(upper_bound_s=upper, calibrated_s=r['seconds'], collectives_s=r['collectives_s'],
                label=f'calibrated on {chip.name} {cal.date}')  # fmt: skip


def tree_costs(chip: chips.Chip, target: ModelConfig, head: e3.Eagle3Config, batch: int,
               slots: int):  # fmt: skip
    """The cost curves `decoding.tree_budget.choose` reads, for `target` with EAGLE-3 head
    `head` at `batch` rows and `slots` cache slots on one `chip`: (verify_s(T): the target's
    call over T tokens a row plus AR's engine work, draft_s(levels, branch): the head's
    window over the accepted path, a call on each further level's frontier, and the tree
    round's engine work beyond AR's). ValueError for an uncalibrated chip."""
    m = for_chip(chip, target, head=head)
    extra = m.engine_s('tree') - m.engine_s('ar')

    def verify_s(tokens: int) -> float:
        return m.verify_s(batch, tokens, slots) + m.engine_s('ar')

    def draft_s(levels: int, branch: int) -> float:
        tier = Tier('tree', 1, (levels + 1,) + (branch,) * (levels - 1))
        return m.draft_s(tier, batch, slots) + extra

    return verify_s, draft_s


def line(pred: dict) -> str:
    """A prediction in one line: the upper bound, and the calibrated time or 'uncalibrated'."""
    text = f'upper bound {pred["upper_bound_s"] * 1e3:.3f} ms'
    if pred['calibrated_s'] is None:
        text += f'; {pred["label"]} (upper bound only)'
    else:
        text += f'; {pred["calibrated_s"] * 1e3:.3f} ms {pred["label"]}'
    if pred['collectives_s']:
        text += f' (collectives {pred["collectives_s"] * 1e3:.3f} ms at the interconnect)'
    elif pred['collectives_s'] is None:
        text += ' (collectives not timed: no interconnect bandwidth for the chip)'
    return text
