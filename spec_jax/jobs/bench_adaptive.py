"""Verification sized online against every fixed size, on the workloads that decide it.

For each batch size, each workload's prompts run through AR, a chain at each fixed draft
length of `c.tiers` and the adaptive chain (`spec.adaptive`: the same lengths, one chosen
each round on device from the run's acceptance and the tiers' costs) in interleaved rounds,
every program warmed first (`bench_chain.interleaved_runs`). The adaptive chain runs twice
over: 'adaptive' prices its tiers by `c.costs` (a chip's calibration: 'auto' is this
machine's), and with `c.measured_costs` 'adaptive measured' by the seconds a round of each
fixed tier takes on the workload's first batch, measured just before (`round_seconds`: a
profiled step-cost table, the median of `c.cost_calls` calls; acceptance is still learned
online). Workloads:

  speed   the speed sets' prompts (`c.sets`)
  mbpp    MBPP prompts (code: prompt lookup accepts often)
  long    the long-context set (`c.long_sets`: CNN/DM articles), its own prompt bucket
  mixed   all of them: per engine the seconds and tokens of the three summed per round

(`c.workloads` runs a selection, in its order; the mixed one where it holds two or more.)

Reported per (batch, workload), measured: tokens/s of each engine (median over rounds),
each adaptive engine over the best fixed tier (AR is tier 0) and over AR (the median of the
per-round ratios and their range over the rounds: n rounds, no interval) and its drafted
tokens a round (which tiers it ran); on the mixed workload also its headroom: each workload
by its own best fixed tier, chosen after the fact, over the best single tier (`headroom`:
near 1, choosing a tier per workload cannot beat the best one). The issue's goals
(adaptive >= 0.97x the best fixed tier on each workload, above every fixed tier on the
mixed one, never below AR) are printed as met or not, a ratio goal only when every round
agrees (`goals`).
"""

from __future__ import annotations

import dataclasses
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from spec_jax import checkpoints, decoding, rules
from spec_jax.decoding import drafters
from spec_jax.decoding.adaptive import TierCosts
from spec_jax.decoding.build import adaptive_of, chip_tier_costs
from spec_jax.decoding.drafters import measured
from spec_jax.eval import tasks as tasks_lib
from spec_jax.jobs import bench_chain, speed_report
from spec_jax.jobs.timing import WARMED
from spec_jax.sampling import Sampler

WORKLOADS = ('speed', 'mbpp', 'long')
ADAPTIVE = 'adaptive'  # The adaptive engines' names start with it.


def workload_ids(c: ml_collections.ConfigDict, tok) -> dict[str, list]:
    """Chat ids of each workload's prompts."""
    _, speed = bench_chain.speed_ids(c, tok, c.prompts_per_set)
    long_c = ml_collections.ConfigDict(dict(sets=c.long_sets, data_root=c.data_root))
    _, long = bench_chain.speed_ids(long_c, tok, c.long_prompts)
    mbpp = tasks_lib.make('mbpp', c.data_root).load('', c.mbpp_prompts)
    return dict(speed=speed, mbpp=[tok.encode_chat(list(it.messages)) for it in mbpp],
                long=long)  # fmt: skip


