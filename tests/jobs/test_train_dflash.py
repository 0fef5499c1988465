"""The train_dflash job end to end on its :tiny config: data, taps and top-k sidecars,
training, held-out acceptance, export in the released layout, loaded back."""

import json
import os

import numpy as np

from spec_jax.checkpoints import dflash_format
from spec_jax.jobs import train_dflash
from spec_jax.jobs.runtime import load_config

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')


def test_tiny_job_trains_evaluates_and_exports(tmp_path):
    c = load_config(os.path.join(CONFIGS, 'smollm2_135m_dflash.py'), 'tiny')
    c.export.dir = str(tmp_path / 'export')
    summary = train_dflash.run(c, str(tmp_path / 'work'))
    assert summary['teacher_taps']['tokens'] > 0 and summary['teacher_topk']['tokens'] > 0
    assert summary['train']['steps'] == c.train.steps
    with open(tmp_path / 'work' / 'metrics.jsonl') as f:
        rows = [json.loads(line) for line in f]
    assert len(rows) == c.train.steps // c.train.log_every
    assert all(np.isfinite(r['loss']) and r['positions'] > 0 for r in rows)
    ev = summary['eval']
    assert len(ev['position_agreement']) == c.model.block_size - 1
    assert all(0 <= a <= 1 for a in ev['position_agreement'])
    # Position j is scored wherever x_{a+j} is inside the response: fewer as j grows.
    assert ev['positions'][0] > 0 and ev['positions'] == sorted(ev['positions'], reverse=True)
    assert 1 <= ev['chain3_mean_accept_len'] <= c.model.block_size
    cfg, params = dflash_format.load(c.export.dir)
    assert cfg.block_size == c.model.block_size and cfg.num_layers == c.model.num_layers
    saved = np.load(tmp_path / 'work' / 'params.npz')  # The trained float32 tensors.
    back = dflash_format.params_to_state(cfg, params)
    assert sorted(saved) == sorted(back)
    for name, value in saved.items():  # bf16 on export: within bf16's rounding.
        np.testing.assert_allclose(back[name], value, rtol=1e-2, atol=1e-6, err_msg=name)
