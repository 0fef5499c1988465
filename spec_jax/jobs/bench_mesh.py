"""AR and chain decoding at one batch on one device against a mesh, and the compile time
of every jitted entry point on each.

configs/bench_mesh.py. Needs as many devices as the mesh: on a CPU, fake ones, set before
JAX starts (`XLA_FLAGS=--xla_force_host_platform_device_count=8`). Prints, per mode,
tokens/s on one device and on the mesh and their ratio; then the compile seconds of each
entry point (the decode loop of AR, chain and tree mode: prefill, rounds and commit in one
program; the draft LM's distillation step and the EAGLE-3 head's TTT step), persistent
cache off. Fake devices share the host's cores, so on the 2-core CPU the ratio measures
the mesh's overhead (collectives, per-device launch), not a speedup; on a TPU or GPU slice
it is the data-parallel scaling.
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
from spec_jax.jobs import runtime
from spec_jax.jobs.bench_chain import speed_setup
from spec_jax.sampling import Sampler
from spec_jax.train import core as train_core
from spec_jax.train import distill
from spec_jax.train import eagle3 as train_e3

ENTRY_POINTS = ('ar', 'chain', 'tree', 'train_lm', 'train_eagle3')


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the mesh bench of config `c` (configs/bench_mesh.py)."""
    unknown = sorted(set(c.entry_points) - set(ENTRY_POINTS))
    if unknown:
        raise ValueError(f'entry_points {unknown} unknown; valid: {ENTRY_POINTS}')
    if not set(c.modes) <= {'ar', 'chain'}:
        raise ValueError(f"modes {tuple(c.modes)}: each 'ar' or 'chain'")
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
    for mode in c.modes:  # Tokens/s of each ('ar', 'chain').
        engine = engines[mode]
        row = dict(mode=mode)
        for where, on in placements.items():
            params = decoding.Params(
                sharding.shard(target.params, on),
                sharding.shard(draft.params if mode == 'chain' else None, on,
                               sharding.ShardingRules.replicated()),
            )  # fmt: skip
            rates = []
            decoding.generate(engine, params, ids, seed=c.rounds)  # Warm-up: untimed.
            for r in range(c.rounds):
                result = decoding.generate(engine, params, ids, seed=r)
                rates.append(result.num_tokens / result.seconds)
            row[where] = dict(tokens_per_s=float(np.median(rates)))
        one, many = (row[w]['tokens_per_s'] for w in placements)
        row['mesh_over_one'] = many / one
        report['rows'].append(row)
        parts = ', '.join(f'{w}: {row[w]["tokens_per_s"]:.1f} tok/s' for w in placements)
        print(f'{mode} batch {len(ids)}: {parts}; mesh / one device {row["mesh_over_one"]:.2f}x '
              '(each placement warmed: one untimed call first)')  # fmt: skip
    print(f'compile seconds, one device / mesh {dict(mesh.shape)}:')
    report['compile'] = []
    for key, (label, compile_on) in entry_points(c, target, draft, dec, engines, ids).items():
        seconds = {w: compile_on(on) for w, on in placements.items()}
        report['compile'].append(dict(entry_point=key, **seconds))
        print(f'  {label:36s} ' + ' / '.join(f'{s:5.1f}' for s in seconds.values()))
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_mesh.json'), 'w') as f:
            json.dump(report, f, indent=2)
    return report


def entry_points(c, target, draft, dec, engines, ids) -> dict:
    """{key: (label, mesh or None -> seconds to lower and compile it there)} of the jitted
    entry points `c.entry_points` names (ENTRY_POINTS), in that order: the target sharded
    by the rules, drafts replicated, a trained state sharded by the rules."""

    def decode_loop(engine, drafted):
        def compile_on(mesh):
            params = decoding.Params(
                sharding.shard(target.params, mesh),
                sharding.shard(drafted, mesh, sharding.ShardingRules.replicated()),
            )
            rows = host.loop_rows(engine, ids, multiple=sharding.data_size(mesh))
            return _compile_seconds(
                mesh, eng.decode_loop, engine, params.target, params.draft,
                *(sharding.place_rows(x, mesh) for x in rows), jax.random.PRNGKey(0),
            )  # fmt: skip

        return compile_on

    optimizer = train_core.make_optimizer(1e-4, 100, 10)
    rng = np.random.default_rng(0)
    tokens_bt = rng.integers(0, target.cfg.vocab_size, (c.batch, c.train_len), np.int32)
    valid_bt = np.ones(tokens_bt.shape, bool)
    batch = [tokens_bt, valid_bt, valid_bt]  # Tokens, loss mask, valid keys.

    def train_step(step, params, *frozen):
        def compile_on(mesh):
            state = dict(params=params, opt_state=optimizer.init(params), step=np.int32(0))
            return _compile_seconds(
                mesh, step, sharding.shard(target.params, mesh), *frozen,
                sharding.shard(state, mesh), *(sharding.place_rows(x, mesh) for x in batch),
            )  # fmt: skip

        return compile_on

    points = {}
    for key in c.entry_points:
        if key in ('ar', 'chain'):
            drafted = draft.params if key == 'chain' else None
            points[key] = (f'decode loop, {key}', decode_loop(engines[key], drafted))
        elif key == 'tree':
            head = drafters.make('eagle3', target, c.head, dtype=c.dtype, seed=c.seed)
            engine = decoding.Engine(target.cfg, dec, head.drafter,
                                     tree=decoding.tree_shape(c.tree),
                                     sampler=Sampler(c.temperature))  # fmt: skip
            points[key] = ('decode loop, tree', decode_loop(engine, head.params))
        elif key == 'train_lm':
            step = distill.make_train_step(target.cfg, draft.model.cfg, optimizer)
            points[key] = ('train step, draft LM (distillation)', train_step(step, draft.params))
        else:  # 'train_eagle3': a random head has the trained one's shapes.
            e3_head = drafters.random_head(target.cfg, c.seed)
            step = train_e3.make_train_step(target.cfg, e3_head.cfg, optimizer)
            vocab_ids = (np.asarray(e3_head.draft_ids_u, np.int32), np.asarray(e3_head.t2d))
            points[key] = ('train step, EAGLE-3 head (TTT)',
                           train_step(step, e3_head.params, *vocab_ids))  # fmt: skip
    return points


def _compile_seconds(mesh, fn, *args) -> float:
    """Seconds to lower and compile jitted `fn` for `args` under `mesh`, in-memory caches
    cleared first (the speed runs compiled some already) and the persistent cache off (or a
    rerun would time cache loads)."""
    jax.clear_caches()
    with runtime.compilation_cache_off(), sharding.use_mesh(mesh):
        start = time.perf_counter()
        fn.lower(*args).compile()
        return time.perf_counter() - start
