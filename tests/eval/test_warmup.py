"""Warm-ups (spec_jax.eval.warmup) and the drift monitor's judgement (spec_jax.eval.monitor).

The runner end to end on a fake machine: `decoding.generate` replaced by a stand-in that runs
no model and advances an injected clock by each call's true seconds (a prefill per row, then
a per-token cost per method), plus a first-execution cost on the first call of each program
(the engine's structure, the batch's rows and its prompt bucket: what jit keys an executable
on). With warm-ups every timed call reads exactly its true seconds and every speedup equals
the injected truth, and the monitor reads x1.000; with warm-ups off the first-execution
costs land on timed calls, the speedups move, and the monitor warns naming warm-up.
"""

from __future__ import annotations

import os
import time

import jax
import pytest

from spec_jax import decoding, rules
from spec_jax.decoding import batching
from spec_jax.decoding.stats import Stats, summarize
from spec_jax.eval import machine, metrics, monitor, runner, timing, warmup
from spec_jax.jobs import evaluate, runtime

CONFIG = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'experiments',
                      'smollm2_135m.py')  # fmt: skip
FIRST = 5.0  # Seconds of a program's first execution beyond its later ones (injected).
PREFILL = 0.1  # True seconds of the prefill, per row.
TOKENS = 4  # Every row's limit; the fake emits exactly this many tokens.
ROWS = 4  # Batch size: 24 speed rows, six full batches.


def per_token(drafts: bool, rule, baseline: bool) -> float:
    """True seconds a token of each method (AR, lossless, lenience, min-p, its baseline)."""
    if not drafts:
        return 0.010
    kind = type(rule).__name__.lower()
    if 'minp' in kind:
        return 0.0075 if baseline else 0.007
    return 0.006 if 'lenien' in kind else 0.008


def method_cost(m) -> float:
    return per_token(m.mode != 'ar', rules.make(m.rule), m.baseline)


class FakeMachine:
    """`decoding.generate`'s stand-in and the clock it advances: each call reads `clock` as
    generate does (before the prefill, after it, after the rounds); the injected clock moves
    by the call's true prefill and rounds seconds, each plus half of FIRST on the first call
    of a program. A call given another clock (the warm-ups' wall clock) pays its charge off
    the injected one."""

    def __init__(self):
        self.now, self.pending, self.programs = 0.0, [], []

    def clock(self) -> float:
        self.now += self.pending.pop(0) if self.pending else 0.0
        return self.now

    def generate(self, engine, params, prompts, *, seed=0, max_new_tokens=None,
                 sample_ids=None, clock=time.perf_counter):  # fmt: skip
        del params, seed, sample_ids
        dec = engine.decode
        bucket = batching.prompt_bucket_of(max(map(len, prompts)), dec.prompt_bucket,
                                           dec.max_prompt_len)  # fmt: skip
        key = (jax.tree.structure(engine), len(prompts), bucket)
        extra = 0.0 if key in self.programs else FIRST / 2
        self.programs += [] if extra == 0.0 else [key]
        limits = ([max_new_tokens] * len(prompts) if isinstance(max_new_tokens, int)
                  else list(max_new_tokens))  # fmt: skip
        rounds = per_token(engine.num_draft > 0, engine.rule, engine.baseline) * sum(limits)
        self.pending = [0.0, PREFILL * len(prompts) + extra, rounds + extra]
        start, prefilled, ended = clock(), clock(), clock()
        self.pending = []
        stats = summarize(Stats.zeros(len(prompts), max(engine.num_draft, 1), 4))
        return decoding.Result([[7] * n for n in limits], stats, ended - start,
                               prefilled - start)  # fmt: skip


def truth(engine_per_token: float) -> float:
    """True seconds of a full batch: ROWS prefills and ROWS x TOKENS tokens."""
    return PREFILL * ROWS + engine_per_token * ROWS * TOKENS


