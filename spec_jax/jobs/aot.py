"""The AOT job: a config's decode loops compiled for a named TPU topology on this (CPU)
machine, from abstract weights, and what the compiled programs say (launch/aot.py).

    python launch/aot.py --config configs/smollm2_135m_chain.py:tiny --topology v5e:2x2
    python launch/aot.py --config configs/experiments/qwen25_72b_chain.py:v5p \
        --topology v5p:2x2x1 --block_efficiency 7.98
    python launch/aot.py --config configs/smollm2_135m_draft.py:tiny   # its training steps
    python launch/aot.py --config configs/experiments/llama31_8b_eagle3.py:h100 \
        --device h100 --dry_run      # the memory estimate only, for any chip

Per mode (AR and the config's chain or tree mode), on the config's mesh (`c.mesh`, -1
filled from the topology's chips):

1. the dry run (spec_jax/costs/memory.py): weights, KV cache and activations per chip;
   a plan over the chip's HBM is refused here, before anything compiles (`force` skips it);
   and the analytic roofline of one round (spec_jax/costs/roofline.py: the weights and
   cache it reads, the FLOPs it computes), for any chip, GPUs included;
2. `engine.decode_loop` lowered and compiled for the topology's devices, the weights
   `jax.ShapeDtypeStruct`s with the rules' NamedShardings (no checkpoint read): the
   compile time, every field of `memory_analysis()` per chip against the chip's HBM
   (refused when over it, with the numbers), and the collectives of the loop body in the
   optimized HLO (spec_jax/jobs/hlo.py: kind, count, bytes per round);
3. one round compiled on its own (`chain_round` / `tree_round` on the state the compiled
   `init_state` hands the loop, with its shardings): `cost_analysis()`'s flops and bytes
   accessed give the round's roofline on the chip (spec_jax/costs/chips.py): predicted AR
   tokens/s per chip, and the chain or tree speedup at `block_efficiency` tokens a round
   (speedup = block efficiency x AR round time / SD round time);
4. beside each upper bound, the calibrated prediction where the chip has measured
   efficiencies (spec_jax/costs/calibration.py: the compiled loop body's collective bytes
   at the chip's interconnect bandwidth), else its upper bound labelled uncalibrated; every
   printed speedup says which it is.

The roofline's assumptions: the round reaches the chip's peak bf16 flops or HBM bandwidth
(the slower bounds it), overlaps them perfectly, and its collectives, launches and host
work cost nothing; every row is live (no finished rows); XLA's cost analysis counts each
fusion's operands and results once. It is an upper bound on speed, not a measurement.

A train_draft config (configs/smollm2_135m_{draft,eagle3}.py) compiles its training steps
instead (`run_train`, spec_jax/jobs/aot_train.py). A config's `weights` 'int8' compiles and
sizes the int8 weights it loads (`ModelConfig.weights`), `scan_layers` the scanned layers.

Compiling for a TPU needs libtpu (`pip install 'jax[tpu]==<jax version>'`, Linux x86-64):
without it the job says what to install (`LibtpuMissing`); the dry run needs nothing.
Results also go to `<workdir>/aot.json`.
"""

from __future__ import annotations

import importlib.util
import json
import os
import time
from functools import partial

import jax
import ml_collections
import numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh

from spec_jax import sharding
from spec_jax.costs import calibration, chips, memory, roofline
from spec_jax.decoding import engine as eng
from spec_jax.jobs import aot_train, hlo, runtime
from spec_jax.jobs.abstract import Abstract, build_abstract, decode_block, plan_of

MEMORY_FIELDS = (
    'argument_size_in_bytes', 'output_size_in_bytes', 'temp_size_in_bytes',
    'generated_code_size_in_bytes', 'alias_size_in_bytes',
)  # fmt: skip
MIB = 1 << 20


class LibtpuMissing(RuntimeError):
    """Compiling for a TPU topology needs libtpu, which is not installed."""


def install_hint() -> str:
    return (
        f"pip install 'jax[tpu]=={jax.__version__}'  (libtpu, Linux x86-64 only; or "
        "pip install -e '.[tpu]')"
    )


