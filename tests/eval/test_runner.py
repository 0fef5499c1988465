"""The evaluation runner end to end on the tiny experiment: a real run killed with SIGKILL
and restarted finishes with exactly one result per sample; its metrics and report; results
that refuse to mix with another config's; torn lines; the dry run and bad configs."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import defaultdict

import pytest
from figures import check_series

from spec_jax import decoding
from spec_jax.eval import (
    findings,
    metrics,
    metrics_csv,
    paper,
    plots,
    records,
    runner,
    sandbox,
    timing,
)
from spec_jax.eval.tasks.base import Item
from spec_jax.jobs import evaluate, runtime

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')
LAUNCH = os.path.join(ROOT, 'launch', 'evaluate.py')
CONFIG = os.path.join(ROOT, 'configs', 'experiments', 'smollm2_135m.py')


def tiny_config():
    return runtime.load_config(CONFIG, 'tiny')


def count_lines(path: str) -> int:
    if not os.path.exists(path):
        return 0
    with open(path) as f:
        return sum(1 for line in f if line.endswith('\n'))


@pytest.fixture(scope='session')
def tiny_run(tmp_path_factory):
    """The tiny experiment, killed (SIGKILL) once results start to land, then rerun with
    the same command to the end. Returns (workdir, lines at the kill, the second stdout)."""
    workdir = str(tmp_path_factory.mktemp('eval') / 'run')
    cmd = [sys.executable, LAUNCH, f'--config={CONFIG}:tiny', f'--workdir={workdir}',
           '--config.progress=False']  # fmt: skip
    results = os.path.join(workdir, 'results.jsonl')
    first = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 600
    while count_lines(results) < 3 and first.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    assert first.wait() == -signal.SIGKILL  # Killed, not finished.
    at_kill = count_lines(results)
    second = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    return workdir, at_kill, second.stdout


def read_rows(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, 'results.jsonl')) as f:
        return [json.loads(line) for line in f]


def test_killed_run_restarts_to_one_result_per_sample(tiny_run):
    workdir, at_kill, _ = tiny_run
    c = tiny_config()
    methods = runner.methods_of(c)
    items = runner.load_items(c)
    expected = {(m.name, task, it.id, seed) for seed in c.seeds for task, (_, its) in
                items.items() for it in its for m in methods}  # fmt: skip
    rows = read_rows(workdir)
    monitor = {records.row_key(r) for r in rows if timing.is_monitor(r['method'])}
    # The drift monitor: AR again on each group's first batch (3 MBPP rows, 2 x 2 speed),
    # twice at the start and three times at the end, each call under its own name.
    first = {(r['task'], r['item']) for r in rows if r['batch_id'].split('/')[2] == '0'}
    assert {(m, task, item) for m, task, item, _ in monitor} == {
        (m, *row) for row in first for m in timing.START_MONITORS + timing.END_MONITORS}
    rows = [r for r in rows if not timing.is_monitor(r['method'])]
    keys = [records.row_key(r) for r in rows]
    assert 0 < at_kill < len(expected)  # The kill landed mid-run.
    assert len(keys) == len(set(keys)) == len(expected)
    assert set(keys) == expected


def test_rows_hold_text_score_and_counters(tiny_run):
    rows = read_rows(tiny_run[0])
    for r in rows:
        assert r['num_tokens'] >= 1 and isinstance(r['text'], str)
        assert (r['correct'] is None) == (r['task'].startswith('speed_')
                                          or timing.is_monitor(r['method']))  # fmt: skip
        assert 0 < r['batch']['prefill_s'] < r['batch']['seconds']
        # Every program ran once untimed first (spec_jax.eval.warmup): no timed call
        # compiled, loaded or ran a program for the first time.
        assert r['batch']['compile_s'] == 0 and r['batch']['cold'] is False
        st = r['stats']
        assert st['metered'] == st['emitted'] + 1  # Every emitted token and the first.
        if r['method'] == 'ar':
            assert st['drafted'] == 0 and st['blocks'] == st['emitted']
        else:
            assert st['emitted'] == st['accepted'] + st['blocks']


def test_metrics_and_report_of_the_run(tiny_run, tmp_path):
    workdir, _, stdout = tiny_run
    assert 'evaluation throughput / decode throughput' in stdout
    assert 'report:' in stdout and 'score % [interval]' in stdout
    assert 'Drift monitor (AR on the same rows at the start and the end' in stdout
    assert ' programs run once untimed before their first timed call; 0 timed calls ran a ' \
        'program cold' in stdout
    assert ', 0 timed calls overlapped by scoring' in stdout
    c = tiny_config()
    methods = runner.methods_of(c)
    rows = metrics.aggregate(read_rows(workdir), methods)
    assert {r['method'] for r in rows} == {m.name for m in methods}
    by = {(r['task'], r['method']): r for r in rows}
    samples = defaultdict(list)
    for sample in read_rows(workdir):
        samples[(sample['task'], sample['method'])].append(sample)
    for r in rows:
        assert r['tokens_per_s'] > 0
        group = samples[(r['task'], r['method'])]
        # Each target call emits its accepted drafts plus one token; the first token comes
        # from prefill (the counters' `emitted` leaves it out, the samples' texts do not).
        blocks = sum(s['stats']['blocks'] for s in group)
        accepted = sum(s['stats']['accepted'] for s in group)
        assert sum(s['stats']['emitted'] for s in group) == accepted + blocks
        if r['kind'] == 'ar':
            assert r['speedup'] == pytest.approx(1.0) and r['block_efficiency'] == 1.0
        else:
            assert r['block_efficiency'] == pytest.approx((accepted + blocks) / blocks)
            assert r['accept_length'] == pytest.approx(accepted / blocks)
            assert 1.0 <= r['block_efficiency'] <= c.num_draft + 1
        if r['kind'] in ('ar', 'lossless', 'baseline'):
            assert r['tv'] < 1e-5 and r['outside'] < 1e-6  # They emit the reference law.
        # SPEED-Bench's figures (spec_jax/eval/speed.py): the acceptance length is the block
        # efficiency; the per-position counts pool to the position acceptance; TTFT once per
        # call, TPOT per request.
        assert r['ttft_n'] == len({s['batch_id'] for s in group}) and r['ttft_s'] > 0
        assert r['tpot_s'] > 0 and r['tpot_requests'] <= len(group)
        if r['kind'] != 'ar':
            assert r['acceptance_length'] == pytest.approx(r['block_efficiency'])
            at, rounds = r['position_acceptance_at'], r['position_rounds']
            assert len(at) == c.num_draft and sum(rounds) == sum(
                s['stats']['reached'] for s in group)  # fmt: skip
            assert sum(a * n for a, n in zip(at, rounds) if n) == pytest.approx(accepted)
    lossy = by[('mbpp', 'minp_verify:rho=0.3')]
    assert lossy['tv'] > 0 and lossy['outside'] > 0  # Truncation leaks outside A.
    assert by[('mbpp', 'cos:lam=0.4')]['outside'] == 0.0  # Its baseline truncates nothing.
    # The report the run wrote, and its figures' series.
    report_dir = os.path.join(workdir, 'report')
    for name in ('report.md', 'metrics.csv', 'pareto_mbpp.png', 'distortion_vs_param.png'):
        assert os.path.getsize(os.path.join(report_dir, name)) > 0
    assert metrics_csv.read_metrics_csv(os.path.join(report_dir, 'metrics.csv')) == rows
    assert evaluate.report_only(workdir)['rows'] == rows  # launch/report.py re-renders it.
    with open(os.path.join(report_dir, 'report.md')) as f:
        md = f.read()
    assert 'baseline[min_p=0.3]' in md and 'minp_verify:rho=0.3' in md
    # The speed table: the field's figures, the TV paid and the matched baseline beside.
    speed_md = md[md.index("## Speed in the field's terms") :].split('\n## ')[0]
    assert '### speed' in speed_md and '### mbpp' in speed_md
    minp = next(line for line in speed_md.splitlines() if '`minp_verify:rho=0.3`' in line)
    assert '| baseline[min_p=0.3]: ' in minp and ' (n ' in minp
    # The header: machine, versions, the config's fingerprint, the load.
    with open(os.path.join(workdir, 'run.json')) as f:
        fingerprint = json.load(f)['fingerprint']
    header = md[md.index('## Run') : md.index('## Headline')]
    for text in ('- CPU: ', '- cores: ', '- JAX devices: ', '- jax: ', '- spec_jax: ',
                 f'- config fingerprint: {fingerprint}', '- load average at start: ',
                 '- gamma: 3 drafted tokens', '- temperature: 0.7', '- drafter: lm ',
                 '- token limits: 12 new tokens', '- batch size: 4', '- seeds: 0',
                 '- task mbpp: first 3 items, at most 12 new tokens', '- data root: ',
                 '- commit: ', '- compile and warm-up: '):  # fmt: skip
        assert text in header, text
    drift = [line for line in header.splitlines() if line.startswith('- drift s0/')]
    assert len(drift) == 2 and all(line.endswith(('steady (within x1.10)', 'see the warning)'))
                                   for line in drift)  # fmt: skip
    # Every row paired with AR on the batches of its task group.
    for r in rows:
        assert r['speedup_n_batches'] >= 1 and r['speedup_basis'] == 'batches'
        assert r['speedup_group'] == ('speed' if r['task'].startswith('speed_') else r['task'])
    path = str(tmp_path / 'pareto.png')
    drawn = plots.pareto(rows, 'mbpp', path)
    families = {plots.family(r) for r in rows if r['task'] == 'mbpp'}
    assert families <= set(drawn)
    check_series(path, drawn, dict(drawn))


def test_a_changed_config_refuses_to_mix(tiny_run, tmp_path):
    workdir = str(tmp_path / 'run')
    os.makedirs(workdir)
    for name in ('run.json', 'results.jsonl'):
        with open(os.path.join(tiny_run[0], name)) as src, open(f'{workdir}/{name}', 'w') as f:
            f.write(src.read())
    c = tiny_config()
    c.temperature = 0.9
    with pytest.raises(records.ConfigMismatchError, match=r'temperature: 0\.7 -> 0\.9'):
        runner.run(c, workdir)
    c.tasks.mbpp.limit = 2
    c.temperature = 0.7
    with pytest.raises(records.ConfigMismatchError, match=r'tasks\.mbpp\.limit: 3 -> 2'):
        runner.run(c, workdir)
    c.tasks.mbpp.limit, c.progress, c.score_workers = 3, False, 1  # Runtime fields may.
    store, _, progress = runner.run(c, workdir)  # Everything is done: nothing to run.
    assert progress.samples == 0 and len(store.rows) == count_lines(f'{workdir}/results.jsonl')


def test_mixing_when_told_and_torn_lines(tmp_path):
    config, plan = {'a': 1, 'tasks': {'x': 1}}, [{'name': 'ar'}]
    store = records.ResultStore(str(tmp_path), config, plan)
    row = dict(method='ar', task='t', item='0', seed=0)
    store.append([row, row])  # A key is written once.
    with open(store.path, 'a') as f:
        f.write('{"method": "ar", "task": "t", "item": "1"')  # Killed mid-line.
    again = records.ResultStore(str(tmp_path), config, plan)
    assert [records.row_key(r) for r in again.rows] == [('ar', 't', '0', 0)]
    with open(store.path) as f:
        assert f.read().endswith('}\n')  # The torn line is gone.
    with pytest.raises(records.ConfigMismatchError):
        records.ResultStore(str(tmp_path), {'a': 2, 'tasks': {'x': 1}}, plan)
    mixed = records.ResultStore(str(tmp_path), {'a': 2, 'tasks': {'x': 1}}, plan, mix=True)
    mixed.append([dict(row, item='1')])
    fingerprints = [r['config'] for r in read_rows(str(tmp_path))]
    assert fingerprints == [records.fingerprint(config), mixed.fingerprint]
    with open(tmp_path / 'run.json') as f:
        assert json.load(f)['history'] == [records.fingerprint(config)]


def test_dry_run_and_bad_configs():
    c = tiny_config()
    text = evaluate.dry_run(c)
    assert 'baseline[min_p=0.3]' in text and 'matched to minp_verify:rho=0.3' in text
    assert f'total: {14 * (3 + 2 * 2)} samples' in text  # 14 methods; 3 items, 2 x 2.
    c.tasks.nope = evaluate.task(1, 4)
    with pytest.raises(ValueError, match=r"tasks\.nope: unknown task; valid: \[.*'gsm8k'"):
        runner.task_limits(c)
    c = tiny_config()
    c.tasks.mbpp.max_new_tokens = 99
    with pytest.raises(ValueError, match='exceeds max_new_tokens=12'):
        runner.task_limits(c)
    c = tiny_config()
    c.grid = ('lenience:l=0.5', 'lenience:l=0.5')
    with pytest.raises(ValueError, match='twice'):
        runner.methods_of(c)
    c.grid, c.mode = ('lenience:l=0.5',), 'tree'
    assert 'tree mode: dynamic tree: 8 nodes, depth 4, branch 2' in evaluate.dry_run(c)


def test_a_tree_experiment_runs(tmp_path):
    """Tree mode end to end on random tiny models with a random head: every method of the
    plan (AR, lossless, the lossy tree rules and their matched baselines) writes its
    samples, with tree rounds' statistics."""
    c = tiny_config()
    c.mode, c.drafter, c.draft, c.lookup = 'tree', 'eagle3', 'random', 0
    c.grid = ('lenience:l=0.5', 'minp_verify:rho=0.3')
    c.tasks = {'gsm8k': evaluate.task(2, 8)}
    c.progress = False
    evaluate.run(c, str(tmp_path))
    store, methods, _ = runner.run(c, str(tmp_path))  # Resumed: everything is there.
    assert [m.name for m in methods] == ['ar', 'lossless', 'lenience:l=0.5',
                                         'minp_verify:rho=0.3', 'baseline[min_p=0.3]']  # fmt: skip
    # The drift monitor's AR again, MONITOR_CALLS - 1 times at the start, at the end all.
    assert len(store.rows) == 2 * (len(methods) + 2 * timing.MONITOR_CALLS - 1)
    for row in store.rows:
        assert row['stats']['blocks'] >= 1 and row['num_tokens'] >= 1
        if row['method'] != 'ar':
            assert row['stats']['metered'] == row['stats']['emitted'] + 1
    with open(tmp_path / 'report' / 'report.md') as f:
        assert 'Mode: tree (matched baselines: target truncated)' in f.read()


