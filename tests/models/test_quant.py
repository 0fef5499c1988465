"""int8 weight-only quantization (spec_jax.models.quant, `ModelConfig.weights='int8'`).

What is checked: the round trip's error bound; an int8 forward equals the float forward of
its dequantized weights; names, dtypes and shardings of the int8 tree; loading with
`quantize='int8'` (HF directory, random) and a GPTQ directory packed here by the layout
AutoGPTQ documents; the compiled decode step holding no dequantized copy of the weights;
next-token agreement with fp32 on the embedded default (slow).
"""

import dataclasses
import json
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

from spec_jax import checkpoints, sharding
from spec_jax.checkpoints import gptq
from spec_jax.checkpoints.convert import param_shapes, params_to_state, state_to_params
from spec_jax.checkpoints.hf import config_to_hf
from spec_jax.models import llama, quant
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import causal_forward
from spec_jax.testing import random_params

# Untied head and qkv biases (qwen2): every quantized name and every float leaf appear.
CFG = ModelConfig.tiny('qwen2', vocab_size=61, width=28, num_heads=6, num_kv_heads=2)
INT8 = CFG.replace(weights='int8')


@pytest.fixture(scope='module')
def params():
    return random_params(CFG, seed=0, std=0.1)


SHAPES = [('q_dnh', (28, 6, 14)), ('o_nhd', (6, 14, 28)), ('down_fd', (38, 28)),
          ('lm_head_vd', (61, 28))]  # fmt: skip


@pytest.mark.parametrize('name,shape', SHAPES)
def test_round_trip_within_half_a_step(name, shape):
    rng = np.random.default_rng(0)
    w = rng.standard_normal(shape).astype(np.float32) * rng.uniform(0.01, 2.0, shape[-1])
    w[(0,) * (len(shape) - 1)] = 0.0  # Part of one output channel is zero ...
    q, scale = quant.quantize(name, w)
    assert q.dtype == np.int8 and scale.dtype == np.float32
    assert scale.shape == quant.scale_shape(name, shape)
    assert np.abs(q.astype(int)).max() == quant.QMAX  # Each channel's largest |w| is +-127.
    err = np.abs(quant.dequantize(name, q, scale) - w)
    step = quant.dequantize(name, np.ones_like(q), scale)  # The scale, broadcast.
    assert np.all(err <= step / 2 + 1e-6 * np.abs(w))
    # The jax path (on device: orbax and random weights) gives the same int8 values.
    qj, sj = quant.quantize(name, jnp.asarray(w))
    np.testing.assert_array_equal(np.asarray(qj), q)
    np.testing.assert_allclose(np.asarray(sj), scale, rtol=1e-6)  # XLA: amax * (1 / 127).
    zero = np.zeros(shape, np.float32)  # ... and an all-zero weight: scale 1, q 0.
    qz, sz = quant.quantize(name, zero)
    assert not qz.any() and np.all(sz == 1.0)


def test_int8_tree_names_dtypes_and_init(params):
    q = quant.quantize_params(params)
    attn, mlp = q['layer_0']['attn'], q['layer_0']['mlp']
    assert attn['q_dnh'].dtype == jnp.int8 and attn['q_scale_nh'].shape == (6, 14)
    assert attn['k_scale_kh'].shape == (2, 14) and attn['o_scale_d'].shape == (28,)
    assert mlp['gate_scale_f'].shape == (38,) and mlp['down_scale_d'].shape == (28,)
    assert q['lm_head_vd'].dtype == jnp.int8 and q['lm_head_scale_v'].shape == (61,)
    assert q['embed_vd'].dtype == jnp.float32 and attn['q_bias_nh'].dtype == jnp.float32
    # The int8 config's init declares exactly this tree (what param_shapes and the AOT
    # and memory estimates read), with random int8 weights of the float init's std.
    shapes = jax.tree.map(lambda s: (s.shape, s.dtype), param_shapes(INT8))
    assert jax.tree.map(lambda x: (x.shape, x.dtype), q) == shapes
    back = quant.dequantize_params(q)
    assert jax.tree.structure(back) == jax.tree.structure(params)
    with pytest.raises(ValueError, match="'fp8'"):
        CFG.replace(weights='fp8')


