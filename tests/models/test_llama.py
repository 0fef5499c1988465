"""The decoder: prefill + steps + chunks == one full forward; masks; taps; shapes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.models import attention
from spec_jax.models import cache as cache_lib
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.models.llama import causal_forward, forward, init_params

FAMILIES = {
    'llama': ModelConfig.tiny('llama'),
    'llama3_scaled': ModelConfig.tiny(
        'llama', tie_embeddings=False, rope_scaling=RopeScaling('llama3', 8.0, 1.0, 4.0, 32)
    ),
    'qwen2': ModelConfig.tiny('qwen2'),
    'qwen3': ModelConfig.tiny('qwen3'),
}
B, T, S = 3, 23, 37  # Batch, tokens, cache slots: distinct primes.


@pytest.fixture(scope='module', params=sorted(FAMILIES))
def model(request):
    cfg = FAMILIES[request.param]
    params = init_params(cfg, jax.random.PRNGKey(0))
    # Random norms and biases so that every parameter matters (numpy: no per-shape compiles).
    rng = np.random.default_rng(1)
    params = jax.tree.map(lambda x: x + 0.1 * rng.standard_normal(x.shape, np.float32), params)
    return cfg, params


def tokens(cfg, seed=2):
    return jax.random.randint(jax.random.PRNGKey(seed), (B, T), 0, cfg.vocab_size)


def test_param_shapes(model):
    cfg, params = model
    d, n, k, h, l = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.num_layers
    assert sorted(p for p in params if p.startswith('layer_')) == [f'layer_{i}' for i in range(l)]
    attn = params[f'layer_{l - 1}']['attn']
    assert attn['q_dnh'].shape == (d, n, h)
    assert attn['k_dkh'].shape == (d, k, h)
    assert attn['o_nhd'].shape == (n, h, d)
    assert params['layer_0']['mlp']['down_fd'].shape == (cfg.mlp_width, d)
    assert ('lm_head_vd' in params) == (not cfg.tie_embeddings)


@pytest.mark.parametrize('prefix,chunk', [(7, 1), (5, 4)])
def test_prefill_then_steps_equals_full_forward(model, prefix, chunk):
    cfg, params = model
    toks = tokens(cfg)
    want, _ = causal_forward(cfg, params, toks)
    cache = cache_lib.KVCache.init(cfg, B, S)
    outs = []
    for start in [0, *range(prefix, T, chunk)]:
        stop = prefix if start == 0 else min(start + chunk, T)
        n = stop - start
        logits, _, cache = forward(
            cfg, params, toks[:, start:stop], cache.positions(n), cache, cache.causal_mask(n)
        )
        cache = cache.advance(n)
        outs.append(logits)
    got = jnp.concatenate(outs, axis=1)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)


def test_a_call_longer_than_a_query_block_equals_short_calls():
    """A call of 1,031 tokens attends in 3 query blocks of 344 (`attention.QUERY_BLOCK`
    512; the last block padded with one masked query): its logits and cache equal those
    of calls of at most 512 tokens, each one block."""
    cfg = FAMILIES['qwen2']
    params = init_params(cfg, jax.random.PRNGKey(0))
    t, s = 1031, 1039
    assert attention.block_tokens(t) == 344 and attention.block_tokens(500) == 500
    toks = jax.random.randint(jax.random.PRNGKey(3), (2, t), 0, cfg.vocab_size)

    def run(calls):
        cache, outs = cache_lib.KVCache.init(cfg, 2, s), []
        for start, stop in calls:
            n = stop - start
            logits, _, cache = forward(
                cfg, params, toks[:, start:stop], cache.positions(n), cache, cache.causal_mask(n)
            )
            cache, _ = cache.advance(n), outs.append(logits)
        return jnp.concatenate(outs, axis=1), cache

    got, got_cache = run([(0, t)])
    want, want_cache = run([(0, 500), (500, 1000), (1000, t)])
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    np.testing.assert_allclose(got_cache.k[-1], want_cache.k[-1], atol=2e-5, rtol=1e-5)


def test_rows_of_different_lengths(model):
    """Each row continues from its own length; rows never see each other."""
    cfg, params = model
    toks = tokens(cfg)
    want, _ = causal_forward(cfg, params, toks)
    lengths = jnp.array([4, 9, 16])
    cache = cache_lib.KVCache.init(cfg, B, S)
    _, _, cache = forward(
        cfg, params, toks[:, :16], cache.positions(16), cache, cache.causal_mask(16)
    )
    cache = cache.set_lengths(lengths)
    step = jnp.take_along_axis(toks, lengths[:, None], axis=1)
    logits, _, _ = forward(cfg, params, step, cache.positions(1), cache, cache.causal_mask(1))
    expect = jnp.take_along_axis(want, lengths[:, None, None], axis=1)
    np.testing.assert_allclose(logits, expect, atol=2e-5, rtol=1e-5)


def test_tree_mask_matches_chains(model):
    """Verifying a tree in one call gives each node the logits of its own root path."""
    cfg, params = model
    toks = tokens(cfg)
    prefix = 6
    parents = np.array([-1, 0, 0, 1, 1, 2, 3])  # Node 0 is the root.
    ancestors = np.eye(len(parents), dtype=bool)
    for i, p in enumerate(parents):
        if p >= 0:
            ancestors[i] |= ancestors[p]
    depth = ancestors.sum(1) - 1
    node_tokens = jax.random.randint(jax.random.PRNGKey(5), (B, len(parents)), 0, cfg.vocab_size)

    cache = cache_lib.KVCache.init(cfg, B, S)
    _, _, cache = forward(
        cfg, params, toks[:, :prefix], cache.positions(prefix), cache, cache.causal_mask(prefix)
    )
    cache = cache.advance(prefix)
    mask = cache_lib.tree_mask(cache.lengths, jnp.broadcast_to(ancestors, (B, 7, 7)), S)
    positions = cache.lengths[:, None] + jnp.asarray(depth)[None]
    tree_logits, _, tree_cache = forward(cfg, params, node_tokens, positions, cache, mask)

    for node in range(len(parents)):
        path = np.nonzero(ancestors[node])[0]  # Root ... node, in depth order.
        # Right-pad every path to one length so that one compiled shape serves all nodes.
        padded = np.concatenate([path, np.zeros(4 - len(path), int)])
        seq = jnp.concatenate([toks[:, :prefix], node_tokens[:, padded]], axis=1)
        want, _ = causal_forward(cfg, params, seq)
        np.testing.assert_allclose(
            tree_logits[:, node], want[:, prefix + len(path) - 1], atol=2e-5, rtol=1e-5
        )

    # Commit the path root -> 1 -> 3 -> 6 and continue: same as decoding that chain.
    path = jnp.broadcast_to(jnp.array([0, 1, 3, 6]), (B, 4))
    committed = tree_cache.commit_path(path, jnp.full((B,), 4))
    nxt = toks[:, :1]
    logits, _, _ = forward(
        cfg, params, nxt, committed.positions(1), committed, committed.causal_mask(1)
    )
    seq = jnp.concatenate([toks[:, :prefix], node_tokens[:, [0, 1, 3, 6]], nxt], axis=1)
    want, _ = causal_forward(cfg, params, seq)
    np.testing.assert_allclose(logits[:, 0], want[:, -1], atol=2e-5, rtol=1e-5)


def test_taps_are_layer_inputs(model):
    cfg, params = model
    toks = tokens(cfg)
    _, taps = causal_forward(cfg, params, toks, tap_layers=(0, 2))
    assert taps.shape == (B, T, 2, cfg.width)
    embed = params['embed_vd'][toks]
    np.testing.assert_allclose(taps[:, :, 0], embed, atol=1e-6)
    # Layer 2's input differs from the embedding and from layer 0's.
    assert float(jnp.abs(taps[:, :, 1] - embed).max()) > 1e-3


def test_logits_index_selects_positions(model):
    cfg, params = model
    toks = tokens(cfg)
    want, _ = causal_forward(cfg, params, toks)
    b, t = toks.shape
    index = jnp.array([[3], [0], [22]])
    got, _, _ = forward(
        cfg,
        params,
        toks,
        jnp.broadcast_to(jnp.arange(t), (b, t)),
        None,
        jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t)),
        logits_index_bu=index,
    )
    np.testing.assert_allclose(got, jnp.take_along_axis(want, index[:, :, None], 1), atol=1e-5)


def test_bad_config_and_taps():
    with pytest.raises(ValueError, match='num_kv_heads'):
        ModelConfig.tiny(num_heads=5, num_kv_heads=2)
    with pytest.raises(ValueError, match="'mamba'"):
        ModelConfig.tiny(family='mamba')
    cfg = ModelConfig.tiny()
    params = init_params(cfg, jax.random.PRNGKey(0))
    with pytest.raises(ValueError, match='tap layer 3'):
        causal_forward(cfg, params, jnp.zeros((1, 2), jnp.int32), tap_layers=(3,))
