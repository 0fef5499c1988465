"""The dry run's memory estimate (spec_jax/jobs/memory.py): int8 bytes, KV heads replicated
where the model axis does not divide them, and the paper setups on their named hardware
(nothing compiled, no libtpu)."""

import math
import os

import pytest

from spec_jax.jobs import abstract, aot, chips, memory
from spec_jax.jobs.runtime import load_config
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
    # The K projections (and their biases) are whole on every chip: 8 heads, not 8 / 16.
    k_proj = 80 * 2 * (8192 * 8 * 128 + 8 * 128) * 2
    assert at16.weights - kv(8).weights / 2 == pytest.approx(k_proj * 15 / 16, rel=1e-3)


def _estimate(name: str, arg: str, device: str, **mesh):
    c = load_config(os.path.join(EXPERIMENTS, name), arg)
    for axis, size in mesh.items():
        c.mesh[axis] = size
    return aot.run(c, device=device, dry_run=True)


@pytest.mark.parametrize(
    'name, arg, device',
    [
        ('qwen25_72b_chain.py', 'v5p', 'v5p'),
        ('qwen25_72b_chain.py', 'v5e16_int8', 'v5e'),
        ('qwen25_72b_chain.py', 'v5e32_int8', 'v5e'),
        ('qwen25_72b_chain.py', 'h100x8', 'h100'),
        ('llama31_8b_eagle3.py', 'v5e8', 'v5e'),
        ('llama31_8b_eagle3.py', 'v5e4', 'v5e'),
        ('llama31_8b_eagle3.py', 'h100', 'h100'),
    ],
)
def test_the_paper_setups_fit_their_hardware_by_the_estimate(name, arg, device):
    # The estimate only: compiled, Llama's 60-node tree loop on v5e-8 and Qwen's int8 chain
    # loop on v5e-16 need more temporaries than it counts (docs/performance.md).
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


def test_qwen72b_on_a_v5e8_in_int8_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r'needs [\d.]+ GiB per v5e chip, over its 16.00 GiB'):
        _estimate('qwen25_72b_chain.py', 'v5e16_int8', 'v5e', model=8)


def test_72b_in_bf16_on_one_device_does_not_fit_any_chip():
    plan = memory.Plan(QWEN72, batch=8, prompt_len=2048, slots=4107)
    total = memory.estimate(plan).total
    assert total > max(c.hbm_bytes for c in chips.CHIPS.values())
    assert math.isclose(memory.estimate(plan).weights / 1e9, 145.4, rel_tol=0.01)