def engines_of(c: ml_collections.ConfigDict, target, dec):
    """AR, a chain at each fixed length of `c.tiers` (0 is AR's) and the adaptive chain
    (its tier costs from `c.costs`: a chip's calibration, or the relative model; its prior
    the drafter's measured acceptance where `c.prior_from` is 'drafter' and it has one)."""
    made = drafters.make(c.drafter, target, c.draft, ngram=c.ngram, lookup=c.lookup,
                         dtype=c.dtype, seed=c.seed)  # fmt: skip
    tiers = tuple(int(v) for v in c.tiers.split(','))
    if tiers[0] != 0 or list(tiers) != sorted(set(tiers)):
        raise ValueError(f"bench adaptive: tiers={c.tiers!r} must start at 0 (AR) and rise, "
                         "as '0,1,2,4'")  # fmt: skip
    rule, top = rules.make(c.rule), tiers[-1]
    block = decoding.adaptive_config(c.tiers, c.costs)
    block.prior_from = c.get('prior_from', 'drafter')

    def chip_costs(chip, tier_list, shapes=()):
        del shapes
        slots = c.max_prompt_len + c.max_new_tokens
        return chip_tier_costs(chip, tier_list, target.cfg, made.drafter, c.drafter, slots)

    engines = {'ar': decoding.Engine(target.cfg, dec)}
    for k in tiers[1:]:
        engines[f'gamma {k}'] = decoding.Engine(target.cfg, dec, made.drafter, k, rule)
    adaptive = adaptive_of(block, 'chain', top, chip_costs, drafter=c.drafter,
                           measured=measured.prior(c.draft, c.drafter, c.lookup))
    engines[ADAPTIVE] = decoding.Engine(target.cfg, dec, made.drafter, top, rule,
                                        adaptive=adaptive)  # fmt: skip
    engines[ADAPTIVE].check()
    return engines, decoding.Params(target.params, made.params), tiers


def round_seconds(engines: dict, params, group, temperature: float,
                  calls: int = 3) -> tuple[list[float], float]:  # fmt: skip
    """Each fixed tier's seconds a round (AR's a step) on `group`, measured, and the
    drafter's catch-up seconds a token: each engine decodes it once untimed (compile and
    warm-up), then `calls` times, the engines interleaved; a call's seconds after its
    prefill over its rounds (the batch's longest row: the loop runs until every row is
    done), the median of the calls. A profiled step-cost table, as DSpark's; the adaptive
    engine's AR tier also runs its drafter's `follow` (a draft LM nothing, a head its
    buffer's writes), which AR's step here does not pay. Each tier at least the one below
    it (`monotone`). The catch-up: the first drafting tier's prefill over AR's (the
    drafter's prefill), over the longest prompt's tokens (medians; 0 when not above
    AR's)."""
    sampler = Sampler(temperature=temperature)
    fixed = [e.replace(sampler=sampler) for n, e in engines.items() if not n.startswith(ADAPTIVE)]

    def timed(engine) -> tuple[float, float]:
        res = decoding.generate(engine, params, group, seed=0)
        rounds = max(int(np.max(res.stats['per_row']['blocks'])), 1)
        return (res.seconds - res.prefill_seconds) / rounds, res.prefill_seconds

    for engine in fixed:
        timed(engine)
    runs = np.median(np.asarray([[timed(engine) for engine in fixed] for _ in range(calls)]),
                     axis=0)  # [engine, (round, prefill)]  # fmt: skip
    prompt = max(len(p) for p in group)
    return monotone(runs[:, 0]), max(float(runs[1, 1] - runs[0, 1]), 0.0) / prompt


def monotone(seconds_k) -> list[float]:
    """Measured round seconds, each at least the tier's below: a longer chain does all a
    shorter one does and more (more draft calls, more tokens verified), so a measurement
    below the tier under it is noise (on this machine a chain of 2 measured 38.2 ms against
    54.0 ms for a chain of 1 on one prompt, and the engine priced that way drafted 2.3
    tokens a round where the best fixed tier drafts 1)."""
    return np.maximum.accumulate(np.asarray(seconds_k, float)).tolist()