@pytest.fixture(scope='module')
def runs(tmp_path_factory):
    """The tiny experiment on the speed sets (10 alpaca, 10 qa and 4 MT-bench prompts: one
    group of six batches, in prompt buckets of 16 tokens: five at 48, one at 64, so two
    programs a method), AR, lossless SD, lenience, min-p and its baseline, on the fake
    machine: warm-ups on, then off. Returns {'on' | 'off': (rows, metrics by method,
    progress, the fake)}."""
    c = runtime.load_config(CONFIG, 'tiny')
    c.grid, c.progress, c.batch_size = ('lenience:l=0.5', 'minp_verify:rho=0.3'), False, ROWS
    c.tasks = {f'speed_{s}': evaluate.task(n, TOKENS)
               for s, n in (('alpaca', 10), ('qa', 10), ('mt_bench', 4))}  # fmt: skip
    c.prompt_bucket, c.max_prompt_len = 16, 384
    methods = runner.methods_of(c)
    out = {}
    with pytest.MonkeyPatch.context() as patch:
        for name in ('on', 'off'):
            fake = FakeMachine()
            patch.setattr(decoding, 'generate', fake.generate)
            patch.setattr(warmup.WarmUp, 'enabled', name == 'on')
            store, _, progress = runner.run(c, str(tmp_path_factory.mktemp(name)), fake.clock)
            rows = runner.results(store) + [r for r in store.rows
                                            if timing.is_monitor(r['method'])]  # fmt: skip
            by = {r['method']: r for r in metrics.aggregate(runner.results(store), methods)}
            out[name] = (rows, by, progress, fake)
    return methods, out


def test_warmed_timed_calls_read_their_true_seconds_and_speedups_the_truth(runs):
    methods, out = runs
    rows, by, progress, fake = out['on']
    cost = {m.name: method_cost(m) for m in methods}
    assert len(fake.programs) > len(methods)  # Several buckets: several programs a method.
    # One warm-up per program, none on a timed call; every timed call its true seconds.
    assert progress.warmups == len(fake.programs) and progress.cold_calls == 0
    calls = {(r['batch_id'], r['method']): r['batch'] for r in rows}
    monitors = 2 * timing.MONITOR_CALLS - 1  # AR's call in its round is the start's first.
    assert len(calls) == 6 * len(methods) + monitors  # Six batches by every method.
    for (_, method), b in calls.items():
        name = 'ar' if timing.is_monitor(method) else method
        assert b['seconds'] == pytest.approx(truth(cost[name]), rel=1e-9)
        assert b['cold'] is False and b['compile_s'] == 0.0
    assert sum(b['warmed'] for b in calls.values()) == len(fake.programs)
    for m in methods:
        expected = truth(cost['ar']) / truth(cost[m.name])  # Equal tokens a batch.
        assert by[m.name]['speedup'] == pytest.approx(expected, rel=1e-9), m.name
    # The monitor reads 1 on this still machine, and says so; no warning.
    quiet = dict(usable_cores=2, load_start=(0.4, 0.3, 0.2), load_end=(0.5, 0.4, 0.3))
    items = monitor.lines(rows, quiet)
    assert set(items) == {'drift s0/speed'}
    assert 'x1.000' in items['drift s0/speed'] and items['drift s0/speed'].endswith(
        'steady (within x1.10)')  # fmt: skip
    text = warmup.summary(rows)
    assert f'{len(fake.programs)} warm-up calls (2 tokens a row, untimed)' in text
    assert f'; 0 of {len(calls)} timed calls ran a program cold' in text


def test_without_warm_ups_first_executions_land_on_timed_calls(runs):
    """The control: the same run with warm-ups off charges FIRST to the timed call that
    runs each program first, and the speedups move off the truth. AR's first program runs
    first in the monitor's first start call: the slowest of the start's three, which
    their median leaves out (one cold or bursty call does not move the monitor)."""
    methods, out = runs
    rows, by, progress, fake = out['off']
    on = out['on'][1]
    assert progress.warmups == 0 and progress.cold_calls == len(fake.programs)
    charged = [r['batch'] for r in rows if r['batch']['cold']]
    assert len({(b['id'], b['slot']) for b in charged}) == len(fake.programs)
    moved = [m.name for m in methods[1:]
             if abs(by[m.name]['speedup'] / on[m.name]['speedup'] - 1) > 0.01]  # fmt: skip
    assert moved, 'first executions did not move any speedup: the test cannot fail'
    quiet = dict(usable_cores=2, load_start=(0.4, 0.3, 0.2), load_end=(0.5, 0.4, 0.3))
    (reading,) = timing.drift(rows).values()
    assert reading['start_rates'][0] < reading['start'] / monitor.STEADY  # The cold call.
    assert reading['ratio'] == pytest.approx(1.0) and 'drift warning' not in monitor.lines(
        rows, quiet)  # fmt: skip
    calls = 6 * len(methods) + 2 * timing.MONITOR_CALLS - 1
    cold = f'; {len(fake.programs)} of {calls} timed calls ran a program cold'
    assert cold in warmup.summary(rows)


