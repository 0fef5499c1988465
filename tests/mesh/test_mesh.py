"""Decoding on meshes of 8 fake CPU devices gives one device's tokens, with the intended
shardings (run through tests/test_mesh.py, which sets the device count).

The model's head counts, MLP width and vocabulary divide 8, so every mesh of
`MESHES` (data x model) shards all of them; greedy fp32 tokens must be identical on every
mesh, and sampled tokens with fixed seeds too (the per-row noise does not depend on the
placement; the logits differ from one device's only by reduction order, ~1e-7, which
moves a draw only if it lands within that of a CDF boundary: it did not in these runs).
"""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from safetensors.numpy import save_file

from spec_jax import checkpoints, decoding, rules, sharding
from spec_jax.checkpoints.hf import config_to_hf
from spec_jax.decoding import engine as eng
from spec_jax.decoding import trees
from spec_jax.decoding.drafters import Eagle3Drafter, LMDrafter
from spec_jax.decoding.state import DecodeSettings
from spec_jax.jobs import bench_mesh, generate
from spec_jax.jobs.runtime import load_config
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig
from spec_jax.sampling import Sampler
from spec_jax.testing import random_params
from spec_jax.train import core as train_core
from spec_jax.train import distill
from spec_jax.train import eagle3 as train_e3

CFG = ModelConfig.tiny(vocab_size=72, num_heads=16, num_kv_heads=8, head_dim=6, mlp_width=40)
DRAFT = CFG.replace(num_layers=1)
HEAD = e3.Eagle3Config.for_target(CFG, draft_vocab_size=CFG.vocab_size, taps=(0, 1, 2))
MESHES = [(1, 8), (2, 4), (8, 1)]
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [7], [9, 9, 1, 4], [3, 1], [5], [2, 8, 8], [6, 6]]
DEC = DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)


def test_device_count():
    assert jax.device_count() == 8


@pytest.fixture(scope='module')
def weights():
    target = random_params(CFG, seed=3, std=0.16)
    head = e3.init_params(HEAD, jax.random.PRNGKey(5))
    head = e3.init_from_target(HEAD, head, target, jax.numpy.arange(CFG.vocab_size))
    d2t, t2d = e3.vocab_maps(np.arange(CFG.vocab_size), CFG.vocab_size)
    head = e3.Eagle3Head(HEAD, head, jax.numpy.asarray(d2t), jax.numpy.asarray(t2d))
    return dict(target=target, lm=random_params(DRAFT, seed=4, std=0.16),
                eagle3=Eagle3Drafter.params_for(head, target))  # fmt: skip


ENGINES = {
    'ar': decoding.Engine(CFG, DEC),
    'chain': decoding.Engine(CFG, DEC, LMDrafter(DRAFT), 3, rules.make('lossless')),
    'tree': decoding.Engine(CFG, DEC, Eagle3Drafter(HEAD), tree=trees.TreeShape(6, 3, 2)),
}
# The rules that read the raw logits, through their block-level verifier: relaxed
# acceptance takes its top K behind an optimization barrier (categorical.top_k), MARS its
# top 2 from reductions (categorical.top_two), in chain and tree rounds.
LOGIT_ENGINES = {
    'chain_relaxed': ENGINES['chain'].replace(rule=rules.make('relaxed', top_k=4, delta=0.6)),
    'tree_mars': ENGINES['tree'].replace(rule=rules.make('mars', theta=0.5)),
}


def params_on(weights, mode, mesh):
    """The target sharded by the default rules, the draft replicated."""
    draft = {'ar': None, 'chain': weights['lm'], 'tree': weights['eagle3']}[mode]
    return decoding.Params(
        sharding.shard(weights['target'], mesh),
        sharding.shard(draft, mesh, sharding.ShardingRules.replicated()),
    )


def run(weights, mode, mesh, temperature, prompts=PROMPTS, engine=None):
    engine = (engine or ENGINES[mode]).replace(sampler=Sampler(temperature=temperature))
    return decoding.generate(engine, params_on(weights, mode, mesh), prompts, seed=1)


