"""Metrics of an evaluation: one row per (task, method) from the per-sample results.

Definitions (docs/eval.md; the paper's, docs/paper.md §3):

  score             mean of `correct` over items (each item's mean over its seeds first);
                    95% interval: Wilson's for one sample per item, else the t-interval
                    of the item means (mean +- t(0.975, n - 1) s / sqrt(n): n is small)
  strict_score      math tasks: the same mean of detail['strict'] (correct and no hedge)
  block_efficiency  tokens emitted per target forward, the bonus token counted (AR: 1)
  be_full_gamma     the paper's chain BE: mean of (accepted + 1) over the full blocks,
                    rounds that verified all gamma drafts of a draft that no stop token
                    and no token limit cut (`decoding.engine.chain_round`)
  full_fraction     full blocks / rounds
  accept_length     the paper's EAGLE BE: accepted drafts per target forward (no +1)
  acceptance_rate   accepted drafts / drafted tokens (tree: per depth of the path)
  position_acceptance  accepted drafts / reached positions (a position is reached iff
                    every earlier one of its round was accepted; tree: a depth of the
                    path whose node had children): the per-position acceptance
                    probability, comparable between chain and tree
  ds                the paper's DS: chain gamma x full blocks / decode seconds; tree (as
                    the paper's) tokens_per_s
  tokens_per_s      generated tokens / decode seconds (compiles excluded); a row's seconds
                    are its share of its batch's by target forwards (prefill and rounds:
                    what a row costs), and a batch holds rows of one task group only
                    (`spec_jax.eval.timing.task_group`), decoded by every method in turn
  speedup           the geometric mean over batches of the method's tokens/s over AR's
                    on the same rows of the same batch, over the task's group (every
                    'speed_*' set: group 'speed', `speedup_group`); `speedup_lo` /
                    `speedup_hi` its 95% t-interval on log ratios from 5 batches on,
                    `speedup_n_batches` (`spec_jax.eval.stats.paired.speedup`)
  decode_speedup    the same of the decode alone: per batch, the tokens after each row's
                    first (prefill draws it) over the seconds after the prefill call,
                    against AR's; `_lo`, `_hi`, `_n_batches` as the speedup's
  prefill_share     the prefill calls' share of the method's decode seconds (what a
                    speedup over AR cannot touch: both run the same prefill)
  n_seeds, score_seed_std  seeds, and the std over seeds of each seed's score
  pair_n, d_score, d_be, d_tv, speedup_vs_matched, ...  a lossy row against its matched
                    baseline on their shared (item, seed) keys only, with intervals
                    (`spec_jax.eval.stats.paired.matched_deltas`)
  sd_d_be, sd_speedup, flattery_be, ...  the same against plain lossless SD, and the
                    difference (`spec_jax.eval.engine_rules.vs_plain_sd`)
  tv_plain          TV(pi, p) against the processed target itself (plain lossless SD's
                    law) over the same positions: `tv` where the baseline truncates nothing
  tv, kl, outside   means over every emitted position (first token, drafts, replacement
                    and bonus tokens) of TV(pi, p_A), KL(p_A || pi) and pi's mass outside
                    the allowed set A, p_A the matched baseline's law; KL over the
                    positions where it is finite, `kl_inf_fraction` the others (pi = 0
                    where p_A > 0: lenience or min-p verification of a deterministic draft)
  overshoot_mean/max  of max_x pi(x)/p(x) against the temperature-processed target p
                    (finite ones; `overshoot_inf_fraction`: p underflowed where pi did not)
  js                mean Jensen-Shannon divergence JS(pi, p_A) over the metered
                    positions (nats, <= ln 2; finite where KL is not)
  tv_at_offset      mean TV at each offset of a round (drafted positions, then the bonus)
  acceptance_length, position_acceptance_at, ttft_s, tpot_s (each with _half, _n), tv_half,
                    tv_n  SPEED-Bench's per-request figures (`spec_jax.eval.speed`)
  seeds_k, avg_at_k, pass_at_k  k = the fewest samples (seeds) of an item; avg@k and
                    pass@k over them (`spec_jax.eval.outcomes.over_seeds`; AIME's)
  n_scorer_errors, n_timeouts, n_infra_errors, failed_samples  scorings that failed
                    (`spec_jax.eval.outcomes`): wrong answers in the score, counted apart

Counters are pooled over rows (sums, then ratios), so a row's weight is its token count.
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence

from scipy import stats

from spec_jax import rules
from spec_jax.eval import engine_rules, outcomes, speed, timing
from spec_jax.eval.plan import Method
from spec_jax.eval.stats import paired

Z95 = 1.959963984540054


def wilson(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a binomial proportion (n >= 1)."""
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    # Exact ends at 0 and n successes (the formula gives them up to rounding).
    lo = 0.0 if successes == 0 else max(0.0, centre - half)
    hi = 1.0 if successes == n else min(1.0, centre + half)
    return lo, hi


