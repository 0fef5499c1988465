"""The claims job: the paper's six claims on one target, each as a verdict with its numbers.

    python launch/claims.py --config configs/experiments/smollm2_135m_claims.py

The config is an evaluation config (`jobs.evaluate.default_config`: target, head, tasks,
T, batch) with `arms` (rule grids per arm, arms of `ARMS`), `dflash_draft` (the DFlash
drafter of the DFlash arms), `floor_rules` and `arm_reports` (write each arm's evaluation
report). The job runs:

  chain, tree  the evaluation (`eval.runner`, resumable) of each arm's grid with the
               config's drafter, in chain and in tree mode, on the same prompts and seeds:
               <workdir>/<arm>/ holds its results and its report (`arm_report`: tables
               and intervals, no verdicts; the job's one Holm family is claims.md's)
  dflash_chain, ddtree
               the same with the DFlash drafter `dflash_draft`: its chain and its DDTree
               (C3's second tree/chain pair, `eval.claims.TREE_PAIRS`)
  greedy       T 0: AR, chain and tree decoding of the same prompts, and the DFlash chain
               and DDTree where those arms run (C1)
  floors       the target as its own draft (drafter 'self', q = p) in chain and tree form
               under each floor rule, with the floors derived on its text (`eval.floors`)

then `eval.claims` turns them into one line per claim and `<workdir>/claims.md` (with the
frontier figure beside it), and prints the lines.
"""

from __future__ import annotations

import json
import os
import time

import ml_collections
import numpy as np

from spec_jax import decoding, rules
from spec_jax.eval import (
    claims,
    claims_report,
    findings,
    floors,
    machine,
    metrics,
    records,
    report,
    runner,
    timing,
)
from spec_jax.sampling import Sampler

# Each arm's mode and drafter: the config's own (the EAGLE-3 head) or its `dflash_draft`.
ARMS = {'chain': ('chain', 'config'), 'tree': ('tree', 'config'),
        'dflash_chain': ('chain', 'dflash'), 'ddtree': ('tree', 'dflash')}  # fmt: skip
# The rule the floors are derived for (`eval.floors`: min-p's allowed set, from its rho).
FLOOR_RULE = 'minp_verify'


def check_floor_rules(specs) -> None:
    """Raises ValueError at the first of `specs` that is not a min-p rule: the floors are
    derived for min-p verification only."""
    for spec in specs:
        if rules.make(spec).name != FLOOR_RULE:
            raise ValueError(f'floor_rules: {spec!r} is not a {FLOOR_RULE} rule; the floors are '
                             f"derived for min-p only (e.g. '{FLOOR_RULE}:rho=0.1')")  # fmt: skip


def check_arms(c: ml_collections.ConfigDict) -> None:
    """Raises ValueError at an arm not in `ARMS`, or DFlash arms without `dflash_draft`."""
    for arm in c.arms:
        if arm not in ARMS:
            raise ValueError(f'arms.{arm}: not an arm of the claims job; valid: {tuple(ARMS)}')
        if ARMS[arm][1] == 'dflash' and not c.get('dflash_draft'):
            raise ValueError(f"arms.{arm} drafts with the DFlash drafter: set dflash_draft to "
                             f"its directory or 'random' (got {c.get('dflash_draft')!r})")


