"""The dry run's memory estimate (spec_jax/costs/memory.py): int8 bytes, KV heads replicated
where the model axis does not divide them, and the paper setups on their named hardware
(nothing compiled, no libtpu)."""

import dataclasses
import math
import os

import pytest

from spec_jax.costs import chips, memory
from spec_jax.jobs import abstract, aot
from spec_jax.jobs.runtime import load_config
from spec_jax.models import attention
from spec_jax.models.config import ModelConfig

EXPERIMENTS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs', 'experiments')
QWEN72 = abstract.model_config('Qwen/Qwen2.5-72B-Instruct', 'bfloat16')


def test_int8_is_one_byte_a_projection_parameter_plus_a_scale_per_output_channel():
    # Llama-3.2-1B ties its LM head to the embedding, which int8 leaves in bf16.
    cfg = ModelConfig.llama3_2_1b().replace(dtype='bfloat16', param_dtype='bfloat16')
    d, n, k, h, f = cfg.width, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.mlp_width
    matmul = cfg.num_layers * (2 * d * n * h + 2 * d * k * h + 3 * d * f)
    channels = cfg.num_layers * (n * h + 2 * k * h + d + 2 * f + d)

    def weights(quant, model=1):
        plan = memory.Plan(cfg, batch=1, prompt_len=1, slots=1, mesh=(1, model), quant=quant)
        return memory.estimate(plan).weights

    bf16 = weights('')
    # models/quant.py: int8 weights, float32 scales.
    assert bf16 - weights('int8') == 2 * matmul - (matmul + 4 * channels)
    # Over a model axis of 4 (N 32, K 8, F 8192, V 128,256 all divide): every split array
    # is a quarter; only the norms (D each, two a layer and the final one) stay whole.
    norms = (2 * cfg.num_layers + 1) * d * 2
    assert weights('', 4) - norms == pytest.approx((bf16 - norms) / 4)


def test_a_model_axis_larger_than_k_holds_one_kv_head_a_device():
    def kv(model):
        plan = memory.Plan(QWEN72, batch=8, prompt_len=2048, slots=4107, mesh=(1, model))
        return memory.estimate(plan)

    per_head_row = 2 * 80 * 4107 * 128 * 2  # K and V of 80 layers, bf16, one head and row.
    assert kv(8).kv_cache == 8 * 1 * per_head_row
    at16 = kv(16)
    assert at16.kv_cache == 8 * 1 * per_head_row  # Each head held twice (kv_repeat).
    assert any('each held 2 times' in n for n in at16.notes)
    # As loaded (`checkpoints.load`): the K and V projections (and biases) repeated to 16
    # heads and split, one a chip, so they do not halve from model 8 to 16 as the rest does
    # (the norms, whole everywhere, do not either).
    k_proj = 80 * 2 * (8192 * 8 * 128 + 8 * 128) * 2
    norms = (2 * 80 + 1) * 8192 * 2
    assert at16.weights - kv(8).weights / 2 == pytest.approx(k_proj / 16 + norms / 2, rel=1e-6)
    assert memory.held(QWEN72, 16).num_kv_heads == 16 and memory.held(QWEN72, 8) == QWEN72


def _estimate(name: str, arg: str, device: str, weights: str | None = None, **mesh):
    c = load_config(os.path.join(EXPERIMENTS, name), arg)
    for axis, size in mesh.items():
        c.mesh[axis] = size
    if weights is not None:
        c.weights = weights
    return aot.run(c, device=device, dry_run=True)


