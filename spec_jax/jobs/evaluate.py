"""The evaluation job: rules against their matched baselines on tasks, then the report.

    python launch/evaluate.py --config configs/experiments/smollm2_135m.py
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py --dry_run

`default_config` lists every field; configs/experiments/ build on it. `run` resumes a
killed run from `<workdir>/results.jsonl` (docs/eval.md) and writes the report beside it.
"""

from __future__ import annotations

import json
import os
import time

import jax
import ml_collections
import numpy as np

from spec_jax import decoding, distributed, rules, sharding
from spec_jax.eval import (
    findings,
    machine,
    metrics,
    monitor,
    paper,
    plan,
    records,
    report,
    runner,
    warmup,
)
from spec_jax.eval.tasks import fast_hsd
from spec_jax.jobs import profile, runtime
from spec_jax.rules import theory

# Parameter ranges of the theory curves (others: 0.05..0.95).
THEORY_SPANS = {'eta': (0.01, 0.3), 'eps': (0.01, 0.3)}


def default_config(tiny: bool = False) -> ml_collections.ConfigDict:
    """The evaluation job's config with every field and its default."""
    c = ml_collections.ConfigDict()
    c.name = 'experiment'
    # The target: 'embedded', a .gguf file, an HF directory or hub id, an orbax directory,
    # or 'random:<preset>' (random weights, the embedded tokenizer).
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'
    c.seed = 0  # Weights of 'random:' models.
    c.weights = ''  # '' the checkpoint's; 'int8' or 'float' (docs/quantization.md).
    c.scan_layers = False  # One scan over stacked layers (TPU/GPU compile time; not on CPU).
    c.mode = 'chain'  # 'chain', or 'tree' (EAGLE-3 draft trees: drafter 'eagle3', lookup 0).
    c.drafter = 'lm'  # 'lm' (a draft LM at `draft`), 'eagle3' (a head dir) or 'ngram'.
    c.draft = 'random:tiny' if tiny else ''
    c.draft_seed = 1 if tiny else -1  # Seed of 'random:' draft weights (-1: `seed`).
    c.num_draft = 1  # gamma: drafted tokens per chain round.
    c.ngram = 3
    c.lookup = 0  # k > 0: prompt lookup (n-grams of k..ngram) before the drafter.
    c.draft_sharding = 'batch'  # On a mesh: 'batch', or 'heads' (decoding.spec_config).
    # Tree mode's shape (decoding.tree_config; configs/smollm2_135m_tree.py): a CPU default.
    c.tree = decoding.tree_config(nodes=8, depth=4, branch=2)
    # Each round's size chosen online (decoding.adaptive_config; tiers '' off): every
    # speculative method of the plan, matched baselines too, sizes its rounds; AR does not.
    c.adaptive = decoding.adaptive_config()
    c.temperature = 0.7
    # Lossy rules (rules.make specs); the plan adds AR, lossless SD and matched baselines.
    c.grid = ('minp_verify:rho=0.3', 'lenience:l=0.5', 'cos:lam=0.4')
    # Task -> the first `limit` items (0 = all) and the per-row token limit.
    c.tasks = ml_collections.ConfigDict()
    c.seeds = (0,)
    c.batch_size = 8
    c.max_new_tokens = 32 if tiny else 256  # The output buffer (the largest task limit).
    c.max_prompt_len = 1024
    c.prompt_bucket = 128
    c.meter_distortion = True
    c.data_root = ''  # '' = $SPEC_JAX_DATA, else the samples bundled in the package.
    # Runtime only (not part of the results' fingerprint):
    c.mix = False  # Allow a changed config to add results to a workdir of another.
    c.score_workers = 2  # Threads scoring while the next batch decodes.
    c.progress = True
    c.compilation_cache = ''  # JAX's persistent cache dir ('' = the user cache, 'off').
    # A jax.profiler trace of profile_rounds rounds of AR and the mode's lossless engine on
    # the first batch, before the evaluation (spec_jax/jobs/profile.py); '' = none.
    c.profile_dir = ''
    c.profile_rounds = 5
    # Devices: (data, model) sizes, one may be -1 (docs/sharding.md); 1 x 1: one device.
    c.mesh = sharding.mesh_config()
    return c


def task(limit: int, max_new_tokens: int, source: str = '', **options) -> ml_collections.ConfigDict:
    """One entry of `c.tasks`: the first `limit` items (0 = all) of `source` ('' = the data
    root, 'hub' = through `datasets`, or a local file), each generating at most
    `max_new_tokens`; `options` are fields of the task (e.g. INCLUDE's `per_language`)."""
    return ml_collections.ConfigDict(
        dict(limit=limit, max_new_tokens=max_new_tokens, source=source, options=options)
    )


