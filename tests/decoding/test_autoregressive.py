"""AR mode of the engine (rounds with nothing drafted): exactness, stopping, limits, seeds,
per-sample randomness, no retracing."""

import chex
import jax
import jax.numpy as jnp
import pytest

from spec_jax import decoding, rules
from spec_jax.decoding import batching, engine
from spec_jax.decoding.state import DecodeSettings, row_limits
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import causal_forward, init_params
from spec_jax.sampling import Sampler

CFG = ModelConfig.tiny(vocab_size=31)
PROMPTS = [[1, 2, 3], [4, 5, 6, 7, 8, 9, 10, 11, 12], [7]]


@pytest.fixture(scope='module')
def params():
    # Larger weights than the default init so that greedy outputs are not constant.
    p = init_params(CFG, jax.random.PRNGKey(3))
    return jax.tree.map(lambda x: x * 8.0 if x.ndim > 2 else x, p)


def generate(params, prompts, settings, sampler=None, **kw):
    run = decoding.Engine(CFG, settings, sampler=sampler or Sampler(temperature=0.0))
    return decoding.generate(run, decoding.Params(params), prompts, **kw)


def naive_greedy(params, prompt, n):
    """Greedy decoding by full forwards without a cache: the reference."""
    seq = list(prompt)
    for _ in range(n):
        logits, _ = causal_forward(CFG, params, jnp.array([seq]))
        seq.append(int(jnp.argmax(logits[0, -1])))
    return seq[len(prompt) :]


def test_greedy_matches_full_forward_reference(params):
    settings = DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)
    result = generate(params, PROMPTS, settings)
    for prompt, got in zip(PROMPTS, result.tokens):
        assert got == naive_greedy(params, prompt, 12)
    assert len({tuple(t) for t in result.tokens}) > 1


def test_stop_tokens_and_exact_limits(params):
    settings = DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)
    free = generate(params, PROMPTS, settings).tokens
    stop = free[1][4]  # A token row 1 emits at step 5.
    stopped = DecodeSettings(
        max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8, stop_tokens=(stop,)
    )
    result = generate(params, PROMPTS, stopped, max_new_tokens=[12, 12, 5])
    for row, (got, want) in enumerate(zip(result.tokens, free)):
        limit = [12, 12, 5][row]
        cut = want.index(stop) + 1 if stop in want[:limit] else limit
        assert got == want[:cut], row  # Ends at the stop token (kept) or exactly the limit.


def test_sampling_is_seeded(params):
    settings = DecodeSettings(max_new_tokens=16, prompt_bucket=8, new_tokens_bucket=8)
    sampler = Sampler(temperature=1.0)
    a = generate(params, PROMPTS, settings, sampler, seed=1).tokens
    b = generate(params, PROMPTS, settings, sampler, seed=1).tokens
    c = generate(params, PROMPTS, settings, sampler, seed=2).tokens
    assert a == b
    assert a != c


def test_no_retrace_within_a_bucket(params):
    settings = DecodeSettings(max_new_tokens=6, prompt_bucket=8, new_tokens_bucket=8)
    traced = jax.jit(chex.assert_max_traces(engine.decode_loop.__wrapped__, n=1))
    for prompts, limit, temperature, rule in [
        ([[1, 2, 3], [4, 5]], 6, 0.0, rules.Lossless()),
        ([[9, 9, 9, 9, 9, 9, 9], [3]], 4, 0.7, rules.Lossless()),
        ([[5], [6, 7, 8]], 2, 1.0, rules.Lossless()),
    ]:
        batch = batching.pack_prompts(prompts, prompt_bucket=8, max_prompt_len=64)
        run = decoding.Engine(CFG, settings, rule=rule, sampler=Sampler(temperature=temperature))
        traced(
            run,
            params,
            None,
            jnp.asarray(batch.tokens),
            jnp.asarray(batch.lengths),
            jnp.asarray(row_limits(limit, 2, 6)),
            jnp.arange(2, dtype=jnp.int32),
            jax.random.PRNGKey(0),
        )


def test_tokens_depend_on_the_sample_id_not_the_batch(params):
    """At T 0.7 a prompt's tokens are a function of (seed, its sample id): the same in a
    batch of 5 or alone, in any row order, or resumed in a later batch."""
    settings = DecodeSettings(max_new_tokens=16, prompt_bucket=8, new_tokens_bucket=8)
    sampler = Sampler(temperature=0.7)
    prompts = [[1, 2, 3], [4, 5], [7], [1, 2, 3], [9, 8, 7, 6]]
    whole = generate(params, prompts, settings, sampler, seed=3, sample_ids=[10, 11, 12, 13, 14])
    assert whole.tokens[0] != whole.tokens[3]  # Same prompt, other id: other noise.
    order = [4, 2, 0]
    part = generate(params, [prompts[i] for i in order], settings, sampler, seed=3,
                    sample_ids=[10 + i for i in order])  # fmt: skip
    assert part.tokens == [whole.tokens[i] for i in order]
    alone = generate(params, prompts[1:2], settings, sampler, seed=3, sample_ids=[11])
    assert alone.tokens == whole.tokens[1:2]


def test_bad_input_is_rejected_before_compiling(params):
    settings = DecodeSettings(max_new_tokens=8, max_prompt_len=5)
    with pytest.raises(ValueError, match='prompt 1 has 9 tokens.*maximum of 5'):
        generate(params, PROMPTS, settings)
    with pytest.raises(ValueError, match='prompt 0 is empty'):
        generate(params, [[]], settings)
    with pytest.raises(ValueError, match=r'max_new_tokens \[9\] must be in \[1, 8\]'):
        generate(params, [[1]], settings, max_new_tokens=9)
    with pytest.raises(ValueError, match='max_new_tokens must be >= 1'):
        DecodeSettings(max_new_tokens=0)
    with pytest.raises(ValueError, match='temperature'):
        Sampler(temperature=-1.0)
    long_ctx = DecodeSettings(max_new_tokens=600, max_prompt_len=5)
    with pytest.raises(ValueError, match='the target supports 512'):
        generate(params, [[1]], long_ctx)