def test_int8_forward_equals_dequantized_forward(params):
    """The in-matmul dequantization computes exactly the float model of q * scale."""
    q = quant.quantize_params(params)
    toks = jax.random.randint(jax.random.PRNGKey(0), (3, 11), 0, CFG.vocab_size)
    got, _ = causal_forward(INT8, q, toks)
    want, _ = causal_forward(CFG, quant.dequantize_params(q), toks)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-5)
    exact, _ = causal_forward(CFG, params, toks)  # Quantization itself moves the logits.
    assert 1e-4 < float(jnp.abs(got - exact).max()) < 0.05 * float(jnp.abs(exact).max())


def test_int8_shardings_follow_the_names(params):
    q = quant.quantize_params(params)
    mesh = AbstractMesh((2, 2), ('data', 'model'))
    specs = sharding.param_specs(q, mesh)
    attn, mlp = specs['layer_1']['attn'], specs['layer_1']['mlp']
    assert attn['q_dnh'] == P(None, 'model', None) and attn['q_scale_nh'] == P('model', None)
    assert attn['o_nhd'] == P('model', None, None) and attn['o_scale_d'] == P(None)
    assert mlp['gate_df'] == P(None, 'model') and mlp['gate_scale_f'] == P('model')
    assert mlp['down_fd'] == P('model', None) and mlp['down_scale_d'] == P(None)
    assert specs['lm_head_vd'] == P('model', None) and specs['lm_head_scale_v'] == P('model')
    # A KV-head scale is split like its weight: both by the K rule.
    assert attn['k_scale_kh'][0] == attn['k_dkh'][1]


# ---- loading ----------------------------------------------------------------------------


def _write_hf(directory, cfg, state, extra_config=None):
    directory.mkdir()
    save_file(state, str(directory / 'model.safetensors'))
    config = config_to_hf(cfg)
    config.update(extra_config or {})
    (directory / 'config.json').write_text(json.dumps(config))
    return str(directory)


def test_load_quantize_int8_streams_an_hf_directory(tmp_path, params):
    state = {k: np.asarray(v, np.float32) for k, v in params_to_state(CFG, params).items()}
    path = _write_hf(tmp_path / 'hf', CFG, state)
    model = checkpoints.load(path, quantize='int8')
    assert model.cfg.weights == 'int8'
    # Quantized on the host as it streamed: the numpy quantization of every tensor.
    host = jax.tree.map(np.asarray, params)
    for i in range(CFG.num_layers):
        for group, names in (('attn', ('q_dnh', 'o_nhd')), ('mlp', ('gate_df', 'down_fd'))):
            for name in names:
                q, s = quant.quantize(name, host[f'layer_{i}'][group][name])
                got = model.params[f'layer_{i}'][group]
                np.testing.assert_array_equal(got[name], q)
                np.testing.assert_array_equal(got[quant.scale_name(name)], s)
    np.testing.assert_array_equal(model.params['lm_head_vd'], quant.quantize(
        'lm_head_vd', host['lm_head_vd'])[0])  # fmt: skip
    np.testing.assert_array_equal(model.params['embed_vd'], host['embed_vd'])
    with pytest.raises(ValueError, match="quantize='int4'"):
        checkpoints.load(path, quantize='int4')


def test_orbax_round_trip_keeps_int8(tmp_path, params):
    q = quant.quantize_params(params)
    path = str(tmp_path / 'orbax')
    checkpoints.save_orbax(path, INT8, q)
    jax.tree.map(np.testing.assert_array_equal, checkpoints.load(path).params, q)
    bf16 = checkpoints.load(path, dtype='bfloat16')  # Only the float leaves are cast.
    attn = bf16.params['layer_0']['attn']
    assert (attn['q_dnh'].dtype, attn['q_scale_nh'].dtype) == (jnp.int8, jnp.float32)
    assert bf16.params['embed_vd'].dtype == jnp.bfloat16 and bf16.cfg.weights == 'int8'
    floats = checkpoints.load(path, quantize='float')
    assert floats.cfg.weights == 'float' and 'q_scale_nh' not in floats.params['layer_0']['attn']


