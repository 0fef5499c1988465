"""The rules bench: the cost of `rules.verify_chain` against a target forward over the same
tokens (configs/bench_rules.py).

verify_chain alone (jitted, warmed: run once untimed first, median over interleaved
rounds) on random processed probabilities [B, A+1, V] and [B, A, V], then one target
forward of B x (A+1) tokens with a KV cache of `prefix` committed tokens (the verification
forward of a chain round), and the ratio. A vocabulary other than the target's is
compared with the same forward, which is a pessimistic reference: a real 128k-vocabulary
target (Llama-3.1-8B) costs ~60x more than the 135M default.
"""

from __future__ import annotations

import json
import os

import jax
import jax.numpy as jnp
import ml_collections

from spec_jax import checkpoints, rules
from spec_jax.jobs.timing import WARMED, interleaved_medians, warm_up
from spec_jax.models.cache import KVCache
from spec_jax.models.llama import forward


def random_block(key, b: int, a: int, v: int):
    """Random processed target [B, A+1, V] and draft [B, A, V] laws, drafts sampled."""
    k1, k2, k3 = jax.random.split(key, 3)

    @jax.jit
    def make():
        target = jax.nn.softmax(3.0 * jax.random.normal(k1, (b, a + 1, v)), -1)
        draft = jax.nn.softmax(3.0 * jax.random.normal(k2, (b, a, v)), -1)
        tokens = jax.random.categorical(k3, jnp.log(draft)).astype(jnp.int32)
        return target, draft, tokens

    return jax.block_until_ready(make())


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Times every rule of `c.rules` at every vocabulary of `c.vocabs` and the forward."""
    b, a = c.batch, c.num_draft
    verify = jax.jit(rules.verify_chain)  # The rule is a pytree: one compile per rule kind.
    fns = {}
    for v in c.vocabs:
        target, draft, tokens = random_block(jax.random.PRNGKey(v), b, a, v)
        for spec in c.rules:
            rule, key = rules.make(spec), jax.random.PRNGKey(0)
            fns[f'verify_chain V={v} {spec}'] = (
                lambda rule=rule, t=target, d=draft, x=tokens, k=key: verify(rule, k, t, d, x)
            )
    model = checkpoints.load(c.model, c.dtype, c.seed)
    cache = KVCache.init(model.cfg, b, c.prefix + a + 9).set_lengths(
        jnp.full((b,), c.prefix, jnp.int32)
    )
    tokens = jnp.ones((b, a + 1), jnp.int32)
    step = jax.jit(
        lambda p, x, cache: forward(
            model.cfg, p, x, cache.positions(a + 1), cache, cache.causal_mask(a + 1)
        )[0]
    )
    forward_name = f'forward {c.model} B={b} T={a + 1}'
    fns[forward_name] = lambda: step(model.params, tokens, cache)
    warm_up(fns)  # Compile and first execution outside the timing.
    med = interleaved_medians(fns, c.rounds)
    fwd = med[forward_name]
    print(f'B={b} A={a}; {WARMED}; median of {c.rounds} interleaved rounds (measured, this '
          'machine)')  # fmt: skip
    report = {}
    for name, seconds in med.items():
        line = f'{name:60s} {seconds * 1e3:9.2f} ms'
        if name != forward_name:
            other = f' (vs the {model.cfg.vocab_size}-vocab forward)'
            ref = other if f'V={model.cfg.vocab_size} ' not in name else ''
            line += f'   {100 * seconds / fwd:6.2f}% of the target forward{ref}'
        report[name] = dict(ms=seconds * 1e3, of_forward=seconds / fwd)
        print(line)
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_rules.json'), 'w') as f:
            json.dump(report, f, indent=2)
    return report
