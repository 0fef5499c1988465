"""Interleaved timing: the batch plan (one task group per batch, ids a resumed run
rebuilds), the balanced schedule, the per-batch speedup estimator against drift (pure, on
constructed rows), and the runner end to end with a fake clock injected (no real sleeps):
a method slowed on purpose shows it in its own speedup only, and a clock that drifts for
every method leaves each speedup within its interval of the undisturbed one."""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from spec_jax.eval import findings, machine, metrics, records, runner, timing
from spec_jax.eval.stats import design, paired
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


def test_interleave_follows_the_design_skips_what_is_done_and_monitors():
    plan = timing.batch_plan([('t', It(str(i))) for i in range(8)], 0, 2, lambda r: r[1].id)
    assert [(b.number, b.group_size) for b in plan] == [(k, 4) for k in range(4)]
    order = timing.interleave(plan, ['ar', 'a', 'b'], lambda b, m: True, lambda n: f'[{n}]')
    # The monitor's start calls; each pair of batches an order and its reverse (the
    # design's, relabelled from the seed); then the monitor's end calls.
    starts, ends = timing.START_MONITORS, timing.END_MONITORS
    assert [(b.index, m, place) for b, m, place in order[:2]] == [
        (0, f'[{starts[0]}]', -2), (0, f'[{starts[1]}]', -1)]  # fmt: skip
    order = order[2:]
    orders = design.design(3, 4, 0, 't')
    names = ['ar', 'a', 'b']
    assert [(b.index, m, place) for b, m, place in order[:6]] == [
        (k, names[i], place) for k in (0, 1) for place, i in enumerate(orders[k])]  # fmt: skip
    assert [m for _, m, _ in order[3:6]] == [m for _, m, _ in order[:3]][::-1]
    assert [(b.index, m, place) for b, m, place in order[12:]] == [
        (0, f'[{m}]', 3 + k) for k, m in enumerate(ends)]  # fmt: skip
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
    """A clock `decoding.generate` reads three times per decode call: before its prefill
    call, after it, after the rounds. Call k takes prefill(k) then seconds(k) - prefill(k)."""

    def __init__(self, seconds, prefill):
        self.seconds, self.prefill, self.calls, self.now = seconds, prefill, 0, 1000.0

    def __call__(self) -> float:
        k, phase = divmod(self.calls, 3)
        self.now += (0.0, self.prefill(k), self.seconds(k) - self.prefill(k))[phase]
        self.calls += 1
        return self.now


@pytest.fixture(scope='module')
def fake_runs(tmp_path_factory):
    """One small run on the real clock (it compiles), then three on fake clocks over the
    same schedule (20 GSM8K items, batches of 4, AR, lossless SD and lenience): undisturbed,
    lenience slowed 2x, and every method on a machine slowing to half speed. A call's
    prefill takes 0.4 s x its batch's cost whatever the method."""
    c = runtime.load_config(CONFIG, 'tiny')
    c.grid, c.progress = ('lenience:l=0.5',), False
    c.tasks = {'gsm8k': evaluate.task(20, 4)}
    methods = runner.methods_of(c)
    factor = {'ar': 1.0, 'lossless': 0.8, 'lenience:l=0.5': 0.6}
    factor.update({m: 1.0 for m in timing.START_MONITORS + timing.END_MONITORS})
    root = tmp_path_factory.mktemp('timing')
    real, _, _ = runner.run(c, str(root / 'real'))  # Compiles: the fake runs compile nothing.
    # The schedule (nothing done: every run has the same): slot -> (method, batch number).
    slots = {r['batch']['slot']: (r['method'], int(r['batch_id'].split('/')[2]))
             for r in real.rows}  # fmt: skip

    def method_at(k):
        return slots[k][0]

    def batch_cost(k):  # Batches differ in cost.
        return 1.0 + 0.25 * slots[k][1]

    def prefill(k):
        return 0.4 * batch_cost(k)

    clocks = {
        'undisturbed': lambda k: prefill(k) + batch_cost(k) * factor[method_at(k)],
        'slowed': lambda k: prefill(k) + batch_cost(k) * factor[method_at(k)]
        * (2.0 if method_at(k) == 'lenience:l=0.5' else 1.0),
        'drift': lambda k: (prefill(k) + batch_cost(k) * factor[method_at(k)]) * (1.0 + k / 15),
    }
    out = {}
    for name, seconds in clocks.items():
        store, _, progress = runner.run(c, str(root / name), clock=FakeClock(seconds, prefill))
        assert progress.compile_s == 0.0
        results = runner.results(store)
        out[name] = (results, {r['method']: r for r in metrics.aggregate(results, methods)},
                     progress)  # fmt: skip
    return methods, method_at, out