@pytest.fixture(scope='module')
def one_device(weights):
    return {(m, t): run(weights, m, None, t) for m in ENGINES for t in (0.0, 1.0)}


@pytest.mark.parametrize('shape', MESHES, ids=lambda s: f'{s[0]}x{s[1]}')
@pytest.mark.parametrize('mode', list(ENGINES))
def test_mesh_decoding_equals_one_device(weights, one_device, mode, shape):
    mesh = sharding.make_mesh(sharding.mesh_config(*shape))
    for temperature in (0.0, 1.0):
        got = run(weights, mode, mesh, temperature)
        want = one_device[(mode, temperature)]
        assert got.tokens == want.tokens, (mode, shape, temperature)
        assert got.stats['blocks'] == want.stats['blocks']


@pytest.mark.parametrize('name', list(LOGIT_ENGINES))
def test_logit_rules_on_a_mesh_equal_one_device(weights, name):
    """On 2 x 4 (rows and heads split), greedy and sampled tokens of one device."""
    mode, engine = name.split('_')[0], LOGIT_ENGINES[name]
    mesh = sharding.make_mesh(sharding.mesh_config(2, 4))
    for temperature in (0.0, 1.0):
        got = run(weights, mode, mesh, temperature, engine=engine)
        want = run(weights, mode, None, temperature, engine=engine)
        assert got.tokens == want.tokens, (name, temperature)
        assert got.stats['per_row']['accepted'] == want.stats['per_row']['accepted']


def test_params_and_outputs_carry_the_intended_shardings(weights):
    mesh = sharding.make_mesh(sharding.mesh_config(2, 4))
    placed = sharding.shard(weights['target'], mesh)
    layer = placed['layer_0']['attn']
    assert layer['q_dnh'].sharding.spec == P(None, 'model', None)
    assert layer['o_nhd'].sharding.spec == P('model', None, None)
    assert placed['layer_0']['mlp']['down_fd'].sharding.spec == P('model', None)
    assert placed['embed_vd'].sharding.spec == P('model', None)
    assert placed['final_norm']['scale'].sharding.spec == P()
    assert layer['q_dnh'].addressable_shards[0].data.shape == (CFG.width, 4, CFG.head_dim)
    engine = ENGINES['chain']
    draft = sharding.shard(weights['lm'], mesh, sharding.ShardingRules.replicated())
    rows = [np.zeros((8, 8), np.int32), np.full(8, 3, np.int32), np.full(8, 5, np.int32),
            np.arange(8, dtype=np.int32)]  # fmt: skip
    with jax.set_mesh(mesh):
        tokens_bo, num_b, stats = eng.decode_loop(
            engine, placed, draft, *(sharding.place_rows(x, mesh) for x in rows),
            jax.random.PRNGKey(0),
        )  # fmt: skip
    for out, spec in ((tokens_bo, P('data', None)), (num_b, P('data'))):
        assert out.sharding.is_equivalent_to(NamedSharding(mesh, spec), out.ndim), out.sharding


def test_a_batch_the_data_axis_does_not_divide_is_padded(weights, one_device):
    mesh = sharding.make_mesh(sharding.mesh_config(-1, 1))
    got = run(weights, 'chain', mesh, 1.0, PROMPTS[:5])
    want = one_device[('chain', 1.0)]
    assert got.tokens == want.tokens[:5]
    assert len(got.stats['per_row']['emitted']) == 5


