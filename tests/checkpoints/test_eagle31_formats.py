"""EAGLE-3.1 heads on disk (fc_norm.{i}.weight, the fc_norm / norm_output flags) in both
layouts: round trips, a hand-built head against the numpy port, and loud failures."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.checkpoints import CheckpointError
from spec_jax.checkpoints import eagle_formats as ef
from spec_jax.models import eagle3 as e3
from tests.checkpoints.test_eagle_formats import (
    LLAMA_HEAD_CONFIG,
    LLAMA_TARGET,
    TARGET,
    _official_state,
    _reference_logits,
    _write,
)

HEAD31 = e3.Eagle3Config.for_target(TARGET, draft_vocab_size=29, fc_norm=True, norm_output=True)
FC_NORMS = ['fc_norm.0.weight', 'fc_norm.1.weight', 'fc_norm.2.weight']


def _head31(seed=1):
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(lambda: e3.init_params(HEAD31, jax.random.PRNGKey(0)))  # no compile
    params = jax.tree.map(lambda s: rng.normal(0, 0.1, s.shape).astype(np.float32), shapes)
    used = np.sort(rng.choice(TARGET.vocab_size, HEAD31.draft_vocab_size, replace=False))
    d2t, t2d = e3.vocab_maps(used, TARGET.vocab_size)
    return e3.Eagle3Head(HEAD31, params, jnp.asarray(d2t), jnp.asarray(t2d))


@pytest.mark.parametrize('fmt', ['official', 'speculators'])
def test_eagle31_round_trip(tmp_path, fmt):
    head = _head31()
    ef.save_head(str(tmp_path), head, fmt, dtype='float32')
    with open(tmp_path / 'config.json') as f:
        config = json.load(f)
    assert config['fc_norm'] is True and config['norm_output'] is True
    state = ef.read_state(str(tmp_path))
    assert set(FC_NORMS) <= set(state) and state['fc_norm.1.weight'].shape == (TARGET.width,)
    loaded = ef.load_head(str(tmp_path), TARGET)
    assert loaded.cfg == head.cfg  # Same config and the same numbers: the same head.
    assert jax.tree.structure(loaded.params) == jax.tree.structure(head.params)
    for got, want in zip(jax.tree.leaves(loaded.params), jax.tree.leaves(head.params)):
        np.testing.assert_array_equal(got, want)


def _hand_built(rng, config_flags):
    state = _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng)
    state = {k: v * 20 if v.ndim == 2 and k != 'fc.weight' else v for k, v in state.items()}
    for name in [*state, *FC_NORMS]:  # Distinct norms, so a swapped norm shows in the logits.
        if name.endswith('norm.weight') or name.startswith('fc_norm.'):
            state[name] = rng.uniform(0.5, 1.5, 64).astype(np.float16)
    return state, dict(LLAMA_HEAD_CONFIG, **config_flags)


@pytest.mark.parametrize(
    'flags',
    [
        {'fc_norm': True, 'norm_output': True},
        {'eagle_config': {'fc_norm': True, 'norm_output': True}},  # nested, as NVIDIA's heads
        {'norm_output': True},  # fc_norm inferred from its tensors
    ],
)
def test_hand_built_eagle31_head_matches_the_numpy_port(tmp_path, flags):
    """The per-tap norms run before fc: our logits equal the numpy port fed normed taps."""
    rng = np.random.default_rng(4)
    state, config = _hand_built(rng, flags)
    _write(tmp_path, config, state)
    head = ef.load_head(str(tmp_path), LLAMA_TARGET)
    assert head.cfg.fc_norm and head.cfg.norm_output
    t = 6
    emb = rng.normal(size=(t, 64)).astype(np.float32)
    taps = rng.normal(size=(t, 3, 64)) * np.array([1.0, 8.0, 40.0])[:, None]
    eps = config['rms_norm_eps']
    w = np.stack([np.asarray(state[n], np.float64) for n in FC_NORMS])
    normed = taps / np.sqrt((taps * taps).mean(-1, keepdims=True) + eps) * w
    ours = jax.jit(e3.eagle3_forward, static_argnums=0)(  # one compile, not one an op
        head.cfg,
        head.params,
        jnp.asarray(emb)[None],
        jnp.asarray(taps, jnp.float32)[None],
        jnp.arange(t)[None],
        jnp.tril(jnp.ones((t, t), bool))[None],
    )[0][0]
    want = _reference_logits(state, config, emb, normed.reshape(t, -1), eps)
    np.testing.assert_allclose(np.asarray(ours), want, rtol=2e-4, atol=2e-4)
    # The same tensors under speculators names, flags at the top level.
    spec = {k.replace('midlayer.', 'layers.0.'): v for k, v in state.items()}
    cfg = ef.config_from_json(dict(config, norm_output=True), LLAMA_TARGET)
    assert ef.state_to_head(cfg, spec).cfg == head.cfg


def test_eagle3_heads_load_unchanged(tmp_path):
    rng = np.random.default_rng(5)
    _write(tmp_path, LLAMA_HEAD_CONFIG, _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng))
    head = ef.load_head(str(tmp_path), LLAMA_TARGET)
    assert not head.cfg.fc_norm and not head.cfg.norm_output and 'fc_norm_ed' not in head.params


def _drop(*names):
    return lambda s: {k: v for k, v in s.items() if k not in names}


@pytest.mark.parametrize(
    'flags,edit,match',
    [
        ({'fc_norm': True}, _drop(*FC_NORMS), r"lacks \['fc_norm.0.weight', 'fc_norm.1.weight', "
         r"'fc_norm.2.weight'\] \(an EAGLE-3.1 fc_norm head has one fc_norm.i.weight per tap"),
        ({}, _drop('fc_norm.1.weight'), r"lacks \['fc_norm.1.weight'\]"),
        ({}, lambda s: dict(s, **{'fc_norm.2.weight': s['fc_norm.2.weight'][:63]}),
         r'fc_norm.2.weight has shape \(63,\), expected \(64,\): one RMSNorm scale over a tap '
         'of target width 64'),
        ({}, lambda s: dict(s, **{'fc_norm.0.weight': s['fc_norm.0.weight'][:, None]}),
         r'fc_norm.0.weight has shape \(64, 1\), expected \(64,\)'),
        ({}, lambda s: dict(s, **{'fc_norm.3.weight': s['fc_norm.0.weight']}),
         r"does not support: \['fc_norm.3.weight'\]"),
        ({'fc_norm': False}, lambda s: s,
         r"sets fc_norm: false but the head has fc_norm tensors \['fc_norm.0.weight'"),
        ({'norm_output': 'yes'}, lambda s: s, "norm_output must be true or false, got 'yes'"),
        ({'norm_output': True, 'eagle_config': {'norm_output': False}}, lambda s: s,
         'sets norm_output both true and false'),
    ],
)  # fmt: skip
def test_missing_or_malformed_eagle31_parts_fail(tmp_path, flags, edit, match):
    rng = np.random.default_rng(6)
    state, config = _hand_built(rng, flags)
    _write(tmp_path, config, edit(state))
    with pytest.raises(CheckpointError, match=match):
        ef.load_head(str(tmp_path), LLAMA_TARGET)