def test_sample_ids_are_stable_and_distinct():
    ids = {runner.sample_id(task, str(i)) for task in ('gsm8k', 'humaneval') for i in range(500)}
    assert len(ids) == 1000 and all(0 <= i < 2**31 for i in ids)
    assert runner.sample_id('gsm8k', '7') == runner.sample_id('gsm8k', '7')


def test_short_batches_run_at_a_few_sizes():
    assert [runner.padded_size(n, 10) for n in range(1, 11)] == [1, 2, 3, 5, 5] + [10] * 5
    assert [runner.padded_size(n, 4) for n in range(1, 5)] == [1, 2, 4, 4]


@pytest.mark.parametrize('name, methods', [('qwen25_72b_chain', 30), ('llama31_8b_eagle3', 26)])
def test_the_paper_setups_plan_here(name, methods):
    """The paper's two setups (hub weights, accelerators) dry-run offline: every rule of
    docs/paper.md §4's grids with its matched baseline, the paper's task sizes."""
    c = runtime.load_config(os.path.join(ROOT, 'configs', 'experiments', f'{name}.py'))
    text = evaluate.dry_run(c)
    assert f'{methods} methods:' in text
    assert 'baseline[min_p=0.9]' in text and 'baseline[eta=0.25]' in text
    assert ('target truncated' in text) == (c.mode == 'tree')
    for task, size in paper.TASK_SIZES.items():
        assert task in text and str(size) in text
    # The paper's own items (source 'fast_hsd'; MBPP+ from the hub); options reach the task.
    limits = runner.task_limits(c)
    assert {name: spec['source'] for name, spec in limits.items()} == paper.TASK_SOURCES
    assert '  include                        220 items,' in text
    assert '  bfcl_parallel_multiple         200 items,' in text
    c.tasks.include.options.per_langauge = 3
    with pytest.raises(ValueError, match=r"task 'include' has no option\(s\) \['per_langauge'\]"):
        evaluate.dry_run(c)


