"""Fitting a chip's calibration (spec_jax/costs/calibration.py) on measured points
(spec_jax/costs/points.py), and the report of what it knows: per point, fitted or held out,
and the error.

The fit: h and e on a grid of fractions (`GRID`, log-spaced from 0.01 to 1), the engine's
work a round of each measured mode in closed form at each (h, e), minimizing the summed
squared relative error over the points whose role is 'fit'. What the points cannot decide
is not guessed silently:

- e is identified only when a fitted point is compute-heavy (its calls' FLOPs at the peak
  take at least `COMPUTE_SHARE` of their bytes' time at the peak bandwidth; an AR loop's
  prefill, 1/128 of its steps, is not); otherwise e = h is assumed and said
  (`Calibration.unknown`); h likewise needs a memory-heavy point;
- a mode's engine work needs a fitted round of that mode, or a tested round whose work
  outside its calls was timed (`Point.engine_ms`, the accelerator bench's `outside_ms`:
  their median); otherwise 0 is assumed and said;
- with `matvec`, v (the bandwidth fraction of calls of M = 1: `efficiency.is_matvec`) needs
  a fitted point whose memory time is mostly such calls and one whose is mostly the others;
  then (h, e) and v are fitted in turn (`ROUNDS` passes: each a grid search with the other
  held), else v = h is assumed and said.

`held_out` predicts every point from a fit that leaves out the point itself and every point
sharing one of its calls (`Point.shares_a_call`): leave-one-out over the fitted points, and
for a 'test' point (a round) a fit on the others without its own target call. That is held
out by construction: no point's own measurement, nor its target call's, ever enters the
fit that predicts it. `compare_forms` runs it for each form: the form a chip's calibration
uses is the one whose held-out errors are smallest, where the points decide it.
"""

from __future__ import annotations

import math

import numpy as np

from spec_jax.costs import chips
from spec_jax.costs.efficiency import FORMS, LAW_PASSES, ROUND_MODES, Calibration, is_matvec
from spec_jax.costs.points import Point

GRID = np.logspace(-2, 0, 161)  # Fractions of a peak, 0.01 to 1 (a step of 2.9 %).
COMPUTE_SHARE = 0.25  # A call is compute-heavy (identifies e) from this FLOP/byte time ratio.
ROUNDS = 3  # Passes of (h, e) then v when v is fitted (on the CPU's points the third moves none).


def _terms(chip: chips.Chip, p: Point) -> list[tuple[float, ...]]:
    """[(count, memory s, compute s, all-reduce s, laws s, matvec)] of a point's calls, the
    times at the chip's peaks, the laws inside a round only; matvec 1.0 for a call of M = 1."""
    out = []
    for call, count, vocab in p.calls():
        laws = LAW_PASSES * call.rows * call.tokens * vocab * 4 if p.mode else 0
        reduce = chip.all_reduce_seconds(call.all_reduce, call.model) or 0.0
        out.append((count, call.cost.bytes_accessed / chip.hbm_bandwidth,
                    call.cost.flops / chip.peak_flops, reduce, laws / chip.hbm_bandwidth,
                    float(is_matvec(call))))  # fmt: skip
    return out


def _predict(terms, h, e, beta, v):
    """Seconds of a point's calls at fractions h, e, v (arrays broadcast), no engine work."""
    total = 0.0
    for count, m, c, fixed, laws, matvec in terms:
        mt, ct = m / (v if matvec else h), c / e
        total = total + count * (np.maximum(mt, ct) + beta * np.minimum(mt, ct) + fixed
                                 + laws / h)  # fmt: skip
    return total


def _share(terms, matvec: bool) -> float:
    """The share of a point's memory time (at the peak) in calls of M = 1 (or the others)."""
    total = sum(n * m for n, m, *_ in terms)
    return sum(n * m for n, m, *_, mv in terms if bool(mv) == matvec) / total if total else 0.0


def fit(chip: chips.Chip, points, form: str = 'additive', date: str = '', jax: str = '',
        shapes: str = '', rounds=(), matvec: bool = False) -> Calibration:  # fmt: skip
    """The Calibration of `chip` fitted on `points`, with the engine work timed in `rounds`
    (tested rounds with `engine_ms`) for modes no fitted point measures, and with `matvec`
    its own fraction for calls of M = 1 where the points identify it (module docstring).
    ValueError for no points or an unknown form."""
    if form not in FORMS:
        raise ValueError(f'form {form!r} is not one of {sorted(FORMS)}')
    points = list(points)
    if not points:
        raise ValueError('a fit needs at least one measured point')
    beta = FORMS[form]
    terms = [_terms(chip, p) for p in points]
    time_at_peak = [(sum(n * m for n, m, *_ in t), sum(n * c for n, _, c, *_ in t))
                     for t in terms]  # fmt: skip
    knows_e = any(c >= COMPUTE_SHARE * m for m, c in time_at_peak)
    knows_h = any(m >= COMPUTE_SHARE * c for m, c in time_at_peak)
    unknown = []
    if knows_e and knows_h:
        h, e = GRID[:, None], GRID[None, :]
    else:
        h = e = GRID
        unknown.append('matmul fraction not identified (no compute-heavy point fitted): e = h '
                       'assumed' if knows_h else 'HBM fraction not identified (no memory-heavy '
                       'point fitted): h = e assumed')  # fmt: skip
    knows_v = all(any(_share(t, side) > 0.5 for t in terms) for side in (True, False))
    if matvec and not knows_v:
        unknown.append('matrix-vector fraction not identified (no fitted point mostly of M = 1 '
                       'calls, or none mostly of others): v = h assumed')  # fmt: skip
    solve = lambda h, e, v: _solve(points, terms, h, e, beta, v, rounds)  # noqa: E731
    loss, engine, assumed = solve(h, e, h)
    pick = _picker(loss)
    best_h, best_e, best_v = pick(h), pick(e), None
    if matvec and knows_v:
        for _ in range(ROUNDS):
            best_v = float(GRID[np.argmin(solve(best_h, best_e, GRID)[0])])
            loss, engine, assumed = solve(h, e, best_v)
            pick = _picker(loss)
            best_h, best_e = pick(h), pick(e)
    return Calibration(chip, best_h, best_e, form,
                       tuple((m, pick(k)) for m, k in engine.items()), date, jax, shapes,
                       tuple(p.name for p in points), tuple(unknown + assumed), best_v)  # fmt: skip


