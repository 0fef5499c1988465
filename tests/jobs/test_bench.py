"""The bench job's :tiny variants run end to end and report every figure."""

import os

import pytest

from spec_jax.jobs import bench
from spec_jax.jobs.common import load_config

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')


def test_ar_bench_reports_bound_and_ratios(tmp_path):
    c = load_config(os.path.join(CONFIGS, 'bench.py'), 'tiny')
    c.ar_batches = (1,)
    report = bench.run(c, str(tmp_path))
    assert report['bandwidth_gbs'] > 0 and report['bound_ms'] > 0
    assert set(report['verify_cost_ratio']) == set(c.verify_tokens)
    assert report['verify_cost_ratio'][1] == 1.0
    assert report['ar_tokens_per_s_b1'] > 0
    assert os.path.exists(os.path.join(tmp_path, 'bench.json'))


def test_chain_bench_reports_speedup(tmp_path):
    c = load_config(os.path.join(CONFIGS, 'bench_chain.py'), 'tiny')
    c.temperatures = (0.0,)
    c.batches = (2,)
    report = bench.run(c, str(tmp_path))
    (row,) = report['rows']
    assert row['speedup'] > 0
    assert row['block_efficiency'] == pytest.approx(c.num_draft + 1)  # Identical draft.
    # speedup = block efficiency / round cost; with every draft accepted it is the ceiling.
    assert row['speedup'] * row['round_cost'] == pytest.approx(row['block_efficiency'])
    assert row['speedup_ceiling'] == pytest.approx(row['speedup'])
    assert os.path.exists(os.path.join(tmp_path, 'bench_chain.json'))