def score_interval(per_item: Sequence[Sequence[bool]]) -> tuple[float, float, float]:
    """(mean, lo, hi) of a score from each item's samples (one list per item)."""
    means = [sum(s) / len(s) for s in per_item]
    n = len(means)
    mean = sum(means) / n
    if all(len(s) == 1 for s in per_item):
        lo, hi = wilson(sum(int(s[0]) for s in per_item), n)
        return mean, lo, hi
    sd = math.sqrt(sum((m - mean) ** 2 for m in means) / (n - 1)) if n > 1 else 0.0
    if sd == 0.0:  # No item-level spread (or one item): Wilson's on the pooled samples.
        lo, hi = wilson(sum(int(x) for s in per_item for x in s), sum(len(s) for s in per_item))
        return mean, lo, hi
    half = float(stats.t.ppf(0.975, n - 1)) * sd / math.sqrt(n)
    return mean, max(0.0, mean - half), min(1.0, mean + half)


def method_info(method: Method) -> dict:
    """kind, rule, param, param_name, pairs of a planned method (the report's columns)."""
    if method.name == 'ar':
        kind = 'ar'
    elif method.name == 'lossless':
        kind = 'lossless'
    else:
        kind = 'baseline' if method.baseline else 'lossy'
    if kind == 'baseline':
        rule, param, param_name = method.truncation, method.param, method.truncation
    else:
        r = rules.make(method.rule)
        rule, param, param_name = r.name, None, None
        for f in dataclasses.fields(r):
            value = getattr(r, f.name)
            if isinstance(value, float):
                param, param_name = value, f.name
                break
    return dict(kind=kind, rule=rule, param=param, param_name=param_name,
                pairs=list(method.pairs))  # fmt: skip


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def aggregate(rows: Sequence[dict], methods: Sequence[Method]) -> list[dict]:
    """The metrics rows (one per task x method that has results): tasks sorted by name,
    methods in plan order within each. Each group is summed in (item, seed) order, so the
    figures do not depend on the order results were written in (scoring threads, resumed
    runs): float sums are not associative."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in sorted(rows, key=lambda r: (str(r['item']), r.get('seed', 0))):
        groups[(r['task'], r['method'])].append(r)
    tasks = sorted({r['task'] for r in rows})
    out = []
    for task in tasks:
        task_rows = []
        for m in methods:
            group = groups.get((task, m.name))
            if group:
                task_rows.append(_metrics(task, m, group))
        _paired_fields(task, task_rows, methods, groups)
        out += task_rows
    return out


def _paired_fields(task: str, task_rows: list[dict], methods: Sequence[Method],
                   groups: dict[tuple[str, str], list[dict]]) -> None:  # fmt: skip
    """Adds each row's speedup against AR over its task group's batches, its seeds' spread,
    and a lossy row's paired Δs against its matched baseline (`spec_jax.eval.stats.paired`)."""
    group_name = timing.task_group(task)
    ar = next((m.name for m in methods if m.mode == 'ar'), None)

    def in_group(method: str) -> list[dict]:
        return [r for (t, m), rs in sorted(groups.items(), key=lambda g: g[0]) if m == method
                and timing.task_group(t) == group_name for r in rs]  # fmt: skip

    ar_rows = in_group(ar) if ar else []
    for r in task_rows:
        r['speedup_group'] = group_name
        if ar_rows:
            r.update(paired.speedup(in_group(r['method']), ar_rows))
        else:
            r.update(speedup=None, speedup_lo=None, speedup_hi=None, speedup_n_batches=None,
                     speedup_n_units=None, speedup_basis=None, decode_speedup=None,
                     decode_speedup_lo=None, decode_speedup_hi=None,
                     decode_speedup_n_batches=None)  # fmt: skip
        r.update(paired.seed_spread(groups[(task, r['method'])]))
        matched = r['pairs'][0] if r['kind'] == 'lossy' and r['pairs'] else None
        r.update(dict.fromkeys(paired.MATCHED_FIELDS))  # Every row has every column.
        if matched is not None:
            timed = (in_group(r['method']), in_group(matched))
            r.update(paired.matched_deltas(groups[(task, r['method'])],
                                           groups.get((task, matched), []), timed))  # fmt: skip
        # The same Δs against plain lossless SD, and how much that comparison flatters.
        r.update(engine_rules.vs_plain_sd(r, lambda m: groups.get((task, m), []), in_group))


def _strict_score(group: list[dict]) -> dict:
    """{'strict_score': mean of detail['strict'] over items (seeds first; a row without it
    counts as not strict)} when a row has one (the math tasks' hedge-free score), else {}."""
    if not any('strict' in (r.get('detail') or {}) for r in group):
        return {}
    per_item: dict[str, list[bool]] = defaultdict(list)
    for r in group:
        per_item[r['item']].append(bool((r.get('detail') or {}).get('strict')))
    return {'strict_score': sum(sum(s) / len(s) for s in per_item.values()) / len(per_item)}


