"""Chain speculative decoding against spec_jax's own AR decoding, side by side.

For each (temperature, batch size) the same prompts run through AR and chain decoding in
interleaved rounds, each program warmed first (run once untimed at every batch shape:
`jobs.timing.warm_up`); the report gives tokens/s of each, block efficiency, acceptance and the
wall-clock speedup. Optionally Hugging Face transformers' assisted generation (torch CPU,
batch 1) runs the same target and draft on the same prompts as a peer.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from spec_jax import checkpoints, data_files, decoding, rules
from spec_jax.checkpoints import params_to_state
from spec_jax.decoding import batching, drafters
from spec_jax.decoding import engine as eng
from spec_jax.jobs import runtime, speed_report
from spec_jax.jobs.timing import WARMED, interleaved_medians, warm_up
from spec_jax.models.llama import forward
from spec_jax.sampling import Sampler


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the chain benchmark of config `c` (configs/bench_chain.py)."""
    target, prompts, ids, dec = speed_setup(c)
    built = drafters.make(
        c.drafter, target, c.draft, ngram=c.ngram, lookup=c.lookup, dtype=c.dtype, seed=c.seed
    )
    engines = speed_report.with_matched({
        'ar': decoding.Engine(target.cfg, dec),
        'spec': decoding.Engine(target.cfg, dec, built.drafter, c.num_draft, rules.make(c.rule)),
    }, 'spec')  # A lossy rule's matched baseline ('spec matched') is timed beside it.
    params = decoding.Params(target.params, built.params)
    print(
        f'{len(prompts)} prompts ({c.prompts_per_set} from each of {", ".join(c.sets)}), '
        f'{c.max_new_tokens} new tokens max, gamma {c.num_draft}, draft {c.drafter}'
        f'{" " + c.draft if c.draft and c.drafter != "ngram" else ""}'
        f'{f" behind prompt lookup ({c.ngram}..{c.lookup}-grams)" if c.lookup else ""}, '
        f'rule {c.rule}'
    )
    print(f'timing: {WARMED}; then {c.rounds} interleaved round(s) of every engine, medians')

    report = {'rows': []}
    for temperature in c.temperatures:
        tv = {}
        for batch in c.batches:
            batch_ids = speed_report.fill(ids, batch)
            times = interleaved_runs(engines, params, batch_ids, temperature, batch, c.rounds)
            row = summarize_runs(temperature, batch, times, c.num_draft)
            if speed_report.is_lossy(engines['spec']) and not tv:  # Once per temperature.
                tv = speed_report.metered_tv(engines['spec'], params, batch_ids, temperature,
                                             batch)  # fmt: skip
            row['speed'] = speed_report.rows_of(times, engines, batch, {'spec': tv})
            report['rows'].append(row)
            print(
                f'T={temperature} batch {batch}: AR {row["ar_tokens_per_s"]:.1f} tok/s, '
                f'chain {row["spec_tokens_per_s"]:.1f} tok/s -> speedup '
                f'{row["speedup"]:.2f}x; block efficiency {row["block_efficiency"]:.2f}, '
                f'acceptance {row["acceptance_rate"]:.2f}; a round costs '
                f'{row["round_cost"]:.2f} AR tokens, so accepting every draft would give '
                f'at most {row["speedup_ceiling"]:.2f}x'
            )
            speed_report.print_table(temperature, batch, row['speed'])

    if c.overhead:
        report['overhead'] = round_overhead(engines['spec'], params, ids[:1], c.rounds)
    if c.sweep_values:
        report['sweep'] = sweep_compiles(c, engines['spec'], params, ids[: max(c.batches)])
    if c.hf_peer and built.model is not None:
        report['hf_peer'] = hf_assisted_peer(c, target, built.model, ids, report['rows'])
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_chain.json'), 'w') as f:
            json.dump(report, f, indent=2)
    return report


def speed_setup(c: ml_collections.ConfigDict):
    """The target, the speed prompts of `c.sets` (`c.prompts_per_set` of each) and their
    chat ids, and the decode settings of a speed bench: (target, prompts, ids, settings)."""
    target = checkpoints.load(c.model, c.dtype, c.seed)
    tok = target.tokenizer
    prompts, ids = speed_ids(c, tok, c.prompts_per_set)
    dec = decoding.DecodeSettings(
        max_new_tokens=c.max_new_tokens,
        stop_tokens=tok.stop_ids,
        max_prompt_len=c.max_prompt_len,
        prompt_bucket=c.prompt_bucket,
    )
    return target, prompts, ids, dec


