"""The bench job: a registry of benches picked by config (`BENCHES`, `c.kinds`).

  forward  the bandwidth bound of a decode step, the cost of a forward over T new tokens
  ar       AR tokens/s against the bound
  chain    chain speculative decoding against AR (spec_jax.jobs.bench_chain)
  adaptive verification sized online against every fixed draft length (bench_adaptive)
  tree     EAGLE-3 trees against AR and the chain with the same head (bench_tree)
  rules    verify_chain against the target forward (spec_jax.jobs.bench_rules)
  accel    a preset's real shapes on an accelerator in minutes, beside the predictions
           (spec_jax.jobs.bench_accel)
  prior    a drafter's acceptance on held-out prompts, written beside it: the adaptive
           engine's first prior (spec_jax.jobs.bench_prior)

Every comparison runs interleaved in one process (rounds of A, B, C, A, B, C, ...) and
reports medians: this machine's timings move by +-30 % between runs, ratios within one
run by a few percent (docs/performance.md).
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections

from spec_jax import checkpoints, decoding
from spec_jax.jobs import (
    bench_accel,
    bench_adaptive,
    bench_chain,
    bench_mesh,
    bench_prior,
    bench_rules,
    bench_tree,
    runtime,
)
from spec_jax.jobs.profile import profile_bench
from spec_jax.jobs.timing import WARMED, interleaved_medians, warm_up
from spec_jax.models.cache import KVCache
from spec_jax.models.llama import forward


def memory_bandwidth(num_bytes: int = 512 << 20, rounds: int = 7) -> float:
    """Bytes/s of an XLA fp32 matrix-vector product over `num_bytes` of weights: the rate at
    which a decode step can stream its weights from memory."""
    cols = 4096
    w = jnp.ones((num_bytes // 4 // cols, cols), jnp.float32)
    x = jnp.ones((cols,), jnp.float32)
    matvec = jax.jit(lambda w, x: w @ x)
    matvec(w, x).block_until_ready()
    return num_bytes / interleaved_medians({'matvec': lambda: matvec(w, x)}, rounds)['matvec']


def forward_costs(
    cfg, params, new_tokens: tuple[int, ...], batch: int, slots: int, rounds: int
) -> dict[int, float]:
    """Median seconds of one cached forward over T new tokens, for each T.

    The cache is donated and carried from call to call, as inside a decode loop, so the
    timing holds no copy of it.
    """
    step = jax.jit(
        lambda params, tokens, cache: forward(
            cfg,
            params,
            tokens,
            cache.positions(tokens.shape[1]),
            cache,
            cache.causal_mask(tokens.shape[1]),
        )[::2],
        donate_argnums=2,
    )
    caches, fns = {}, {}
    for t in new_tokens:
        tokens = jnp.ones((batch, t), jnp.int32)
        caches[t] = KVCache.init(cfg, batch, slots).set_lengths(jnp.full((batch,), slots // 2))

        def call(t=t, tokens=tokens):
            logits, caches[t] = step(params, tokens, caches[t])
            return logits

        fns[t] = call
    warm_up(fns)  # Compile and first execution outside the timing.
    return interleaved_medians(fns, rounds)


def ar_speed(model, batch: int, new_tokens: int, prompt_len: int, rounds: int) -> float:
    """Tokens/s of the on-device AR loop (no stop tokens: every row makes `new_tokens`)."""
    settings = decoding.DecodeSettings(
        max_new_tokens=new_tokens, prompt_bucket=prompt_len, max_prompt_len=prompt_len
    )
    engine = decoding.Engine(model.cfg, settings)
    prompts = [[(7 * i + 3 * b) % 1000 + 100 for i in range(prompt_len)] for b in range(batch)]
    run = lambda: decoding.generate(engine, decoding.Params(model.params), prompts)  # noqa: E731
    warm_up({'ar': run})
    seconds = interleaved_medians({'ar': lambda: run().tokens}, rounds)['ar']
    return batch * new_tokens / seconds


def bandwidth_and_forward(c: ml_collections.ConfigDict, model) -> dict:
    """The bandwidth bound of a decode step and the cost of a forward over T new tokens."""
    cfg, params = model.cfg, model.params
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(params))
    bandwidth = memory_bandwidth(c.bandwidth_bytes)
    bound_s = param_bytes / bandwidth
    print(
        f'model {c.model}: {param_bytes / 1e6:.0f} MB of {cfg.param_dtype} weights; '
        f'XLA matvec bandwidth {bandwidth / 1e9:.1f} GB/s -> a decode step needs at least '
        f'{bound_s * 1e3:.1f} ms ({1 / bound_s:.0f} tokens/s at batch 1)'
    )
    costs = forward_costs(cfg, params, tuple(c.verify_tokens), 1, c.slots, c.rounds)
    base = costs[1]
    print(
        f'cost of one forward over T new tokens (batch 1, {c.slots} cache slots), '
        f'relative to T=1 ({base * 1e3:.1f} ms; {WARMED}):'
    )
    for t, seconds in costs.items():
        print(f'  T={t:<3d} {seconds * 1e3:7.1f} ms  ratio {seconds / base:.2f}')
    print(f'forward at T=1 vs the bandwidth bound: {bound_s / base:.2f} of the bound')
    return dict(
        bandwidth_gbs=bandwidth / 1e9,
        bound_ms=bound_s * 1e3,
        verify_cost_ratio={t: seconds / base for t, seconds in costs.items()},
    )


def ar(c: ml_collections.ConfigDict, model) -> dict:
    """AR tokens/s at each batch of `c.ar_batches`, against the bandwidth bound."""
    param_bytes = sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(model.params))
    bound_s = param_bytes / memory_bandwidth(c.bandwidth_bytes)
    report = {}
    for batch in c.ar_batches:
        tps = ar_speed(model, batch, c.ar_new_tokens, c.ar_prompt_len, c.ar_rounds)
        per_step = batch / tps
        print(
            f'AR decoding, batch {batch}: {tps:.1f} tokens/s ({per_step * 1e3:.1f} ms per '
            f'step, prefill included; {WARMED}); {bound_s / per_step:.2f} of the bandwidth '
            'bound'
        )
        report[f'ar_tokens_per_s_b{batch}'] = tps
    return report


def _on_model(bench):
    """A bench of (config, loaded model) as a job of (config, workdir)."""

    def job(c, workdir=None):
        del workdir
        return bench(c, checkpoints.load(c.model, c.dtype, c.seed))

    return job


# Bench kind -> job(config, workdir) -> report. A config names the kinds it runs in order
# (`c.kinds`); configs/bench.py runs ('forward', 'ar').
BENCHES = {
    'forward': _on_model(bandwidth_and_forward),
    'ar': _on_model(ar),
    'chain': bench_chain.run,
    'adaptive': bench_adaptive.run,
    'tree': bench_tree.run,
    'mesh': bench_mesh.run,
    'rules': bench_rules.run,
    'accel': bench_accel.run,
    'prior': bench_prior.run,
}


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the benches `c.kinds` of config `c` (configs/bench*.py) and prints reports;
    with a workdir, writes `<workdir>/bench.json` (every kind's report by kind)."""
    unknown = [k for k in c.kinds if k not in BENCHES]
    if unknown:
        raise ValueError(f'unknown bench kinds {unknown}; valid: {sorted(BENCHES)}')
    runtime.log_devices()
    report = {kind: BENCHES[kind](c, workdir) for kind in c.kinds}
    if c.get('profile_dir'):  # A trace of the config's rounds (spec_jax/jobs/profile.py).
        report['profile'] = profile_bench(c, c.profile_dir)
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench.json'), 'w') as f:
            json.dump(report, f, indent=2, default=str)
    return report
