"""launch/diagnose.py theory mode on the ':tiny' config: files exist and the claims hold."""

from __future__ import annotations

import csv
import os

import numpy as np

from spec_jax.jobs import diagnose, runtime

_ROOT = os.path.join(os.path.dirname(__file__), '..', '..')


def _config(arg):
    return runtime.load_config(os.path.join(_ROOT, 'configs', 'diagnose.py'), arg)


def test_theory_tiny_writes_outputs_and_reproduces_claims(tmp_path):
    out = diagnose.run(_config('tiny'), str(tmp_path))
    for key in ('csv', 'png', 'claims'):
        assert os.path.getsize(out['paths'][key]) > 0, key
    with open(out['paths']['csv']) as f:
        rows = list(csv.DictReader(f))
    assert {r['mode'] for r in rows} == {'chain', 'tree'}
    claims = out['claims']
    expected = (
        'lossless_exact',
        'chain_truncation_floor',
        'tree_truncation_greedy',
        'lenience_ceiling',
        'cos_no_ceiling',
    )
    for name in expected:
        assert claims[name]['holds'], (name, claims[name])
    # Numerically: lossless is exact; truncation distortion does not vanish at q = p.
    for r in rows:
        if r['rule'] == 'lossless':
            assert float(r['tv_baseline']) < 1e-5
    chain_minp = [r for r in rows if r['rule'].startswith('minp') and r['mode'] == 'chain']
    tree_minp = [r for r in rows if r['rule'].startswith('minp') and r['mode'] == 'tree']
    assert float(chain_minp[-1]['tv_baseline']) > 0.01
    assert float(tree_minp[-1]['tv_greedy']) < 1e-3
    assert float(tree_minp[-1]['tv_baseline']) > float(chain_minp[-1]['tv_baseline'])
    quality = [float(r['quality']) for r in chain_minp]
    assert np.all(np.diff(quality) > 0) and abs(quality[-1] - 1.0) < 1e-6


def test_config_is_locked_and_validates():
    cfg = _config('')
    assert cfg.mode == 'theory' and len(cfg.rules) > len(_config('tiny').rules)
    try:
        _config('huge')
    except ValueError as e:
        assert 'huge' in str(e)
    else:
        raise AssertionError('expected ValueError')