def test_a_mesh_that_does_not_divide_the_model_names_axis_and_sizes():
    mesh = sharding.make_mesh(sharding.mesh_config(2, 4))
    with pytest.raises(ValueError, match=r'embed_vd \(67, 28\): .* of size 67 .*model of size 4'):
        sharding.shard(random_params(ModelConfig.tiny(), seed=0), mesh)  # V 67.
    odd = random_params(ModelConfig.tiny(vocab_size=72, num_heads=12, num_kv_heads=3), seed=0)
    with pytest.raises(ValueError, match='3 KV heads do not split over mesh axis model of size 4'):
        sharding.shard(odd, mesh)
    fewer = ModelConfig.tiny(vocab_size=72, num_heads=8, mlp_width=40)  # K 2 < 4: kept whole.
    fewer = random_params(fewer, seed=0)
    placed = sharding.shard(fewer, mesh)['layer_0']['attn']
    assert placed['k_dkh'].sharding.spec == P(None, None, None)
    assert placed['q_dnh'].sharding.spec == P(None, 'model', None)


def test_the_generate_job_runs_on_the_config_mesh():
    """`c.mesh` of a job config: the weights placed on it, the job's text unchanged."""
    c = generate.default_config(tiny=True)
    c.sampling.temperature = 1.0
    want = [r['text'] for r in generate.run(c)]
    c.mesh.data = -1
    built = decoding.build(c)
    assert sharding.mesh_of(built.params).shape == {'data': 8, 'model': 1}
    assert [r['text'] for r in generate.run(c)] == want


def test_mesh_bench_reports_both_placements_and_compiles():
    report = bench_mesh.run(load_config('configs/bench_mesh.py', 'tiny'))
    assert [row['mode'] for row in report['rows']] == ['ar']
    for row in report['rows']:
        placed = [v for k, v in row.items() if isinstance(v, dict)]
        assert len(placed) == 2 and all(p['tokens_per_s'] > 0 for p in placed)
        assert row['mesh_over_one'] > 0
    assert [row['entry_point'] for row in report['compile']] == ['train_lm']
    for row in report['compile']:
        assert all(v > 0.1 for k, v in row.items() if k != 'entry_point')  # Compiled anew.


def test_orbax_restores_and_converts_straight_into_shardings(weights, tmp_path):
    """A saved target restored on 2 x 4 (and in bf16 on 8 x 1): every parameter in its
    rule's sharding with the saved values; HF tensors converted while placed on 1 x 8 and
    restored on 8 x 1; the HF tensors streamed straight onto 2 x 4; a mesh that does not
    divide the model is refused before anything is read."""
    out = checkpoints.save_orbax(tmp_path / 'ckpt', CFG, weights['target'])
    for shape, dtype in (((2, 4), None), ((8, 1), 'bfloat16')):
        mesh = sharding.make_mesh(sharding.mesh_config(*shape))
        got = checkpoints.load(out, dtype=dtype, mesh=mesh)
        specs = sharding.param_specs(weights['target'], mesh)
        for x, spec, want in zip(jax.tree.leaves(got.params),
                                 jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, P)),
                                 jax.tree.leaves(weights['target']), strict=True):  # fmt: skip
            assert x.sharding == NamedSharding(mesh, spec), (x.sharding, spec)
            assert x.dtype == (dtype or want.dtype)
            np.testing.assert_array_equal(np.asarray(x), np.asarray(want).astype(x.dtype))
    source = tmp_path / 'hf'
    source.mkdir()
    state = checkpoints.params_to_state(CFG, weights['target'])
    save_file(state, str(source / 'model.safetensors'))
    (source / 'config.json').write_text(json.dumps(config_to_hf(CFG)))
    placed_on = sharding.make_mesh(sharding.mesh_config(1, 8))
    converted = checkpoints.convert_to_orbax(source, tmp_path / 'conv', mesh=placed_on)
    mesh = sharding.make_mesh(sharding.mesh_config(8, 1))
    got = checkpoints.load(converted, mesh=mesh)
    q = got.params['layer_1']['attn']['q_dnh']
    assert q.sharding.is_equivalent_to(NamedSharding(mesh, P()), 3)  # Model 1: replicated.
    for x, want in zip(jax.tree.leaves(got.params), jax.tree.leaves(weights['target'])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(want))
    # The HF directory itself, streamed tensor by tensor onto a 2 x 4 mesh.
    mesh = sharding.make_mesh(sharding.mesh_config(2, 4))
    streamed = checkpoints.load(source, mesh=mesh).params
    assert streamed['embed_vd'].sharding.spec == P('model', None)
    for x, want in zip(jax.tree.leaves(streamed), jax.tree.leaves(weights['target'])):
        np.testing.assert_array_equal(np.asarray(x), np.asarray(want))
    odd = checkpoints.save_orbax(tmp_path / 'odd', ModelConfig.tiny(),
                                 random_params(ModelConfig.tiny(), seed=0))  # fmt: skip
    with pytest.raises(ValueError, match=r'embed_vd \(67, 28\): .* of size 67 .*model of size 4'):
        checkpoints.load(odd, mesh=sharding.make_mesh(sharding.mesh_config(2, 4)))


