"""Interleaved timing: the batch plan (one task group per batch, ids a resumed run
rebuilds), the rotating schedule, the per-batch speedup estimator against drift (pure, on
constructed rows), and the runner end to end with a fake clock injected (no real sleeps):
a method slowed on purpose shows it in its own speedup only, and a clock that drifts for
every method leaves each speedup within its interval of the undisturbed one."""

from __future__ import annotations

import dataclasses
import os

import pytest

from spec_jax.eval import metrics, paired, runner, timing
from spec_jax.jobs import evaluate, runtime

CONFIG = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'experiments',
                      'smollm2_135m.py')  # fmt: skip


@dataclasses.dataclass(frozen=True)
class It:
    id: str


def test_batch_plan_groups_tasks_and_keeps_ids():
    rows = [('gsm8k', It(str(i))) for i in range(6)]
    rows += [(f'speed_{s}', It(str(i))) for s in ('qa', 'alpaca') for i in range(2)]
    plan = timing.batch_plan(rows, 0, 4, lambda r: (r[0], r[1].id))
    assert [b.group for b in plan] == ['gsm8k', 'gsm8k', 'speed']
    assert [len(b.rows) for b in plan] == [4, 2, 4]  # Only a group's last batch is short.
    assert all(len({timing.task_group(t) for t, _ in b.rows}) == 1 for b in plan)
    assert {t for t, _ in plan[2].rows} == {'speed_qa', 'speed_alpaca'}  # They share one.
    assert [b.index for b in plan] == [0, 1, 2]
    assert plan[0].id.startswith('s0/gsm8k/0/') and len({b.id for b in plan}) == 3
    # The same rows in another order (a resumed run) give the same batches and ids; another
    # seed or other rows give other ids.
    assert timing.batch_plan(rows[::-1], 0, 4, lambda r: (r[0], r[1].id)) == plan
    assert timing.batch_plan(rows, 1, 4, lambda r: (r[0], r[1].id))[0].id.startswith('s1/')
    fewer = timing.batch_plan(rows[1:], 0, 4, lambda r: (r[0], r[1].id))
    assert fewer[0].id != plan[0].id


def test_interleave_rotates_and_skips_what_is_done():
    plan = timing.batch_plan([('t', It(str(i))) for i in range(8)], 0, 2, lambda r: r[1].id)
    order = timing.interleave(plan, ['ar', 'a', 'b'], lambda b, m: True)
    assert [(b.index, m, place) for b, m, place in order[:6]] == [
        (0, 'ar', 0), (0, 'a', 1), (0, 'b', 2), (1, 'a', 0), (1, 'b', 1), (1, 'ar', 2)]  # fmt: skip
    for index in range(4):  # Every batch by every method before the next batch.
        assert sorted(m for b, m, _ in order[3 * index : 3 * index + 3]) == ['a', 'ar', 'b']
    done = timing.interleave(plan, ['ar', 'a', 'b'], lambda b, m: (b.index, m) != (1, 'b'))
    assert len(done) == 11 and (1, 'b') not in {(b.index, m) for b, m, _ in done}


def timed_rows(order, per_method, drift, rows_per_batch=4):
    """Rows of a constructed run: each scheduled (batch, method) takes per_method[m] x
    drift(slot) seconds for 10 tokens a row, its rows sharing them equally."""
    out = []
    for slot, (batch, method) in enumerate(order):
        seconds = per_method[method] * drift(slot) / rows_per_batch
        for k in range(rows_per_batch):
            out.append(dict(method=method, item=f'{batch}.{k}', seed=0, num_tokens=10,
                            seconds=seconds, batch_id=str(batch)))  # fmt: skip
    return out


def test_interleaving_cancels_drift_that_sequential_runs_keep():
    """A machine slowing to half speed over the run: methods one after another credit the
    slowdown to the one that ran last; interleaved by batch, the speedup's interval holds
    the undisturbed speedup (2)."""
    per_method, batches = {'ar': 1.0, 'spec': 0.5}, 10
    slots = 2 * batches

    def drift(slot):
        return 1.0 + slot / slots

    def speedup(order):
        rows = timed_rows(order, per_method, drift)
        return paired.speedup([r for r in rows if r['method'] == 'spec'],
                              [r for r in rows if r['method'] == 'ar'])  # fmt: skip

    sequential = [(b, m) for m in ('ar', 'spec') for b in range(batches)]
    plan = timing.batch_plan([('t', It(str(i))) for i in range(batches)], 0, 1, lambda r: r[1].id)
    interleaved = [(b.index, m) for b, m, _ in timing.interleave(plan, ['ar', 'spec'],
                                                                 lambda b, m: True)]  # fmt: skip
    seq, inter = speedup(sequential), speedup(interleaved)
    assert seq['speedup_n_batches'] == inter['speedup_n_batches'] == batches
    assert seq['speedup_hi'] < 2.0  # Biased: spec ran on the slower machine.
    assert inter['speedup_lo'] <= 2.0 <= inter['speedup_hi']
    assert abs(inter['speedup'] - 2.0) < abs(seq['speedup'] - 2.0) / 10
    few = timed_rows(interleaved[:8], per_method, drift)  # 4 batches: no interval.
    est = paired.speedup([r for r in few if r['method'] == 'spec'],
                         [r for r in few if r['method'] == 'ar'])  # fmt: skip
    assert est['speedup_n_batches'] == 4 and est['speedup_lo'] is est['speedup_hi'] is None


