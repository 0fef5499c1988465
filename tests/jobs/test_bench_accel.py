"""The accelerator bench at :tiny (spec_jax/jobs/bench_accel.py) writes a record per step
with every field and its provenance, and skips what its time budget cannot hold."""

import json
import os

import jax
import numpy as np
import pytest

from spec_jax.costs import points
from spec_jax.jobs import bench, bench_accel
from spec_jax.jobs.runtime import load_config
from spec_jax.models.config import ModelConfig

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')


def test_the_tiny_accelerator_bench_writes_every_steps_record_with_provenance(tmp_path):
    """The rounds first, then the verify curve, then the AR loop; each record with every
    field and its programs counted (the AR loop's two); the report with the commit, the
    config, jax, the device and the calibration it compares with; slots padded to the
    chip's 128; read back as the cost model's points (the round only tested)."""
    c = load_config(os.path.join(CONFIGS, 'bench_accel.py'), 'tiny')
    c.ar_batches, c.verify_batches, c.verify_tokens, c.verify_skip = (2,), (1,), (1, 3), ()
    c.round_modes = ('tree',)  # The chain round is the same code (compiles: ~10 s each).
    c.budget_s = 1e4  # Nothing skipped here; the budget's own test is below.
    c.chip = 'h200'  # Predictions at a calibrated chip's figures, its 128-slot multiple.
    report = bench.run(c, str(tmp_path))['accel']
    with open(os.path.join(tmp_path, 'bench_accel.json')) as f:
        written = json.load(f)
    assert written['records'] == json.loads(json.dumps(report['records']))
    steps = [(r['step'], r['shapes']['batch'], r['shapes']['T'], r['programs'])
             for r in written['records']]  # fmt: skip
    assert steps == [('tree', 1, 4, 4), ('verify', 1, 1, 1), ('verify', 1, 3, 1), ('ar', 2, 1, 2)]
    for r in written['records']:
        assert set(bench_accel.FIELDS) <= set(r) and 'skipped' not in r, r
        assert r['measured_ms'] > 0 and r['compile_s'] >= 0
        assert r['shapes']['slots'] % 128 == 0, r
        p = r['predicted_ms']
        assert 0 < p['upper_bound'] <= p['calibrated']  # The bound is below the calibrated.
        assert r['fraction_of_bound'] == pytest.approx(p['upper_bound'] / r['measured_ms'])
    tree, *_, ar = written['records']
    assert ar['tokens_per_s'] == pytest.approx(2 / ar['measured_ms'] * 1e3)
    assert tree['share_outside'] >= 0 and tree['parts_over_round'] >= 0
    assert tree['outside_ms'] == pytest.approx(max(
        0, tree['measured_ms'] - tree['forward_ms'] - tree['drafter_ms']))
    assert tree['share_outside'] == pytest.approx(tree['outside_ms'] / tree['measured_ms'])
    assert written['chip'] == 'h200' and written['jax'] == jax.__version__
    assert written['device'] == jax.devices()[0].device_kind
    assert written['commit'] and written['config']['preset'] == 'tiny'
    assert written['config']['verify_tokens'] == [1, 3]
    cal = written['calibration']
    assert cal['calibrated'] and cal['file'] == 'h200_2026-12-04'
    assert cal['describe'].startswith('calibrated on h200 2026-12-04') and cal['fitted_on']
    curve = bench_accel.verify_costs(written, batch=1)  # What tree_budget.interpolated reads.
    assert curve == {r['shapes']['T']: r['measured_ms'] / 1e3 for r in written['records'][1:3]}
    pts = points.from_bench(written)
    assert [(p.mode, p.role) for p in pts] == [('tree', 'test'), ('', 'fit'), ('', 'fit'),
                                               ('', 'fit'), ('ar', 'fit')]  # fmt: skip
    assert pts[0].shares_a_call(pts[1])  # The round's target forward, timed alone.


def test_a_step_over_the_budget_is_skipped_and_recorded(tmp_path):
    c = load_config(os.path.join(CONFIGS, 'bench_accel.py'), 'tiny')
    c.budget_s = 0.0
    report = bench_accel.run(c, str(tmp_path))
    assert [r['step'] for r in report['records']] == ['tree', 'chain'] + ['verify'] * 5 + [
        'ar'] * 2  # fmt: skip
    for r in report['records']:
        assert r['skipped'] == 'budget' and r['measured_ms'] is None
        assert set(bench_accel.FIELDS) <= set(r)
    assert report['calibration']['chip'] == 'cpu'  # A CPU is a chip like any other.
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
