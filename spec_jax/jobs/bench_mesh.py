"""AR and chain decoding at one batch on one device against a data-parallel mesh.

configs/bench_mesh.py. Needs as many devices as the mesh: on a CPU, fake ones, set before
JAX starts (`XLA_FLAGS=--xla_force_host_platform_device_count=8`). Prints, per mode,
tokens/s on one device and on the mesh and their ratio, and the compile time of the decode
loop (its one entry point: prefill, rounds and commit) on each. Fake devices share the
host's cores, so on the 2-core CPU the ratio measures the mesh's overhead (collectives,
per-device launch), not a speedup; on a TPU or GPU slice it is the data-parallel scaling.
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
import numpy as np

from spec_jax import decoding, rules, sharding
from spec_jax.decoding import drafters, host
from spec_jax.decoding import engine as eng
from spec_jax.jobs.bench_chain import speed_setup
from spec_jax.sampling import Sampler


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the mesh bench of config `c` (configs/bench_mesh.py)."""
    mesh = sharding.make_mesh(c.mesh)
    if mesh is None:
        raise ValueError(f'bench mesh {c.mesh.to_dict()} is one device: give a mesh of several')
    target, _, ids, dec = speed_setup(c)
    ids = (ids * c.batch)[: c.batch]
    draft = drafters.make('lm', target, c.draft, dtype=c.dtype, seed=c.seed)
    engines = {
        'ar': decoding.Engine(target.cfg, dec, sampler=Sampler(c.temperature)),
        'chain': decoding.Engine(target.cfg, dec, draft.drafter, c.num_draft,
                                 rules.make(c.rule), sampler=Sampler(c.temperature)),
    }  # fmt: skip
    placements = {'one device': None, f'mesh {dict(mesh.shape)}': mesh}
    print(f'{len(ids)} rows of {c.max_new_tokens} new tokens max, {jax.device_count()} devices')
    report = {'rows': []}
    for mode, engine in engines.items():
        row = dict(mode=mode)
        for where, on in placements.items():
            params = decoding.Params(
                sharding.shard(target.params, on),
                sharding.shard(draft.params if mode == 'chain' else None, on,
                               sharding.ShardingRules.replicated()),
            )  # fmt: skip
            compile_s = compile_seconds(engine, params, ids, on)
            rates = []
            for r in range(c.rounds):
                result = decoding.generate(engine, params, ids, seed=r)
                rates.append(result.num_tokens / result.seconds)
            row[where] = dict(tokens_per_s=float(np.median(rates)), compile_s=compile_s)
        one, many = (row[w]['tokens_per_s'] for w in placements)
        row['mesh_over_one'] = many / one
        report['rows'].append(row)
        parts = ', '.join(
            f'{w}: {row[w]["tokens_per_s"]:.1f} tok/s (compile {row[w]["compile_s"]:.1f} s)'
            for w in placements
        )
        print(f'{mode} batch {len(ids)}: {parts}; mesh / one device {row["mesh_over_one"]:.2f}x')
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_mesh.json'), 'w') as f:
            json.dump(report, f, indent=2)
    return report


def compile_seconds(engine: decoding.Engine, params: decoding.Params, ids, mesh) -> float:
    """Seconds to lower and compile the decode loop for `ids` on `mesh` (or one device)."""
    rows = host.loop_rows(engine, ids, multiple=sharding.data_size(mesh))
    start = time.perf_counter()
    with sharding.use_mesh(mesh):
        args = [sharding.place_rows(x, mesh) for x in rows]
        eng.decode_loop.lower(engine, params.target, params.draft, *args,
                              jax.random.PRNGKey(0)).compile()  # fmt: skip
    return time.perf_counter() - start