def speed_ids(c: ml_collections.ConfigDict, tok, per_set: int):
    """The first `per_set` prompts of each speed set of `c.sets` and their chat ids."""
    data_files.require(data_files.speed_files(c.sets), c.data_root, 'data_root')
    prompts = data_files.speed_prompts(c.sets, per_set, c.data_root, 'data_root')
    return prompts, [tok.encode_chat([{'role': 'user', 'content': t}]) for _, t in prompts]


def interleaved_runs(engines: dict, params, ids, temperature, batch, rounds) -> dict:
    """Every engine over `ids` in groups of `batch` at `temperature`: each group run once
    untimed first (`warm_up`: every program compiled and executed at its shapes), then
    `rounds` interleaved rounds; {name: [(seconds, tokens, results) per round]}. Within a
    round an adaptive engine carries its prior from group to group, as a job would
    (`Adaptive.warmed`), starting each round from its own."""
    sampler = Sampler(temperature=temperature)
    groups = [ids[i : i + batch] for i in range(0, len(ids), batch)]
    engines = {name: engine.replace(sampler=sampler) for name, engine in engines.items()}
    warm_up({(name, k): partial(decoding.generate, engine, params, g, seed=0)
             for name, engine in engines.items() for k, g in enumerate(groups)})  # fmt: skip
    times = {name: [] for name in engines}
    for r in range(rounds):
        for name, engine in engines.items():
            results = []
            for g in groups:
                results.append(decoding.generate(engine, params, g, seed=r + 1))
                engine = carried(engine, results[-1])
            tokens = sum(res.num_tokens for res in results)
            times[name].append((sum(res.seconds for res in results), tokens, results))
    return times


def carried(engine, result):
    """`engine` for a job's next batch: an adaptive engine's prior from `result`'s
    acceptance (`Adaptive.warmed`); any other unchanged."""
    if engine.adaptive is None:
        return engine
    return engine.replace(adaptive=engine.adaptive.warmed(result.stats['per_row']))


def summarize_runs(temperature, batch, times, num_draft: int) -> dict:
    """Median-round tokens/s of AR and chain decoding, and the chain statistics.

    speedup = block_efficiency / round_cost, where round_cost is the wall time of one chain
    round (drafting, verifying A + 1 tokens, bookkeeping) in units of the time AR takes per
    token, as measured here. It splits a speedup into what the drafter's acceptance buys and
    what a round costs on this machine, and bounds it: with every draft accepted a round
    emits A + 1 tokens, so the speedup cannot exceed speedup_ceiling = (A + 1) / round_cost
    unless rounds get cheaper. At batch > 1 a batch runs until its slowest row is done, so
    round_cost also carries the rounds its faster rows wait.
    """

    def median_rate(runs):
        return float(np.median([tokens / seconds for seconds, tokens, _ in runs]))

    spec_stats = [res.stats for _, _, results in times['spec'] for res in results]
    blocks = sum(s['blocks'] for s in spec_stats)
    emitted = sum(s['block_efficiency'] * s['blocks'] for s in spec_stats)
    accepted = sum(s['acceptance_rate'] * s['blocks'] for s in spec_stats)
    ar_rate, spec_rate = median_rate(times['ar']), median_rate(times['spec'])
    block_efficiency = emitted / max(blocks, 1)
    round_cost = block_efficiency * ar_rate / spec_rate
    return dict(
        temperature=temperature,
        batch=batch,
        ar_tokens_per_s=ar_rate,
        spec_tokens_per_s=spec_rate,
        speedup=spec_rate / ar_rate,
        block_efficiency=block_efficiency,
        acceptance_rate=accepted / max(blocks, 1),
        round_cost=round_cost,
        speedup_ceiling=(num_draft + 1) / round_cost,
    )