def paper_setup(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The decoding and tasks both of the paper's setups share (docs/paper.md §1, §2): T 0.7,
    2048 new tokens, MATH, MBPP+, INCLUDE and BFCL parallel_multiple at the paper's sizes,
    from `paper.TASK_SOURCES`: the paper's own items (source 'fast_hsd') for MATH (rows
    240-499 from the hub), INCLUDE and BFCL, MBPP+ from the hub (or '' with a `data_root`
    holding the full v0.2.0 file)."""
    c.temperature = 0.7
    c.max_new_tokens = c.max_prompt_len = 2048
    c.prompt_bucket = 256
    c.batch_size = 8
    for name, size in paper.TASK_SIZES.items():
        source = paper.TASK_SOURCES[name]
        c.tasks[name] = task(size, 2048, source, **paper.TASK_OPTIONS.get(name, {}))
    return c


def dry_run(c: ml_collections.ConfigDict) -> str:
    """The plan, the matched pairs and the sample counts, without loading a model (items
    are counted from the data when it is at hand, else from the limits)."""
    methods = runner.methods_of(c)
    limits = runner.task_limits(c)
    lines = [f'experiment {c.name}: {c.mode} mode, target {c.model}, drafter {c.drafter} '
             f'{c.draft or ""}, T {c.temperature}, seeds {tuple(c.seeds)}', '',
             f'{len(methods)} methods:', plan.describe(methods), '', 'tasks:']  # fmt: skip
    total = 0
    for name, spec in limits.items():
        task = runner.tasks_lib.make(name, c.data_root, **spec['options'])  # Options checked.
        try:
            if spec['source'] == 'hub':
                raise OSError('the hub is not read in a dry run')
            if spec['source'] == 'fast_hsd' and fast_hsd.needs_hub(name, spec['limit']):
                raise OSError("the hub is not read in a dry run ('fast_hsd' rows beyond those "
                              'bundled come from the hub)')  # fmt: skip
            n = len(task.load(spec['source'], spec['limit']))
            where = (
                'items'
                if n == spec['limit'] or not spec['limit']
                else (f'items (of the limit {spec["limit"]}: the data root holds {n})')
            )
        except (OSError, ValueError) as e:  # Data not here: count the limit.
            n, where = spec['limit'], f'items (the limit; data not read: {e})'
        samples = n * len(methods) * len(c.seeds)
        total += samples
        lines.append(f'  {name:28s} {n:5d} {where}, max_new_tokens {spec["max_new_tokens"]}, '
                     f'{samples} samples')  # fmt: skip
    lines.append(f'total: {total} samples')
    if c.mode == 'tree':
        lines.append(f'tree mode: {decoding.tree_shape(c.tree).describe()}')
    if c.get('adaptive') and c.adaptive.tiers:
        lines.append(f'adaptive: each round of every speculative method runs one of the tiers '
                     f'{c.adaptive.tiers!r} (0: an AR step), chosen on device; costs '
                     f'{c.adaptive.costs or "relative"!r}')  # fmt: skip
    return '\n'.join(lines)


def theory_curves(rows: list[dict], mode: str = 'chain', num_siblings: int = 1) -> dict:
    """The closed-form distortion of every lossy rule of a run over its parameter's range
    in the run's mode (`rules.theory.parameter_curve`: synthetic p and q; tree mode the
    node law with `num_siblings` ordered siblings, the tree's branch), for the distortion
    figure."""
    params: dict[tuple[str, str], set] = {}
    for r in rows:
        # Rules that read raw logits or decide the whole block (docs/laws.md §7) have no
        # closed form on the synthetic (p, q) pairs: measured points only.
        if r['kind'] == 'lossy' and r['param'] is not None and not _reads_more(r['method']):
            params.setdefault((r['rule'], r['param_name']), set()).add(float(r['param']))
    out = {}
    for (rule, name), measured in params.items():
        span = THEORY_SPANS.get(name, (0.05, 0.95))
        values = sorted(measured | {float(v) for v in np.linspace(*span, 10)})
        out[rule] = theory.parameter_curve(rule, name, values, mode=mode, num_siblings=num_siblings)
    return out


def _reads_more(method: str) -> bool:
    rule = rules.make(method)
    return bool(rule.needs_logits or rule.block_level)


def run(c: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) the experiment, writes the report; returns paths and timings (on
    several processes each prints its own figures; process 0 writes the report)."""
    start, load_start = time.perf_counter(), machine.load_average()
    runtime.log_devices()
    if c.get('profile_dir'):  # Each process its own trace.
        many = jax.process_count() > 1
        profile.profile_experiment(c, os.path.join(c.profile_dir, f'process_{jax.process_index()}')
                                   if many else c.profile_dir)  # fmt: skip
    store, methods, progress = runner.run(c, workdir)
    header = machine.header(store.fingerprint, load_start)
    drift = monitor.lines(store.rows, header)
    print('Drift monitor (AR on the same rows at the start and the end of each timing group): '
          + ('; '.join(f'{g}: {v}' for g, v in drift.items()) or '-'))  # fmt: skip
    # Process 0 alone holds the merged results (and writes the report).
    out = (write_report(c, runner.results(store), methods, workdir, header)
           if distributed.is_main() else {})  # fmt: skip
    wall = time.perf_counter() - start
    print(
        f'\n{progress.samples} new samples, {progress.tokens} tokens; decode '
        f'{progress.decode_s:.1f} s, compile {progress.compile_s:.1f} s ({progress.compiled} '
        f'executables compiled, {progress.cache_hits} loaded from the persistent cache); '
        f'warm-up {progress.warmup_s:.1f} s beyond compile ({progress.warmups} programs run '
        f'once untimed before their first timed call; {progress.cold_calls} timed calls '
        f'ran a program cold); wall clock {wall:.1f} s'
    )
    ratio = progress.throughput_ratio
    if ratio is not None:
        print(
            f'evaluation throughput / decode throughput: {ratio:.2f} (1.0 = free); prefill '
            f'{progress.prefill_s:.1f} s of the decode seconds; scoring {progress.score_s:.1f} '
            f's after the rounds, {progress.overlapped} timed calls overlapped by scoring'
        )
    if distributed.is_main():
        print(f'results: {store.path}')
        print('\n' + out['findings'])
    # The others wait for the report: a process leaving early would fail JAX's shutdown.
    distributed.barrier(f'evaluate report:{workdir}')
    return dict(out, progress=progress, wall_s=wall)


