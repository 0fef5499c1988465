"""The timing design against drift, simulated on the real layouts: the schedule of the main
job (configs/experiments/smollm2_135m.py: 14 methods, MBPP one batch, the speed sets five)
and of the engines' rules (chain: 27 methods, tree: 12; five speed batches each) from the
real `runner.schedule` (`timing.batch_plan`, `timing.interleave`, the drift monitor), and a
paper-scale layout (26 methods: AR, lossless SD, 12 rules and their baselines; two of the
paper's tasks, 200 and 220 items in batches of 8: 25 and 28 batches), run on an
injected clock (no model: each call's seconds are its batch's cost times the machine's
load at that moment times 3% lognormal noise). Every method is equally fast, so every
speedup's interval should hold 1 and every verdict is a false one.

The Monte Carlo draws a run seed per simulated run (the design's relabelling, `timing.
design`, drawn from it as the runner does) and computes the intervals vectorised, after
checking on the same draws that its schedule is `timing.interleave`'s and its intervals are
`paired.speedup`'s (`test_the_simulation_is_the_real_schedule_and_estimator`).

Loads over the run (t seconds, T the run's length, a round the judged group's median
round): periodic of 10% amplitude with a period of 1 or 1.3 rounds (each run's period drawn
within +-10% of it, its phase uniform); linear (slope uniform in +-15% over the run); a 15%
sawtooth with 1 or 3 teeth over the run (phase uniform); a step of up to +-30% at a uniform
moment; a random walk (Brownian, sd 15% over the run, in log speed)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
from scipy import stats

from spec_jax.decoding import batching
from spec_jax.eval import plan, runner, timing
from spec_jax.eval.stats import design, paired, verdicts
from spec_jax.jobs import runtime

EXPERIMENTS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'experiments')
LAYOUTS = [('smollm2_135m.py', None), ('smollm2_135m_engines.py', None),
           ('smollm2_135m_engines.py', 'tree'), ('paper', None)]  # fmt: skip
NOISE = 0.03  # Lognormal sigma of each (batch, method) call's seconds.
KINDS = ('periodic 1', 'periodic 1.3', 'linear', 'sawtooth 1', 'sawtooth 3', 'step', 'walk')
# Simulated runs per (layout, load): run seeds 0 .. SIMS - 1 (the design's), numpy seed 45
# for the loads and the noise. Binomial spread of one test's coverage at 0.95: sd 0.49
# points at 2,000 runs, 0.69 at 1,000, so the worst of 18-47 tests of a calibrated
# interval lands about 1 point under 0.95 by chance alone, the worst of the paper layout's
# 74 tests at 1,000 runs about 1.7 points (0.933).
SIMS = {'paper': 1000}
DEFAULT_SIMS = 2000
# The bounds (the issue's): worst test's coverage, Holm family-wise error. On the paper
# layout the worst of 74 binomial counts at 1,000 runs cannot decide 0.93 (a calibrated
# interval's expected worst is 0.933): there its mean must reach 0.945 and its worst 0.92
# (0.93 less 1.5 sd of one count).
BOUNDS = (0.93, 0.07)
PAPER_BOUNDS = (0.92, 0.945)


class NothingDone:
    def is_done(self, key) -> bool:
        return False


@dataclasses.dataclass(frozen=True)
class Item:
    id: str


def prompt_len(row) -> int:
    """A stand-in for the tokenized length (no tokenizer here): characters / 4 plus the
    template's ~20 tokens; it orders and buckets the rows as the real one roughly does."""
    return sum(len(m['content']) for m in row[1].messages) // 4 + 20