def _train_state(params, optimizer):
    return dict(params=params, opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32))


def _two_steps(step, state, batch, mesh, *frozen):
    """Two training steps from a copy of `state` (the steps donate it), on one device or
    with the state sharded by the rules and the batch's rows over 'data'."""
    state = jax.tree.map(jnp.copy, state)
    if mesh is not None:
        state = sharding.shard(state, mesh)
        batch = [sharding.place_rows(x, mesh) for x in batch]
    with sharding.use_mesh(mesh):
        for _ in range(2):
            state, metrics = step(*frozen, state, *batch)
    return state, metrics


def test_training_steps_on_a_mesh_equal_one_device(weights):
    """The draft LM's distillation step and the EAGLE-3 head's TTT step on a 2 x 4 mesh
    (target and trained state sharded by the rules, rows over 'data') give one device's
    losses and parameters up to fp32 reduction order; the parameters stay sharded."""
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CFG.vocab_size, (8, 11)), jnp.int32)
    valid = jnp.asarray(np.arange(11)[None, :] < rng.integers(6, 12, (8, 1)))
    batch = [tokens, valid, valid]  # tokens, loss mask, valid keys.
    optimizer = train_core.make_optimizer(3e-3, 10, 1)
    mesh = sharding.make_mesh(sharding.mesh_config(2, 4))
    target_on_mesh = sharding.shard(weights['target'], mesh)
    head = e3.init_params(HEAD, jax.random.PRNGKey(5))
    d2t, t2d = e3.vocab_maps(np.arange(CFG.vocab_size), CFG.vocab_size)
    vocab = (jnp.arange(CFG.vocab_size, dtype=jnp.int32), jnp.asarray(t2d))
    cases = {
        'distill': (distill.make_train_step(CFG, DRAFT, optimizer), weights['lm'], ()),
        'eagle3': (train_e3.make_train_step(CFG, HEAD, optimizer, steps=3), head, vocab),
    }
    for name, (step, params, extra) in cases.items():
        state = _train_state(params, optimizer)
        want, want_metrics = _two_steps(step, state, batch, None, weights['target'], *extra)
        got, got_metrics = _two_steps(step, state, batch, mesh, target_on_mesh, *extra)
        for key in want_metrics:
            np.testing.assert_allclose(got_metrics[key], want_metrics[key], rtol=2e-5,
                                       err_msg=f'{name} {key}')  # fmt: skip
        for a, b in zip(jax.tree.leaves(got['params']), jax.tree.leaves(want['params'])):
            # Adam normalizes each gradient, so a near-zero one that differs in reduction
            # order moves its update by a visible part of lr (3e-3): atol 1/100 of it.
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=3e-5)
        specs = jax.tree.leaves(sharding.param_specs(params, mesh), is_leaf=_is_spec)
        assert P('model', None, None) in specs  # o_nhd: heads split.
        for x, spec in zip(jax.tree.leaves(got['params']), specs, strict=True):
            assert x.sharding.is_equivalent_to(NamedSharding(mesh, spec), x.ndim), (name, spec)


def _is_spec(x):
    return isinstance(x, P)