@pytest.mark.parametrize(
    'name, arg, device',
    [
        ('qwen25_72b_chain.py', 'v5p', 'v5p'),
        ('qwen25_72b_chain.py', 'v5e8_int8', 'v5e'),
        ('qwen25_72b_chain.py', 'v5e16_int8', 'v5e'),
        ('qwen25_72b_chain.py', 'v5e32_int8', 'v5e'),
        ('qwen25_72b_chain.py', 'h100x8', 'h100'),
        ('llama31_8b_eagle3.py', 'v5e8', 'v5e'),
        ('llama31_8b_eagle3.py', 'v5e4', 'v5e'),
        ('llama31_8b_eagle3.py', 'h100', 'h100'),
    ],
)
def test_the_paper_setups_fit_their_hardware_by_the_estimate(name, arg, device):
    # The estimate only; the compiled numbers: docs/performance.md.
    report = _estimate(name, arg, device)
    hbm = chips.chip(device).hbm_bytes
    for mode, numbers in report['modes'].items():
        est = numbers['estimate']
        assert 0 < est['total'] <= hbm, (mode, est['total'] / chips.GIB)
        assert est['kv_cache'] > 0 and est['activations'] > 0
    if name.startswith('qwen'):  # Gamma 10, batch 8, 2048 + 2048 tokens: 4,107 slots.
        assert report['modes']['chain']['estimate']['draft_weights'] > 0
        rows = 8 // report['mesh']['data']
        data, model = report['mesh']['data'], report['mesh']['model']
        heads = 8 // model if 8 % model == 0 else 1
        assert (
            report['modes']['chain']['estimate']['kv_cache']
            == 2 * 80 * rows * heads * (2048 + 2048 + 11) * 128 * 2
        ), (data, model)


def test_qwen72b_in_bf16_on_a_v5e8_is_refused_with_the_numbers():
    # 16.9 GiB of bf16 weights a chip at model 8.
    with pytest.raises(ValueError, match=r'needs [\d.]+ GiB per v5e chip, over its 16.00 GiB'):
        _estimate('qwen25_72b_chain.py', 'v5e8_int8', 'v5e', weights='')


def test_a_drafts_prefill_counts_in_query_blocks_with_its_heads_whole_or_split():
    # Qwen2.5-0.5B's 14 heads whole on every chip: its prefill's scores over the 2,048-token
    # prompt, 3 x [8 rows, 14, 2048, 4107] in fp32, refused the int8 plan on a v5e-16
    # (the TPU compiler too: docs/performance.md); attention in query blocks of 512 tokens
    # holds a quarter of them.
    block = attention.block_tokens(2048)
    assert block == attention.QUERY_BLOCK == 512
    draft = abstract.model_config('Qwen/Qwen2.5-0.5B-Instruct', 'bfloat16')
    plan = memory.Plan(QWEN72, batch=8, prompt_len=2048, slots=4107, mesh=(1, 16), draft=draft)
    draft_scores = 3 * 8 * 14 * block * 4107 * 4
    assert draft_scores <= memory.estimate(plan).activations < 2 * draft_scores
    # Llama-3.1-8B's EAGLE-3 head (32 heads, 8 KV heads) at model 8: whole on every chip,
    # its prefill's scores alone are 6 GiB a chip (24 over the whole prompt: the TPU
    # compiler refused that loop); split as the target's ('heads', the config's), an
    # eighth, and an eighth of its cache.
    c = load_config(os.path.join(EXPERIMENTS, 'llama31_8b_eagle3.py'), 'v5e8')
    plan = abstract.plan_of(abstract.decode_block(c), 'tree', (1, 8))[1]
    assert plan.draft_sharding == 'heads'
    split = memory.estimate(plan)
    whole = memory.estimate(dataclasses.replace(plan, draft_sharding='batch'))
    scores = 3 * 8 * 32 * block * 4156 * 4
    assert whole.activations >= scores > chips.chip('v5e').hbm_bytes / 4
    assert scores / 8 <= split.activations < whole.activations / 2  # Now the target's prefill.
    assert whole.draft_cache == 8 * split.draft_cache
    assert whole.draft_weights > split.draft_weights
    with pytest.raises(
        ValueError, match=r"draft sharding 'rows' is not one of \('batch', 'heads'\)"
    ):
        dataclasses.replace(plan, draft_sharding='rows')


def test_72b_in_bf16_on_one_device_does_not_fit_any_chip():
    plan = memory.Plan(QWEN72, batch=8, prompt_len=2048, slots=4107)
    total = memory.estimate(plan).total
    # B200 (180 GB) holds it; no chip before it does.
    assert total > max(c.hbm_bytes for k, c in chips.CHIPS.items() if k != 'b200')
    assert total < chips.CHIPS['b200'].hbm_bytes
    assert math.isclose(memory.estimate(plan).weights / 1e9, 145.4, rel_tol=0.01)
