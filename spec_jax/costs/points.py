"""Measured points a chip's cost model is fitted on and tested against (spec_jax/costs/fit.py).

A point is one timed unit at known shapes: a bare target forward over T tokens a row
(`mode` ''), an AR step inside the on-device loop, or one round of a mode ('ar', 'chain',
'tree': the target's call, the drafter's calls, the laws and the engine's own work). Its
`parts` are the plans it runs and how many times each per measured unit (the AR loop's
prefill once per its `steps` steps). Its `role`: 'fit' (the calibration fits on it),
'test' (never fitted: a round predicted from the others) or 'excluded: <why>' (reported,
never fitted).

`keys` names its calls by (what, rows, T, slots): a fit for a point's prediction leaves
out the point itself and every point that shares a call with it (the tree round's target
call, a T 60 forward at its batch and slots, is never among the fitted points of the tree
round's prediction).

Sources: the H200's measurements are copied into spec_jax/assets/costs/ (the file names
where they were made); a bench_accel report (`from_bench`) gives any chip's, this CPU's
included.
"""

from __future__ import annotations

import dataclasses
import json
import os

from spec_jax.costs import memory, roofline
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig, preset

ASSETS = os.path.join(os.path.dirname(os.path.dirname(__file__)), 'assets', 'costs')
MODES = ('', 'ar', 'chain', 'tree')


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured unit (module docstring): `ms` measured for `parts` [(plan, count)]."""

    name: str
    ms: float
    mode: str
    parts: tuple[tuple[memory.Plan, float], ...]
    role: str = 'fit'
    engine_ms: float | None = None  # A round's work outside its calls, timed (a bench's).

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f'point {self.name!r}: mode {self.mode!r} is not one of {MODES}')
        if self.role not in ('fit', 'test') and not self.role.startswith('excluded: '):
            raise ValueError(f"point {self.name!r}: role {self.role!r}; valid: 'fit', 'test', "
                             "'excluded: <why>'")  # fmt: skip

    @property
    def plan(self) -> memory.Plan:
        """The point's main plan (its first part: the call or round it is named for)."""
        return self.parts[0][0]

    def calls(self) -> list[tuple[roofline.Call, float, int]]:
        """[(call, count, vocab)] of every part: the roofline's calls with their vocabularies."""
        out = []
        for plan, count in self.parts:
            vocab = dict(target=plan.target.vocab_size,
                         draft=plan.draft.vocab_size if plan.draft else 0,
                         head=plan.head.draft_vocab_size if plan.head else 0)  # fmt: skip
            out += [(c, count, vocab[c.what]) for c in roofline.round_calls(plan)]
        return out

    @property
    def keys(self) -> frozenset:
        """(what, rows, T, slots) of each of its calls."""
        return frozenset((c.what, c.rows, c.tokens, plan.slots)
                         for plan, _ in self.parts for c in roofline.round_calls(plan))  # fmt: skip

    def shares_a_call(self, other: Point) -> bool:
        return bool(self.keys & other.keys)


def point(
    name: str, ms: float, mode: str, target: ModelConfig, batch: int, slots: int, tokens: int,
    *, head: e3.Eagle3Config | None = None, draft: ModelConfig | None = None, draft_calls=(),
    prefill: int = 0, steps: int = 1, role: str = 'fit',
) -> Point:  # fmt: skip
    """A Point of `tokens` verified a row at `batch` rows and `slots` cache slots; with a
    prompt of `prefill` tokens run once per `steps` measured steps (an AR loop's time over
    its new tokens, prefill included)."""
    drafted = dict(head=head, draft=draft, draft_calls=tuple(draft_calls)) if draft_calls else {}
    parts = [(memory.Plan(target, batch, max(prefill, 1), slots, tokens, **drafted), 1.0)]
    if prefill:
        parts.append((memory.Plan(target, batch, prefill, slots, prefill), 1.0 / steps))
    return Point(name, ms, mode, tuple(parts), role)


def target_of(name: str, dtype: str) -> ModelConfig:
    """A preset's ModelConfig held in `dtype` (weights and compute)."""
    return preset(name).replace(dtype=dtype, param_dtype=dtype)


def load(name: str) -> tuple[dict, tuple[Point, ...]]:
    """(metadata, points) of the measurement file `name` in spec_jax/assets/costs/ (its
    `source` names where the numbers were made)."""
    path = os.path.join(ASSETS, name if name.endswith('.json') else f'{name}.json')
    if not os.path.exists(path):
        have = sorted(f[:-5] for f in os.listdir(ASSETS) if f.endswith('.json'))
        raise ValueError(f'no measurement file {name!r} in {ASSETS}; have {have}')
    with open(path) as f:
        meta = json.load(f)
    if 'records' in meta:  # A bench_accel report.
        return meta, from_bench(meta)
    target = target_of(meta['preset'], meta['dtype'])
    head = e3.Eagle3Config.for_target(target, draft_vocab_size=meta['head_draft_vocab'])
    head = head.replace(dtype=meta['dtype'])
    pts = []
    for p in meta['points']:
        calls = tuple(p.get('draft_calls', ()))
        pts.append(point(p['name'], p['ms'], p['mode'], target, p['batch'], p['slots'],
                         p['tokens'], head=head if calls else None, draft_calls=calls,
                         prefill=p.get('prefill', 0), steps=p.get('steps', 1),
                         role=p['role']))  # fmt: skip
    return meta, tuple(pts)


def from_bench(report: dict) -> tuple[Point, ...]:
    """Points of a bench_accel report (spec_jax/jobs/bench_accel.py): each measured verify
    forward and AR loop step is 'fit' (the loop's step times the rounds alone: the prefill
    is timed apart); each round is 'test' (its `engine_ms`: the work outside its target and
    drafter calls, timed), and its target forward, timed alone inside the round's step, a
    'fit' point that shares the round's target call (so it is never fitted for the round's
    own prediction)."""
    c = report['config']
    target = target_of(c['preset'], c['dtype'])
    head = e3.Eagle3Config.for_target(target, draft_vocab_size=c['draft_vocab']
                                      or target.vocab_size).replace(dtype=c['dtype'])  # fmt: skip
    pts = []
    for r in report['records']:
        if r.get('measured_ms') is None:
            continue
        s, step = r['shapes'], r['step']
        where = f'batch {s["batch"]}, {s["slots"]} slots'
        if step == 'verify':
            pts.append(point(f'forward T {s["T"]}, {where}', r['measured_ms'], '', target,
                             s['batch'], s['slots'], s['T']))  # fmt: skip
        elif step == 'ar':
            pts.append(point(f'AR loop step, {where}', r['measured_ms'], 'ar', target,
                             s['batch'], s['slots'], 1))  # fmt: skip
        elif step in ('chain', 'tree'):
            calls = tuple(r['draft_calls'])
            p = point(f'{step} round T {s["T"]}, {where}', r['measured_ms'], step, target,
                      s['batch'], s['slots'], s['T'], head=head, draft_calls=calls, role='test')
            pts.append(dataclasses.replace(p, engine_ms=r.get('outside_ms')))
            if r.get('forward_ms'):
                pts.append(point(f'{step} round\'s target forward T {s["T"]}, {where}',
                                 r['forward_ms'], '', target, s['batch'], s['slots'], s['T']))
    return tuple(pts)
