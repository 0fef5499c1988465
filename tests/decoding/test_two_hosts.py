"""A mesh over two processes (`hosts='all'`; two fake CPU devices in each, the processes
joined over loopback) decodes as one device does: a 2 x 2 mesh whose data axis spans the
processes, each placing its own devices' slices, and every process gets all the tokens."""

import json
import os
import sys

import numpy as np

from spec_jax import decoding, rules
from spec_jax.decoding.drafters import LMDrafter
from spec_jax.decoding.state import DecodeSettings
from spec_jax.models.config import ModelConfig
from spec_jax.sampling import Sampler
from spec_jax.testing import random_params
from spec_jax.testing.processes import start_processes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CFG = ModelConfig.tiny(vocab_size=72, num_heads=16, num_kv_heads=8, head_dim=6, mlp_width=40)
DRAFT = CFG.replace(num_layers=1)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9], [7], [9, 9, 1, 4], [3, 1]]  # 5 rows: padded to 6.
DEC = DecodeSettings(max_new_tokens=10, prompt_bucket=8, new_tokens_bucket=8)

WORKER = r"""
import json, sys
from absl import flags
from spec_jax import decoding, distributed, rules, sharding
from tests.decoding.test_two_hosts import CFG, DRAFT, PROMPTS, engine, weights

flags.DEFINE_string('coordinator', '', '')
flags.DEFINE_integer('num_processes', 0, '')
flags.DEFINE_integer('process_id', -1, '')
flags.FLAGS(sys.argv[:1] + sys.argv[2:])
F = flags.FLAGS
distributed.initialize(F.coordinator, F.num_processes, F.process_id)
import jax
try:  # A mesh over every host must use every process's devices.
    sharding.make_mesh(sharding.mesh_config(data=2, model=1, hosts='all'))
except ValueError as e:
    refused = str(e)
mesh = sharding.make_mesh(sharding.mesh_config(data=2, model=2, hosts='all'))
target, draft = weights()
params = decoding.Params(sharding.shard(target, mesh),
                         sharding.shard(draft, mesh, sharding.ShardingRules.replicated()))
q = params.target['layer_0']['attn']['q_dnh']
out = dict(devices=jax.device_count(), local=len(jax.local_devices()), refused=refused,
           multi=mesh.is_multi_process, q_local=[s.data.shape for s in q.addressable_shards])
for t in (0.0, 1.0):
    result = decoding.generate(engine(t), params, PROMPTS, seed=1)
    out[str(t)] = dict(tokens=result.tokens, blocks=result.stats['blocks'])
with open(f'{sys.argv[1]}.{jax.process_index()}', 'w') as f:
    json.dump(out, f)
"""


def weights():
    return random_params(CFG, seed=3, std=0.16), random_params(DRAFT, seed=4, std=0.16)


def engine(temperature: float) -> decoding.Engine:
    return decoding.Engine(CFG, DEC, LMDrafter(DRAFT), 3, rules.make('lossless'),
                           sampler=Sampler(temperature=temperature))  # fmt: skip


def test_a_mesh_over_two_processes_decodes_as_one_device(tmp_path):
    out = str(tmp_path / 'out')
    procs = start_processes(
        [sys.executable, '-c', WORKER, out], 2,
        dict(XLA_FLAGS='--xla_force_host_platform_device_count=2', PYTHONPATH=ROOT), ROOT,
    )  # fmt: skip
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [log[-3000:] for log in logs]
    target, draft = weights()
    want = {
        str(t): decoding.generate(engine(t), decoding.Params(target, draft), PROMPTS, seed=1)
        for t in (0.0, 1.0)
    }
    for i in range(2):
        with open(f'{out}.{i}') as f:
            got = json.load(f)
        assert (got['devices'], got['local'], got['multi']) == (4, 2, True)
        assert 'covers 2 of the 4 devices of 2 processes' in got['refused']
        # q_dnh [D, N, H]: heads over 'model' (2), one slice per local device.
        assert got['q_local'] == [[CFG.width, CFG.num_heads // 2, CFG.head_dim]] * 2
        for t, result in want.items():  # Greedy and sampled (fixed seed): every token.
            assert got[t]['tokens'] == result.tokens, (i, t)
            np.testing.assert_array_equal(got[t]['blocks'], result.stats['blocks'])