def priced_line(engines: dict, batch: int, tiers, costs: list[float],
                catch_up: float | None) -> str:  # fmt: skip
    """The measured round seconds and catch-up beside the adaptive chain's own prices: each
    tier in units of AR's step both ways (a calibration fitted on another day is read by its
    ratios; where they part, the curve misprices this machine's drafting). `catch_up` None:
    not measured (a drafter that never lags, or a head that buffers AR steps: its catch-up,
    a 16-token window, is not its prefill), its price alone said."""
    table = engines[ADAPTIVE].adaptive.costs
    priced = np.asarray(table.seconds(batch, jnp.float32(0.0)))
    measured_ms = ', '.join(f'{1e3 * s:.1f} ms' for s in costs)
    of_ar = [' / '.join(f'{x / v[0]:.2f}' for x in v) for v in (costs, priced)]
    said = (f"measured seconds a round of tiers {tiers}: {measured_ms}; of AR's step "
            f'{of_ar[0]} measured, {of_ar[1]} priced')  # fmt: skip
    per, least = (float(np.interp(batch, table.batch_n, v)) / priced[0]
                  for v in (table.catch_up_n, table.catch_up_base_n))
    price = f'{least:.3f} of an AR step a catch-up {per:+.4f} a token'
    if catch_up is None:
        return said + (f"; the drafter's catch-up priced {price}, not measured (the measured "
                       'pricing keeps it)' if per or least else
                       '; the drafter follows every round (no catch-up)')  # fmt: skip
    return (f"{said}; the draft's catch-up {1e6 * catch_up:.1f} us a token, of an AR step "
            f'{catch_up / costs[0]:.4f} measured; priced {price}')


def with_measured(engines: dict, costs: list[float], catch_up: float | None = 0.0) -> dict:
    """`engines` and the adaptive chain again under the measured round costs and catch-up
    a token (this batch's, at every batch of the engine's own table: the same shapes, so it
    runs the adaptive chain's compiled programs), as `ADAPTIVE + ' measured'`; `catch_up`
    None (not measured: a buffering head's) keeps the engine's priced one a token; the
    priced base of a catch-up (its one forward or window) is kept either way."""
    sized = engines[ADAPTIVE].adaptive
    batch_n = np.asarray(sized.costs.batch_n).tolist()
    kept = np.asarray(sized.costs.catch_up_n) if catch_up is None else catch_up
    table = TierCosts.table([[s] * len(batch_n) for s in costs], batch_n=batch_n,
                            catch_up_n=kept, catch_up_base_n=np.asarray(
                                sized.costs.catch_up_base_n))  # fmt: skip
    measured = dataclasses.replace(sized, costs=table)
    return dict(engines, **{f'{ADAPTIVE} measured': engines[ADAPTIVE].replace(
        adaptive=measured)})  # fmt: skip


def compare(times: dict, rounds: int) -> dict:
    """Tokens/s per engine (median over rounds) and, per adaptive engine, its per-round
    ratios over the best fixed tier (best by median; AR is tier 0) and over AR."""
    rate = {n: [tok / sec for sec, tok, _ in runs] for n, runs in times.items()}
    median = {n: float(np.median(v)) for n, v in rate.items()}
    fixed = [n for n in rate if not n.startswith(ADAPTIVE)]
    best = max(fixed, key=median.get)
    out = dict(tokens_per_s=median, best_fixed=best, rounds=rounds, adaptive={})
    for name in [n for n in rate if n.startswith(ADAPTIVE)]:
        over = {n: np.asarray(rate[name]) / np.asarray(rate[n]) for n in fixed}
        out['adaptive'][name] = dict(
            over_best=float(np.median(over[best])),
            over_best_range=(float(over[best].min()), float(over[best].max())),
            over_ar=float(np.median(over['ar'])),
            over_ar_range=(float(over['ar'].min()), float(over['ar'].max())),
            over_each={n: float(np.median(v)) for n, v in over.items()},
            over_each_range={n: (float(v.min()), float(v.max())) for n, v in over.items()},
            mean_draft=mean_draft(times[name]))  # fmt: skip
    return out


def headroom(times: dict, rows: dict, mixed: dict, best_mixed: str) -> dict:
    """The most the mixed goal can gain from a choice per workload: each round, every
    workload decoded by its own best fixed tier (by median: chosen after the fact), over the
    best fixed tier on the mixed workload (`best_mixed`); `times` and `rows` by workload,
    `mixed` the mixed workload's times. A choice per round within a prompt may gain more;
    near 1, no choice of one fixed tier per workload beats the best single tier."""
    best = {w: rows[w]['best_fixed'] for w in times}
    chosen = summed([times[w][best[w]] for w in times])
    ratio = np.asarray([tok / sec for sec, tok, _ in chosen]) / np.asarray(
        [tok / sec for sec, tok, _ in mixed[best_mixed]])  # fmt: skip
    return dict(tiers=best, over_best=float(np.median(ratio)),
                over_best_range=(float(ratio.min()), float(ratio.max())))


