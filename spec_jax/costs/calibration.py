"""Attainable time of a round: the analytic roofline's calls (spec_jax/costs/roofline.py) at
efficiencies measured on a chip kind, beside the upper bound at its published peaks.

A calibration of a chip holds two fractions fitted from timed single calls (a decode step,
one forward over T tokens) and nothing else:

- the HBM fraction h: the share of the published bandwidth a memory-bound call reaches
  (the geometric mean of (bytes / bandwidth) / measured over the calls whose roofline is
  memory bound);
- the matmul fraction e(M) of the peak bf16 FLOP/s at M = rows x T tokens a call: one point
  per compute-bound call (FLOPs / peak / measured). Between measured points e is linear in
  log M; below the smallest and above the largest measured M it is the nearest point's
  (flat: no curve is assumed where nothing was measured), so one point holds everywhere.

A call then takes max(bytes / (h x bandwidth), FLOPs / (e(M) x peak)) plus its laws'
traffic (`LAW_PASSES` passes over [rows, T, V] in fp32, at the calibrated bandwidth) plus
its all-reduces at the chip's interconnect bandwidth (`Chip.all_reduce_seconds`, not
overlapped); a round is the sum of its calls (no overlap between calls). Launches, the host
and the engine's own work (tree masks, top-k, sorting) are not counted: on the H200 they
are ~10 % of the tree round (docs/performance.md, "Calibrated predictions").

The upper bound keeps its meaning: it uses the peaks (h = e = 1), the round's FLOPs and
bytes summed before taking the max, and no collectives, so it is never above a calibrated
prediction. A chip without a calibration gets its upper bound only, labelled uncalibrated.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import numpy as np

from spec_jax.costs import chips, memory, roofline
from spec_jax.models.config import ModelConfig

LAW_PASSES = 4  # logits, p, its transform, q: memory.py's laws of a round.


@dataclasses.dataclass(frozen=True)
class Measurement:
    """One timed call at known shapes: `plan` (target only, `width` = T) took `ms`."""

    what: str
    ms: float
    plan: memory.Plan


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Measured efficiencies of one chip kind (module docstring).

    Attributes:
      chip: the chip.
      hbm_fraction: h.
      matmul: ((M, e), ...) ascending in M.
      date, jax, shapes: when, under which jax version, at which shapes it was measured.
      fitted_on: the measurements' names.
    """

    chip: chips.Chip
    hbm_fraction: float
    matmul: tuple[tuple[int, float], ...]
    date: str
    jax: str
    shapes: str
    fitted_on: tuple[str, ...] = ()

    def efficiency(self, tokens: int) -> float:
        """e(M) at M = `tokens` (rows x T), interpolated as the module says."""
        ms = np.log([m for m, _ in self.matmul])
        es = [e for _, e in self.matmul]
        return float(np.interp(math.log(max(tokens, 1)), ms, es))

    def call_seconds(self, call: roofline.Call, vocab: int = 0) -> float:
        """Seconds of one call on the chip, its all-reduces aside (module docstring)."""
        c = self.chip
        bandwidth = self.hbm_fraction * c.hbm_bandwidth
        laws = LAW_PASSES * call.rows * call.tokens * vocab * 4 / bandwidth
        compute = call.cost.flops / (self.efficiency(call.rows * call.tokens) * c.peak_flops)
        return max(call.cost.bytes_accessed / bandwidth, compute) + laws

    def round_seconds(self, plan: memory.Plan, collective_bytes: float | None = None) -> dict:
        """The calibrated time of one round of `plan`: {seconds, collectives_s (None: the
        interconnect is not at hand), calls: [(what, T, seconds)]}. `collective_bytes`
        (per chip, per round: a compiled program's count) replaces the analytic all-reduces."""
        calls = roofline.round_calls(plan)
        vocabs = {'target': plan.target.vocab_size,
                  'draft': plan.draft.vocab_size if plan.draft else 0,
                  'head': plan.head.draft_vocab_size if plan.head else 0}  # fmt: skip
        timed = [(c.what, c.tokens, self.call_seconds(c, vocabs[c.what])) for c in calls]
        coll = collective_seconds(self.chip, plan, calls, collective_bytes)
        return dict(seconds=sum(s for *_, s in timed) + (coll or 0.0), collectives_s=coll,
                    calls=timed)  # fmt: skip

    def describe(self) -> str:
        points = ', '.join(f'{e:.2f} at M {m}' for m, e in self.matmul)
        return (f'calibrated on {self.chip.name} {self.date} (jax {self.jax}; {self.shapes}): '
                f'HBM {self.hbm_fraction:.2f} of peak, matmul {points}')  # fmt: skip


def fit(chip: chips.Chip, measurements, date: str, jax: str, shapes: str) -> Calibration:
    """A Calibration of `chip` from single-call `measurements` (module docstring).
    ValueError for a measurement of several calls, or none memory bound."""
    hbm, points = [], {}
    for m in measurements:
        calls = roofline.round_calls(m.plan)
        if len(calls) != 1:
            raise ValueError(f'measurement {m.what!r} has {len(calls)} calls: fit single calls')
        (call,) = calls
        flops, num_bytes = call.cost.flops, call.cost.bytes_accessed
        if chip.bound(flops, num_bytes) == 'memory':
            hbm.append(num_bytes / chip.hbm_bandwidth / (m.ms / 1e3))
        else:
            points.setdefault(call.rows * call.tokens, []).append(
                flops / chip.peak_flops / (m.ms / 1e3))
    if not hbm:
        raise ValueError('a calibration needs at least one memory-bound call (a decode step)')
    h = math.exp(sum(map(math.log, hbm)) / len(hbm))
    matmul = tuple(sorted((m, sum(v) / len(v)) for m, v in points.items())) or ((1, h),)
    names = tuple(m.what for m in measurements)
    return Calibration(chip, h, matmul, date, jax, shapes, names)