def paper_layout():
    """26 methods (AR, lossless SD, 12 rules with their matched baselines) over two of the
    paper's tasks in batches of 8, each batch's cost uniform in [0.5, 1.5]."""
    methods = [plan.Method('ar', 'ar', 'lossless'), plan.Method('lossless', 'chain', 'lossless')]
    methods += [plan.Method(f'r{i}', 'chain', f'r{i}', pairs=(f'b{i}',)) for i in range(12)]
    methods += [plan.Method(f'b{i}', 'chain', f'r{i}', baseline=True, pairs=(f'r{i}',))
                for i in range(12)]  # fmt: skip
    rows = [(task, Item(str(i))) for task, n in (('bfcl', 200), ('include', 220))
            for i in range(n)]  # fmt: skip
    batches = timing.batch_plan(rows, 0, 8, lambda r: (r[0], int(r[1].id)))
    order = timing.interleave(batches, methods, lambda b, m: True, runner.monitor)
    cost = dict(zip((b.id for b in batches), np.random.default_rng(0).uniform(0.5, 1.5, 200)))
    return methods, order, np.asarray([cost[b.id] for b, _, _ in order])


@pytest.fixture(scope='module', params=LAYOUTS, ids=lambda p: ':'.join(filter(None, p)))
def layout(request):
    """(name, methods, schedule, per-call base seconds) of a real config's plan."""
    name, arg = request.param
    if name == 'paper':
        return ('paper', *paper_layout())
    c = runtime.load_config(os.path.join(EXPERIMENTS, name), arg)
    methods = runner.methods_of(c)
    order = runner.schedule(c, methods, runner.load_items(c), NothingDone(), prompt_len)

    def cost(batch):  # Prefill by the bucket, then the tokens.
        bucket = max(batching.prompt_bucket_of(prompt_len(r), c.prompt_bucket,
                                               c.max_prompt_len) for r in batch.rows)  # fmt: skip
        return (bucket + 4 * max(c.tasks[t].max_new_tokens for t, _ in batch.rows)) / 100

    label = ':'.join(filter(None, (name.removesuffix('.py'), arg)))
    return label, methods, order, np.asarray([cost(b) for b, _, _ in order])


def comparisons(methods) -> list[tuple[int, int]]:
    """(method, reference) of every judged speed test: each method against AR (the
    speedups), each lossy rule against its matched baseline (speedup_vs_matched)."""
    names = [m.name for m in methods]
    out = [(j, 0) for j in range(1, len(methods))]
    out += [(j, names.index(m.pairs[0])) for j, m in enumerate(methods)
            if not m.baseline and m.rule != 'lossless' and m.pairs]  # fmt: skip
    return out


def timed_rows(order, seconds) -> list[dict]:
    """The rows a run writes: each call's `seconds` shared by its batch's rows (24 tokens
    each), its place and design unit recorded."""
    rows = []
    for (batch, method, place), sec in zip(order, seconds):
        unit = design.unit(batch.number, batch.group_size)
        rows += [dict(method=method.name, task=task, item=it.id, seed=batch.seed, num_tokens=24,
                      seconds=sec / len(batch.rows), batch_id=batch.id,
                      batch=dict(place=place, unit=unit)) for task, it in batch.rows]  # fmt: skip
    return rows


def speedups(rows, methods) -> dict[tuple[str, str], dict]:
    """(group, method) -> `paired.speedup` of each method but AR against AR."""
    by: dict[tuple[str, str], list] = {}
    for r in rows:
        by.setdefault((timing.task_group(r['task']), r['method']), []).append(r)
    groups = sorted({g for g, _ in by})
    return {(g, m.name): paired.speedup(by[g, m.name], by[g, 'ar'])
            for g in groups for m in methods[1:]}  # fmt: skip


def linear(slope):
    return lambda u: 1 + slope * u


def sawtooth(phase, amplitude=0.15):
    return lambda u: 1 + amplitude * ((u + phase) % 1.0)


