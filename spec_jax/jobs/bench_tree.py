"""EAGLE-3 tree decoding against spec_jax's own AR and chain decoding with the same head.

Three parts (configs/bench_tree.py):
  speed        AR, chain and tree side by side per (temperature, batch), in interleaved
               rounds: tokens/s, speedups over AR and over the chain, acceptance length
               (tokens per target forward, the bonus counted), the round cost in AR tokens
               and the speedup ceiling, and the field's speed table (`speed_report`:
               per-position acceptance, TTFT, TPOT; a lossy rule's TV and matched
               baselines); then the tree round's engine overhead.
  equal width  tree M = chain A + 1 for each A of `c.width_trees`, same head, prompts and
               seeds (a dynamic tree at T 0, a sampled static tree at T > 0):
               acceptance length of each with a 95% interval over prompts, and of their
               per-prompt difference (the tree beats the chain when its lower end is > 0).
  shapes       tokens/s of each tree of `c.shapes` at T 0 and batch 1: the best here.
"""

from __future__ import annotations

import json
import os
from functools import partial

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import scipy.stats

from spec_jax import decoding, rules
from spec_jax.decoding import drafters, trees
from spec_jax.decoding import engine as eng
from spec_jax.jobs import speed_report
from spec_jax.jobs.bench_chain import (
    interleaved_runs,
    overhead_report,
    speed_ids,
    speed_setup,
    summarize_runs,
    time_parts,
)
from spec_jax.jobs.timing import WARMED, interleaved_medians, warm_up
from spec_jax.models.cache import tree_mask
from spec_jax.models.llama import forward
from spec_jax.sampling import Sampler


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the tree benchmark of config `c` (configs/bench_tree.py)."""
    target, prompts, ids, dec = speed_setup(c)
    built = drafters.make('eagle3', target, c.draft, dtype=c.dtype, seed=c.seed)
    params = decoding.Params(target.params, built.params)
    shape = decoding.tree_shape(c.tree)
    chain = decoding.Engine(target.cfg, dec, built.drafter, c.num_draft, rules.make(c.rule))
    engines = {
        'ar': decoding.Engine(target.cfg, dec),
        'chain': chain,
        'tree': chain.replace(tree=shape),
    }
    for name in ('chain', 'tree'):  # A lossy rule's matched baselines, timed beside them.
        engines = speed_report.with_matched(engines, name)
    print(
        f'{len(prompts)} prompts ({c.prompts_per_set} from each of {", ".join(c.sets)}), '
        f'{c.max_new_tokens} new tokens max, head {c.draft}, rule {c.rule}; chain gamma '
        f'{c.num_draft}, {shape.describe()}'
    )
    print(f'timing: {WARMED}; then {c.rounds} interleaved round(s), medians')
    report = {'rows': []}
    for temperature in c.temperatures:
        tv = {}
        for batch in c.batches:
            batch_ids = speed_report.fill(ids, batch)
            row, times = speed_row(engines, params, batch_ids, temperature, batch, c.rounds)
            for name in ('chain', 'tree'):  # Metered untimed, once per temperature.
                if speed_report.is_lossy(engines[name]) and name not in tv:
                    tv[name] = speed_report.metered_tv(engines[name], params, batch_ids,
                                                       temperature, batch)  # fmt: skip
            row['speed'] = speed_report.rows_of(times, engines, batch, tv)
            report['rows'].append(row)
            print(
                f'T={temperature} batch {batch}: AR {row["ar_tokens_per_s"]:.1f} tok/s, chain '
                f'{row["chain_tokens_per_s"]:.1f} ({row["chain_speedup"]:.2f}x, acceptance '
                f'length {row["chain_accept_length"]:.2f}), tree {row["tree_tokens_per_s"]:.1f}'
                f' ({row["tree_speedup"]:.2f}x AR, {row["tree_over_chain"]:.2f}x chain; '
                f'acceptance length {row["tree_accept_length"]:.2f}); a tree round costs '
                f'{row["tree_round_cost"]:.2f} AR tokens: ceiling {row["tree_ceiling"]:.2f}x'
            )
            speed_report.print_table(temperature, batch, row['speed'])
    if c.overhead:
        report['overhead'] = tree_overhead(engines['tree'], params, ids[:1], c.rounds)
    if c.width_trees:
        width_ids = ids
        if c.width_prompts_per_set != c.prompts_per_set:
            width_ids = speed_ids(c, target.tokenizer, c.width_prompts_per_set)[1]
        report['equal_width'] = equal_width(c, chain, params, width_ids)
    if c.shapes:
        report['shapes'] = shape_search(c, chain, params, ids)
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_tree.json'), 'w') as f:
            json.dump(report, f, indent=2)
    return report


def speed_row(engines, params, ids, temperature, batch, rounds) -> tuple[dict, dict]:
    """Median-round tokens/s of AR, chain and tree at one (temperature, batch), and the
    timed runs (`bench_chain.interleaved_runs`)."""
    times = interleaved_runs(engines, params, ids, temperature, batch, rounds)
    row = dict(temperature=temperature, batch=batch)
    for name in ('chain', 'tree'):
        # A round emits at most its longest path + 1: num_draft (the tree's path) + 1.
        part = summarize_runs(temperature, batch, {'ar': times['ar'], 'spec': times[name]},
                              engines[name].num_draft)  # fmt: skip
        row['ar_tokens_per_s'] = part['ar_tokens_per_s']
        row[f'{name}_tokens_per_s'] = part['spec_tokens_per_s']
        row[f'{name}_speedup'] = part['speedup']
        row[f'{name}_accept_length'] = part['block_efficiency']
        row[f'{name}_round_cost'] = part['round_cost']
        row[f'{name}_ceiling'] = part['speedup_ceiling']
    row['tree_over_chain'] = row['tree_tokens_per_s'] / row['chain_tokens_per_s']
    return row, times


def tree_overhead(engine: decoding.Engine, params, ids, rounds: int) -> dict:
    """The share of a tree round outside the target forward over its M nodes and the head
    (its tree and its window over the path), on the state after prefill, each part jitted
    alone and timed interleaved (`bench_chain.time_parts`)."""
    shape, d = engine.tree, engine.drafter
    whole = jax.jit(eng.tree_round, donate_argnums=3)

    @partial(jax.jit, donate_argnums=2)
    def target_forward(engine, params, s):
        x_bm = jnp.broadcast_to(s.pending_b()[:, None], (len(ids), shape.nodes))
        parents_bm = jnp.broadcast_to(jnp.maximum(jnp.arange(shape.nodes) - 1, 0), x_bm.shape)
        anc_bmm = trees.ancestors(parents_bm, shape.nodes)  # A chain: the same cost.
        c = s.cache
        positions = s.committed_b[:, None] + jnp.arange(shape.nodes)[None, :]
        logits, taps, cache = forward(engine.cfg, params, x_bm, positions, c,
                                      tree_mask(c.lengths, anc_bmm, c.max_len),
                                      tap_layers=d.tap_layers)  # fmt: skip
        return s.replace(cache=cache), (logits, taps)  # Returned: else XLA drops them.

    @partial(jax.jit, donate_argnums=2)
    def drafter_only(engine, draft_params, s):
        verification = eng.Verification(engine.rule, engine.baseline)
        state, tokens, parents, q = d.propose_tree(
            draft_params, s.draft, s.committed_b, shape, s.key_b, eng.probs_fn(engine, verification)
        )
        taps = jnp.zeros((len(ids), shape.path_len + 1, len(d.tap_layers), engine.cfg.width))
        state = d.observe(draft_params, state, s.history_bs, s.committed_b, s.committed_b, taps)
        return s.replace(draft=state), (tokens, parents, q)

    calls = {
        'round': lambda s: (whole(engine, params.target, params.draft, s), None),
        'forward': lambda s: target_forward(engine, params.target, s),
        'drafter': lambda s: drafter_only(engine, params.draft, s),
    }
    med = time_parts(calls, engine, params, ids, rounds)
    return overhead_report(f'a tree round at batch {len(ids)}',
                           f'target forward over {shape.nodes} nodes', med)


def mean_interval(x) -> tuple[float, float]:
    """Mean and its 95% half-width over independent prompts (Student's t, n - 1 degrees)."""
    x = np.asarray(x, np.float64)
    if len(x) < 2:
        return float(x.mean()), float('inf')
    half = scipy.stats.t.ppf(0.975, len(x) - 1) * x.std(ddof=1) / np.sqrt(len(x))
    return float(x.mean()), float(half)


def per_prompt_length(result) -> np.ndarray:
    rows = result.stats['per_row']
    return np.asarray(rows['emitted'], np.float64) / np.maximum(rows['blocks'], 1)


def width_tree(spec: str, nodes: int) -> trees.TreeShape:
    """A tree of `nodes` nodes from a bench spec: 'dynamic:depth,branch', or
    'static:p1,...,pM-1' (the parents of nodes 1..M-1) with the head's top-ranked children,
    'iid:p1,...' or 'distinct:p1,...' with sampled ones (`TreeShape.sampled`)."""
    kind, _, values = spec.partition(':')
    numbers = [int(v) for v in values.split(',')]
    if kind == 'dynamic':
        return trees.TreeShape(nodes, *numbers)
    if kind not in ('static', 'iid', 'distinct') or len(numbers) != nodes - 1:
        raise ValueError(
            f"width tree {spec!r}: 'dynamic:depth,branch', or 'static:', 'iid:' or "
            f"'distinct:' with the {nodes - 1} parents of nodes 1..{nodes - 1}"
        )
    return trees.TreeShape.fixed([0] + numbers, sampled='' if kind == 'static' else kind)


def equal_width(c, chain: decoding.Engine, params, ids) -> list[dict]:
    """Acceptance length of chain A against a tree of M = A + 1 nodes on the same prompts
    and seeds, per temperature: `c.width_trees` holds (A, the tree at T 0, the tree at
    T > 0) (`width_tree` specs); each prompt's length is its mean over `c.width_seeds`."""
    out = []
    for temperature in c.temperatures:
        sampler = Sampler(temperature=temperature)
        for a, greedy_spec, sampled_spec in c.width_trees:
            shape = width_tree(greedy_spec if temperature == 0 else sampled_spec, a + 1)
            runs = {
                'chain': chain.replace(num_draft=a, sampler=sampler),
                'tree': chain.replace(tree=shape, sampler=sampler),
            }
            lengths = {
                name: np.mean([per_prompt_length(decoding.generate(engine, params, ids, seed=s))
                               for s in c.width_seeds], axis=0)
                for name, engine in runs.items()
            }  # fmt: skip
            (cm, ch), (tm, th) = (mean_interval(lengths[k]) for k in ('chain', 'tree'))
            dm, dh = mean_interval(lengths['tree'] - lengths['chain'])
            row = dict(temperature=temperature, num_draft=a, tree=shape.describe(),
                       chain=cm, chain_ci=ch, tree_length=tm, tree_ci=th, gain=dm, gain_ci=dh,
                       tree_wins=dm - dh > 0)  # fmt: skip
            out.append(row)
            print(
                f'T={temperature} width {a + 1}: chain A={a} {cm:.2f} +- {ch:.2f}, '
                f'{shape.describe()} {tm:.2f} +- {th:.2f}; tree - chain {dm:+.2f} +- {dh:.2f} '
                f'per prompt ({"tree wins" if row["tree_wins"] else "no clear win"})'
            )
    return out


def shape_search(c, chain: decoding.Engine, params, ids) -> dict:
    """Tokens/s of each tree of `c.shapes` ((nodes, depth, branch)) at T 0, batch 1."""
    engines = {f'{m}/{d}/{k}': chain.replace(tree=trees.TreeShape(m, d, k))
               for m, d, k in c.shapes}  # fmt: skip
    runs = {name: partial(decoding.generate, engine, params) for name, engine in engines.items()}
    warm_up({(name, k): partial(run_one, [p]) for name, run_one in runs.items()
             for k, p in enumerate(ids)})  # Every tree at every prompt bucket.  # fmt: skip
    rates, lengths = {}, {}

    def timed(name):
        def go():
            results = [runs[name]([p]) for p in ids]
            rates.setdefault(name, []).append(
                sum(r.num_tokens for r in results) / sum(r.seconds for r in results)
            )
            emitted = sum(sum(r.stats['per_row']['emitted']) for r in results)
            lengths[name] = emitted / max(sum(r.stats['blocks'] for r in results), 1)
            return 0

        return go

    interleaved_medians({name: timed(name) for name in runs}, c.rounds)
    table = {name: dict(tokens_per_s=float(np.median(rates[name])),
                        accept_length=float(lengths[name])) for name in runs}  # fmt: skip
    best = max(table, key=lambda n: table[n]['tokens_per_s'])
    for name, row in table.items():
        mark = '  <- best here' if name == best else ''
        print(f'tree nodes/depth/branch {name}: {row["tokens_per_s"]:.1f} tok/s, acceptance '
              f'length {row["accept_length"]:.2f}{mark}')  # fmt: skip
    return dict(table=table, best=best)