def call_rows(method: str, number: int, rate: float, **batch) -> list[dict]:
    """A constructed timed call of AR (or a monitor's) on batch `number` of one speed
    group: two rows of 10 tokens at `rate` tokens/s; `batch`, its record's items."""
    record = dict(dict(warmed=False, cold=False, compile_s=0.0, invocation='i'), **batch)
    return [dict(method=method, batch_id=f's0/speed/{number}/h', num_tokens=10,
                 seconds=10 / rate, batch=record) for _ in range(2)]  # fmt: skip


def test_the_monitor_warns_when_the_start_is_slow_on_most_of_its_calls():
    """Constructed calls: two of the start's three calls cold (warm-ups off) and slow, the
    group's other batches and the end at full speed: the monitor reads the medians, warns
    naming warm-up and the start; one slow call at each end is left out by the medians."""
    quiet = dict(usable_cores=2, load_start=(0.4, 0.3, 0.2), load_end=(0.5, 0.4, 0.3))
    s1, s2, s3 = timing.START_MONITORS[0], timing.START_MONITORS[1], 'ar'
    e1, e2, e3 = timing.END_MONITORS
    others = [r for k in (1, 2, 3) for r in call_rows('ar', k, 100.0, slot=10 + k)]
    slow = (call_rows(s1, 0, 50.0, cold=True, slot=0) + call_rows(s2, 0, 55.0, cold=True, slot=1)
            + call_rows(s3, 0, 100.0, slot=2))  # fmt: skip
    ends = [r for k, m in enumerate((e1, e2, e3)) for r in call_rows(m, 0, 100.0, slot=20 + k)]
    items = monitor.lines(slow + others + ends, quiet)
    (reading,) = timing.drift(slow + others + ends).values()
    assert reading['start'] == pytest.approx(55.0) and reading['end'] == pytest.approx(100.0)
    assert reading['calls'] == 18 and reading['start_rates'] == pytest.approx([50, 55, 100])
    assert 'median of 3 calls, 50.0-100.0' in items['drift s0/speed']
    warning = items['drift warning']
    assert "likely warm-up: 2 of the start's 3 calls ran their program's first execution, " \
        'not warmed (warm-ups off)' in warning
    assert 'the change came at the start, on the first batch alone' in warning
    assert machine.header_lines(dict(quiet, **items))[0] == f'- {warning}'
    # One burst at each end: the medians leave both out.
    bursts = (call_rows(s1, 0, 40.0, slot=0) + call_rows(s2, 0, 100.0, slot=1)
              + call_rows(s3, 0, 100.0, slot=2) + call_rows(e1, 0, 100.0, slot=20)
              + call_rows(e2, 0, 30.0, slot=21) + call_rows(e3, 0, 100.0, slot=22))  # fmt: skip
    (steady,) = timing.drift(bursts + others).values()
    assert steady['ratio'] == pytest.approx(1.0)
    assert 'drift warning' not in monitor.lines(bursts + others, quiet)


def test_the_monitor_names_load_and_thermal_from_what_the_run_saw():
    """Constructed readings: a start slower than the end under a load above the cores
    names load; an end slower than a warmed start on a quiet machine names thermal."""
    warmed = [dict(batch=dict(warmed=True, cold=False, compile_s=0.0, warmup_s=0.8))]
    loaded = dict(usable_cores=2, load_start=(3.5, 2.0, 1.0), load_end=(1.0, 1.5, 1.0))
    quiet = dict(usable_cores=2, load_start=(0.5, 0.5, 0.5), load_end=(0.9, 0.6, 0.5))
    (load,) = monitor.causes(dict(ratio=1.5), warmed, loaded)
    assert load.startswith('load: the 1-minute load average reached 3.50')
    (heat,) = monitor.causes(dict(ratio=0.8), warmed, quiet)
    assert heat.startswith('thermal: slower at the end')
    (other,) = monitor.causes(dict(ratio=1.5), warmed, quiet)
    assert other.startswith('other work between the two load samples') and '0.80 s' in other
    old = monitor.causes(dict(ratio=1.5), [dict(batch=dict(compile_s=0.0))], loaded)
    assert old[0].endswith('(a run from before warm-ups)') and old[1].startswith('load:')