def summed(runs: list) -> list:
    """Rounds over several workloads as one (the mixed workload's): each round's seconds and
    tokens summed over `runs` (one engine's [(seconds, tokens, results)] per workload), its
    results joined."""
    return [(sum(r[0] for r in rs), sum(r[1] for r in rs), [x for r in rs for x in r[2]])
            for rs in zip(*runs)]  # fmt: skip


def mean_draft(runs) -> float:
    """An engine's drafted tokens per round (an AR round drafts 0), over its timed calls:
    which tiers it ran, on average (0 without calls)."""
    per_row = [res.stats['per_row'] for _, _, results in runs for res in results]
    blocks = sum(int(np.sum(r['blocks'])) for r in per_row)
    return sum(int(np.sum(r['drafted'])) for r in per_row) / max(blocks, 1)


def line(batch: int, name: str, row: dict) -> str:
    """One printed result of (batch, workload)."""
    rates = ', '.join(f'{n} {v:.1f}' for n, v in row['tokens_per_s'].items())
    parts = []
    for engine, a in row['adaptive'].items():
        (lo, hi), (alo, ahi) = a['over_best_range'], a['over_ar_range']
        parts.append(f"{engine} / best fixed ({row['best_fixed']}) {a['over_best']:.3f} "
                     f"[{lo:.3f}-{hi:.3f}], / AR {a['over_ar']:.3f} [{alo:.3f}-{ahi:.3f}], "
                     f"{a['mean_draft']:.2f} drafted a round")  # fmt: skip
    return (f'batch {batch} {name}: tokens/s {rates} (measured, medians of {row["rounds"]} '
            f'rounds); ' + '; '.join(parts) + f' (median and range of {row["rounds"]} '
            'per-round ratios: no interval)')