class Layout:
    """A schedule's batches in run order, their costs and start times (the monitor's calls
    before and after each group included), for simulating many runs of it."""

    def __init__(self, methods, order, base):
        self.m = len(methods)
        cost, self.batches = {}, []
        for (b, method, _), sec in zip(order, base):
            if not timing.is_monitor(method.name) and b.id not in {x.id for x in self.batches[-1:]}:
                self.batches.append(b)  # A batch's round: its calls run one after another.
            cost.setdefault(b.id, float(sec))
        self.cost = np.asarray([cost[b.id] for b in self.batches])
        starts, t = [], 0.0
        for k, b in enumerate(self.batches):
            t += len(timing.START_MONITORS) * self.cost[k] * (b.number == 0)  # The monitor.
            starts.append(t)
            t += self.m * self.cost[k]
            if k + 1 == len(self.batches) or self.batches[k + 1].group != b.group:
                t += len(timing.END_MONITORS) * cost[self.batches[k - b.number].id]
        self.starts, self.length = np.asarray(starts), t
        self.groups: dict[str, list[int]] = {}
        for k, b in enumerate(self.batches):
            self.groups.setdefault(b.group, []).append(k)
        judged = [k for ks in self.groups.values() if len(ks) >= verdicts.MIN_BATCHES for k in ks]
        self.round = self.m * float(np.median(self.cost[judged]))

    def places(self, seeds) -> np.ndarray:
        """[runs, batches, methods]: each method's place in each batch under run seed s."""
        out = np.empty((len(seeds), len(self.batches), self.m), int)
        for g, ks in self.groups.items():
            for i, s in enumerate(seeds):
                out[i, ks] = np.argsort(design.design(self.m, len(ks), s, g), axis=1)
        return out

    def moments(self, places) -> np.ndarray:
        return self.starts[None, :, None] + (places + 0.5) * self.cost[None, :, None]


def load(kind: str, t: np.ndarray, length: float, round_s: float, rng) -> np.ndarray:
    """The machine's slowness factor at moments t [runs, batches, methods] (module doc)."""
    shape, u = (len(t), 1, 1), t / length
    name, _, arg = kind.partition(' ')
    if name == 'periodic':
        period = float(arg) * round_s * rng.uniform(0.9, 1.1, shape)
        return 1 + 0.1 * np.sin(2 * np.pi * t / period + rng.uniform(0, 2 * np.pi, shape))
    if name == 'linear':
        return 1 + rng.uniform(-0.15, 0.15, shape) * u
    if name == 'sawtooth':
        return 1 + 0.15 * ((int(arg) * u + rng.uniform(0, 1, shape)) % 1.0)
    if name == 'step':
        return 1 + rng.uniform(-0.3, 0.3, shape) * (u > rng.uniform(0, 1, shape))
    steps = 400  # A Brownian path on a grid of the run, read at each call's moment.
    path = np.cumsum(rng.normal(0, 0.15 / np.sqrt(steps), (len(t), steps + 1)), 1)
    at = np.minimum(u * steps, steps - 1e-9)
    lo = np.floor(at).astype(int)
    flat = path[np.arange(len(t))[:, None], lo.reshape(len(t), -1)].reshape(t.shape)
    nxt = path[np.arange(len(t))[:, None], (lo + 1).reshape(len(t), -1)].reshape(t.shape)
    return np.exp(flat + (at - lo) * (nxt - flat))


def intervals(lay: Layout, methods, logsec: np.ndarray):
    """{(group, method, reference): (centre, half, df)} of the log speedups [runs] as
    `paired.ratio_interval` computes them: over batches, or over the design's units from
    paired.MIN_UNITS units on."""
    out = {}
    for g, ks in lay.groups.items():
        n = len(ks)
        if n < verdicts.MIN_BATCHES:
            continue
        units = [design.unit(k, n) for k in range(n)]
        for j, ref in comparisons(methods):
            x = logsec[:, ks, ref] - logsec[:, ks, j]
            if units[-1] + 1 >= paired.MIN_UNITS:
                x = np.stack([x[:, np.equal(units, u)].mean(1) for u in range(units[-1] + 1)], 1)
            half = stats.t.ppf(0.975, x.shape[1] - 1) * x.std(1, ddof=1) / np.sqrt(x.shape[1])
            out[g, methods[j].name, methods[ref].name] = (x.mean(1), half, x.shape[1] - 1)
    return out


def simulate(lay: Layout, methods, kind: str, runs: int, seed: int = 45):
    """(log seconds [runs, batches, methods], their places, the intervals) of `runs`
    simulated runs under a load of `kind`."""
    rng = np.random.default_rng(seed)
    places = lay.places(range(runs))
    t = lay.moments(places)
    logsec = (np.log(lay.cost)[None, :, None] + np.log(load(kind, t, lay.length, lay.round, rng))
              + rng.normal(0.0, NOISE, t.shape))  # fmt: skip
    return logsec, places, intervals(lay, methods, logsec)