def tpu_devices(topology: str) -> list:
    """The devices of TPU topology `topology` ('v5e:2x2'), compiled for without a TPU."""
    chips.topology_chips(topology)  # A ValueError for a malformed name first.
    if importlib.util.find_spec('libtpu') is None:
        raise LibtpuMissing(
            f'compiling for TPU topology {topology!r} needs libtpu, which is not installed: '
            + install_hint()
        )
    # libtpu takes a lock file per host for its one process on the chips; compiling needs no
    # chip, so several compiling processes (tests, jobs) may load it side by side.
    os.environ.setdefault('ALLOW_MULTIPLE_LIBTPU_LOAD', '1')
    return list(topologies.get_topology_desc(platform='tpu', topology_name=topology).devices)


def topology_mesh(c_mesh, devices) -> Mesh:
    """A ('data', 'model') mesh of the mesh block over the first of `devices` (also 1 x 1:
    the compile still targets one chip of the topology)."""
    data, model = sharding.mesh_shape(c_mesh, len(devices))
    grid = np.array(devices[: data * model], dtype=object).reshape(data, model)
    auto = (jax.sharding.AxisType.Auto,) * 2
    return Mesh(grid, sharding.MESH_AXES, axis_types=auto)


def run(
    c: ml_collections.ConfigDict,
    workdir: str | None = None,
    *,
    topology: str = 'v5e:2x2',
    device: str = '',
    modes: tuple[str, ...] = (),
    block_efficiency: float = 3.0,
    dry_run: bool = False,
    force: bool = False,
    prompt_len: int = 0,
    keep_compiled: bool = False,
    rounds: bool = True,
) -> dict:
    """Compiles (or, with `dry_run` or a GPU `device`, only estimates) config `c`'s decode
    loops for `topology` (module docstring).

    Args:
      c: a generate or experiment config (its `weights` 'int8' compiles and sizes the
        int8 weights it loads, its `scan_layers` stacked layers), or a train_draft config
        (`run_train`).
      workdir: where aot.json goes (optional).
      topology: a TPU topology name ('v5e:2x2', 'v5p:2x2x1', 'v6e:2x2', 'v4:2x2x1').
      device: a chip of `chips.CHIPS` for the estimate ('h100'; default the topology's).
        A GPU is estimated only (its compiler needs the GPU).
      modes: 'ar' and/or the config's own mode (default both).
      block_efficiency: tokens a chain or tree round commits, for the predicted speedup.
      dry_run: the estimate only (no libtpu, nothing compiled).
      force: compile a plan the estimate puts over the chip's HBM (the compiled numbers
        still decide).
      prompt_len: the prompt bucket to compile (default the longest, `c.max_prompt_len`
        rounded up to `c.prompt_bucket`).
      keep_compiled: also return the compiled loops (`report['compiled'][mode]`).
      rounds: also compile one round per mode for the roofline (a second and third
        compile: `init_state` and the round).

    Returns:
      {'config', 'topology', 'chip', 'mesh', 'modes': {mode: numbers}, 'speedup'}.

    Raises:
      ValueError: a plan over the chip's HBM (estimated, or compiled), a bad mode, mesh or
        topology, a mesh that does not divide a sharded parameter.
      LibtpuMissing: compiling without libtpu.
    """
    if aot_train.is_train_config(c):
        return run_train(c, workdir, topology=topology, keep_compiled=keep_compiled)
    block = decode_block(c)
    chip = chips.chip(device or topology)
    modes = tuple(modes) or tuple(dict.fromkeys(('ar', block.spec.mode)))
    quant = 'int8' if c.get('weights') == 'int8' else ''  # c.weights: checkpoints.load's.
    compile_it = not dry_run and chip.platform == 'tpu'
    if compile_it and device and chips.chip(topology) is not chip:
        raise ValueError(f'device {device!r} is not the chip of topology {topology!r}')
    if device and not compile_it:  # The estimate alone: the mesh block's own sizes.
        if -1 in (c.mesh.data, c.mesh.model):
            raise ValueError(
                f'device {device!r}: give the mesh sizes (--config.mesh.data, '
                f'--config.mesh.model; {c.mesh.to_dict()} has a -1 and no topology to fill it)'
            )
        count = int(c.mesh.data) * int(c.mesh.model)
    else:
        count = chips.topology_chips(topology)
    mesh_shape = sharding.mesh_shape(c.mesh, count)
    mesh = topology_mesh(c.mesh, tpu_devices(topology)) if compile_it else None
    where = (f'{topology if compile_it else chip.name} (mesh data {mesh_shape[0]} x model '
             f'{mesh_shape[1]})')  # fmt: skip
    report = dict(config=c.get('name', ''), topology=topology if compile_it else '',
                  chip=chip.name, mesh=dict(zip(sharding.MESH_AXES, mesh_shape)), quant=quant,
                  modes={}, block_efficiency=block_efficiency)  # fmt: skip
    programs = {}
    for mode in modes:
        _, plan, _ = plan_of(block, mode, mesh_shape, quant, prompt_len)
        est = memory.estimate(plan)
        analytic = roofline.round_cost(plan).on(chip)
        numbers = dict(estimate=est.as_dict(), analytic=analytic)
        line = _roofline_line(analytic, chip, plan.batch, mode, mesh_shape)
        pred = calibration.predict(plan, chip, mode=mode)
        numbers['calibrated'] = dict(seconds=pred['calibrated_s'], label=pred['label'],
                                     collectives_s=pred['collectives_s'])  # fmt: skip
        print(f'{mode}: batch {plan.batch}, prompt bucket {plan.prompt_len}, {plan.slots} '
              f'slots, {where}; estimate per chip:\n{est.table(chip)}\n'
              f'  analytic round (upper bound on speed): {line}\n'
              f'  predicted round: {calibration.line(pred)}')  # fmt: skip
        if not force:
            memory.check_fits(est.total, chip, f'{mode} on {where} (estimate)', est.table(chip))
        if compile_it:
            ab = build_abstract(block, mode, mesh, quant, prompt_len)
            compiled, more = compile_mode(ab, chip, where, mode, rounds)
            numbers.update(more)
            coll_bytes = sum(v['bytes'] for v in more['collectives'].values())
            if coll_bytes:  # The compiled loop body's collectives replace the analytic ones.
                pred = calibration.predict(plan, chip, coll_bytes, mode)
                numbers['calibrated'] = dict(seconds=pred['calibrated_s'], label=pred['label'],
                                             collectives_s=pred['collectives_s'])  # fmt: skip
                print(f'  predicted round with the compiled collectives '
                      f'({coll_bytes / MIB:.2f} MiB): {calibration.line(pred)}')  # fmt: skip
            programs[mode] = compiled
        report['modes'][mode] = numbers
    report['speedup'] = _speedups(report, block_efficiency, 'round')
    report['speedup_analytic'] = _speedups(report, block_efficiency, 'analytic')
    report['speedup_calibrated'] = _speedups(report, block_efficiency, 'calibrated')
    # A ratio of two rounds each at its speed bound: not itself a bound, and no forecast
    # (H200 tree: 1.84x analytic, 0.92x measured).
    ratio = 'roofline ratio: each round at its bound, not a forecast'
    for key, what in (('speedup_analytic', f'analytic {ratio}'),
                      ('speedup', f'compiled {ratio}'),
                      ('speedup_calibrated', f'calibrated on {chip.name}')):  # fmt: skip
        for mode, speedup in report[key].items():
            print(f'{mode} vs AR at block efficiency {block_efficiency}: predicted speedup '
                  f'{speedup:.2f}x ({what})')  # fmt: skip
    return _finish(report, programs, workdir, keep_compiled)