def round_overhead(engine: decoding.Engine, params, ids, rounds: int) -> dict:
    """The share of a chain round spent outside the target forward and the drafter.

    On the state after prefill, jitted alone and timed interleaved (medians of `rounds` x 5
    calls, each state donated and carried to the next call as inside the loop): a whole
    round (`chain_round`), the target forward over its A + 1 positions (logits included),
    and the drafter's propose + observe (its drafts and q returned). overhead = 1 -
    (forward + drafter) / round: verification, the commit, statistics and the loop's
    bookkeeping. Each part returns its outputs: a part whose logits went unused would be
    timed without its LM head (XLA drops dead code), which once read as 25 % overhead.
    """
    a = engine.num_draft
    whole = jax.jit(partial(eng.chain_round, a_round=a), donate_argnums=3)

    @partial(jax.jit, donate_argnums=2)
    def target_forward(engine, params, s):
        x_bt = jnp.broadcast_to(s.pending_b()[:, None], (len(ids), a + 1))
        c = s.cache
        mask = c.causal_mask(a + 1)
        logits, _, cache = forward(engine.cfg, params, x_bt, c.positions(a + 1), c, mask,
                                   tap_layers=engine.drafter.tap_layers)  # fmt: skip
        return s.replace(cache=cache), logits  # Returned: else XLA drops the LM head.

    @partial(jax.jit, donate_argnums=2)
    def drafter_only(engine, draft_params, s):
        verification = eng.Verification(engine.rule, engine.baseline)
        d = engine.drafter
        state, x_ba, q_bav = d.propose(draft_params, s.draft, s.history_bs, s.committed_b,
                                       s.key_b, a, eng.probs_fn(engine, verification))  # fmt: skip
        taps = None
        if d.tap_layers:
            taps = jnp.zeros((len(ids), a + 1, len(d.tap_layers), engine.cfg.width))
        state = d.observe(draft_params, state, s.history_bs, s.committed_b, s.committed_b, taps)
        return s.replace(draft=state), (x_ba, q_bav)  # Returned, so nothing is dropped.

    calls = {
        'round': lambda s: (whole(engine, params.target, params.draft, s), None),
        'forward': lambda s: target_forward(engine, params.target, s),
        'drafter': lambda s: drafter_only(engine, params.draft, s),
    }
    return overhead_report(f'a chain round at batch {len(ids)}', 'target forward', time_parts(
        calls, engine, params, ids, rounds))  # fmt: skip


def time_parts(calls: dict, engine: decoding.Engine, params, ids, rounds: int) -> dict:
    """Median seconds per call of each part of a round, on the state after prefilling `ids`:
    each part jitted alone (state donated), run 5 times per timing carrying its state, timed
    in `rounds` interleaved rounds after a warm-up run of each (`warm_up`)."""
    batch = batching.pack_prompts(
        ids, prompt_bucket=engine.decode.prompt_bucket, max_prompt_len=engine.decode.max_prompt_len
    )
    args = (
        jnp.asarray(batch.tokens),
        jnp.asarray(batch.lengths),
        jnp.full((len(ids),), engine.decode.max_new_tokens, jnp.int32),
        jnp.arange(len(ids), dtype=jnp.int32),
        jax.random.PRNGKey(0),
    )
    init = jax.jit(eng.init_state)
    states = {}

    def timed(name):
        def go():
            for _ in range(5):
                states[name], out = calls[name](states[name])
            return states[name].committed_b, out

        return go

    for name in calls:
        states[name] = init(engine, params.target, params.draft, *args)
    warm_up({name: timed(name) for name in calls})
    return {k: v / 5 for k, v in interleaved_medians({k: timed(k) for k in calls}, rounds).items()}


def overhead_report(what: str, forward_label: str, med: dict) -> dict:
    """Prints and returns a round's split: target forward + drafter + the engine's rest
    (`what` names the round and its batch)."""
    share = 1.0 - (med['forward'] + med['drafter']) / med['round']
    print(
        f'{what}: {med["round"] * 1e3:.2f} ms = {forward_label} '
        f'{med["forward"] * 1e3:.2f} ms + drafter {med["drafter"] * 1e3:.2f} ms + engine '
        f'{(med["round"] - med["forward"] - med["drafter"]) * 1e3:.2f} ms: overhead '
        f'{100 * share:.1f}% of the round (goal < 10%)'
    )
    return dict(round_ms=med['round'] * 1e3, forward_ms=med['forward'] * 1e3,
                drafter_ms=med['drafter'] * 1e3, overhead=share)  # fmt: skip


