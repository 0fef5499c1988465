"""The timing design against drift, simulated on the real layouts: the schedule of the main
job (configs/experiments/smollm2_135m.py: 14 methods, MBPP one batch, the speed sets five)
and of the engines' rules (chain: 27 methods, tree: 12; five speed batches each) from the
real `runner.schedule` (`timing.batch_plan`, `timing.interleave`, the drift monitor), run
on an injected clock (no model: each call's seconds are its batch's cost times the
machine's drift at that moment times noise), and the speedups from the real
`paired.speedup`. Every method is equally fast, so every speedup's interval should hold 1.

Drift over the run fraction u in [0, 1]: linear (1 + s u), a sawtooth of 15% over the run
(1 + 0.15 frac(u + phase): a ramp and one drop at a random moment), and their product."""

from __future__ import annotations

import os

import numpy as np
import pytest

from spec_jax.decoding import batching
from spec_jax.eval import paired, runner, timing
from spec_jax.jobs import runtime

EXPERIMENTS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'experiments')
LAYOUTS = [('smollm2_135m.py', None), ('smollm2_135m_engines.py', None),
           ('smollm2_135m_engines.py', 'tree')]  # fmt: skip
SEEDS = 200
NOISE = 0.03  # Lognormal sigma of each (batch, method) call's seconds.


class NothingDone:
    def is_done(self, key) -> bool:
        return False


def prompt_len(row) -> int:
    """A stand-in for the tokenized length (no tokenizer here): characters / 4 plus the
    template's ~20 tokens; it orders and buckets the rows as the real one roughly does."""
    return sum(len(m['content']) for m in row[1].messages) // 4 + 20


@pytest.fixture(scope='module', params=LAYOUTS, ids=lambda p: ':'.join(filter(None, p)))
def layout(request):
    """(methods, schedule, per-call base seconds) of a real config's plan."""
    name, arg = request.param
    c = runtime.load_config(os.path.join(EXPERIMENTS, name), arg)
    methods = runner.methods_of(c)
    order = runner.schedule(c, methods, runner.load_items(c), NothingDone(), prompt_len)

    def cost(batch):  # Prefill by the bucket, then the tokens.
        bucket = max(batching.prompt_bucket_of(prompt_len(r), c.prompt_bucket,
                                               c.max_prompt_len) for r in batch.rows)  # fmt: skip
        return (bucket + 4 * max(c.tasks[t].max_new_tokens for t, _ in batch.rows)) / 100

    return methods, order, np.asarray([cost(b) for b, _, _ in order])


def timed_rows(order, base, drift, noise) -> list[dict]:
    """The rows a run on this clock writes: each call's seconds base x drift(moment) x
    noise, shared by its batch's rows (24 tokens each), its place recorded."""
    ends = np.cumsum(base)
    moment = (ends - base / 2) / ends[-1]
    rows = []
    for (batch, method, place), seconds in zip(order, base * drift(moment) * noise):
        rows += [dict(method=method.name, task=task, item=it.id, seed=batch.seed, num_tokens=24,
                      seconds=seconds / len(batch.rows), batch_id=batch.id,
                      batch=dict(place=place)) for task, it in batch.rows]  # fmt: skip
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


def test_the_design_balances_every_method_place_and_runs_ar_in_the_middle():
    for m in (1, 2, 3, 12, 14, 27):
        for n in range(2, 9):  # One batch cannot balance: it gets no interval.
            orders = timing.design(m, n)
            assert len(orders) == n and all(sorted(o) == list(range(m)) for o in orders)
            sums = [sum(o.index(i) for o in orders) for i in range(m)]
            # Equal sums where they can be (n even); else within one place of the mean.
            assert max(sums) - min(sums) <= (0 if n % 2 == 0 else 2), (m, n, sums)
            assert all(abs(o.index(0) - (m - 1) / 2) <= 1 for o in orders)
    with pytest.raises(ValueError, match='batches >= 1'):
        timing.design(3, 0)


def test_rows_carry_places_and_the_monitor_retimes_each_groups_first_batch(layout):
    methods, order, _ = layout
    groups = {}
    for batch, method, place in order:
        groups.setdefault((batch.seed, batch.group), []).append((batch, method.name, place))
    for calls in groups.values():
        first = calls[0][0]
        # Every batch of the group by every method, then AR again on its first batch.
        assert calls[-1] == (first, timing.MONITOR, len(methods))
        assert len(calls) == first.group_size * len(methods) + 1
        assert {b.id for b, _, _ in calls} == {b.id for b, _, _ in calls[:-1]}


def test_equal_methods_on_drifting_machines_keep_1_in_every_interval(layout):
    """No noise: linear drift of +-15% and a 15% sawtooth at three phases; every method of
    a group of five batches has an interval and it holds 1 (the global rotation excluded
    it: lenience l 0.2 1.0149 [1.0143, 1.0155] in the issue); a one-batch group (MBPP) has
    no interval: 'n batches 1'."""
    methods, order, base = layout
    drifts = [linear(0.15), linear(-0.15)] + [sawtooth(phase) for phase in (0.0, 0.3, 0.7)]
    for drift in drifts:
        for (group, method), est in speedups(timed_rows(order, base, drift, 1.0),
                                             methods).items():  # fmt: skip
            if est['speedup_n_batches'] < paired.MIN_BATCHES:
                assert group == 'mbpp' and est['speedup_n_batches'] == 1
                assert est['speedup_lo'] is None
                continue
            assert est['speedup_lo'] <= 1.0 <= est['speedup_hi'], (group, method, est)


def test_intervals_cover_1_under_random_drift_and_noise(layout):
    """Over 200 seeds: 3% lognormal noise per (batch, method), a slope drawn in [-15%,
    +15%] times a 15% sawtooth at a random phase. Bound: each method's 95% interval holds
    1 in at least 93% of the seeds (the issue's; a calibrated interval's count is
    Binomial(200, 0.95), sd 1.5 points, so the worst of 26 methods has little slack:
    noise alone gives 91.5-92.5% for it on other seeds). Measured: worst 94.0% (main job),
    94.0% (engines, chain), 94.5% (tree). At 3% noise this check hardly tells designs
    apart (the global rotation's worst: 93.5%, 94.0%, 93.0%); the noiseless one above
    does."""
    methods, order, base = layout
    hits: dict[tuple[str, str], int] = {}
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        slope, phase = rng.uniform(-0.15, 0.15), rng.uniform()
        drift = lambda u: linear(slope)(u) * sawtooth(phase)(u)  # noqa: E731, B023
        noise = np.exp(rng.normal(0.0, NOISE, len(order)))
        for key, est in speedups(timed_rows(order, base, drift, noise), methods).items():
            if est['speedup_lo'] is not None:
                hits[key] = hits.get(key, 0) + (est['speedup_lo'] <= 1.0 <= est['speedup_hi'])
    assert hits and all(key[0] == 'speed' for key in hits)
    coverage = {key: n / SEEDS for key, n in hits.items()}
    print(f'coverage of 1 over {SEEDS} seeds: worst {min(coverage.values()):.3f}, mean '
          f'{np.mean(list(coverage.values())):.3f} over {len(coverage)} methods')
    assert min(coverage.values()) >= 0.93, sorted(coverage.items(), key=lambda kv: kv[1])[:3]