def compile_mode(ab: Abstract, chip: chips.Chip, where: str, mode: str, rounds: bool = True):
    """Compiles the decode loop and one round of `ab`; prints their numbers and returns
    (the compiled loop, the numbers); ValueError when the loop's memory is over the chip's
    HBM."""
    loop, seconds = compile_loop(ab)
    stats = memory_fields(loop)
    total = used_bytes(stats)
    lines = [f'  {k[: -len("_in_bytes")]:22s} {v / chips.GIB:9.3f} GiB ({v} B)'
             for k, v in stats.items()]  # fmt: skip
    lines.append(f'  {"total":22s} {total / chips.GIB:9.3f} GiB of {chip.hbm_bytes / chips.GIB:.0f}'
                 f' GiB HBM ({total / chip.hbm_bytes:.1%})')  # fmt: skip
    print(f'{mode}: decode loop compiled in {seconds:.1f} s for {where}; memory_analysis per '
          'chip:\n' + '\n'.join(lines))  # fmt: skip
    memory.check_fits(total, chip, f'{mode} decode loop on {where} (compiled)', '\n'.join(lines))
    coll = hlo.loop_collectives(loop.as_text())
    parts = ', '.join(f'{k} x{v["count"]} ({v["bytes"] / MIB:.2f} MiB)' for k, v in coll.items())
    print(f'  loop body collectives per round, per chip: {parts or "none"}')
    numbers = dict(compile_s=seconds, memory=stats, memory_total=total, hbm=chip.hbm_bytes,
                   collectives=coll)  # fmt: skip
    if not rounds:
        return loop, numbers
    cost = round_cost(ab)
    r = roofline.Cost(cost['flops'], cost['bytes_accessed']).on(chip)
    tokens = ab.plan.batch / r['seconds'] / ab.mesh.size if mode == 'ar' else None
    line = _roofline_line(r, chip, ab.plan.batch, mode, ab.plan.mesh)
    print(f'  one round, compiled (upper bound on speed): {line}')
    return loop, dict(numbers, round=dict(cost, **r, ar_tokens_per_s_per_chip=tokens))