def sweep_compiles(c, engine: decoding.Engine, params, ids) -> dict:
    """Seconds and compiled loops of a sweep: `c.sweep_rule` at each of `c.sweep_values`,
    then its matched baseline, through one engine (traced parameters), against the same
    runs with JAX's caches cleared before each (a compile per value, as a static rule cost
    before)."""
    runs = [(v, False) for v in c.sweep_values] + [(c.sweep_values[0], True)]
    engine = engine.replace(sampler=Sampler(temperature=0.7))

    def sweep(clear_each: bool) -> float:
        jax.clear_caches()
        start = time.perf_counter()
        for value, baseline in runs:
            if clear_each:
                jax.clear_caches()
            rule = rules.make(c.sweep_rule, **{c.sweep_param: value})
            decoding.generate(engine.replace(rule=rule, baseline=baseline), params, ids)
        return time.perf_counter() - start

    with runtime.compilation_cache_off():  # Measure compiles, not loads.
        per_value = sweep(clear_each=True)
        traced = sweep(clear_each=False)
        compiles = eng.rounds_call._cache_size()  # generate: prefill_call, then this.
    print(
        f'sweep of {c.sweep_rule} {c.sweep_param} over {list(c.sweep_values)} + its matched '
        f'baseline ({len(runs)} runs of {len(ids)} prompts): {traced:.1f} s with {compiles} '
        f'compiled loop(s); {per_value:.1f} s compiling each value ({per_value / traced:.1f}x)'
    )
    return dict(runs=len(runs), traced_s=traced, compiles=compiles, per_value_s=per_value)


def hf_assisted_peer(c, target, draft, ids, rows) -> dict:
    """transformers' assisted generation (batch 1) on the same prompts, same weights."""
    try:
        import torch
        import transformers
    except ImportError as e:
        logging.warning('skipping the transformers peer: %s', e)
        return {}
    torch.manual_seed(c.seed)
    hf_target, hf_draft = to_hf(target, transformers, torch), to_hf(draft, transformers, torch)
    out = {}
    for temperature in c.temperatures:
        kwargs = dict(
            max_new_tokens=c.max_new_tokens,
            assistant_model=hf_draft,
            eos_token_id=list(target.tokenizer.stop_ids),
            pad_token_id=target.tokenizer.pad_id or 0,
            num_assistant_tokens=c.num_draft,
            num_assistant_tokens_schedule='constant',
            assistant_confidence_threshold=0.0,
        )
        kwargs.update(
            dict(do_sample=True, temperature=temperature)
            if temperature > 0
            else dict(do_sample=False)
        )
        with torch.no_grad():  # Warm-up (lazy init, allocator), as ours compiles first.
            hf_target.generate(torch.tensor([ids[0]]), **dict(kwargs, max_new_tokens=8))
        tokens, seconds = 0, 0.0
        for prompt in ids:
            x = torch.tensor([prompt])
            start = time.perf_counter()
            with torch.no_grad():
                y = hf_target.generate(x, **kwargs)
            seconds += time.perf_counter() - start
            tokens += y.shape[1] - x.shape[1]
        rate = tokens / seconds
        out[str(temperature)] = dict(hf_tokens_per_s=rate)
        ours = [
            r['spec_tokens_per_s']
            for r in rows
            if r['temperature'] == temperature and r['batch'] == 1
        ]
        if not ours:  # The peer runs batch 1; without our batch-1 row there is no ratio.
            print(f'transformers assisted generation, T={temperature}, batch 1: {rate:.1f} tok/s')
            continue
        out[str(temperature)]['ours_over_hf'] = ours[0] / rate
        print(
            f'transformers assisted generation, T={temperature}, batch 1: {rate:.1f} '
            f'tok/s; spec_jax chain / transformers = {ours[0] / rate:.2f}x'
        )
    return out


def to_hf(model, transformers, torch):
    """A transformers LlamaForCausalLM with our (dequantized) weights."""
    cfg = model.cfg
    if cfg.family != 'llama':
        raise ValueError(f'the transformers peer supports llama-family models, not {cfg.family}')
    hf_cfg = transformers.LlamaConfig(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.width,
        intermediate_size=cfg.mlp_width,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_eps,
        rope_theta=cfg.rope_theta,
        tie_word_embeddings=cfg.tie_embeddings,
        max_position_embeddings=cfg.max_position,
        rope_scaling=cfg.rope_scaling.to_hf(),
    )
    hf = transformers.LlamaForCausalLM(hf_cfg).eval()
    state = {
        k: torch.from_numpy(np.array(v, np.float32))
        for k, v in params_to_state(cfg, jax.device_get(model.params)).items()
    }
    missing, unexpected = hf.load_state_dict(state, strict=False)
    if unexpected or [k for k in missing if k != 'lm_head.weight']:
        raise ValueError(
            f'weights do not fit transformers: missing {missing}, unexpected {unexpected}'
        )
    if cfg.tie_embeddings:
        hf.tie_weights()
    return hf
