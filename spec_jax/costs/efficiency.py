"""Efficiencies: the attainable time of a call, a measured point and a round on a chip, the
analytic roofline's calls (spec_jax/costs/roofline.py) at fractions fitted on measurements
(spec_jax/costs/fit.py), beside the upper bound at the chip's published peaks.

A calibration of a chip holds:

- h, the HBM fraction: the share of the published bandwidth the calls' bytes move at;
- e, the matmul fraction: the share of the peak FLOP/s their FLOPs run at (one number: the
  measurements so far do not resolve a curve over M = rows x T);
- optionally v, the matrix-vector fraction: the share of the bandwidth a call of one row and
  one token (M = 1) moves its bytes at, where the chip runs those dots with another kernel
  (XLA:CPU: Eigen's matrix-vector product at M = 1, YNNPACK's GEMM from M = 2, which streams
  the weights about 1.45x slower: docs/performance.md); None: v = h;
- the form: how a call's memory time m = bytes / (h x bandwidth) and compute time
  c = FLOPs / (e x peak) combine: max(m, c) + beta x min(m, c), beta 0 ('max': perfect
  overlap), 0.5 ('blend') or 1 ('additive': no overlap);
- the engine's own work of a round, per mode (AR, chain, tree: masks, top-k, sorting,
  commits; seconds a round, fitted where a round of that mode was measured, else 0 and
  said so in `unknown`);
- what the fit could not identify and assumed instead (`unknown`: e.g. no compute-bound
  point fitted, so e is set to h).

A call takes its form's time plus its all-reduces at the chip's interconnect
(`Chip.all_reduce_seconds`, not overlapped); inside a round (not a bare forward) its laws
too: `LAW_PASSES` fp32 passes over [rows, T, V] at h x bandwidth. A round is the sum of
its calls (no overlap between calls) plus its mode's engine work.

The upper bound keeps its meaning: it uses the peaks (h = e = 1), the round's FLOPs and
bytes summed before taking the max, and no collectives or engine work, so it is never above
a calibrated prediction.
"""

from __future__ import annotations

import dataclasses

from spec_jax.costs import chips, memory, roofline

LAW_PASSES = 4  # logits, p, its transform, q: memory.py's laws of a round.
FORMS = {'max': 0.0, 'blend': 0.5, 'additive': 1.0}  # beta: max(m, c) + beta x min(m, c).
ROUND_MODES = ('ar', 'chain', 'tree')


