"""Scanned layers (`ModelConfig.scan_layers`): the same model as the unrolled one.

The scanned decoder runs the layers as one `nn.scan` over parameters stacked [L, ...] and a
KV cache of [L, R, S, H] arrays; its forward, its greedy AR and chain tokens (through
`decoding.generate`), its tree commit and its int8 variant must equal the unrolled model's
in fp32 (tiny configs with prime sizes).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

from spec_jax import checkpoints, decoding, sharding
from spec_jax.checkpoints.convert import param_shapes, params_to_state
from spec_jax.checkpoints.hf import config_to_hf
from spec_jax.decoding.drafters import LMDrafter
from spec_jax.models import quant
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import LAYERS, causal_forward, forward, stack_layers, unstack_layers
from spec_jax.testing import random_params, tiny

# Untied head and qkv biases: every kind of parameter is stacked (L 3, V 31, D 28).
CFG = ModelConfig.tiny('qwen2', vocab_size=31)
SCAN = CFG.replace(scan_layers=True)
B, T, S = 3, 7, 23


@pytest.fixture(scope='module')
def params():
    return random_params(CFG, seed=1, std=0.16)


def test_stacked_tree_is_the_scanned_init(params):
    stacked = stack_layers(params, CFG.num_layers)
    assert sorted(stacked) == sorted([LAYERS, 'embed_vd', 'final_norm', 'lm_head_vd'])
    want = jax.tree.map(lambda s: (s.shape, s.dtype), param_shapes(SCAN))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), stacked) == want
    assert stacked[LAYERS]['attn']['q_dnh'].shape == (3, CFG.width, 6, CFG.head_dim)
    back = unstack_layers(stacked)
    jax.tree.map(np.testing.assert_array_equal, back, params)
    with pytest.raises(ValueError, match='layer_3'):
        stack_layers(params, 4)


def test_stacked_specs_follow_the_names(params):
    """A stacked leaf keeps its name's sharding behind a replicated L axis."""
    specs = sharding.param_specs(stack_layers(params, CFG.num_layers))
    layer = specs[LAYERS]
    assert layer['attn']['q_dnh'] == P(None, None, 'model', None)
    assert layer['attn']['o_nhd'] == P(None, 'model', None, None)
    assert layer['mlp']['down_fd'] == P(None, 'model', None)
    assert layer['attn']['q_bias_nh'] == P(None, 'model', None)
    assert layer['attn_norm']['scale'] == P()
    mesh = AbstractMesh((1, 2), ('data', 'model'))
    assert sharding.param_specs(stack_layers(params, 3), mesh)[LAYERS]['mlp']['gate_df'] == P(
        None, None, 'model'
    )


def _prefill_then_step(cfg, params, toks, taps=()):
    cache = KVCache.init(cfg, B, S)
    out, tap, cache = forward(
        cfg, params, toks[:, :-1], cache.positions(T - 1), cache, cache.causal_mask(T - 1), taps
    )
    cache = cache.advance(T - 1)
    step, _, cache = forward(cfg, params, toks[:, -1:], cache.positions(1), cache,
                             cache.causal_mask(1))  # fmt: skip
    return out, tap, step, cache


def test_forward_equals_unrolled(params):
    toks = jax.random.randint(jax.random.PRNGKey(0), (B, T), 0, CFG.vocab_size)
    taps = (0, 2)
    want = _prefill_then_step(CFG, params, toks, taps)
    got = _prefill_then_step(SCAN, stack_layers(params, CFG.num_layers), toks, taps)
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)
    assert got[3].k.shape == (CFG.num_layers, *want[3].k[0].shape)
    np.testing.assert_array_equal(got[3].k, jnp.stack(want[3].k))
    np.testing.assert_array_equal(got[3].v, jnp.stack(want[3].v))
    with pytest.raises(ValueError, match='stacked'):  # An unrolled model's cache.
        unrolled_cache = KVCache.init(CFG, B, S)
        forward(SCAN, stack_layers(params, 3), toks[:, :1], unrolled_cache.positions(1),
                unrolled_cache, unrolled_cache.causal_mask(1))  # fmt: skip


