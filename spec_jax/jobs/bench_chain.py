"""Chain speculative decoding against spec_jax's own AR decoding, side by side.

For each (temperature, batch size) the same prompts run through AR and chain decoding in
interleaved rounds; the report gives tokens/s of each, block efficiency, acceptance and the
wall-clock speedup. Optionally Hugging Face transformers' assisted generation (torch CPU,
batch 1) runs the same target and draft on the same prompts as a peer.
"""

from __future__ import annotations

import json
import os
import time
from functools import partial

import jax
import ml_collections
import numpy as np
from absl import logging

from spec_jax import checkpoints, data_files, decoding, rules
from spec_jax.checkpoints import params_to_state
from spec_jax.decoding import drafters
from spec_jax.jobs import common
from spec_jax.sampling import Sampler


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the chain benchmark of config `c` (configs/bench_chain.py)."""
    data_files.require(data_files.speed_files(c.sets), c.data_root, 'data_root')
    common.log_devices()
    target = checkpoints.load(c.model, c.dtype, c.seed)
    tok = target.tokenizer
    prompts = data_files.speed_prompts(c.sets, c.prompts_per_set, c.data_root, 'data_root')
    ids = [tok.encode_chat([{'role': 'user', 'content': text}]) for _, text in prompts]
    dec = decoding.DecodeSettings(
        max_new_tokens=c.max_new_tokens,
        stop_tokens=tok.stop_ids,
        max_prompt_len=c.max_prompt_len,
        prompt_bucket=c.prompt_bucket,
    )
    built = drafters.make(
        c.drafter, target, c.draft, ngram=c.ngram, lookup=c.lookup, dtype=c.dtype, seed=c.seed
    )
    engines = {
        'ar': decoding.Engine(target.cfg, dec),
        'spec': decoding.Engine(
            target.cfg, dec, built.drafter, c.num_draft, rules.make(c.rule)
        ),
    }
    params = decoding.Params(target.params, built.params)
    print(
        f'{len(prompts)} prompts ({c.prompts_per_set} from each of {", ".join(c.sets)}), '
        f'{c.max_new_tokens} new tokens max, gamma {c.num_draft}, draft {c.drafter}'
        f'{" " + c.draft if c.draft and c.drafter != "ngram" else ""}'
        f'{f" behind prompt lookup ({c.ngram}..{c.lookup}-grams)" if c.lookup else ""}, '
        f'rule {c.rule}'
    )

    report = {'rows': []}
    for temperature in c.temperatures:
        sampler = Sampler(temperature=temperature)
        for batch in c.batches:
            groups = [ids[i : i + batch] for i in range(0, len(ids), batch)]
            runners = {
                name: partial(decoding.generate, engine.replace(sampler=sampler), params)
                for name, engine in engines.items()
            }
            for run_group in runners.values():  # Compile every shape first.
                [run_group(g, seed=0) for g in groups]
            times = {'ar': [], 'spec': []}
            for r in range(c.rounds):
                for name, run_group in runners.items():
                    results = [run_group(g, seed=r + 1) for g in groups]
                    tokens = sum(res.num_tokens for res in results)
                    times[name].append((sum(res.seconds for res in results), tokens, results))
            row = summarize_runs(temperature, batch, times, c.num_draft)
            report['rows'].append(row)
            print(
                f'T={temperature} batch {batch}: AR {row["ar_tokens_per_s"]:.1f} tok/s, '
                f'chain {row["spec_tokens_per_s"]:.1f} tok/s -> speedup '
                f'{row["speedup"]:.2f}x; block efficiency {row["block_efficiency"]:.2f}, '
                f'acceptance {row["acceptance_rate"]:.2f}; a round costs '
                f'{row["round_cost"]:.2f} AR tokens, so accepting every draft would give '
                f'at most {row["speedup_ceiling"]:.2f}x'
            )

    if c.hf_peer and built.model is not None:
        report['hf_peer'] = hf_assisted_peer(c, target, built.model, ids, report['rows'])
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_chain.json'), 'w') as f:
            json.dump(report, f, indent=2)
    return report


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