def test_the_main_job_shows_the_grid_as_curves_and_prints_findings(tiny_run, tmp_path):
    """The main job's grid (three values of each rule family) appears as curves: the
    trade-off figure the run wrote draws each family's three points (colours read back from
    the PNG), and the run ends with findings naming every lossy method with its numbers."""
    workdir, _, stdout = tiny_run
    c = tiny_config()
    methods = runner.methods_of(c)
    pooled = findings.pooled_rows(read_rows(workdir), methods)
    assert {r['task'] for r in pooled} == {'mbpp', 'speed'}
    families = defaultdict(int)
    for m in methods:
        if m.name not in ('ar', 'lossless') and not m.baseline:
            families[m.rule.split(':')[0]] += 1
    assert dict(families) == {'minp_verify': 3, 'lenience': 3, 'cos': 3}
    expected = {f'{rule} {what}': n for rule, n in families.items() for what in ('ΔBE', 'speedup')}
    expected['lossless'] = 1
    expected['baselines'] = families['minp_verify']  # Matched baselines, at TV to the target.
    written = os.path.join(workdir, 'report', 'tradeoff_speed.png')
    assert os.path.getsize(written) > 0
    path = str(tmp_path / 'tradeoff.png')
    check_series(path, plots.tradeoff(pooled, 'speed', path), expected)
    tail = stdout[stdout.index('Findings'):]
    for m in methods:
        if m.name not in ('ar', 'lossless') and not m.baseline:
            rule, value = m.rule.split(':')[0], m.rule.split('=')[1]
            assert f'speed: {rule} ' in tail and f' {float(value):g}: ΔBE ' in tail
    assert "The paper's claims this run cannot test:" in tail
    with open(os.path.join(workdir, 'report', 'report.md')) as f:
        md = f.read()
    assert md.index('## Trade-off') < md.index('## Headline')