def _metrics(task: str, method: Method, group: list[dict]) -> dict:
    scored = group[0].get('correct') is not None
    row = dict(task=task, scored=scored, method=method.name, **method_info(method))
    per_item: dict[str, list[bool]] = defaultdict(list)
    for r in group:
        per_item[r['item']].append(bool(r.get('correct')))
    row.update(n_items=len(per_item), n_samples=len(group))
    if scored:
        row['score'], row['score_lo'], row['score_hi'] = score_interval(list(per_item.values()))
        row.update(_strict_score(group))
        row.update(outcomes.over_seeds(per_item))
        row.update(outcomes.failures(group))
    else:
        row['score'] = row['score_lo'] = row['score_hi'] = None
        row.update(dict.fromkeys(('seeds_k', 'avg_at_k', 'pass_at_k', 'failed_samples')))
        row.update(dict.fromkeys(outcomes.FAILURE_FIELDS.values()))
    total = defaultdict(float)
    for r in group:
        for k, v in r['stats'].items():
            if not isinstance(v, list) and k != 'max_overshoot':
                total[k] += v
    ar = method.mode == 'ar'
    row['block_efficiency'] = _ratio(total['emitted'], total['blocks'])
    full = total['full_blocks']
    row['be_full_gamma'] = None if ar else _ratio(total['full_accepted'] + full, full)
    row['accept_length'] = None if ar else _ratio(total['accepted'], total['blocks'])
    row['acceptance_rate'] = None if ar else _ratio(total['accepted'], total['drafted'])
    has = {k for r in group for k in r['stats']}  # Older result lines lack newer counters.
    row['position_acceptance'] = (
        None if ar or 'reached' not in has else _ratio(total['accepted'], total['reached'])
    )
    row['full_fraction'] = None if ar else _ratio(full, total['blocks'])
    row['tokens'] = sum(r['num_tokens'] for r in group)
    row['decode_seconds'] = sum(r['seconds'] for r in group)
    row['tokens_per_s'] = _ratio(row['tokens'], row['decode_seconds'])
    row['prefill_share'] = _prefill_share(group)
    if ar:
        row['ds'] = None
    elif method.mode == 'tree':
        row['ds'] = row['tokens_per_s']
    else:
        ds = _ratio(total['full_drafted'], row['decode_seconds'])
        row['ds'] = ds if 'full_drafted' in has else None
    metered = total['metered']
    for name in ('tv', 'outside'):
        row[name] = _ratio(total[f'{name}_sum'], metered) if metered else None
    # JS (bounded by ln 2): a number where KL is infinite, as in tree runs.
    row['js'] = _ratio(total['js_sum'], metered) if metered and 'js_sum' in has else None
    # TV against plain lossless SD's law (the processed target itself): `tv` where the
    # matched baseline truncates nothing.
    plain = metered and 'tv_plain_sum' in has
    row['tv_plain'] = _ratio(total['tv_plain_sum'], metered) if plain else None
    # KL and overshoot: means over the positions where they are finite, and the fraction
    # where they are not (a single infinite position would make a mean meaningless).
    for name, key in (('kl', 'kl'), ('overshoot', 'overshoot_mean')):
        finite = metered - total[f'{name}_inf']
        row[key] = _ratio(total[f'{name}_sum'], finite) if metered else None
        row[f'{name}_inf_fraction'] = total[f'{name}_inf'] / metered if metered else None
    peaks = [r['stats']['max_overshoot'] for r in group if 'max_overshoot' in r['stats']]
    row['overshoot_max'] = max(peaks) if peaks and metered else None
    row['tv_at_offset'] = _per_offset(group)
    # SPEED-Bench's per-request figures (acceptance length, per position, TTFT, TPOT).
    speed_row = speed.fields(speed.requests_of_rows(group), spec=not ar)
    row.update({k: v for k, v in speed_row.items() if k not in ('tv', 'tv_positions')})
    return row


def _prefill_share(group: list[dict]) -> float | None:
    """The prefill calls' share of the decode seconds of the batches the rows ran in (each
    (batch, method) once; None when no batch recorded its prefill)."""
    calls = {r['batch_id']: r['batch'] for r in group if r.get('batch_id') is not None
             and 'prefill_s' in (r.get('batch') or {})}  # fmt: skip
    total = sum(b['seconds'] for b in calls.values())
    return sum(b['prefill_s'] for b in calls.values()) / total if total else None


def _per_offset(group: list[dict]) -> list[float] | None:
    """Mean TV at each block offset over the rounds that emitted there (offsets 0..A-1: a
    drafted position or its replacement; A: the bonus token of a round that accepted all
    its drafts); None when not metered."""
    rows = [r['stats'] for r in group if 'tv_at_offset' in r['stats']]
    tv = [sum(col) for col in zip(*(r['tv_at_offset'] for r in rows))]
    count = [sum(col) for col in zip(*(r['metered_at_offset'] for r in rows))]
    if not sum(count):
        return None
    return [t / n if n else None for t, n in zip(tv, count)]
