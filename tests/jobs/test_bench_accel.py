"""The accelerator bench at :tiny (spec_jax/jobs/bench_accel.py) writes a record per step
with every field, and skips what its time budget cannot hold."""

import json
import os

import jax
import numpy as np
import pytest

from spec_jax.jobs import bench, bench_accel
from spec_jax.jobs.runtime import load_config
from spec_jax.models.config import ModelConfig

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')


def test_the_tiny_accelerator_bench_writes_every_field(tmp_path):
    c = load_config(os.path.join(CONFIGS, 'bench_accel.py'), 'tiny')
    c.ar_batches, c.verify_batches, c.verify_tokens = (2,), (1,), (1, 3)
    c.round_modes = ('tree',)  # The chain round is the same code (compiles: ~10 s each).
    c.tree = (4, 2, 2)  # Depth 2: fewer unrolled drafter levels to compile than :tiny's 4.
    c.budget_s = 1e4  # Nothing skipped here; the budget's own test is below.
    c.chip = 'h200'  # Predictions at a calibrated chip's figures (a CPU has none).
    report = bench.run(c, str(tmp_path))['accel']
    with open(os.path.join(tmp_path, 'bench_accel.json')) as f:
        written = json.load(f)
    assert written['records'] == json.loads(json.dumps(report['records']))
    steps = [(r['step'], r['shapes']['batch'], r['shapes']['T']) for r in written['records']]
    assert steps == [('ar', 2, 1), ('verify', 1, 1), ('verify', 1, 3), ('tree', 1, 4)]
    for r in written['records']:
        assert set(bench_accel.FIELDS) <= set(r) and 'skipped' not in r, r
        assert r['measured_ms'] > 0 and r['compile_s'] >= 0
        p = r['predicted_ms']
        assert 0 < p['upper_bound'] <= p['calibrated']  # The bound is below the calibrated.
        assert r['fraction_of_bound'] == pytest.approx(p['upper_bound'] / r['measured_ms'])
    ar, *_, tree = written['records']
    assert ar['tokens_per_s'] == pytest.approx(2 / ar['measured_ms'] * 1e3)
    assert tree['share_outside'] == pytest.approx(
        1 - (tree['forward_ms'] + tree['drafter_ms']) / tree['measured_ms'])
    assert written['chip'] == 'h200' and written['jax'] == jax.__version__
    curve = bench_accel.verify_costs(written, batch=1)  # What tree_budget.interpolated reads.
    assert curve == {r['shapes']['T']: r['measured_ms'] / 1e3 for r in written['records'][1:3]}


def test_a_step_over_the_budget_is_skipped_and_recorded(tmp_path):
    c = load_config(os.path.join(CONFIGS, 'bench_accel.py'), 'tiny')
    c.budget_s = 0.0
    report = bench_accel.run(c, str(tmp_path))
    assert [r['step'] for r in report['records']] == ['ar'] * 2 + ['verify'] * 8 + ['chain', 'tree']
    for r in report['records']:
        assert r['skipped'] == 'budget' and r['measured_ms'] is None
        assert set(bench_accel.FIELDS) <= set(r)
    with pytest.raises(ValueError, match="unknown config arg 'llama'; valid: "):
        load_config(os.path.join(CONFIGS, 'bench_accel.py'), 'llama')


def test_weights_are_drawn_on_the_device_with_the_presets_vocabulary():
    c = load_config(os.path.join(CONFIGS, 'bench_accel.py'), 'tiny')
    cfg, params, drafter, draft_params = bench_accel.build_models(c)
    assert cfg.vocab_size == ModelConfig.tiny().vocab_size  # Its own, no tokenizer's.
    for x in jax.tree.leaves((params, draft_params['head'])):
        assert isinstance(x, jax.Array) and x.dtype == np.float32
    norm = np.asarray(params['final_norm']['scale'])
    assert abs(norm.mean() - 1) < 0.1 and 0.02 < norm.std() < 0.2  # Norms near 1.
    again = bench_accel.build_models(c)[1]  # The same seed draws the same weights.
    assert np.array_equal(np.asarray(again['embed_vd']), np.asarray(params['embed_vd']))
