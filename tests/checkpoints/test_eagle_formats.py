"""EAGLE-3 on-disk formats: round trips, a hand-built official state dict, loud failures."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.checkpoints import CheckpointError
from spec_jax.checkpoints import eagle_formats as ef
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig

TARGET = ModelConfig.tiny(num_layers=6)
HEAD = e3.Eagle3Config.for_target(TARGET, draft_vocab_size=29)
B, T = 2, 7


def _head(seed=1):
    params = e3.init_params(HEAD, jax.random.PRNGKey(seed))
    rng = np.random.default_rng(seed)
    # Non-trivial norms so a swapped norm would show in the logits.
    params = jax.tree.map(lambda x: x + jnp.asarray(rng.normal(0, 0.1, x.shape), x.dtype), params)
    used = np.sort(rng.choice(TARGET.vocab_size, HEAD.draft_vocab_size, replace=False))
    d2t, t2d = e3.vocab_maps(used, TARGET.vocab_size)
    return e3.Eagle3Head(HEAD, params, jnp.asarray(d2t), jnp.asarray(t2d))


@jax.jit
def _logits(params, taps, emb):
    pos = jnp.broadcast_to(jnp.arange(T), (B, T))
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    return e3.eagle3_forward(HEAD, params, emb, taps, pos, mask)[0]


def _inputs():
    rng = np.random.default_rng(0)
    taps = jnp.asarray(rng.normal(size=(B, T, 3, TARGET.width)), jnp.float32)
    emb = jnp.asarray(rng.normal(size=(B, T, TARGET.width)), jnp.float32)
    return taps, emb


@pytest.mark.parametrize('fmt', ['official', 'speculators'])
def test_round_trip_identical_logits(tmp_path, fmt):
    head = _head()
    ef.save_head(str(tmp_path), head, fmt, dtype='float32')
    with open(tmp_path / 'config.json') as f:
        config = json.load(f)
    if fmt == 'official':
        assert config[
            'draft_vocab_size'
        ] == 29 and 'midlayer.self_attn.q_proj.weight' in ef.read_state(str(tmp_path))
    else:
        assert config['speculators_model_type'] == 'eagle3'
        assert config['transformer_layer_config']['hidden_size'] == TARGET.width
    loaded = ef.load_head(str(tmp_path), TARGET)
    assert loaded.cfg == head.cfg
    np.testing.assert_array_equal(loaded.d2t, head.d2t)
    np.testing.assert_array_equal(loaded.t2d, head.t2d)
    taps, emb = _inputs()
    np.testing.assert_array_equal(
        _logits(loaded.params, taps, emb), _logits(head.params, taps, emb)
    )
    # State -> head -> state is exact in both layouts.
    state = ef.head_to_state(head, fmt)
    back = ef.head_to_state(ef.state_to_head(head.cfg, state), fmt)
    assert state.keys() == back.keys()
    for k in state:
        np.testing.assert_array_equal(state[k], back[k])


def test_bf16_export_is_close(tmp_path):
    head = _head()
    ef.save_head(str(tmp_path), head, 'official', dtype='bfloat16')
    loaded = ef.load_head(str(tmp_path), TARGET)
    taps, emb = _inputs()
    np.testing.assert_allclose(
        _logits(loaded.params, taps, emb), _logits(head.params, taps, emb), atol=0.05
    )


def _official_state(h, ht, nh, nkv, hd, f, v, vd, rng):
    """A state dict in the official key layout with the given sizes."""

    def w(*shape):
        return rng.normal(0, 0.02, shape).astype(np.float16)

    used = np.sort(rng.choice(v, vd, replace=False))
    t2d = np.zeros(v, bool)
    t2d[used] = True
    return {
        'fc.weight': w(h, 3 * ht),
        'midlayer.hidden_norm.weight': np.ones(h, np.float16),
        'midlayer.input_layernorm.weight': np.ones(h, np.float16),
        'midlayer.self_attn.q_proj.weight': w(nh * hd, 2 * h),
        'midlayer.self_attn.k_proj.weight': w(nkv * hd, 2 * h),
        'midlayer.self_attn.v_proj.weight': w(nkv * hd, 2 * h),
        'midlayer.self_attn.o_proj.weight': w(h, nh * hd),
        'midlayer.post_attention_layernorm.weight': np.ones(h, np.float16),
        'midlayer.mlp.gate_proj.weight': w(f, h),
        'midlayer.mlp.up_proj.weight': w(f, h),
        'midlayer.mlp.down_proj.weight': w(h, f),
        'norm.weight': np.ones(h, np.float16),
        'lm_head.weight': w(vd, h),
        'd2t': (used - np.arange(vd)).astype(np.int64),
        't2d': t2d,
    }


def _write(directory, config, state):
    from safetensors.numpy import save_file

    os.makedirs(directory, exist_ok=True)
    save_file(state, os.path.join(directory, 'model.safetensors'))
    with open(os.path.join(directory, 'config.json'), 'w') as f:
        json.dump(config, f)


# The yuhuili/EAGLE3-LLaMA3.1-Instruct-8B head, every size divided by 64 (vocab by 512):
# H 4096 -> 64, 32 heads x 128 -> 8 x 8 (q 64 x 128), 8 KV heads -> 2, I 14336 -> 224,
# V 128256 -> 250, draft vocab 32000 -> 62. config.json as released (no rope_theta).
LLAMA_HEAD_CONFIG = {
    'architectures': ['LlamaForCausalLM'],
    'hidden_size': 64,
    'intermediate_size': 224,
    'num_attention_heads': 8,
    'num_key_value_heads': 2,
    'num_hidden_layers': 1,
    'rms_norm_eps': 1e-05,
    'max_position_embeddings': 2048,
    'vocab_size': 250,
    'draft_vocab_size': 62,
    'hidden_act': 'silu',
    'tie_word_embeddings': False,
    'torch_dtype': 'float16',
    'pad_token_id': 0,
    'bos_token_id': 128000,
    'eos_token_id': 128001,
}
LLAMA_TARGET = ModelConfig.llama3_1_8b().replace(
    vocab_size=250, width=64, num_heads=8, num_kv_heads=2, head_dim=8, mlp_width=224
)


def test_hand_built_official_llama_head_loads(tmp_path):
    rng = np.random.default_rng(0)
    state = _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng)
    _write(tmp_path, LLAMA_HEAD_CONFIG, state)
    head = ef.load_head(str(tmp_path), LLAMA_TARGET)
    assert head.cfg.rope_theta == 10000.0 and head.cfg.rope_scaling.kind == 'default'
    assert head.cfg.taps == (2, 16, 29)  # HF hidden_states [2, L//2, L-3] of a 32-layer target
    assert head.cfg.head_dim == 8 and head.cfg.draft_vocab_size == 62
    assert head.params['q_xnh' if False else 'midlayer']['q_xnh'].shape == (128, 8, 8)
    np.testing.assert_array_equal(np.asarray(head.draft_ids_u), np.nonzero(state['t2d'])[0])
    # And it runs: taps [B, T, 3, 64] -> logits over the 62 draft ids.
    pos = jnp.zeros((1, 1), jnp.int32)
    out = e3.eagle3_forward(
        head.cfg,
        head.params,
        jnp.ones((1, 1, 64)),
        jnp.ones((1, 1, 3, 64)),
        pos,
        jnp.ones((1, 1, 1), bool),
    )[0]
    assert out.shape == (1, 1, 62) and np.isfinite(np.asarray(out)).all()
    # The same tensors under speculators names load as the speculators layout.
    spec = {k.replace('midlayer.', 'layers.0.'): v for k, v in state.items()}
    assert ef.detect_format(spec) == 'speculators'


def test_fc_width_mismatch_fails_loudly(tmp_path):
    rng = np.random.default_rng(1)
    state = _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng)
    state['fc.weight'] = state['fc.weight'][:, : 3 * 48]  # taps of a 48-wide target
    _write(tmp_path, LLAMA_HEAD_CONFIG, state)
    with pytest.raises(
        CheckpointError,
        match=r'fc.weight has shape \(64, 144\).*3 taps x '
        r'target width 64 = 192',
    ):
        ef.load_head(str(tmp_path), LLAMA_TARGET)
    # The head's own config against a narrower target: caught before the tensors.
    good = tmp_path / 'good'
    _write(good, LLAMA_HEAD_CONFIG, _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng))
    with pytest.raises(CheckpointError, match='target width 64.*target has width 48'):
        ef.load_head(str(good), LLAMA_TARGET.replace(width=48))


def test_draft_vocab_larger_than_target_fails(tmp_path):
    rng = np.random.default_rng(2)
    _write(
        tmp_path,
        dict(LLAMA_HEAD_CONFIG, draft_vocab_size=251),
        _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng),
    )
    with pytest.raises(
        CheckpointError, match='draft_vocab_size 251 is larger than the target vocab_size 250'
    ):
        ef.load_head(str(tmp_path), LLAMA_TARGET)
    # A head whose t2d covers another vocabulary than the target's.
    _write(tmp_path / 'v', LLAMA_HEAD_CONFIG, _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng))
    with pytest.raises(
        CheckpointError, match='t2d covers 250 target ids but the target vocabulary has 300'
    ):
        ef.load_head(str(tmp_path / 'v'), LLAMA_TARGET.replace(vocab_size=300))


def test_missing_d2t_fails(tmp_path):
    rng = np.random.default_rng(3)
    state = _official_state(64, 64, 8, 2, 8, 224, 250, 62, rng)
    del state['d2t']
    _write(tmp_path, LLAMA_HEAD_CONFIG, state)
    with pytest.raises(CheckpointError, match=r"lacks \['d2t'\].*needs d2t and t2d"):
        ef.load_head(str(tmp_path), LLAMA_TARGET)


def test_not_an_eagle_head(tmp_path):
    with pytest.raises(CheckpointError, match='no fc.weight'):
        ef.detect_format({'model.embed_tokens.weight': 0})
    with pytest.raises(CheckpointError, match='midlayer'):
        ef.detect_format({'fc.weight': 0, 'norm.weight': 0})


def test_unsupported_tensors_and_options_fail(tmp_path):
    """A head with parts this loader does not model must not load with them dropped."""
    head = _head()
    ef.save_head(str(tmp_path), head, 'official', dtype='float32')
    with open(tmp_path / 'config.json') as f:
        config = json.load(f)
    state = ef.head_to_state(head)
    biased = dict(state, **{'midlayer.self_attn.q_proj.bias': np.zeros(HEAD.width, np.float32)})
    with pytest.raises(CheckpointError, match=r"does not support: \['midlayer.self_attn.q_proj"):
        ef.state_to_head(HEAD, biased)
    for option in ('norm_before_fc', 'attention_bias'):
        with pytest.raises(CheckpointError, match=f'sets {option}: true'):
            ef.config_from_json(dict(config, **{option: True}), TARGET)


@pytest.mark.parametrize('fmt', ['official', 'speculators'])
def test_norm_before_residual_survives_export(tmp_path, fmt):
    head = _head()
    head = e3.Eagle3Head(
        head.cfg.replace(norm_before_residual=True), head.params, head.d2t, head.t2d
    )
    ef.save_head(str(tmp_path), head, fmt, dtype='float32')
    assert ef.load_head(str(tmp_path), TARGET).cfg.norm_before_residual


def _reference_logits(state, config, emb_td, taps_td, eps):
    """The official head's forward in numpy, written from docs/eagle3.md §1 (one sequence at
    positions 0..T-1): fc over the concatenated taps; attention input = [input_layernorm(
    embedding), hidden_norm(hidden)] (embedding first); residual = the hidden before its norm;
    RoPE rotate-half; GQA; SiLU MLP; final norm; lm_head over the draft vocabulary."""
    w = {k: np.asarray(v, np.float64) for k, v in state.items()}
    nh, nkv = config['num_attention_heads'], config['num_key_value_heads']
    hd = config.get('head_dim') or config['hidden_size'] // nh
    theta = config.get('rope_theta', 10000.0)

    def norm(x, name):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w[name]

    def rope(x):  # [T, heads, hd]
        angles = np.arange(len(x))[:, None] * theta ** (-np.arange(0, hd, 2) / hd)
        cos, sin = np.cos(np.tile(angles, 2))[:, None], np.sin(np.tile(angles, 2))[:, None]
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return x * cos + np.concatenate([-x2, x1], -1) * sin

    t = len(emb_td)
    hidden = taps_td @ w['fc.weight'].T
    x = np.concatenate(
        [
            norm(emb_td, 'midlayer.input_layernorm.weight'),
            norm(hidden, 'midlayer.hidden_norm.weight'),
        ],
        -1,
    )
    q = rope((x @ w['midlayer.self_attn.q_proj.weight'].T).reshape(t, nh, hd))
    k = rope((x @ w['midlayer.self_attn.k_proj.weight'].T).reshape(t, nkv, hd))
    v = (x @ w['midlayer.self_attn.v_proj.weight'].T).reshape(t, nkv, hd)
    k, v = np.repeat(k, nh // nkv, 1), np.repeat(v, nh // nkv, 1)
    scores = np.einsum('qnh,knh->nqk', q, k) / np.sqrt(hd)
    scores = np.where(np.tril(np.ones((t, t), bool)), scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    attn = np.einsum('nqk,knh->qnh', probs, v).reshape(t, nh * hd)
    r = hidden + attn @ w['midlayer.self_attn.o_proj.weight'].T
    m = norm(r, 'midlayer.post_attention_layernorm.weight')
    gate, up = m @ w['midlayer.mlp.gate_proj.weight'].T, m @ w['midlayer.mlp.up_proj.weight'].T
    out = r + (gate / (1 + np.exp(-gate)) * up) @ w['midlayer.mlp.down_proj.weight'].T
    return norm(out, 'norm.weight') @ w['lm_head.weight'].T


@pytest.mark.parametrize('head_dim,theta', [(None, None), (16, 5e5)])  # Llama; Qwen3-like
def test_official_head_matches_a_numpy_port(tmp_path, head_dim, theta):
    """Loaded official tensors give the official forward's logits: column order of q/k/v
    (embedding first), which norm goes where, the residual, RoPE, an explicit head_dim."""
    rng = np.random.default_rng(2)
    nh, hd = 8, head_dim or 8
    config = dict(LLAMA_HEAD_CONFIG)
    if head_dim:
        config['head_dim'] = head_dim  # 8 heads x 16 = 128 != hidden 64
    if theta:
        config['rope_theta'] = theta
    state = _official_state(64, 64, nh, 2, hd, 224, 250, 62, rng)
    state = {k: v * 20 if v.ndim == 2 and k != 'fc.weight' else v for k, v in state.items()}
    for name in state:  # Distinct norms, so a swapped norm shows in the logits.
        if name.endswith('norm.weight'):
            state[name] = rng.uniform(0.5, 1.5, state[name].shape).astype(np.float16)
    _write(tmp_path, config, state)
    head = ef.load_head(str(tmp_path), LLAMA_TARGET)
    t = 6
    emb = rng.normal(size=(t, 64)).astype(np.float32)
    taps = rng.normal(size=(t, 3, 64)).astype(np.float32)
    ours = e3.eagle3_forward(
        head.cfg,
        head.params,
        jnp.asarray(emb)[None],
        jnp.asarray(taps)[None],
        jnp.arange(t)[None],
        jnp.tril(jnp.ones((t, t), bool))[None],
    )[0][0]
    want = _reference_logits(state, config, emb, taps.reshape(t, -1), config['rms_norm_eps'])
    np.testing.assert_allclose(np.asarray(ours), want, rtol=2e-4, atol=2e-4)