def compile_loop(ab: Abstract):
    """(the compiled decode loop of `ab`, seconds to lower and compile it). `OverHBM` when
    the TPU compiler itself finds the program over the chip's HBM (its verdict quoted; the
    largest allocations it lists printed before)."""
    start = time.perf_counter()  # Timed: no persistent cache read or written.
    with runtime.compilation_cache_off(), jax.set_mesh(ab.mesh):
        lowered = eng.decode_loop.lower(ab.engine, *ab.args)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as e:
            if 'RESOURCE_EXHAUSTED' not in str(e):
                raise
            p, listing = ab.plan, compiler_refusal(str(e))
            print(f'the TPU compiler refused the {ab.engine.mode} decode loop:\n{listing}')
            raise memory.OverHBM(
                f'{ab.engine.mode} decode loop (batch {p.batch}, {p.slots} slots, mesh data '
                f'{p.mesh[0]} x model {p.mesh[1]}) does not fit the chip, the TPU compiler '
                f'says: {listing.splitlines()[0] if listing else "out of memory"}: use a '
                'larger model axis, more data shards, a smaller batch, fewer cache slots or a '
                'smaller tree',
                listing,
            ) from None
    return compiled, time.perf_counter() - start


def compiler_refusal(message: str, lines: int = 40) -> str:
    """The TPU compiler's out-of-memory message, cut to its first `lines` lines: the verdict
    and the largest allocations it lists (size, shape, the HLO op that made each), which
    name what the program holds (docs/performance.md)."""
    kept = [line.rstrip() for line in message.splitlines() if line.strip()]
    return '\n'.join(kept[:lines] + (['...'] if len(kept) > lines else []))


def memory_fields(compiled) -> dict[str, int]:
    """`MEMORY_FIELDS` of `compiled.memory_analysis()` (bytes per device)."""
    stats = compiled.memory_analysis()
    return {k: int(getattr(stats, k)) for k in MEMORY_FIELDS}


def used_bytes(stats: dict[str, int]) -> int:
    """What a program holds at once on a device: arguments, outputs (less those aliasing an
    argument), temporaries and its code."""
    return (stats['argument_size_in_bytes'] + stats['output_size_in_bytes']
            - stats['alias_size_in_bytes'] + stats['temp_size_in_bytes']
            + stats['generated_code_size_in_bytes'])  # fmt: skip


def round_cost(ab: Abstract) -> dict:
    """flops and bytes accessed per device of one round, compiled on the loop's state as
    `init_state` shards it."""
    engine, args = ab.engine, ab.args
    with runtime.compilation_cache_off(), jax.set_mesh(ab.mesh):
        init = jax.jit(eng.init_state).lower(engine, *args).compile()
        shapes = jax.eval_shape(eng.init_state, engine, *args)
        state = jax.tree.map(
            lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s),
            shapes, init.output_shardings,
        )  # fmt: skip
        if engine.tree is not None:
            body = eng.tree_round
        else:
            body = partial(eng.chain_round, a_round=engine.num_draft)
        compiled = jax.jit(body).lower(engine, args[0], args[1], state).compile()
    return _cost(compiled)