def _picker(loss):
    """A function reading an array broadcast to `loss`'s shape at its minimum."""
    best = np.unravel_index(np.argmin(loss), np.shape(loss))
    return lambda a: float(np.broadcast_to(a, np.shape(loss))[best])


def _solve(points, terms, h, e, beta, v, rounds):
    """(summed squared relative error over `points`, {mode: engine work}, what was assumed
    for the modes not fitted) at fractions h, e, v (arrays broadcast), each measured mode's
    engine work in closed form."""
    y = np.array([p.ms / 1e3 for p in points])
    pred = [_predict(t, h, e, beta, v) for t in terms]
    engine, unknown = {}, []
    for mode in ROUND_MODES:
        idx = [i for i, p in enumerate(points) if p.mode == mode]
        timed = [p.engine_ms / 1e3 for p in rounds if p.mode == mode and p.engine_ms is not None]
        if not idx and timed:
            engine[mode] = float(np.median(timed))
            unknown.append(f'engine work of a {mode} round timed outside its calls in '
                           f'{len(timed)} round(s), not fitted')  # fmt: skip
            continue
        if not idx:
            unknown.append(f'engine work of a {mode} round not measured: 0 assumed')
            continue
        w = sum(1 / y[i] ** 2 for i in idx)
        k = np.maximum(sum((y[i] - pred[i]) / y[i] ** 2 for i in idx) / w, 0.0)
        engine[mode] = k
        for i in idx:
            pred[i] = pred[i] + k
    loss = sum((pred[i] / y[i] - 1) ** 2 for i in range(len(points)))
    return loss, engine, unknown


def seconds(cal: Calibration, p: Point) -> float:
    """The calibrated seconds of a measured point."""
    return cal.calls_seconds(p.calls(), p.mode)


def held_out(chip: chips.Chip, points, form: str = 'additive',
             matvec: bool = False) -> list[dict]:  # fmt: skip
    """Per point: {name, role, mode, measured_ms, fitted (in the full calibration),
    in_sample_ms, in_sample_err (the full calibration's: its engine work timed in the tested
    rounds, the point's own included), held_out_ms, held_out_err (from the fit without
    it and without any point sharing a call with it; None for an excluded point or when
    nothing is left to fit), held_out_fitted_on, held_out_unknown}. Errors are predicted /
    measured - 1."""
    fitted = [p for p in points if p.role == 'fit']
    timed = [p for p in points if p.role == 'test' and p.engine_ms is not None]
    full = fit(chip, fitted, form, rounds=timed, matvec=matvec)
    rows = []
    for p in points:
        row = dict(name=p.name, role=p.role, mode=p.mode, measured_ms=p.ms, fitted=p in fitted,
                   in_sample_ms=seconds(full, p) * 1e3, held_out_ms=None, held_out_err=None,
                   held_out_fitted_on=(), held_out_unknown=())  # fmt: skip
        row['in_sample_err'] = row['in_sample_ms'] / p.ms - 1
        others = [q for q in fitted if q is not p and not q.shares_a_call(p)]
        if not p.role.startswith('excluded') and others:
            cal = fit(chip, others, form, rounds=[q for q in timed if q is not p], matvec=matvec)
            row.update(held_out_ms=seconds(cal, p) * 1e3, held_out_fitted_on=cal.fitted_on,
                       held_out_unknown=cal.unknown)  # fmt: skip
            row['held_out_err'] = row['held_out_ms'] / p.ms - 1
        rows.append(row)
    return rows


def compare_forms(chip: chips.Chip, points, matvec: bool = False) -> dict[str, float]:
    """{form: root-mean-square held-out relative error over the points held out} (with
    `matvec`: each form with its own fraction for calls of M = 1)."""
    out = {}
    for form in FORMS:
        errs = [r['held_out_err'] for r in held_out(chip, points, form, matvec)
                if r['held_out_err'] is not None]  # fmt: skip
        out[form] = math.sqrt(sum(x * x for x in errs) / len(errs)) if errs else math.nan
    return out


def table(rows: list[dict]) -> str:
    """The held-out report as text: one line a point (ms; errors in %)."""
    lines = []
    for r in rows:
        held = ('not held out' if r['held_out_ms'] is None else
                f'held out {r["held_out_ms"]:.2f} ms ({r["held_out_err"]:+.0%}; fitted on '
                f'{len(r["held_out_fitted_on"])} others)')  # fmt: skip
        role = 'fitted' if r['fitted'] else r['role']
        lines.append(f'{r["name"]}: measured {r["measured_ms"]:.2f} ms; {role}, in sample '
                     f'{r["in_sample_ms"]:.2f} ms ({r["in_sample_err"]:+.0%}); {held}')
        lines += [f'    held-out fit: {u}' for u in r['held_out_unknown']
                  if 'fraction' in u or f'a {r["mode"]} round' in u]
    return '\n'.join(lines)