def _gptq_pack(w_oi, bits, group_size, rng, act_order, fmt):
    """One Linear [out, in] packed as AutoGPTQ writes it (symmetric, zero 2^(bits-1)):
    returns (tensors, the float weight the packed values mean, HF layout)."""
    out, inp = w_oi.shape
    per, maxq, zero = 32 // bits, 2**bits - 1, 2 ** (bits - 1)
    order = rng.permutation(inp) if act_order else np.arange(inp)
    g_idx = np.empty(inp, np.int32)
    g_idx[order] = np.arange(inp) // group_size  # desc_act: groups in activation order.
    groups = inp // group_size
    scales = np.zeros((groups, out), np.float16)
    for g in range(groups):
        amax = np.abs(w_oi[:, g_idx == g]).max(axis=1)
        scales[g] = np.maximum(2 * amax / maxq, 1e-4)
    s_io = scales.astype(np.float32)[g_idx]  # [in, out]
    q_io = np.clip(np.round(w_oi.T / s_io) + zero, 0, maxq).astype(np.uint32)
    meant = ((q_io.astype(np.float32) - zero) * s_io).T
    qweight = np.zeros((inp // per, out), np.uint32)
    for r in range(inp // per):
        for j in range(per):
            qweight[r] |= q_io[r * per + j] << np.uint32(bits * j)
    stored = np.full((groups, out), zero - (1 if fmt == 'gptq' else 0), np.uint32)
    qzeros = np.zeros((groups, out // per), np.uint32)
    for c in range(out // per):
        for j in range(per):
            qzeros[:, c] |= stored[:, c * per + j] << np.uint32(bits * j)
    tensors = {'qweight': qweight.view(np.int32), 'qzeros': qzeros.view(np.int32),
               'scales': scales, 'g_idx': g_idx}  # fmt: skip
    return tensors, meant


# A width and MLP that 32-bit words and groups of 16 divide.
GPTQ_CFG = ModelConfig.tiny('qwen2', vocab_size=61, width=32, num_heads=4, num_kv_heads=2,
                            head_dim=8, mlp_width=48)  # fmt: skip


@pytest.mark.parametrize('bits,fmt,act_order', [(8, 'gptq', True), (4, 'gptq_v2', False)])
def test_gptq_directory_loads_as_int8(tmp_path, bits, fmt, act_order):
    cfg = GPTQ_CFG
    rng = np.random.default_rng(bits)
    float_state = params_to_state(cfg, random_params(cfg, seed=2, std=0.1))
    files, meant = {}, {}
    for name, w in float_state.items():
        w = np.asarray(w, np.float32)
        if name.endswith('proj.weight'):
            base = name[: -len('.weight')]
            tensors, meant[name] = _gptq_pack(w, bits, 16, rng, act_order, fmt)
            files.update({f'{base}.{k}': v for k, v in tensors.items()})
            if '.o_proj' in name:  # Exporters write a zero bias for every Linear.
                files[f'{base}.bias'] = np.zeros(w.shape[0], np.float16)
        else:
            files[name] = w.astype(np.float16)
            meant[name] = w.astype(np.float16).astype(np.float32)
    qconfig = {'quant_method': 'gptq', 'bits': bits, 'group_size': 16, 'desc_act': act_order,
               'sym': True, 'checkpoint_format': fmt}  # fmt: skip
    path = _write_hf(tmp_path / 'gptq', cfg, files, {'quantization_config': qconfig})

    layout = gptq.layout_of(path)
    assert (layout.bits, layout.zero_offset) == (bits, 1 if fmt == 'gptq' else 0)
    base = 'model.layers.1.mlp.down_proj'
    got = gptq.dequantize(layout, *(files[f'{base}.{p}'] for p in gptq._PARTS))
    np.testing.assert_array_equal(got, meant[f'{base}.weight'])  # Unpacked exactly.

    model = checkpoints.load(path)
    assert model.cfg.weights == 'int8'
    ref = state_to_params(cfg, meant.get, list(meant))  # The float model the file means.
    deq = quant.dequantize_params(model.params)
    assert jax.tree.structure(deq) == jax.tree.structure(ref)
    for (p, x), y in zip(jax.tree_util.tree_flatten_with_path(deq)[0], jax.tree.leaves(ref)):
        if p[-1].key not in quant.QUANTIZED:
            np.testing.assert_array_equal(x, y)  # Embedding, norms, biases: as stored.
    # Requantizing adds at most half a step of the per-channel grid to each element.
    for i in range(cfg.num_layers):
        for group, leaf in (('attn', 'q_dnh'), ('attn', 'o_nhd'), ('mlp', 'down_fd')):
            w8 = model.params[f'layer_{i}'][group][leaf]
            s = model.params[f'layer_{i}'][group][quant.scale_name(leaf)]
            step = quant.dequantize(leaf, jnp.ones_like(w8), s)
            err = jnp.abs(quant.dequantize(leaf, w8, s) - ref[f'layer_{i}'][group][leaf])
            assert bool(jnp.all(err <= step / 2 + 1e-6))
    float_model = checkpoints.load(path, quantize='float')
    assert float_model.cfg.weights == 'float'
    jax.tree.map(lambda x, y: np.testing.assert_allclose(x, y, atol=1e-6), float_model.params,
                 ref)  # fmt: skip

    bad = dict(files, **{f'{base.replace("down", "up")}.bias': np.ones(48, np.float16)})
    bad_path = _write_hf(tmp_path / 'bad', cfg, bad, {'quantization_config': qconfig})
    with pytest.raises(checkpoints.CheckpointError, match='up_proj.bias is non-zero'):
        checkpoints.load(bad_path)


# ---- memory of the compiled decode loop -------------------------------------------------

MEM_CFG = ModelConfig.tiny(
    vocab_size=512, width=256, num_layers=4, num_heads=8, num_kv_heads=2, head_dim=32,
    mlp_width=1024, tie_embeddings=False,
)  # fmt: skip


# The loop body of an AR decode (a while loop of steps with a cache), compiled in a fresh
# process with XLA:CPU's sequential scheduler: its default concurrency-optimized scheduler
# gives every temporary its own buffer (live ranges are not reused), so a dot's converted
# operand costs a weight-sized buffer per dot whatever the code does (measured: 15.7 MB of
# temp for the 16.3 MB of fp32 weights below, in-matmul or not). On TPU (a v5e compile)
# the convolution reads the int8 weight itself. Without quant.matmul's barrier the int8
# loop measured 15.4 MB here too (XLA hoisted the converts out of the loop). Printed: the
# temp bytes of the int8 loop and of the same loop with the weights dequantized outside
# the matmuls (`dequantize_params` at the top of the step).
_LOOP_MEMORY = r"""
import json, sys
import jax, jax.numpy as jnp
from spec_jax.models import quant
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward
from spec_jax.testing import random_params

cfg = ModelConfig(**json.loads(sys.argv[1]))
int8 = cfg.replace(weights='int8')
fp = random_params(cfg, seed=0)
q = quant.quantize_params(fp)
cache = KVCache.init(cfg, 2, 64)
tokens = jnp.zeros((2, 1), jnp.int32)

def loop(step_cfg, dequantize):
    def run(p, cache):
        def body(i, carry):
            cache, total = carry
            w = quant.dequantize_params(p) if dequantize else p
            logits, _, cache = forward(step_cfg, w, tokens, cache.positions(1), cache,
                                       cache.causal_mask(1))
            return cache.advance(1), total + logits.sum()
        return jax.lax.fori_loop(0, 4, body, (cache, 0.0))
    return run

def temp(fn, p):
    return jax.jit(fn).lower(p, cache).compile().memory_analysis().temp_size_in_bytes

print(json.dumps(dict(
    fp32_weights=sum(x.nbytes for x in jax.tree.leaves(fp)),
    int8_weights=sum(x.nbytes for x in jax.tree.leaves(q)),
    largest=max(x.nbytes for x in jax.tree.leaves(fp)),
    float_loop=temp(loop(cfg, False), fp),
    int8_loop=temp(loop(int8, False), q),
    dequantized_outside=temp(loop(cfg, True), q),
)))
"""


def test_decode_loop_holds_no_dequantized_weights():
    args = {k: v for k, v in dataclasses.asdict(MEM_CFG).items() if k != 'rope_scaling'}
    env = dict(os.environ, JAX_PLATFORMS='cpu',
               XLA_FLAGS='--xla_cpu_enable_concurrency_optimized_scheduler=false')  # fmt: skip
    out = subprocess.run([sys.executable, '-c', _LOOP_MEMORY, json.dumps(args)], env=env,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    print(f'\n{m}')
    # In the matmul: at most about one converted weight at a time beside the float loop's.
    assert m['int8_loop'] < m['float_loop'] + 1.5 * m['largest']
    assert m['int8_loop'] < 0.2 * m['fp32_weights']
    assert m['int8_weights'] < 0.3 * m['fp32_weights']  # 1 byte a weight, 4 a channel.
    # The same bound fails for weights dequantized outside the matmuls (XLA hoists the
    # loop-invariant dequantization: a float copy of every weight across the loop).
    assert m['dequantized_outside'] > 0.8 * m['fp32_weights']


# ---- the embedded default ---------------------------------------------------------------

PROMPTS = [
    'What is the capital of France?',
    'Explain how a bicycle works.',
    'Write a Python function that returns the n-th Fibonacci number.',
    'Natalia sold clips to 48 of her friends in April, and then she sold half as many clips '
    'in May. How many clips did Natalia sell altogether in April and May?',
    'List three prime numbers larger than 100 and explain why they are prime.',
    'Translate to French: the cat sleeps on the warm windowsill.',
]
RAW = [  # Plain text, no chat template: longer runs of ordinary prose and code.
    'Once upon a time, in a small village by the sea, there lived an old fisherman who '
    'every morning rowed out beyond the rocks, and every evening came home with a story.',
    "The mitochondrion is the organelle in which most of the cell's energy is produced: "
    'glucose is broken down and its energy stored as ATP.',
    'def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n'
    '        mid = (lo + hi) // 2\n',
    'In 1969 the Apollo 11 mission landed the first humans on the Moon. Neil Armstrong and '
    'Buzz Aldrin spent about two hours outside the lunar module.',
]


@pytest.mark.slow
def test_int8_next_tokens_agree_with_fp32_on_the_embedded_default(embedded, record_property):
    tok = embedded.tokenizer
    rows = [tok.encode_chat([{'role': 'user', 'content': p}]) for p in PROMPTS]
    rows += [tok.encode(p) for p in RAW]
    length = max(map(len, rows))
    ids = np.zeros((len(rows), length), np.int32)  # Right-padded: causal, so harmless.
    for i, r in enumerate(rows):
        ids[i, : len(r)] = r
    # Chat rows count after the template's shared prefix (the same text in every one).
    chats = rows[: len(PROMPTS)]
    shared = next(i for i in range(length) if len({tuple(r[: i + 1]) for r in chats}) > 1)
    positions = np.arange(length)[None, :]
    starts = np.array([shared] * len(chats) + [0] * len(RAW))[:, None]
    valid = (positions >= starts) & (positions < np.array([len(r) for r in rows])[:, None])
    want, _ = causal_forward(embedded.cfg, embedded.params, jnp.asarray(ids))
    q = quant.quantize_params(embedded.params)
    got, _ = causal_forward(embedded.cfg.replace(weights='int8'), q, jnp.asarray(ids))
    want, got = np.asarray(want)[valid], np.asarray(got)[valid]
    same = got.argmax(-1) == want.argmax(-1)
    agree = float(same.mean())
    top2 = np.sort(want, axis=-1)[:, -2:]
    margins = (top2[:, 1] - top2[:, 0])[~same]  # fp32's top-1 lead where int8 differs.
    record_property('int8_top1_agreement', agree)
    print(
        f'\nint8 vs fp32 next-token agreement: {agree:.4f} over {len(same)} positions; '
        f'fp32 margins where they differ: {np.round(np.sort(margins), 2).tolist()}; max '
        f'|logit diff| {np.abs(got - want).max():.3f}'
    )
    assert agree >= AGREEMENT_FLOOR
    assert np.all(margins < MARGIN_CEILING)  # Only near ties flip.


# Measured (2026-12-02): 0.964 over 277 positions (10 differ, each where fp32's top two
# logits are within 0.21 of each other; the largest logit change is 1.7). The floor sits
# four binomial standard deviations (1.1 % at n = 277) below, so a real loss of accuracy
# fails and run-to-run noise of reduction order does not; only near ties may flip: a flip
# where fp32 leads by a whole logit (5x the largest flipped lead seen) is a quantization bug.
AGREEMENT_FLOOR = 0.92
MARGIN_CEILING = 1.0


def test_export_writes_the_float_per_layer_checkpoint(params):
    """`params_to_state` (every saver's input) of an int8 tree is the state of its float
    dequantization, and a stacked tree's is the unrolled tree's: no integer written as a
    float, no `layers` tensor an HF reader cannot name."""
    q = quant.quantize_params(params)
    want = params_to_state(CFG, quant.dequantize_params(q))
    got = params_to_state(INT8, q)
    assert sorted(got) == sorted(want)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    stacked = llama.stack_layers(params, CFG.num_layers)
    stacked = params_to_state(CFG.replace(scan_layers=True), stacked)
    for name, x in params_to_state(CFG, params).items():
        np.testing.assert_array_equal(stacked[name], x, err_msg=name)