def test_the_design_balances_every_method_place_and_relabels_every_unit_at_random():
    for m in (1, 2, 3, 12, 14, 27):
        for n in range(2, 9):  # One batch cannot balance: it gets no interval.
            orders = design.design(m, n, 3, 'speed')
            assert len(orders) == n and all(sorted(o) == list(range(m)) for o in orders)
            sums = [sum(o.index(i) for o in orders) for i in range(m)]
            # Equal sums where they can be (n even); else within one place of the mean.
            assert max(sums) - min(sums) <= (0 if n % 2 == 0 else 2), (m, n, sums)
            for k in range(3 * (n % 2), n, 2):  # Each pair: an order, then its reverse.
                assert orders[k + 1] == orders[k][::-1]
                assert design.unit(k, n) == design.unit(k + 1, n) == (k - 3 * (n % 2)) // 2 + (
                    n % 2)  # fmt: skip
            assert design.design(m, n, 3, 'speed') == orders  # A resumed run: the same.
    assert design.design(14, 5, 0, 'speed') != design.design(14, 5, 1, 'speed')
    assert design.design(14, 5, 0, 'speed') != design.design(14, 5, 0, 'mbpp')
    # No method holds a fixed place: over 700 run seeds AR's place in a group's first batch
    # takes each of 14 places 50 times on average (Binomial sd 6.8); all within 4 sd.
    counts = np.bincount([design.design(14, 5, s, 'speed')[0].index(0) for s in range(700)],
                         minlength=14)  # fmt: skip
    assert np.abs(counts - 50).max() <= 4 * np.sqrt(700 * (1 / 14) * (13 / 14)), counts
    with pytest.raises(ValueError, match='batches >= 1'):
        design.design(3, 0)
    with pytest.raises(ValueError, match='outside a group of 5'):
        design.unit(5, 5)


def test_rows_carry_places_and_the_monitor_retimes_each_groups_first_batch(layout):
    _, methods, order, _ = layout
    groups = {}
    for batch, method, place in order:
        groups.setdefault((batch.seed, batch.group), []).append((batch, method.name, place))
    for calls in groups.values():
        first, starts, ends = calls[0][0], timing.START_MONITORS, timing.END_MONITORS
        # AR on the group's first batch before its round, every batch of the group by every
        # method, then AR again on its first batch.
        assert calls[: len(starts)] == [(first, m, k - len(starts)) for k, m in enumerate(starts)]
        assert calls[-len(ends) :] == [(first, m, len(methods) + k) for k, m in enumerate(ends)]
        assert len(calls) == first.group_size * len(methods) + len(starts) + len(ends)
        rounds = calls[len(starts) : -len(ends)]
        assert {b.id for b, _, _ in calls} == {b.id for b, _, _ in rounds}
        assert not any(timing.is_monitor(m) for _, m, _ in rounds)


def test_equal_methods_on_drifting_machines_keep_1_in_every_interval(layout):
    """No noise: linear drift of +-15% and a 15% sawtooth at three phases; every method of
    a group of five batches has an interval and it holds 1 (the global rotation excluded
    it: lenience l 0.2 1.0149 [1.0143, 1.0155] in the issue); a one-batch group (MBPP) has
    no interval: 'n batches 1'. (The paper layout: in the noisy simulation below.)"""
    name, methods, order, base = layout
    if name == 'paper':
        pytest.skip('the paper layout is in the noisy simulation (test_speed_intervals_...)')
    drifts = [linear(0.15), linear(-0.15)] + [sawtooth(phase) for phase in (0.0, 0.3, 0.7)]
    for drift in drifts:
        for (group, method), est in speedups(timed_rows(order, base * drift(moments(base))),
                                             methods).items():  # fmt: skip
            if est['speedup_n_batches'] < paired.MIN_BATCHES:
                assert group == 'mbpp' and est['speedup_n_batches'] == 1
                assert est['speedup_lo'] is None
                continue
            assert est['speedup_lo'] <= 1.0 <= est['speedup_hi'], (group, method, est)