def _llama8b(batch: int, slots: int, width: int) -> memory.Plan:
    cfg = ModelConfig.llama3_1_8b().replace(dtype='bfloat16', param_dtype='bfloat16')
    return memory.Plan(cfg, batch, 128, slots, width)


def h200_measurements() -> tuple[Measurement, ...]:
    """The H200's fitted measurements (/work/shared/data/gpu/h200_2026-12-04.md; Llama-3.1-8B
    shapes, bf16, random weights): decode steps and forwards only; the tree round and the
    tree over AR are held out (tests/jobs/test_calibration.py)."""
    return (
        Measurement('AR decode loop, batch 8, 256 slots (prefill included)', 4.66,
                    _llama8b(8, 256, 1)),
        Measurement('AR round, batch 8, 4096 slots', 5.65, _llama8b(8, 4096, 1)),
        Measurement('forward T 1, batch 8, 4096 slots', 5.55, _llama8b(8, 4096, 1)),
        Measurement('forward T 60, batch 8, 4156 slots', 20.3, _llama8b(8, 4156, 60)),
    )  # fmt: skip


@functools.cache
def calibration(name: str) -> Calibration | None:
    """The calibration of chip `name`, or None (uncalibrated)."""
    if name == 'h200':
        return fit(chips.CHIPS['h200'], h200_measurements(), '2026-12-04', '0.11.2 (CUDA 13)',
                   'Llama-3.1-8B bf16, batch 8, 256-4156 slots, T 1 and 60')  # fmt: skip
    return None


def collective_seconds(chip: chips.Chip, plan: memory.Plan, calls: list[roofline.Call],
                       collective_bytes: float | None = None) -> float | None:  # fmt: skip
    """A round's all-reduces at the chip's interconnect: the calls' own (analytic), or
    `collective_bytes` per chip (a compiled program's count) over the model axis; None where
    the chip's interconnect bandwidth is not at hand."""
    if collective_bytes is not None:
        return chip.all_reduce_seconds(collective_bytes, plan.mesh[1])
    parts = [chip.all_reduce_seconds(c.all_reduce, c.model) for c in calls]
    return None if None in parts else sum(parts)


def predict(plan: memory.Plan, chip: chips.Chip, collective_bytes: float | None = None) -> dict:
    """Both predictions of one round of `plan` on `chip`: {upper_bound_s, calibrated_s (None:
    uncalibrated), collectives_s, label}."""
    upper = roofline.round_cost(plan).on(chip)['seconds']
    cal = calibration(chip.name)
    if cal is None:
        coll = collective_seconds(chip, plan, roofline.round_calls(plan), collective_bytes)
        return dict(upper_bound_s=upper, calibrated_s=None, collectives_s=coll,
                    label=f'{chip.name} uncalibrated')  # fmt: skip
    r = cal.round_seconds(plan, collective_bytes)
    return dict(upper_bound_s=upper, calibrated_s=r['seconds'], collectives_s=r['collectives_s'],
                label=f'calibrated on {chip.name} {cal.date}')  # fmt: skip


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



def tree_costs(chip: chips.Chip, target: ModelConfig, head, batch: int, slots: int):
    """The calibrated cost curves `tree_budget.choose` reads, for `target` with EAGLE-3 head
    `head` at `batch` rows and `slots` cache slots on one `chip`: (verify_s(T): the target's
    forward over T tokens a row, draft_s(levels, branch): the head's window over the accepted
    path, then a call on each further level's frontier). ValueError for an uncalibrated chip.
    A call's FLOPs and all-reduced bytes are linear in T and its bytes read constant, so each
    model is costed once, at T 1."""
    cal = calibration(chip.name)
    if cal is None:
        calibrated = sorted(n for n in chips.CHIPS if calibration(n))
        raise ValueError(f'chip {chip.name!r} is uncalibrated; calibrated chips: {calibrated}')
    plan = memory.Plan(target, batch, 1, slots, 1, head=head, draft_calls=(1,))
    (one, head_one) = roofline.round_calls(plan)

    def seconds(call: roofline.Call, tokens: int, vocab: int) -> float:
        cost = roofline.Cost(call.cost.flops * tokens, call.cost.bytes_accessed)
        scaled = dataclasses.replace(call, tokens=tokens, cost=cost,
                                     all_reduce=call.all_reduce * tokens)  # fmt: skip
        return cal.call_seconds(scaled, vocab)

    def verify_s(tokens: int) -> float:
        return seconds(one, tokens, target.vocab_size)

    def draft_s(levels: int, branch: int) -> float:
        calls = (levels + 1,) + (branch,) * (levels - 1)
        return sum(seconds(head_one, t, head.draft_vocab_size) for t in calls)

    return verify_s, draft_s
