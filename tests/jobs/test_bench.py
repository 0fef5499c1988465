"""The bench registry's :tiny configs run end to end and report every figure."""

import os
import time

import pytest

from spec_jax.jobs import bench, timing
from spec_jax.jobs.runtime import load_config

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')


def test_a_warm_up_keeps_first_executions_out_of_the_medians():
    """Thunks whose first call costs 0.3 s more (a first execution, injected as a sleep):
    after `warm_up`, whose seconds hold them, every median is far below it."""
    calls = {'a': 0, 'b': 0}

    def thunk(name):
        def go():
            calls[name] += 1
            time.sleep(0.3 if calls[name] == 1 else 0.0)
            return calls[name]

        return go

    fns = {name: thunk(name) for name in calls}
    assert timing.warm_up(fns) >= 0.6 and calls == {'a': 1, 'b': 1}
    assert all(s < 0.1 for s in timing.interleaved_medians(fns, 3).values())


def test_forward_and_ar_benches_report_bound_and_ratios(tmp_path, capsys):
    c = load_config(os.path.join(CONFIGS, 'bench.py'), 'tiny')
    c.ar_batches = (1,)
    report = bench.run(c, str(tmp_path))
    assert capsys.readouterr().out.count(timing.WARMED) == 2  # The forward costs and AR.
    fwd, ar = report['forward'], report['ar']
    assert fwd['bandwidth_gbs'] > 0 and fwd['bound_ms'] > 0
    assert set(fwd['verify_cost_ratio']) == set(c.verify_tokens)
    assert fwd['verify_cost_ratio'][1] == 1.0
    assert ar['ar_tokens_per_s_b1'] > 0
    assert os.path.exists(os.path.join(tmp_path, 'bench.json'))
    c.kinds = ('forward', 'beam')
    with pytest.raises(ValueError, match=r"unknown bench kinds \['beam'\]; valid: \['accel', "):
        bench.run(c)


def test_chain_bench_reports_speedup_overhead_and_one_compile_sweeps(tmp_path, capsys):
    c = load_config(os.path.join(CONFIGS, 'bench_chain.py'), 'tiny')
    c.temperatures = (0.0,)
    c.batches = (2,)
    c.sweep_values = (0.3, 0.6)  # Two values show one compile; each is a compile per value.
    report = bench.run(c, str(tmp_path))['chain']
    out = capsys.readouterr().out
    assert f'timing: {timing.WARMED}; then 1 interleaved round(s)' in out
    (row,) = report['rows']
    # The field's speed table (:tiny runs a lossy rule): its matched baseline timed beside
    # it, its TV metered; acceptance length with the bonus, every position accepted (the
    # draft is the target), TTFT and TPOT measured.
    assert 'T=0.0 batch 2, measured' in out and 'TPOT ms (n calls)' in out
    ar, spec, matched = row['speed']
    assert (ar['kind'], spec['kind'], matched['kind']) == ('ar', 'lossy', 'baseline')
    assert spec['pairs'] == ['spec matched'] and 'spec matched: 6.00 / ' in out
    assert spec['acceptance_length'] == pytest.approx(c.num_draft + 1)
    assert spec['position_acceptance_at'] == [1.0] * c.num_draft
    assert spec['tv'] >= 0 and spec['tv_positions'] > 0 and spec['tv_batch'] == 2
    assert all(r['ttft_s'] > 0 and r['tpot_s'] > 0 for r in row['speed'])
    assert ar['acceptance_length'] is None and matched['tv'] is None
    assert row['speedup'] > 0
    assert row['block_efficiency'] == pytest.approx(c.num_draft + 1)  # Identical draft.
    # speedup = block efficiency / round cost; with every draft accepted it is the ceiling.
    assert row['speedup'] * row['round_cost'] == pytest.approx(row['block_efficiency'])
    assert row['speedup_ceiling'] == pytest.approx(row['speedup'])
    overhead = report['overhead']
    assert overhead['round_ms'] > 0 and overhead['forward_ms'] > 0 and overhead['drafter_ms'] > 0
    assert overhead['overhead'] == pytest.approx(
        1 - (overhead['forward_ms'] + overhead['drafter_ms']) / overhead['round_ms']
    )
    sweep = report['sweep']
    assert sweep['runs'] == len(c.sweep_values) + 1 and sweep['compiles'] == 1
    assert os.path.exists(os.path.join(tmp_path, 'bench_chain.json'))


def test_tree_bench_reports_speed_overhead_equal_width_and_shapes(tmp_path, capsys):
    c = load_config(os.path.join(CONFIGS, 'bench_tree.py'), 'tiny')
    report = bench.run(c, str(tmp_path))['tree']
    out = capsys.readouterr().out
    assert f'timing: {timing.WARMED}' in out and 'T=0.0 batch 1, measured' in out
    (row,) = report['rows']
    # The field's speed table: a lossless rule, so no matched baseline and TV 0.
    assert [r['method'] for r in row['speed']] == ['ar', 'chain', 'tree']
    for r in row['speed'][1:]:
        assert r['acceptance_length'] == pytest.approx(row[f'{r["method"]}_accept_length'])
        assert len(r['position_acceptance_at']) == c.num_draft and r['tpot_s'] > 0
    assert '0 (lossless)' in out
    for name in ('chain', 'tree'):
        assert row[f'{name}_speedup'] > 0 and row[f'{name}_accept_length'] >= 1
        # speedup = acceptance length / round cost.
        assert row[f'{name}_speedup'] * row[f'{name}_round_cost'] == pytest.approx(
            row[f'{name}_accept_length']
        )
    assert row['tree_over_chain'] == pytest.approx(row['tree_speedup'] / row['chain_speedup'])
    assert 0 < report['overhead']['forward_ms'] < report['overhead']['round_ms']
    (width,) = report['equal_width']
    assert width['num_draft'] == 3 and 'dynamic tree: 4 nodes' in width['tree']
    assert width['gain'] == pytest.approx(width['tree_length'] - width['chain'])
    assert report['shapes']['best'] == '4/3/2'
    assert os.path.exists(os.path.join(tmp_path, 'bench_tree.json'))


def test_rules_bench_sets_each_rule_against_the_forward(capsys):
    c = load_config(os.path.join(CONFIGS, 'bench_rules.py'), 'tiny')
    c.rules = ('lossless', 'lenience:l=0.5')
    report = bench.run(c)['rules']
    assert timing.WARMED in capsys.readouterr().out
    names = [f'verify_chain V=1031 {r}' for r in c.rules]
    assert set(names) < set(report)
    assert all(report[n]['ms'] > 0 and report[n]['of_forward'] > 0 for n in names)
    with pytest.raises(ValueError, match="unknown config arg 'huge'; valid: '', 'tiny'"):
        load_config(os.path.join(CONFIGS, 'bench_rules.py'), 'huge')


def test_mesh_bench_needs_several_devices():
    """Its run on 8 fake devices is tests/mesh; one device is refused with the reason."""
    with pytest.raises(ValueError, match='is one device'):
        bench.run(load_config(os.path.join(CONFIGS, 'bench_mesh.py'), 'tiny'))