def test_rows_record_their_batch_place_prefill_and_provenance(fake_runs):
    methods, method_at, runs = fake_runs
    results, _, progress = runs['undisturbed']
    batches = {}
    for r in results:
        batches.setdefault(r['batch_id'], set()).add(r['method'])
        b, number = r['batch'], int(r['batch_id'].split('/')[2])
        assert b['id'] == r['batch_id']
        assert method_at(b['slot']) == r['method']  # The schedule the clock assumed.
        if timing.is_monitor(r['method']):
            assert b['place'] in (-2, -1, *range(len(methods), len(methods) + 3))
            assert r['correct'] is None  # Not scored.
        else:
            batch = timing.Batch(r['batch_id'], 0, 'gsm8k', number, (), number, 5)
            assert timing.order(methods, batch)[b['place']].name == r['method']
        assert b['prefill_s'] == pytest.approx(0.4 * (1.0 + 0.25 * number))  # The fake's.
        assert {b[k] for k in ('invocation', 'host', 'started')} == {
            records.PROVENANCE[k] for k in ('invocation', 'host', 'started')}  # fmt: skip
    assert len(batches) == 5 and all(len(m) >= len(methods) for m in batches.values())
    assert sum(timing.MONITOR in m for m in batches.values()) == 1  # One group, one monitor.
    # The same rows got the same batch ids in every run.
    assert {r['batch_id'] for r in runs['drift'][0]} == set(batches)
    # Scoring ran after each round, never beside a timed call.
    assert progress.score_s > 0 and progress.overlapped == 0
    assert records.provenance(results)['within_one']


def test_a_slowed_method_shows_it_in_its_own_speedup_only(fake_runs):
    _, _, runs = fake_runs
    base, slow = runs['undisturbed'][1], runs['slowed'][1]
    assert base['ar']['speedup'] == slow['ar']['speedup'] == 1.0
    assert slow['lossless']['speedup'] == pytest.approx(base['lossless']['speedup'], rel=1e-9)
    assert slow['lenience:l=0.5']['decode_speedup'] == pytest.approx(
        base['lenience:l=0.5']['decode_speedup'] / 2, rel=1e-9
    )
    assert slow['lenience:l=0.5']['speedup_vs_matched'] < base['lenience:l=0.5'][
        'speedup_vs_matched'] / 1.5  # The prefill it did not slow dilutes the 2x.  # fmt: skip
    for r in base.values():
        assert r['speedup_n_batches'] == 5 and r['speedup_lo'] <= r['speedup'] <= r['speedup_hi']
        assert r['decode_speedup_n_batches'] == 5


def test_decode_speedup_takes_the_prefill_out(fake_runs):
    """Prefill costs every method alike, so it pulls end-to-end speedups towards 1; the
    decode-only speedup (tokens after the first over the seconds after the prefill call,
    per batch against AR's) is what the rounds gained: here computed by hand from rows."""
    _, _, runs = fake_runs
    results, rows, _ = runs['undisturbed']
    by: dict[tuple, list] = {}
    for r in results:
        by.setdefault((r['method'], r['batch_id']), []).append(r)

    def rate(group):
        b = group[0]['batch']
        return (sum(r['num_tokens'] - 1 for r in group)) / (b['seconds'] - b['prefill_s'])

    for method in ('lossless', 'lenience:l=0.5'):
        ratios = [rate(by[method, batch]) / rate(by['ar', batch]) for m, batch in by
                  if m == method]  # fmt: skip
        expected = paired.ratio_interval(ratios)['mean']
        r = rows[method]
        assert r['decode_speedup'] == pytest.approx(expected, rel=1e-9)
        assert 0 < r['prefill_share'] < 1