def _speedups(report: dict, block_efficiency: float, key: str) -> dict:
    """Block efficiency x the AR round's time / each SD mode's, by the roofline `key`
    ('round': the compiled program's count; 'analytic': roofline.py's; 'calibrated':
    calibration.py's, on a calibrated chip)."""
    modes = report['modes']
    ar = modes.get('ar', {}).get(key)
    if not ar or not ar['seconds']:  # No AR, or an uncalibrated chip.
        return {}
    return {m: block_efficiency * ar['seconds'] / v[key]['seconds']
            for m, v in modes.items() if m != 'ar' and key in v}  # fmt: skip


def _roofline_line(r: dict, chip: chips.Chip, batch: int, mode: str, mesh_shape) -> str:
    """A roofline's numbers in one line, the compiled's or the analytic's (AR: its tokens/s
    a chip)."""
    line = (f'{r["flops"] / 1e9:.3f} GFLOP, {r["bytes_accessed"] / 1e9:.3f} GB per chip -> '
            f'{r["seconds"] * 1e3:.3f} ms on {chip.name} ({r["bound"]} bound)')  # fmt: skip
    if mode == 'ar':
        per_chip = batch / r['seconds'] / (mesh_shape[0] * mesh_shape[1])
        line += (f'; predicted AR {per_chip:,.0f} tokens/s per chip, '
                 f'{batch / r["seconds"]:,.0f} in all (upper bound)')  # fmt: skip
    return line


def run_train(
    c: ml_collections.ConfigDict, workdir: str | None = None, *, topology: str = 'v5e:2x2',
    keep_compiled: bool = False,
) -> dict:  # fmt: skip
    """A train_draft config's training steps (spec_jax/jobs/aot_train.py) compiled for
    `topology` on the config's mesh (`c.mesh`, default one chip): compile time,
    memory_analysis per chip against the HBM (refused when over), the step's collectives
    (the whole program: a step has no loop) and its roofline (predicted step seconds and
    training tokens/s per chip). No dry-run estimate for training."""
    chip = chips.chip(topology)
    mesh = topology_mesh(c.get('mesh') or sharding.mesh_config(), tpu_devices(topology))
    where = f'{topology} (mesh data {mesh.shape["data"]} x model {mesh.shape["model"]})'
    report = dict(config=c.get('name', c.kind), topology=topology, chip=chip.name,
                  mesh=dict(mesh.shape), modes={})  # fmt: skip
    programs = {}
    for ts in aot_train.steps_of(c, mesh):
        start = time.perf_counter()
        with runtime.compilation_cache_off(), jax.set_mesh(mesh):
            compiled = ts.step.lower(*ts.args).compile()
        seconds = time.perf_counter() - start
        stats = memory_fields(compiled)
        total = used_bytes(stats)
        text = compiled.as_text()
        coll = hlo.collectives(text, hlo.computations(text)[1])
        cost = _cost(compiled)
        t = chip.seconds(cost['flops'], cost['bytes_accessed'])
        print(f'{ts.name}: compiled in {seconds:.1f} s for {where}; per chip ' + ', '.join(
            f'{k[: -len("_in_bytes")]} {v / chips.GIB:.3f} GiB ({v} B)' for k, v in stats.items()
        ) + f'; total {total / chips.GIB:.3f} of {chip.hbm_bytes / chips.GIB:.0f} GiB; '
              f'collectives {coll or "none"}; roofline {t * 1e3:.2f} ms a step, '
              f'{ts.tokens / t / mesh.size:,.0f} tokens/s per chip')  # fmt: skip
        memory.check_fits(total, chip, f'{ts.name} on {where} (compiled)')
        report['modes'][ts.name] = dict(compile_s=seconds, memory=stats, memory_total=total,
                                        hbm=chip.hbm_bytes, collectives=coll,
                                        step=dict(cost, seconds=t))  # fmt: skip
        programs[ts.name] = compiled
    return _finish(report, programs, workdir, keep_compiled)


def _cost(compiled) -> dict:
    """flops and bytes accessed per device of a compiled program (`cost_analysis()`)."""
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    return dict(flops=float(cost.get('flops', 0.0)),
                bytes_accessed=float(cost.get('bytes accessed', 0.0)))  # fmt: skip


def _finish(report: dict, programs: dict, workdir: str | None, keep_compiled: bool) -> dict:
    """Writes `report` to <workdir>/aot.json (when a workdir is given) and returns it, with
    the compiled programs under 'compiled' when asked (tests read them)."""
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'aot.json'), 'w') as f:
            json.dump(report, f, indent=2)
    if keep_compiled:
        report['compiled'] = programs
    return report