@dataclasses.dataclass(frozen=True)
class Calibration:
    """Fitted fractions of one chip kind (module docstring).

    Attributes:
      chip: the chip.
      hbm_fraction: h.
      matmul_fraction: e.
      form: a key of `FORMS`.
      engine: ((mode, seconds a round), ...) for the modes of `ROUND_MODES`.
      date, jax, shapes: when, under which jax version, at which shapes it was measured.
      fitted_on: the fitted points' names.
      unknown: what the fit could not identify, and what it assumed instead.
      matvec_fraction: v (None: a call of M = 1 moves its bytes at h too).
    """

    chip: chips.Chip
    hbm_fraction: float
    matmul_fraction: float
    form: str = 'additive'
    engine: tuple[tuple[str, float], ...] = ()
    date: str = ''
    jax: str = ''
    shapes: str = ''
    fitted_on: tuple[str, ...] = ()
    unknown: tuple[str, ...] = ()
    matvec_fraction: float | None = None

    def __post_init__(self):
        if self.form not in FORMS:
            raise ValueError(f'form {self.form!r} is not one of {sorted(FORMS)}')
        if not (0 < self.hbm_fraction and 0 < self.matmul_fraction
                and (self.matvec_fraction is None or 0 < self.matvec_fraction)):
            raise ValueError(f'fractions h {self.hbm_fraction}, e {self.matmul_fraction}, v '
                             f'{self.matvec_fraction}: give positive fractions of the peaks')

    def engine_s(self, mode: str) -> float:
        """The engine's own work of a round of `mode` ('' a bare forward: none)."""
        return dict(self.engine).get(mode, 0.0)

    def call_seconds(self, call: roofline.Call, vocab: int = 0) -> float:
        """Seconds of one call on the chip, its all-reduces aside; `vocab` > 0 adds its laws
        (a call inside a round)."""
        c, beta = self.chip, FORMS[self.form]
        bandwidth = self.hbm_fraction * c.hbm_bandwidth
        matvec = self.matvec_fraction is not None and is_matvec(call)
        stream = self.matvec_fraction * c.hbm_bandwidth if matvec else bandwidth
        m = call.cost.bytes_accessed / stream
        compute = call.cost.flops / (self.matmul_fraction * c.peak_flops)
        laws = LAW_PASSES * call.rows * call.tokens * vocab * 4 / bandwidth
        return max(m, compute) + beta * min(m, compute) + laws

    def calls_seconds(self, calls, mode: str) -> float:
        """Seconds of [(call, count, vocab)] run as a bare forward (`mode` '') or as a round
        of `mode`: the calls (laws inside a round), their all-reduces, the engine's work."""
        total = self.engine_s(mode)
        for call, count, vocab in calls:
            reduce = self.chip.all_reduce_seconds(call.all_reduce, call.model) or 0.0
            total += count * (self.call_seconds(call, vocab if mode else 0) + reduce)
        return total

    def round_seconds(self, plan: memory.Plan, mode: str = '',
                      collective_bytes: float | None = None) -> dict:  # fmt: skip
        """The calibrated time of one round of `plan`, a round of `mode` ('' infers 'ar' for
        a plan of one token and no drafter, else counts no engine work): {seconds,
        collectives_s (None: the interconnect is not at hand), calls: [(what, T, seconds)],
        engine_s}. `collective_bytes` (per chip, per round: a compiled program's count)
        replaces the analytic all-reduces."""
        mode = mode or ('ar' if plan.width == 1 and not plan.draft_calls else '')
        calls = roofline.round_calls(plan)
        vocabs = {'target': plan.target.vocab_size,
                  'draft': plan.draft.vocab_size if plan.draft else 0,
                  'head': plan.head.draft_vocab_size if plan.head else 0}  # fmt: skip
        timed = [(c.what, c.tokens, self.call_seconds(c, vocabs[c.what])) for c in calls]
        coll = collective_seconds(self.chip, plan, calls, collective_bytes)
        engine = self.engine_s(mode)
        return dict(seconds=sum(s for *_, s in timed) + (coll or 0.0) + engine,
                    collectives_s=coll, calls=timed, engine_s=engine)  # fmt: skip

    def describe(self) -> str:
        engine = ', '.join(f'{m} {s * 1e3:.2f} ms' for m, s in self.engine if s)
        matvec = ('' if self.matvec_fraction is None else
                  f' (at one row and token {self.matvec_fraction:.3f})')  # fmt: skip
        text = (f'calibrated on {self.chip.name} {self.date} (jax {self.jax}; {self.shapes}): '
                f'{self.form}, HBM {self.hbm_fraction:.3f} of peak{matvec}, matmul '
                f'{self.matmul_fraction:.3f} of peak, engine work a round: {engine or "none"}')
        return text + ''.join(f'; {u}' for u in self.unknown)


def is_matvec(call: roofline.Call) -> bool:
    """A call of one row and one token (M = 1): its dots are matrix-vector products."""
    return call.rows * call.tokens == 1


def collective_seconds(chip: chips.Chip, plan: memory.Plan, calls: list[roofline.Call],
                       collective_bytes: float | None = None) -> float | None:  # fmt: skip
    """A round's all-reduces at the chip's interconnect: the calls' own (analytic), or
    `collective_bytes` per chip (a compiled program's count) over the model axis; None where
    the chip's interconnect bandwidth is not at hand."""
    if collective_bytes is not None:
        return chip.all_reduce_seconds(collective_bytes, plan.mesh[1])
    parts = [chip.all_reduce_seconds(c.all_reduce, c.model) for c in calls]
    return None if None in parts else sum(parts)