def goals(rows: dict) -> list[str]:
    """The issue's goals, each met or not, per adaptive engine, from the rows
    {(batch, workload): row}. A ratio goal is met or not when every round's ratio says so;
    rounds on both sides of the line are too few to judge (the median beside them: this
    machine's run-to-run spread, 4% on these ratios, is wider than the goal's margin)."""
    out = []
    for (batch, name), row in rows.items():
        for engine, a in row['adaptive'].items():
            at = f'batch {batch} {name}, {engine}'
            if name != 'mixed':
                low, high = a['over_best_range']
                said = 'met' if low >= 0.97 else 'NOT met' if high < 0.97 else (
                    f'too few to judge: its {row["rounds"]} rounds on both sides')
                out.append(f'{at}: >= 0.97x the best fixed tier: {said} (median '
                           f'{a["over_best"]:.3f}, rounds {low:.3f}-{high:.3f})')  # fmt: skip
            else:
                spans = a['over_each_range']
                beaten = [n for n, (_, high) in spans.items() if high <= 1.0]
                unsure = [n for n, (low, high) in spans.items() if low <= 1.0 < high]
                said = (f'NOT met (not above {", ".join(beaten)} in any round)' if beaten else
                        f'too few to judge: its {row["rounds"]} rounds on both sides of '
                        f'{", ".join(unsure)}' if unsure else 'met')  # fmt: skip
                if 'headroom' in row:  # What choosing a fixed tier per workload gains.
                    room = row['headroom']
                    said += (f' (each workload by its best fixed tier, chosen after the fact: '
                             f'{room["over_best"]:.3f} of the best one, measured)')  # fmt: skip
                out.append(f'{at}: above every fixed tier (AR too): {said}')
            low, high = a['over_ar_range']
            said = ('NOT met (below AR in every round)' if high < 1.0 else 'met' if low >= 1.0
                    else f'too few to judge: its {row["rounds"]} rounds on both sides')
            out.append(f'{at}: never below AR (every round): {said} (rounds {low:.3f}-'
                       f'{high:.3f})')  # fmt: skip
    return out


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the adaptive bench of config `c` (configs/bench_adaptive.py)."""
    chosen = tuple(c.get('workloads', WORKLOADS))
    if not chosen or set(chosen) - set(WORKLOADS) or len(set(chosen)) != len(chosen):
        raise ValueError(f'bench adaptive: workloads={chosen!r}; give distinct names of '
                         f'{WORKLOADS}')  # fmt: skip
    target = checkpoints.load(c.model, c.dtype, c.seed)
    tok = target.tokenizer
    dec = decoding.DecodeSettings(max_new_tokens=c.max_new_tokens, stop_tokens=tok.stop_ids,
                                  max_prompt_len=c.max_prompt_len,
                                  prompt_bucket=c.prompt_bucket)  # fmt: skip
    engines, params, tiers = engines_of(c, target, dec)
    ids = workload_ids(c, tok)
    print(f'workloads: {", ".join(f"{n} {len(v)} prompts" for n, v in ids.items())}; '
          f'{c.max_new_tokens} new tokens max; drafter {c.drafter}, tiers {tiers}, costs '
          f'{c.costs or "relative"}; rule {c.rule}')  # fmt: skip
    print(f'timing: {WARMED}; then {c.rounds} interleaved round(s) of every engine, medians')
    rows = {}
    for batch in c.batches:
        by_workload: dict[str, dict] = {}
        for name in chosen:
            batch_ids = speed_report.fill(ids[name], batch)
            # The last workload's programs dropped: each workload compiles and warms its own,
            # so the process stays under the kernel's cap on memory mappings (code_room).
            jax.clear_caches()
            now = engines
            if c.measured_costs:
                costs, catch_up = round_seconds(engines, params, batch_ids[:batch],
                                                c.temperature, c.cost_calls)  # fmt: skip
                catch_up = catch_up if c.drafter == 'lm' else None  # A draft LM's is its prefill.
                said = priced_line(engines, batch, tiers, costs, catch_up)
                print(f'batch {batch} {name}: {said} (medians of {c.cost_calls} calls)')
                now = with_measured(engines, costs, catch_up)
            times = bench_chain.interleaved_runs(now, params, batch_ids, c.temperature, batch,
                                                 c.rounds)  # fmt: skip
            rows[batch, name] = compare(times, c.rounds)
            print(line(batch, name, rows[batch, name]), flush=True)
            by_workload[name] = times
        if len(chosen) < 2:  # No mix of one workload.
            continue
        mixed = {n: summed([by_workload[w][n] for w in by_workload]) for n in now}
        rows[batch, 'mixed'] = row = compare(mixed, c.rounds)
        row['headroom'] = room = headroom(by_workload, {w: rows[batch, w] for w in chosen},
                                          mixed, row['best_fixed'])  # fmt: skip
        print(line(batch, 'mixed', row), flush=True)
        lo, hi = room['over_best_range']
        print(f'batch {batch} mixed: each workload by its best fixed tier ({room["tiers"]}, '
              f'chosen after the fact) {room["over_best"]:.3f} [{lo:.3f}-{hi:.3f}] of the best '
              f"fixed tier ({row['best_fixed']}) (measured: median and range of {c.rounds} "
              'per-round ratios, no interval; an after-the-fact upper reading of what choosing '
              'a tier per workload gains)',
              flush=True)  # fmt: skip
    met = goals(rows)
    print('goals (issue 47, measured here):\n  ' + '\n  '.join(met))
    report = dict(rows={f'{b}/{n}': r for (b, n), r in rows.items()}, goals=met)
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_adaptive.json'), 'w') as f:
            json.dump(report, f, indent=2, default=str)
    return report