class _Raises:
    """A scored task whose scorer raises `error`."""

    name, scored = 'raises', True

    def __init__(self, error: Exception):
        self.error = error

    def score(self, item, text):
        raise self.error


def test_a_scorer_error_is_the_samples_but_a_weak_sandbox_stops_the_run():
    """A scorer that raises scores its sample wrong with the error in its detail; the
    sandbox refusing to score code (below 'namespaces') stops the run with its message
    rather than scoring every code sample wrong."""
    item, row = Item('raises', '0', (), 'a'), {'method': 'ar'}
    wrong = runner._scored(_Raises(ValueError('bad gold')), item, 'text', row)
    assert wrong['correct'] is False and 'bad gold' in wrong['detail']['error']
    with pytest.raises(sandbox.WeakSandboxError, match='only in the'):
        runner._scored(_Raises(sandbox.WeakSandboxError('only in the box')), item, 'text', row)


def test_adaptive_sizes_every_speculative_method_and_not_ar():
    """`adaptive.tiers` reaches every speculative method's engine (matched baselines too)
    through `decoding_block`; AR's engine drops it; ':adaptive' is the main job so sized."""
    c = tiny_config()
    c.adaptive.tiers = 'auto'
    built = decoding.build(runner.decoding_block(c))
    for m in runner.methods_of(c):
        engine = runner.engine_for(built.engine, m)
        assert (engine.adaptive is None) == (m.mode == 'ar'), m.name
        if engine.adaptive is not None:
            assert engine.adaptive.tiers == (0, 1, 2, 3)  # 'auto' under num_draft 3.
    assert "adaptive: each round of every speculative method runs one of the tiers 'auto'" \
        in evaluate.dry_run(c)
    sized = runtime.load_config(CONFIG, 'adaptive')
    assert (sized.num_draft, sized.adaptive.tiers, sized.adaptive.costs) == (4, 'auto', 'auto')
    assert sized.name == 'smollm2_135m_adaptive'
    with pytest.raises(ValueError, match="valid: '', 'tiny', 'adaptive'"):
        runtime.load_config(CONFIG, 'fast')