def test_the_speed_cap_note_names_both_causes_with_measured_shares(fake_runs):
    """Lossless SD below 1.5x: the note names verification's cost and the prefill, with the
    run's end-to-end and decode-only speedups and the prefill's share of AR's seconds."""
    _, _, runs = fake_runs
    rows = list(runs['undisturbed'][1].values())
    (note,) = [line for line in findings.untestable(rows, 'chain') if 'prefill' in line]
    lossless, ar = runs['undisturbed'][1]['lossless'], runs['undisturbed'][1]['ar']
    assert 'verifying T tokens costs' in note
    assert (f"gsm8k: lossless SD {lossless['speedup']:.2f}x end to end, "
            f"{lossless['decode_speedup']:.2f}x after the prefill, which takes "
            f"{100 * ar['prefill_share']:.0f}% of AR's seconds") in note  # fmt: skip


def test_drift_for_every_method_stays_within_the_interval(fake_runs):
    _, _, runs = fake_runs
    base, drift = runs['undisturbed'][1], runs['drift'][1]
    for method, r in drift.items():
        assert r['speedup_lo'] <= base[method]['speedup'] <= r['speedup_hi'], method
    # The monitor: AR on the same rows at the group's start and end sees the slowdown.
    (reading,) = timing.drift(runs['drift'][0]).values()
    assert reading['ratio'] < 0.8 and reading['same_invocation']
    (steady,) = timing.drift(runs['undisturbed'][0]).values()
    assert steady['ratio'] == pytest.approx(1.0)
    assert 'x1.000' in timing.drift_lines(runs['undisturbed'][0])['drift s0/gsm8k']


def test_a_run_resumed_by_another_invocation_on_another_host_reports_the_mix(
    fake_runs, tmp_path, monkeypatch
):
    """The undisturbed run's rows less lenience's on one batch, resumed by an invocation
    on host 'elsewhere': the rows it writes carry it, and the provenance says that
    speed pairs mix invocations (the report's header line)."""
    methods, _, runs = fake_runs
    results = runs['undisturbed'][0]
    drop = sorted({r['batch_id'] for r in results})[0]
    kept = [r for r in results if not (r['batch_id'] == drop and r['method'] == 'lenience:l=0.5')]
    c = runtime.load_config(CONFIG, 'tiny')
    c.grid, c.progress = ('lenience:l=0.5',), False
    c.tasks = {'gsm8k': evaluate.task(20, 4)}
    records.ResultStore(str(tmp_path), c.to_dict(), [])
    with open(tmp_path / 'results.jsonl', 'w') as f:
        f.writelines(json.dumps(r) + '\n' for r in kept)
    other = dict(invocation='second', host='elsewhere', started=2e9)
    monkeypatch.setattr(runner, 'PROVENANCE', other)
    store, _, progress = runner.run(c, str(tmp_path), clock=FakeClock(lambda k: 2.0,
                                                                      lambda k: 0.5))  # fmt: skip
    assert progress.samples == 4
    info = records.provenance(store.rows)
    assert info['hosts'] == sorted([records.PROVENANCE['host'], 'elsewhere'])
    assert len(info['invocations']) == 2 and info['mixed_pairs'] == 1 and not info['within_one']
    text = records.provenance_text(info)
    assert text.startswith('2 invocations on ') and 'MIXED: 1 of ' in text
    assert f'- provenance: {text}' in machine.header_lines(dict(provenance=text))


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