def _siblings(c: ml_collections.ConfigDict) -> int:
    """Siblings per tree node for the theory curves: the tree's branch (1 in chain mode)."""
    return decoding.tree_shape(c.tree).branch if c.mode == 'tree' else 1


def write_report(
    c: ml_collections.ConfigDict, results: list[dict], methods, workdir: str,
    header: dict | None = None,
):  # fmt: skip
    """Metrics and the report of a run's results (`header`: `eval.machine.header`);
    prints the headline table of the task groups (`findings.pooled_rows`: the speed sets
    as one); returns the paths, the rows, the pooled rows and the findings' text."""
    rows = metrics.aggregate(results, methods)
    pooled = findings.pooled_rows(results, methods)
    header = dict(header or {}, settings=machine.settings(c))  # Each setting, one line.
    header.update(monitor.lines(results, header),  # AR's drift and where rows were decoded.
                  provenance=records.provenance_text(records.provenance(results)))
    if warmup.summary(results):
        header['compile and warm-up'] = warmup.summary(results)
    paths = report.write_report(
        rows, os.path.join(workdir, 'report'), mode=c.mode, title=c.name,
        theory=theory_curves(rows, c.mode, _siblings(c)) if c.meter_distortion else None,
        header=header, pooled=pooled,
    )  # fmt: skip
    print(report.headline(pooled))
    others = sorted(os.path.basename(p) for k, p in paths.items() if k != 'report')
    print(f'report: {paths["report"]} (and beside it: {", ".join(others)})')
    return dict(paths=paths, rows=rows, pooled=pooled, findings=findings.text(pooled, c.mode))


def report_only(workdir: str) -> dict:
    """The report of a workdir's results as they stand (a run may still be going)."""
    with open(os.path.join(workdir, 'run.json')) as f:
        run_info = json.load(f)
    c = ml_collections.ConfigDict(run_info['config'])
    store = records.ResultStore.read_only(workdir)
    # Rendered now, perhaps mid-run: the load of this moment, the run's fingerprint.
    now = machine.load_average()
    header = machine.header(run_info.get('fingerprint'), now, now, rendered='mid-run or later '
                            '(launch/report.py): the load is that of the rendering')  # fmt: skip
    return write_report(c, runner.results(store), runner.methods_of(c), workdir, header)
