"""Plain AR generation on device: exactness, stopping, limits, seeds, no retracing."""

import chex
import jax
import jax.numpy as jnp
import pytest

from spec_jax.decoding import autoregressive as ar
from spec_jax.decoding import batching
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import causal_forward, init_params
from spec_jax.sampling import Sampler
from spec_jax.testing import loop_copies

CFG = ModelConfig.tiny(vocab_size=31)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [7]]


@pytest.fixture(scope='module')
def params():
    # Larger weights than the default init so that greedy outputs are not constant.
    p = init_params(CFG, jax.random.PRNGKey(3))
    return jax.tree.map(lambda x: x * 8.0 if x.ndim > 2 else x, p)


def naive_greedy(params, prompt, n):
    """Greedy decoding by full forwards without a cache: the reference."""
    seq = list(prompt)
    for _ in range(n):
        logits, _ = causal_forward(CFG, params, jnp.array([seq]))
        seq.append(int(jnp.argmax(logits[0, -1])))
    return seq[len(prompt) :]


def test_greedy_matches_full_forward_reference(params):
    settings = ar.DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)
    result = ar.generate(CFG, params, PROMPTS, settings)
    for prompt, got in zip(PROMPTS, result.tokens):
        assert got == naive_greedy(params, prompt, 12)
    assert len({tuple(t) for t in result.tokens}) > 1


def test_stop_tokens_and_exact_limits(params):
    settings = ar.DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)
    free = ar.generate(CFG, params, PROMPTS, settings).tokens
    stop = free[1][4]  # A token row 1 emits at step 5.
    stopped = ar.DecodeSettings(
        max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8, stop_tokens=(stop,)
    )
    result = ar.generate(CFG, params, PROMPTS, stopped, max_new_tokens=[12, 12, 5])
    for row, (got, want) in enumerate(zip(result.tokens, free)):
        limit = [12, 12, 5][row]
        cut = want.index(stop) + 1 if stop in want[:limit] else limit
        assert got == want[:cut], row  # Ends at the stop token (kept) or exactly the limit.


def test_sampling_is_seeded(params):
    settings = ar.DecodeSettings(max_new_tokens=16, prompt_bucket=8, new_tokens_bucket=8)
    sampler = Sampler(temperature=1.0)
    a = ar.generate(CFG, params, PROMPTS, settings, sampler, seed=1).tokens
    b = ar.generate(CFG, params, PROMPTS, settings, sampler, seed=1).tokens
    c = ar.generate(CFG, params, PROMPTS, settings, sampler, seed=2).tokens
    assert a == b
    assert a != c


def test_no_retrace_within_a_bucket(params):
    settings = ar.DecodeSettings(max_new_tokens=6, prompt_bucket=8, new_tokens_bucket=8)
    traced = jax.jit(
        chex.assert_max_traces(ar.ar_generate.__wrapped__, n=1),
        static_argnames=('cfg', 'settings'),
    )
    for prompts, limit, temperature in [
        ([[1, 2, 3], [4, 5]], 6, 0.0),
        ([[9, 9, 9, 9, 9, 9, 9], [3]], 4, 0.7),
        ([[5], [6, 7, 8]], 2, 1.0),
    ]:
        batch = batching.pack_prompts(prompts, prompt_bucket=8, max_prompt_len=64)
        traced(
            CFG,
            settings,
            params,
            Sampler(temperature=temperature),
            jnp.asarray(batch.tokens),
            jnp.asarray(batch.lengths),
            jnp.asarray(ar.row_limits(limit, 2, 6)),
            jax.random.PRNGKey(0),
        )


def test_bad_input_is_rejected_before_compiling(params):
    settings = ar.DecodeSettings(max_new_tokens=8, max_prompt_len=5)
    with pytest.raises(ValueError, match='prompt 1 has 9 tokens.*maximum of 5'):
        ar.generate(CFG, params, PROMPTS, settings)
    with pytest.raises(ValueError, match='prompt 0 is empty'):
        ar.generate(CFG, params, [[]], settings)
    with pytest.raises(ValueError, match=r'max_new_tokens \[9\] must be in \[1, 8\]'):
        ar.generate(CFG, params, [[1]], settings, max_new_tokens=9)
    with pytest.raises(ValueError, match='max_new_tokens must be >= 1'):
        ar.DecodeSettings(max_new_tokens=0)
    with pytest.raises(ValueError, match='temperature'):
        Sampler(temperature=-1.0)
    long_ctx = ar.DecodeSettings(max_new_tokens=600, max_prompt_len=5)
    with pytest.raises(ValueError, match='model supports 512'):
        ar.generate(CFG, params, [[1]], long_ctx)


def test_loop_copies_neither_cache_nor_weights(params):
    """Each step updates the KV cache in place and reads the weights in place. With a
    [B, K, S, H] cache and B = 1, XLA:CPU copied every layer's keys and values four times
    per step, and re-laid out the [N, H, D] output weights (spec_jax.models.attention)."""
    settings = ar.DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)
    batch = batching.pack_prompts([[1, 2, 3]], prompt_bucket=8, max_prompt_len=64)
    hlo = (
        ar.ar_generate.lower(
            CFG,
            settings,
            params,
            Sampler(temperature=0.0),
            jnp.asarray(batch.tokens),
            jnp.asarray(batch.lengths),
            jnp.asarray(ar.row_limits(12, 1, 12)),
            jax.random.PRNGKey(0),
        )
        .compile()
        .as_text()
    )
    layer_cache = CFG.num_kv_heads * (batch.bucket + settings.buffer_len) * CFG.head_dim
    assert loop_copies(hlo, layer_cache // 2) == []
