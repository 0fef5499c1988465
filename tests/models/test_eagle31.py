"""EAGLE-3.1 heads: where fc_norm and norm_output act, and that training reaches fc_norm.

Each test compares a 3.1 head with the EAGLE-3 head of the same weights fed what the 3.1
parts should compute by hand, so a norm in the wrong place (over the concatenated taps,
after fc, twice before lm_head, not fed back) shows as a difference.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig
from spec_jax.train import eagle3 as te

TARGET = ModelConfig.tiny(num_layers=6)
HEAD3 = e3.Eagle3Config.for_target(
    TARGET, draft_vocab_size=31, num_heads=4, num_kv_heads=2, head_dim=6, mlp_width=23
)
HEAD31 = HEAD3.replace(fc_norm=True, norm_output=True)
B, T = 2, 5
EPS = HEAD3.rms_eps


def _rms(x, w):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * w


@pytest.fixture(scope='module')
def heads():
    """(EAGLE-3 params, the same weights with fc_norm scales, taps [B, T, E, D_t], embeds)."""
    rng = np.random.default_rng(0)
    shapes = jax.eval_shape(lambda: e3.init_params(HEAD3, jax.random.PRNGKey(1)))  # no compile
    p3 = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.06, s.shape), jnp.float32), shapes)
    p3['norm']['scale'] = jnp.asarray(rng.uniform(0.5, 1.5, HEAD3.width), jnp.float32)
    scales = rng.uniform(0.5, 1.5, (3, TARGET.width)).astype(np.float32)
    p31 = dict(p3, fc_norm_ed=jnp.asarray(scales))
    # Taps of very different sizes, as a real target's low, mid and high layers are.
    taps = rng.normal(size=(B, T, 3, TARGET.width)) * np.array([1.0, 8.0, 40.0])[:, None]
    emb = rng.normal(size=(B, T, TARGET.width))
    return p3, p31, jnp.asarray(taps, jnp.float32), jnp.asarray(emb, jnp.float32)


def _call(cfg, params, emb, hidden, apply_fc=True):
    t = emb.shape[1]
    pos = jnp.broadcast_to(jnp.arange(t), (B, t))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (B, t, t))
    logits, hidden, _ = e3.eagle3_forward(cfg, params, emb, hidden, pos, mask, apply_fc=apply_fc)
    return np.asarray(logits), np.asarray(hidden)


def test_init_params_has_the_fc_norm_scales():
    shapes = jax.eval_shape(lambda: e3.init_params(HEAD31, jax.random.PRNGKey(0)))
    assert shapes['fc_norm_ed'].shape == (3, TARGET.width)
    assert 'fc_norm_ed' not in jax.eval_shape(lambda: e3.init_params(HEAD3, jax.random.PRNGKey(0)))


def test_fc_norm_normalises_each_tap_before_fc(heads):
    """fc_norm = concat(w_i * rmsnorm(tap_i)) then fc: the EAGLE-3 head fed those taps gives
    the same logits; scaling one tap changes nothing with fc_norm and everything without."""
    p3, p31, taps, emb = heads
    cfg = HEAD3.replace(fc_norm=True)
    got, _ = _call(cfg, p31, emb, taps)
    normed = _rms(np.asarray(taps, np.float64), np.asarray(p31['fc_norm_ed'], np.float64))
    want, _ = _call(HEAD3, p3, emb, jnp.asarray(normed, jnp.float32))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    scaled = taps.at[:, :, 1].multiply(50.0)
    np.testing.assert_allclose(_call(cfg, p31, emb, scaled)[0], got, rtol=1e-4, atol=1e-4)
    plain = _call(HEAD3, p3, emb, taps)[0]
    assert np.abs(_call(HEAD3, p3, emb, scaled)[0] - plain).max() > 1e-2


def test_norm_output_feeds_back_the_normed_hidden(heads):
    """norm_output: the returned hidden is norm(layer output), lm_head reads it without a second
    norm (same logits as EAGLE-3), and the next step runs on it."""
    p3, _, taps, emb = heads
    cfg = HEAD3.replace(norm_output=True)
    logits3, hidden3 = _call(HEAD3, p3, emb, taps)
    logits31, hidden31 = _call(cfg, p3, emb, taps)
    scale = np.asarray(p3['norm']['scale'], np.float64)
    np.testing.assert_allclose(hidden31, _rms(hidden3.astype(np.float64), scale), atol=1e-4)
    np.testing.assert_allclose(logits31, logits3, rtol=1e-4, atol=1e-4)
    lm_head = np.asarray(p3['lm_head_ud'], np.float64)
    np.testing.assert_allclose(logits31, hidden31 @ lm_head.T, rtol=1e-4, atol=1e-4)
    # Step 2 on the fed-back hidden: the EAGLE-3 head fed the normed hidden, then normed.
    got, _ = _call(cfg, p3, emb, jnp.asarray(hidden31), apply_fc=False)
    want, _ = _call(HEAD3, p3, emb, jnp.asarray(hidden31), apply_fc=False)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    assert np.abs(_call(HEAD3, p3, emb, jnp.asarray(hidden3), apply_fc=False)[0] - got).max() > 1e-3


def test_ttt_trains_the_fc_norm_scales(heads):
    """The training-time test's gradient reaches fc_norm_ed and is finite."""
    _, p31, taps, emb = heads
    embed_vd = jax.random.normal(jax.random.PRNGKey(2), (TARGET.vocab_size, TARGET.width))
    tokens = jnp.asarray(np.random.default_rng(1).integers(0, TARGET.vocab_size, (B, T)), jnp.int32)
    valid = jnp.ones((B, T), bool)

    def loss(params):
        logits = te.ttt_forward(HEAD31, params, embed_vd, taps, tokens, valid, 2)
        return jax.nn.logsumexp(logits, -1).mean()

    grad = np.asarray(jax.jit(jax.grad(loss))(p31)['fc_norm_ed'])
    assert np.isfinite(grad).all() and np.abs(grad).max() > 1e-6