def dflash_config(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The job's config drafting with its DFlash drafter (`dflash_draft`) instead."""
    out = ml_collections.ConfigDict(c.to_dict())
    out.drafter, out.draft, out.lookup = 'dflash', c.dflash_draft, 0
    return out


def arm_config(c: ml_collections.ConfigDict, arm: str) -> ml_collections.ConfigDict:
    """The evaluation config of one arm: the job's config with the arm's grid, mode and
    drafter."""
    mode, drafter = ARMS[arm]
    out = dflash_config(c) if drafter == 'dflash' else ml_collections.ConfigDict(c.to_dict())
    for key in ('arms', 'floor_rules', 'arm_reports', 'dflash_draft'):
        if key in out:
            del out[key]
    out.name = f'{c.name}_{arm}'
    out.grid = tuple(c.arms[arm])
    out.mode = mode
    return out


def prompts_of(c: ml_collections.ConfigDict, tokenizer) -> tuple[list, list[int]]:
    """(token ids, sample ids) of the config's items, in task then item order: the runner's
    noise per item (`runner.sample_id`), so every arm meets the same random numbers."""
    ids, sample_ids = [], []
    for name, (_, its) in runner.load_items(c).items():
        for it in its:
            ids.append(tokenizer.encode_chat(list(it.messages)))
            sample_ids.append(runner.sample_id(name, it.id))
    return ids, sample_ids


def generate_all(engine, params, c, prompts, sample_ids) -> tuple[list, list[dict]]:
    """(tokens per prompt, per-row stats per prompt) in batches of `c.batch_size`, a short
    last batch padded as the runner pads it (`runner.padded_size`: the same compiled loops)."""
    tokens, stats = [], []
    for i in range(0, len(prompts), c.batch_size):
        chunk, ids = prompts[i : i + c.batch_size], sample_ids[i : i + c.batch_size]
        pad = runner.padded_size(len(chunk), c.batch_size) - len(chunk)
        res = decoding.generate(engine, params, chunk + chunk[-1:] * pad, seed=int(c.seeds[0]),
                                max_new_tokens=[c.max_new_tokens] * len(chunk) + [1] * pad,
                                sample_ids=ids + [0] * pad)  # fmt: skip
        tokens += res.tokens[: len(chunk)]
        per_row = res.stats['per_row']
        stats += [{k: v[b] for k, v in per_row.items()} for b in range(len(chunk))]
    return tokens, stats


def greedy(c: ml_collections.ConfigDict) -> dict:
    """C1's data: AR, chain and tree decoding at T 0, token for token, and the DFlash
    drafter's chain and DDTree where the DFlash arms run. The engines are the arms'
    (metered; the temperature is a traced leaf), so their loops are not compiled again."""
    shape = decoding.tree_shape(c.tree)
    configs = [(c, ('chain', 'tree'))]
    if any(ARMS[arm][1] == 'dflash' for arm in c.arms):
        configs.append((dflash_config(c), ('dflash_chain', 'ddtree')))
    out, n = {}, 0
    for conf, (chain, tree) in configs:
        built = decoding.build(runner.decoding_block(conf))
        prompts, sample_ids = prompts_of(c, built.tokenizer)
        base = built.engine.replace(sampler=Sampler(temperature=0.0))
        engines = {chain: base, tree: base.replace(tree=shape)}
        if not out:
            engines = {'ar': base.replace(drafter=None, num_draft=0, tree=None), **engines}
        for k, e in engines.items():
            out[k] = generate_all(e, built.params, c, prompts, sample_ids)[0]
        n = len(prompts)
    return dict(tokens=out, n=n)


def floor_runs(c: ml_collections.ConfigDict) -> list[dict]:
    """Per floor rule and form (chain, tree) with the target as its own draft: per prompt
    (`keys`: its index, the same prompt and noise in both forms, so they pair) the metered
    TV and the derived floor's mean (`eval.floors`)."""
    block = runner.decoding_block(c)
    block.spec.drafter, block.spec.draft, block.spec.lookup = 'self', '', 0
    built = decoding.build(block)
    prompts, sample_ids = prompts_of(c, built.tokenizer)
    length = c.prompt_bucket + c.max_new_tokens
    shape = decoding.tree_shape(c.tree)
    out = []
    for spec in c.floor_rules:
        rule = rules.make(spec)
        rho = float(rule.rho)
        for form, engine in (('chain', built.engine), ('tree', built.engine.replace(tree=shape))):
            engine = engine.replace(rule=rule)
            tokens, stats = generate_all(engine, built.params, c, prompts, sample_ids)
            p_rows = []
            for i in range(0, len(prompts), c.batch_size):
                p_rows += floors.teacher_probs(
                    engine.cfg, built.params.target, engine.sampler,
                    prompts[i : i + c.batch_size], tokens[i : i + c.batch_size], length,
                )  # fmt: skip
            keys, measured, derived = [], [], []
            for i, (toks, st, p_tv) in enumerate(zip(tokens, stats, p_rows)):
                kinds = floors.position_kinds(st['block_accepted'], engine.num_draft,
                                              form == 'tree')[: len(toks)]  # fmt: skip
                if st.get('metered') and len(toks):
                    keys.append(i)
                    measured.append(st['tv_sum'] / st['metered'])
                    derived.append(float(floors.derived(p_tv, rho, kinds, form == 'tree').mean()))
            out.append(dict(rule=spec, form=form, keys=keys, measured=measured, derived=derived))
    return out


def arm_report(c: ml_collections.ConfigDict, results: list[dict], methods, workdir: str) -> dict:
    """An arm's evaluation report without its findings: the tables and intervals, no
    verdict words, so that the job's one Holm family is claims.md's (`eval.claims`)."""
    header = dict(settings=machine.settings(c), **timing.drift_lines(results),
                  provenance=records.provenance_text(records.provenance(results)))  # fmt: skip
    title = f'{c.name} (tables only: the verdicts are the claims job\'s, claims.md)'
    return report.write_report(metrics.aggregate(results, methods),
                               os.path.join(workdir, 'report'), mode=c.mode, title=title,
                               header=header)  # fmt: skip


def run(c: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs every arm (resuming the evaluations), writes claims.md; returns the claims and
    the wall clock."""
    start = time.perf_counter()
    check_floor_rules(c.floor_rules)
    check_arms(c)
    os.makedirs(workdir, exist_ok=True)
    arms, phases = {}, {}
    for arm in c.arms:
        began = time.perf_counter()
        ac = arm_config(c, arm)
        store, methods, _ = runner.run(ac, os.path.join(workdir, arm))
        results = runner.results(store)
        if c.arm_reports:
            arm_report(ac, results, methods, os.path.join(workdir, arm))
        arms[arm] = dict(rows=findings.pooled_rows(results, methods), results=results,
                         num_draft=ac.num_draft if ac.mode == 'chain' else
                         decoding.tree_shape(ac.tree).path_len)  # fmt: skip
        phases[arm] = time.perf_counter() - began
    began = time.perf_counter()
    data = dict(arms=arms, greedy=greedy(c), config=c.to_dict(),
                tree_branch=decoding.tree_shape(c.tree).branch)  # fmt: skip
    phases['greedy'], began = time.perf_counter() - began, time.perf_counter()
    data['floors'] = floor_runs(c)
    phases['floors'] = time.perf_counter() - began
    print('claims phases (s): ' + ', '.join(f'{k} {v:.0f}' for k, v in phases.items()))
    out = claims.evaluate(data, workdir)
    wall = time.perf_counter() - start
    text = claims_report.markdown(out, title=c.name, wall_s=wall)
    with open(os.path.join(workdir, 'claims.md'), 'w') as f:
        f.write(text)
    with open(os.path.join(workdir, 'claims.json'), 'w') as f:
        json.dump(dict(claims=out['claims'], composition=out['composition'], wall_s=wall), f,
                  indent=1, default=_plain)  # fmt: skip
    print(f'\nclaims: {os.path.join(workdir, "claims.md")} (wall clock {wall:.0f} s)')
    for line in claims_report.summary_lines(out) + out['lines']:
        print(line)
    return dict(out, wall_s=wall)


def _plain(x):
    return x.tolist() if isinstance(x, np.ndarray | np.generic) else str(x)