class FakeClock:
    """A clock the runner reads once before and once after each decode call: call 2k + 1
    returns call 2k's time plus seconds(k), the k-th scheduled (batch, method)."""

    def __init__(self, seconds):
        self.seconds, self.calls, self.now = seconds, 0, 1000.0

    def __call__(self) -> float:
        if self.calls % 2:
            self.now += self.seconds(self.calls // 2)
        self.calls += 1
        return self.now


@pytest.fixture(scope='module')
def fake_runs(tmp_path_factory):
    """One small run on the real clock (it compiles), then three on fake clocks over the
    same schedule (20 GSM8K items, batches of 4, AR, lossless SD and lenience): undisturbed,
    lenience slowed 2x, and every method on a machine slowing to half speed."""
    c = runtime.load_config(CONFIG, 'tiny')
    c.grid, c.progress = ('lenience:l=0.5',), False
    c.tasks = {'gsm8k': evaluate.task(20, 4)}
    methods = runner.methods_of(c)
    factor = {'ar': 1.0, 'lossless': 0.8, 'lenience:l=0.5': 0.6}

    def method_at(k):  # Nothing done yet: slot k is batch k // 3 at place k % 3.
        return timing.rotation(methods, k // len(methods))[k % len(methods)].name

    def batch_cost(k):  # Batches differ in cost.
        return 1.0 + 0.25 * (k // len(methods))

    clocks = {
        'undisturbed': lambda k: batch_cost(k) * factor[method_at(k)],
        'slowed': lambda k: batch_cost(k) * factor[method_at(k)]
        * (2.0 if method_at(k) == 'lenience:l=0.5' else 1.0),
        'drift': lambda k: batch_cost(k) * factor[method_at(k)] * (1.0 + k / 15),
    }
    root = tmp_path_factory.mktemp('timing')
    runner.run(c, str(root / 'real'))  # Compiles: the fake runs below compile nothing.
    out = {}
    for name, seconds in clocks.items():
        store, _, progress = runner.run(c, str(root / name), clock=FakeClock(seconds))
        assert progress.compile_s == 0.0
        results = runner.results(store)
        out[name] = (results, {r['method']: r for r in metrics.aggregate(results, methods)},
                     progress)  # fmt: skip
    return methods, method_at, out


def test_rows_record_their_batch_and_the_rotation(fake_runs):
    methods, method_at, runs = fake_runs
    results, _, progress = runs['undisturbed']
    batches = {}
    for r in results:
        batches.setdefault(r['batch_id'], set()).add(r['method'])
        assert r['batch']['id'] == r['batch_id']
        assert method_at(r['batch']['slot']) == r['method']  # The schedule the clock assumed.
    assert len(batches) == 5 and all(len(m) == len(methods) for m in batches.values())
    # The same rows got the same batch ids in every run.
    assert {r['batch_id'] for r in runs['drift'][0]} == set(batches)
    (group,) = progress.ar_first_tokens_per_s  # One timing group in this run.
    assert progress.ar_first_tokens_per_s[group] == pytest.approx(
        sum(r['num_tokens'] for r in results if r['method'] == 'ar'
            and r['batch']['slot'] == 0) / 1.0)  # fmt: skip


def test_a_slowed_method_shows_it_in_its_own_speedup_only(fake_runs):
    _, _, runs = fake_runs
    base, slow = runs['undisturbed'][1], runs['slowed'][1]
    assert base['ar']['speedup'] == slow['ar']['speedup'] == 1.0
    assert slow['lossless']['speedup'] == pytest.approx(base['lossless']['speedup'], rel=1e-9)
    assert slow['lenience:l=0.5']['speedup'] == pytest.approx(
        base['lenience:l=0.5']['speedup'] / 2, rel=1e-9
    )
    assert slow['lenience:l=0.5']['speedup_vs_matched'] == pytest.approx(
        base['lenience:l=0.5']['speedup_vs_matched'] / 2, rel=1e-9
    )
    for r in base.values():
        assert r['speedup_n_batches'] == 5 and r['speedup_lo'] <= r['speedup'] <= r['speedup_hi']


def test_drift_for_every_method_stays_within_the_interval(fake_runs):
    _, _, runs = fake_runs
    base, drift = runs['undisturbed'][1], runs['drift'][1]
    for method, r in drift.items():
        assert r['speedup_lo'] <= base[method]['speedup'] <= r['speedup_hi'], method
    first, last = runs['drift'][2].ar_first_tokens_per_s, runs['drift'][2].ar_last_tokens_per_s
    assert list(first) == list(last) and all(last[g] < first[g] for g in first)  # Printed.


def test_sets_sharing_a_batch_pair_row_by_row():
    """Two speed sets in one batch whose item ids repeat: every row pairs with AR's row of
    the same set (AR takes 2 s a row on speed_qa and 4 s on speed_alpaca, the method 1 s on
    both: 3x on each batch; paired by item id alone, a set would stand in for the other)."""
    ar_seconds = {'speed_qa': 2.0, 'speed_alpaca': 4.0}
    rows = []
    for method in ('ar', 'spec'):
        for batch in range(5):
            rows += [dict(method=method, task=task, item=str(i), seed=0, num_tokens=10,
                          seconds=ar_seconds[task] if method == 'ar' else 1.0,
                          batch_id=f's0/speed/{batch}')
                     for task in ('speed_qa', 'speed_alpaca') for i in range(2)]  # fmt: skip

    def speedup(rows):
        return paired.speedup([r for r in rows if r['method'] == 'spec'],
                              [r for r in rows if r['method'] == 'ar'])  # fmt: skip

    est = speedup(rows)
    assert est['speedup'] == pytest.approx(3.0) and est['speedup_n_batches'] == 5
    # AR's rows of one set missing: the batch pairs on the rows both have (speed_qa's).
    est = speedup([r for r in rows if r['method'] == 'spec' or r['task'] == 'speed_qa'])
    assert est['speedup'] == pytest.approx(2.0)
