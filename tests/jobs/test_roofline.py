"""The analytic roofline (spec_jax/costs/roofline.py) against XLA's own count of the compiled
call on this CPU, and a round's parts against the memory estimate."""

import dataclasses
import os

import jax
import jax.numpy as jnp
import pytest

from spec_jax import sharding
from spec_jax.costs import chips, memory, roofline
from spec_jax.jobs import abstract
from spec_jax.jobs.runtime import load_config
from spec_jax.models import cache as cache_lib
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward, init_params

EXPERIMENTS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'experiments')
# Wide enough that the matmuls and attention are nearly all the FLOPs; an untied LM head.
CFG = ModelConfig.tiny(width=256, mlp_width=704, num_heads=8, num_kv_heads=4, head_dim=32,
                       vocab_size=509, num_layers=2, tie_embeddings=False)  # fmt: skip


@pytest.mark.parametrize('rows, tokens, slots', [(3, 1, 97), (2, 61, 131)])
def test_a_calls_flops_are_xlas_and_its_bytes_a_floor_of_xlas(rows, tokens, slots):
    """XLA's count adds the elementwise work (norms, RoPE, softmax: under 1 % here), so the
    FLOPs agree within 3 %: leaving out attention (8 % of the 61-token call) or counting
    the untied input embedding as read (7 %) fails. XLA counts every fusion's operands, so
    its bytes are at least the weights and cache read once (measured 1.5x and 4.5x)."""
    params = jax.eval_shape(lambda: init_params(CFG, jax.random.PRNGKey(0)))
    cache = jax.eval_shape(lambda: cache_lib.KVCache.init(CFG, rows, slots))

    def call(params, tokens_bt, cache):
        n = tokens_bt.shape[1]
        return forward(CFG, params, tokens_bt, cache.positions(n), cache, cache.causal_mask(n))

    tokens_bt = jax.ShapeDtypeStruct((rows, tokens), jnp.int32)
    xla = jax.jit(call).lower(params, tokens_bt, cache).compile().cost_analysis()
    xla = xla[0] if isinstance(xla, list) else xla
    ours = roofline.calls_cost(CFG, memory.shapes(CFG), sharding.RULES, (tokens,),
                               CFG.num_layers, 0, model=1, rows=rows, slots=slots,
                               item=4)  # fmt: skip
    assert ours.flops == pytest.approx(xla['flops'], rel=0.03)
    assert ours.bytes_accessed <= xla['bytes accessed']


def test_a_chain_round_reads_the_target_once_and_the_draft_at_each_call():
    """Qwen2.5-72B int8 on v5e-16 with its 0.5B draft, gamma 10: the chain round reads what
    the AR round reads (the same weights and cache) plus the draft's weights and cache at
    each of its 10 calls (whole on every chip: 14 heads split no model axis of 16); its
    FLOPs are 11 tokens' of the target's and the draft's 11."""
    c = load_config(os.path.join(EXPERIMENTS, 'qwen25_72b_chain.py'), 'v5e16_int8')
    _, chain, _ = abstract.plan_of(abstract.decode_block(c), 'chain', (1, 16), 'int8')
    assert chain.draft_calls == (2,) + (1,) * 9
    ar = dataclasses.replace(chain, width=1, draft=None, draft_calls=())  # The same slots.
    est = memory.estimate(chain)
    ar_cost, chain_cost = roofline.round_cost(ar), roofline.round_cost(chain)
    draft = 10 * (est.draft_weights + est.draft_cache)
    assert chain_cost.bytes_accessed == ar_cost.bytes_accessed + draft
    d = chain.draft  # 24 layers, 14 heads of 64, whole on every chip.
    params = sum(x.size for x in jax.tree.leaves(memory.shapes(d)))
    draft_flops = 2 * 8 * 11 * params + 4 * 8 * 11 * 14 * chain.slots * 64 * 24
    assert chain_cost.flops == pytest.approx(11 * ar_cost.flops + draft_flops, rel=1e-3)
    v5e = chips.chip('v5e')
    ar_t, chain_t = ar_cost.on(v5e)['seconds'], chain_cost.on(v5e)['seconds']
    assert ar_t == ar_cost.bytes_accessed / v5e.hbm_bandwidth  # Memory bound at batch 8.
    assert chain_t > 2 * ar_t  # The replicated draft's reads outweigh the target's.