def test_commit_path_of_a_stacked_cache():
    """A tree commit moves the same slots in every layer of a stacked cache."""
    rng = np.random.default_rng(0)
    unrolled = KVCache.init(CFG, B, S)
    unrolled = unrolled.replace(
        k=tuple(jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in unrolled.k),
        v=tuple(jnp.asarray(rng.standard_normal(x.shape), x.dtype) for x in unrolled.v),
    ).set_lengths(jnp.array([2, 5, 0]))
    stacked = unrolled.replace(k=jnp.stack(unrolled.k), v=jnp.stack(unrolled.v))
    path, length = jnp.array([[0, 2, 3], [0, 1, 1], [0, 3, 0]]), jnp.array([3, 2, 1])
    want, got = unrolled.commit_path(path, length), stacked.commit_path(path, length)
    np.testing.assert_array_equal(got.k, jnp.stack(want.k))
    np.testing.assert_array_equal(got.v, jnp.stack(want.v))
    np.testing.assert_array_equal(got.lengths, want.lengths)
    assert KVCache.init(SCAN, B, S).k.shape == (3, B * CFG.num_kv_heads, S, CFG.head_dim)


def test_int8_scanned_equals_int8_unrolled(params):
    toks = jax.random.randint(jax.random.PRNGKey(1), (B, T), 0, CFG.vocab_size)
    q = quant.quantize_params(params)
    stacked = stack_layers(q, CFG.num_layers)
    assert stacked[LAYERS]['attn']['q_scale_nh'].shape == (3, 6, CFG.head_dim)
    want, _ = causal_forward(CFG.replace(weights='int8'), q, toks)
    got, _ = causal_forward(SCAN.replace(weights='int8'), stacked, toks)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_greedy_tokens_equal_unrolled():
    """AR and chain (an unrolled draft LM, gamma 3) through `decoding.generate`."""
    target = tiny.target_params()
    stacked = stack_layers(target, tiny.TARGET.num_layers)
    scan_cfg = tiny.TARGET.replace(scan_layers=True)
    dec = tiny.DECODE

    def run(cfg, params, drafter=None, draft=None, num_draft=0):
        engine = decoding.Engine(cfg, dec, drafter, num_draft)
        return decoding.generate(engine, decoding.Params(params, draft), tiny.PROMPTS).tokens

    ar = run(tiny.TARGET, target)
    assert run(scan_cfg, stacked) == ar
    draft = tiny.draft_params()
    chain = run(scan_cfg, stacked, LMDrafter(tiny.DRAFT), draft, 3)
    assert chain == ar
    assert len(set(map(tuple, ar))) > 1  # Rows that differ: the prompts matter.


def test_load_stacks_an_unrolled_checkpoint(tmp_path, params):
    """`checkpoints.load(scan_layers=True)` reads the `layer_{i}` layout and stacks it; the
    int8 option composes (quantized per tensor, then stacked)."""
    directory = tmp_path / 'hf'
    directory.mkdir()
    save_file(params_to_state(CFG, jax.tree.map(np.asarray, params)),
              str(directory / 'model.safetensors'))  # fmt: skip
    (directory / 'config.json').write_text(json.dumps(config_to_hf(CFG)))
    model = checkpoints.load(str(directory), scan_layers=True)
    assert model.cfg == SCAN
    jax.tree.map(np.testing.assert_array_equal, model.params, stack_layers(params, 3))
    model8 = checkpoints.load(str(directory), scan_layers=True, quantize='int8')
    assert model8.cfg == SCAN.replace(weights='int8')
    assert model8.params[LAYERS]['mlp']['down_fd'].dtype == jnp.int8
    assert model8.params[LAYERS]['mlp']['down_scale_d'].shape == (3, CFG.width)
