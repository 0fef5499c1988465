"""The embedded default (SmolLM2-135M-Instruct Q4_1 GGUF) against Hugging Face transformers.

The reference is transformers' own GGUF path (`from_pretrained(dir, gguf_file=...)`), which
dequantizes and un-permutes q/k independently of spec_jax; both run in fp32.
"""

import numpy as np
import pytest

from spec_jax.models.config import ModelConfig

PROMPTS = [
    'What is the capital of France?',
    'Explain how a bicycle works.',
    'Write a Python function that returns the n-th Fibonacci number.',
    'Translate to French: the cat sleeps on the warm windowsill.',
    'List three prime numbers larger than 100 and explain why they are prime.',
    'RAW:Once upon a time, in a small village by the sea, there lived',  # no chat template
]

pytestmark = [pytest.mark.slow]


@pytest.fixture(scope='module')
def hf_model(hf_embedded):
    return hf_embedded


def test_embedded_config(embedded):
    assert embedded.cfg == ModelConfig.smollm2_135m()
    assert embedded.tokenizer.stop_ids == (2, 0)
    assert 'lm_head_vd' not in embedded.params


@pytest.mark.parity
def test_qk_weights_match_transformers(embedded, hf_model):
    cfg, state = embedded.cfg, hf_model.state_dict()
    for i in range(cfg.num_layers):
        attn = embedded.params[f'layer_{i}']['attn']
        prefix = f'model.layers.{i}.self_attn.'
        hf_q = state[prefix + 'q_proj.weight'].numpy()
        hf_k = state[prefix + 'k_proj.weight'].numpy()
        np.testing.assert_array_equal(np.asarray(attn['q_dnh']).reshape(cfg.width, -1).T, hf_q)
        np.testing.assert_array_equal(np.asarray(attn['k_dkh']).reshape(cfg.width, -1).T, hf_k)


@pytest.mark.parity
@pytest.mark.parametrize('prompt', PROMPTS)
def test_logits_match_transformers(embedded, hf_model, causal_logits, prompt, record_property):
    import torch

    tok = embedded.tokenizer
    if prompt.startswith('RAW:'):
        ids = tok.encode(prompt[4:])
    else:
        ids = tok.encode_chat([{'role': 'user', 'content': prompt}])
    got = causal_logits(embedded.cfg, embedded.params, np.asarray([ids]))
    with torch.no_grad():
        want = hf_model(torch.tensor([ids])).logits.numpy()
    max_diff = float(np.abs(got - want).max())
    agree = float((got.argmax(-1) == want.argmax(-1)).mean())
    record_property('max_abs_diff', max_diff)
    record_property('argmax_agreement', agree)
    print(f'\n{prompt[:40]!r}: T={len(ids)} max|diff|={max_diff:.2e} argmax={agree:.3f}')
    assert max_diff < 2e-3
    assert agree >= 0.98