def moments(base) -> np.ndarray:
    """Each call's moment as a fraction of the run (its middle)."""
    ends = np.cumsum(base)
    return (ends - base / 2) / ends[-1]


def reseeded(methods, order, seed: int) -> list:
    """The schedule of the same plan under another run seed (`timing.interleave` over its
    batches with the seed replaced)."""
    batches = list({b.index: b for b, _, _ in order}.values())
    batches = [dataclasses.replace(b, seed=seed) for b in sorted(batches, key=lambda b: b.index)]
    return timing.interleave(batches, methods, lambda b, m: True, runner.monitor)


def test_the_simulation_is_the_real_schedule_and_estimator(layout):
    """The vectorised simulation runs `timing.interleave`'s schedule under each run seed
    (the calls in the same order) and its intervals are `paired.speedup`'s (to 1e-9)."""
    name, methods, order, base = layout
    lay = Layout(methods, order, base)
    logsec, places, est = simulate(lay, methods, 'periodic 1.3', 3)
    names = [m.name for m in methods]
    for run in (0, 2):
        sched = reseeded(methods, order, run)
        calls = [(b.index, names.index(m.name)) for b, m, _ in sched
                 if not timing.is_monitor(m.name)]  # fmt: skip
        index = {b.index: k for k, b in enumerate(lay.batches)}
        t = lay.moments(places[run : run + 1])[0]
        assert calls == sorted(calls, key=lambda c: t[index[c[0]], c[1]])
        seconds = [np.exp(logsec[run, index[b.index], names.index(m.name)])
                   if not timing.is_monitor(m.name) else 1.0 for b, m, _ in sched]  # fmt: skip
        for (group, method), row in speedups(timed_rows(sched, seconds), methods).items():
            if row['speedup_lo'] is None:
                continue
            centre, half, _ = est[group, method, 'ar']
            assert np.isclose(np.log(row['speedup']), centre[run], atol=1e-9)
            assert np.isclose(np.log(row['speedup_hi']), centre[run] + half[run], atol=1e-9)
            units = design.unit(len(lay.groups[group]) - 1, len(lay.groups[group])) + 1
            assert row['speedup_n_units'] == (units if units >= paired.MIN_UNITS else None)


@pytest.mark.parametrize('kind', KINDS)
def test_speed_intervals_hold_1_under_every_load(layout, kind):
    """Equal methods: each judged speed test's 95% interval holds 1 in at least 93% of the
    simulated runs and Holm over the layout's family of speed tests rejects in at most 7%
    (the issue's bounds; module doc for the runs and their binomial spread). Measured at
    these seeds (worst test's coverage / family-wise error), docs/eval.md, timing."""
    name, methods, order, base = layout
    lay = Layout(methods, order, base)
    runs = SIMS.get(name, DEFAULT_SIMS)
    _, _, est = simulate(lay, methods, kind, runs)
    cover = {key: float(np.mean(np.abs(c) <= h)) for key, (c, h, _) in est.items()}
    ps = np.stack([2 * stats.t.sf(np.abs(c) / (h / stats.t.ppf(0.975, df)), df)
                   for c, h, df in est.values()], 1)  # fmt: skip
    holm = np.maximum.accumulate(np.minimum(1.0, (ps.shape[1] - np.arange(ps.shape[1]))
                                            * np.sort(ps, 1)), axis=1)  # fmt: skip
    fwe = float(np.mean((holm < verdicts.ALPHA).any(1)))
    worst = min(cover, key=cover.get)
    print(f'{name} {kind}: worst coverage {cover[worst]:.3f} ({worst}), mean '
          f'{np.mean(list(cover.values())):.3f} over {len(cover)} tests, Holm family-wise '
          f'error {fwe:.3f} ({runs} runs)')
    assert fwe <= BOUNDS[1], fwe
    if name == 'paper':
        assert cover[worst] >= PAPER_BOUNDS[0], cover[worst]
        assert np.mean(list(cover.values())) >= PAPER_BOUNDS[1], cover
    else:
        assert cover[worst] >= BOUNDS[0], cover[worst]
