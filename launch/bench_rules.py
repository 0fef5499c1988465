"""Cost of `spec_jax.rules.verify_chain` against a target forward over the same tokens.

  python launch/bench_rules.py                       # B=64, A=8, V=49152 and 128256
  python launch/bench_rules.py --vocabs=49152 --rules=lossless,minp_verify:rho=0.3

Times verify_chain alone (jitted, warmed, block_until_ready; median over interleaved rounds)
on random processed probabilities [B, A+1, V] and [B, A, V], then, when the model stack and
the embedded default (SmolLM2-135M GGUF) are available, one target forward of B x (A+1)
tokens with a KV cache (the verification forward of chain speculative decoding), and prints
the ratio. The 128256-vocabulary figure is compared with the same 135M forward, which is a
pessimistic reference: a real 128k-vocabulary target (Llama-3.1-8B) costs ~60x more.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
from absl import app, flags, logging

from spec_jax import rules

_BATCH = flags.DEFINE_integer('batch', 64, 'Rows B.')
_DRAFT_LEN = flags.DEFINE_integer('draft_len', 8, 'Draft length A.')
_VOCABS = flags.DEFINE_list('vocabs', ['49152', '128256'], 'Vocabulary sizes V.')
_RULES = flags.DEFINE_list(
    'rules',
    [
        'lossless',
        'lenience:l=0.5',
        'minp_verify:rho=0.3',
        'eta_verify:eta=0.1',
        'speccascade:deferral=token_v3,alpha=0.7',
    ],
    'Rule specs (rules.make syntax).',
)
_ROUNDS = flags.DEFINE_integer('rounds', 7, 'Interleaved timing rounds (median reported).')
_FORWARD = flags.DEFINE_bool('forward', True, 'Also time a forward of the embedded target.')
_PREFIX = flags.DEFINE_integer('prefix', 128, 'Committed tokens in the KV cache (forward).')


def _inputs(key, b, a, v):
    """Random processed probabilities and drafts sampled from them."""
    k1, k2, k3 = jax.random.split(key, 3)

    @jax.jit
    def make():
        target = jax.nn.softmax(3.0 * jax.random.normal(k1, (b, a + 1, v)), -1)
        draft = jax.nn.softmax(3.0 * jax.random.normal(k2, (b, a, v)), -1)
        tokens = jax.random.categorical(k3, jnp.log(draft)).astype(jnp.int32)
        return target, draft, tokens

    return jax.block_until_ready(make())


def _time(fn):
    t = time.perf_counter()
    jax.block_until_ready(fn())
    return 1e3 * (time.perf_counter() - t)


def _forward_fn(b, t, prefix):
    """A jitted target forward of [B, T] tokens after `prefix` cached ones, or None."""
    try:
        from spec_jax.checkpoints.loader import load
        from spec_jax.models import cache as cache_lib
        from spec_jax.models import llama
    except ImportError as e:  # The model stack is optional for this benchmark.
        logging.warning('no model stack (%s): printing verify cost only', e)
        return None, None
    model = load('embedded')
    cfg = model.cfg
    cache = cache_lib.KVCache.init(cfg, b, prefix + t + 8)
    cache = cache.replace(lengths=jnp.full((b,), prefix, jnp.int32))
    tokens = jnp.ones((b, t), jnp.int32)
    positions = cache.positions(t)
    mask = cache_lib.attention_mask(cache.lengths, t, cache.max_len)

    def run():
        return llama.forward(cfg, model.params, tokens, positions, cache, mask)[0]

    return run, cfg


def main(argv):
    del argv
    b, a = _BATCH.value, _DRAFT_LEN.value
    logging.info('jax %s, devices %s', jax.__version__, jax.devices())
    cases = []
    for v in map(int, _VOCABS.value):
        target, draft, tokens = _inputs(jax.random.key(v), b, a, v)
        for spec in _RULES.value:
            rule = rules.make(spec)
            key = jax.random.key(0)

            def call(rule=rule, target=target, draft=draft, tokens=tokens, key=key):
                return rules.verify_chain(rule, key, target, draft, tokens).tokens

            call()  # Compile and warm up.
            cases.append((f'verify_chain V={v} {spec}', v, call))
    forward, cfg = _forward_fn(b, a + 1, _PREFIX.value) if _FORWARD.value else (None, None)
    if forward is not None:
        forward()
        cases.append((f'forward 135M B={b} T={a + 1}', None, forward))
    times = {name: [] for name, _, _ in cases}
    for _ in range(_ROUNDS.value):
        for name, _, fn in cases:
            times[name].append(_time(fn))
    med = {name: statistics.median(ts) for name, ts in times.items()}
    fwd = med.get(f'forward 135M B={b} T={a + 1}')
    print(f'B={b} A={a}; median of {_ROUNDS.value} interleaved rounds (measured, this machine)')
    for name, v, _ in cases:
        line = f'{name:60s} {med[name]:9.2f} ms'
        if fwd is not None and v is not None:
            ref = '' if v == cfg.vocab_size else ' (vs the 49152-vocab 135M forward)'
            line += f'   {100 * med[name] / fwd:6.2f}% of the target forward{ref}'
        print(line)
    if fwd is None:
        print(
            'No target forward was measured. Reference arithmetic (CPU_NOTES.md, not measured '
            'here): a 135M fp32 decode step costs ~19 ms at B=1 and ~40 ms at B=8, T=1.'
        )


if __name__ == '__main__':
    app.run(main)
