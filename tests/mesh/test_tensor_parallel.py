"""Tensor parallelism that holds at any batch: the compiled decode loops gather no weight.

An audit of the optimized HLO of the AR, chain and tree loops on 8 fake CPU devices (run
through tests/test_mesh.py): at batch 8 on meshes 1 x 8 and 2 x 4, and at batch 1 on
1 x 8, no all-gather may output an array of a sharded weight's full size (a batch-major
cache order split a data shard of several rows by batch instead of by head, and XLA then
gathered the q, k and o projections in every layer: 6 such gathers on v5e 2x2 at batch
8). Two targets: K = 8 KV heads (the model axis of 1 x 8 splits them exactly, 2 x 4 puts
two on each device) and K = 4 (smaller than the model axis of 1 x 8: each head is held
twice, `llama.repeat_kv_heads`, through `checkpoints.load`). Each device must also hold
about 1 / model of the sharded weights' bytes, so that replicating everything cannot pass,
and the K = 4 target must decode one device's tokens on 1 x 8.
"""

import re

import jax
import numpy as np
import pytest

from spec_jax import checkpoints, decoding, rules, sharding
from spec_jax.decoding import engine as eng
from spec_jax.decoding import trees
from spec_jax.decoding.drafters import Eagle3Drafter, LMDrafter
from spec_jax.decoding.state import DecodeSettings
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig
from spec_jax.sampling import Sampler
from spec_jax.testing import random_params

DEC = DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)
TARGETS = {
    'k8': ModelConfig.tiny(vocab_size=72, num_heads=16, num_kv_heads=8, head_dim=6, mlp_width=40),
    'k4': ModelConfig.tiny(vocab_size=72, num_heads=16, num_kv_heads=4, head_dim=6, mlp_width=40),
}
# (target, data, model, batch): K = 8 splits exactly on 1 x 8, twice per device on 2 x 4.
AUDITS = [('k8', 1, 8, 8), ('k8', 2, 4, 8), ('k8', 1, 8, 1), ('k4', 1, 8, 8)]


def _engines(cfg, base):
    """Engines for target `cfg` (its KV heads maybe held twice) whose draft LM and head
    are those of the checkpoint's own config `base`, so every placement drafts alike."""
    head = e3.Eagle3Config.for_target(base, draft_vocab_size=cfg.vocab_size, taps=(0, 1, 2))
    return head, {
        'ar': decoding.Engine(cfg, DEC),
        'chain': decoding.Engine(cfg, DEC, LMDrafter(base.replace(num_layers=1)), 3,
                                 rules.make('lossless')),
        'tree': decoding.Engine(cfg, DEC, Eagle3Drafter(head), tree=trees.TreeShape(6, 3, 2)),
    }  # fmt: skip


@pytest.fixture(scope='module')
def saved(tmp_path_factory):
    """Each target's orbax checkpoint."""
    return {
        name: checkpoints.save_orbax(tmp_path_factory.mktemp(name) / 'ckpt', cfg,
                                     random_params(cfg, seed=3, std=0.16))
        for name, cfg in TARGETS.items()
    }  # fmt: skip


def _drafts(cfg, head_cfg, weights, mesh, rules=sharding.DRAFT_RULES):
    draft = random_params(cfg.replace(num_layers=1), seed=4, std=0.16)
    head = e3.init_params(head_cfg, jax.random.PRNGKey(5))
    head = e3.init_from_target(head_cfg, head, weights, jax.numpy.arange(cfg.vocab_size))
    d2t, t2d = e3.vocab_maps(np.arange(cfg.vocab_size), cfg.vocab_size)
    head = e3.Eagle3Head(head_cfg, head, jax.numpy.asarray(d2t), jax.numpy.asarray(t2d))
    place = lambda p: sharding.shard(p, mesh, rules)  # noqa: E731
    return {'ar': None, 'chain': place(draft),
            'tree': place(Eagle3Drafter.params_for(head, weights))}  # fmt: skip


def _gathered_sizes(hlo: str) -> list[int]:
    """The element count of every array an all-gather outputs in an optimized HLO module."""
    sizes = []
    for line in hlo.splitlines():
        if re.search(r'\ball-gather(-start)?\(', line):
            out = line.split('=', 1)[1].split('all-gather', 1)[0]
            sizes += [int(np.prod([int(d) for d in dims.split(',') if d] or [1]))
                      for dims in re.findall(r'\[([\d,]*)\]', out)]  # fmt: skip
    return sizes


@pytest.mark.parametrize('case', AUDITS, ids=lambda c: f'{c[0]}-{c[1]}x{c[2]}-batch{c[3]}')
def test_decode_loops_gather_no_weight(saved, case):
    name, data, model, batch = case
    mesh = sharding.make_mesh(sharding.mesh_config(data, model))
    loaded = checkpoints.load(saved[name], mesh=mesh)
    cfg = loaded.cfg
    assert cfg.num_kv_heads == max(TARGETS[name].num_kv_heads, model)  # Held M / K times.
    head_cfg, engines = _engines(cfg, TARGETS[name])
    sharded = [x for x in jax.tree.leaves(loaded.params)
               if any(s for s in x.sharding.spec)]  # fmt: skip
    total = sum(x.nbytes for x in sharded)
    on_device = sum(x.addressable_shards[0].data.nbytes for x in sharded)
    assert total / model <= on_device <= 1.05 * total / model, (on_device, total, model)
    weight_sizes = {x.size for x in sharded}
    drafts = _drafts(TARGETS[name], head_cfg, jax.device_get(loaded.params), mesh)
    rows = [np.tile(np.arange(1, 9, dtype=np.int32), (batch, 1)), np.full(batch, 5, np.int32),
            np.full(batch, 7, np.int32), np.arange(batch, dtype=np.int32)]  # fmt: skip
    for mode, engine in engines.items():
        with jax.set_mesh(mesh):
            placed = [sharding.place_rows(x, mesh) for x in rows]
            hlo = eng.decode_loop.lower(
                engine, loaded.params, drafts[mode], *placed, jax.random.PRNGKey(0)
            ).compile().as_text()
        gathered = [s for s in _gathered_sizes(hlo) if s in weight_sizes]
        assert not gathered, (case, mode, gathered)


@pytest.mark.parametrize('mode', ['ar', 'chain', 'tree'])
def test_kv_heads_held_twice_decode_one_devices_tokens(saved, mode):
    """K = 4 on 1 x 8 (each KV head held twice, split): greedy and sampled tokens equal one
    device's with the checkpoint's 4 heads (K = 8 on every mesh: tests/mesh/test_mesh.py)."""
    name = 'k4'
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [7], [9, 9, 1, 4], [3, 1], [5], [2, 8, 8], [6, 6]]
    got = {}
    for where in (None, sharding.make_mesh(sharding.mesh_config(1, 8))):
        loaded = checkpoints.load(saved[name], mesh=where)
        head_cfg, engines = _engines(loaded.cfg, TARGETS[name])
        drafts = _drafts(TARGETS[name], head_cfg, jax.device_get(loaded.params), where)
        for temperature in (0.0, 1.0):
            engine = engines[mode].replace(sampler=Sampler(temperature=temperature))
            params = decoding.Params(loaded.params, drafts[mode])
            got[where is None, temperature] = decoding.generate(engine, params, prompts, seed=1)
    for temperature in (0.0, 1.0):
        assert got[False, temperature].tokens == got[True, temperature].tokens, temperature


def test_a_head_split_over_model_decodes_one_devices_tokens(saved):
    """An EAGLE-3 head with its attention split as the target's (`draft_sharding` 'heads':
    its 8 KV heads and 16 query heads one and two a device on 1 x 8; the setting that fits
    Llama-3.1-8B's tree on a v5e-8, docs/performance.md) holds an eighth of its attention
    weights a device and decodes one device's greedy and sampled tokens."""
    name, heads = 'k8', sharding.DRAFT_SHARDINGS['heads']
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [7], [9, 9, 1, 4], [3, 1], [5], [2, 8, 8], [6, 6]]
    got = {}
    for where in (None, sharding.make_mesh(sharding.mesh_config(1, 8))):
        loaded = checkpoints.load(saved[name], mesh=where)
        head_cfg, _ = _engines(loaded.cfg, TARGETS[name])
        engine = decoding.Engine(loaded.cfg, DEC, Eagle3Drafter(head_cfg, heads),
                                 tree=trees.TreeShape(6, 3, 2))  # fmt: skip
        drafts = _drafts(TARGETS[name], head_cfg, jax.device_get(loaded.params), where, heads)
        if where is not None:
            q = drafts['tree']['head']['midlayer']['q_xnh']
            assert q.addressable_shards[0].data.shape[1] == q.shape[1] // 8
        for temperature in (0.0, 1.0):
            params = decoding.Params(loaded.params, drafts['tree'])
            engine = engine.replace(sampler=Sampler(temperature=temperature))
            got[where is None, temperature] = decoding.generate(engine, params, prompts, seed=1)
    for temperature in (0.0, 1.0):
        assert got[False, temperature].tokens == got[True, temperature].tokens, temperature
