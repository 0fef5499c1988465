"""Hugging Face directories: logits parity with transformers, sharding, config parsing, errors."""

import json
import os

import numpy as np
import pytest

from spec_jax import checkpoints
from spec_jax.checkpoints import CheckpointError, gguf
from spec_jax.models.config import ModelConfig, RopeScaling
from spec_jax.testing import random_params
from spec_jax.tokenizer import TokenizerError

TOKENS_BT = np.random.default_rng(0).integers(0, 67, size=(2, 11))


def _torch_logits(model, tokens_bt):
    import torch

    with torch.no_grad():
        return model(torch.tensor(tokens_bt)).logits.numpy()


@pytest.mark.parity
@pytest.mark.parametrize('family', ['llama', 'qwen2', 'qwen3'])
@pytest.mark.parametrize('shard', [False, True], ids=['single', 'sharded'])
def test_logits_match_transformers(torch_hf_dir, causal_logits, family, shard):
    directory, model, want_cfg = torch_hf_dir(family, shard=shard)
    if shard:
        assert os.path.isfile(os.path.join(directory, 'model.safetensors.index.json'))
    loaded = checkpoints.load(directory)
    assert loaded.cfg == want_cfg
    got = causal_logits(loaded.cfg, loaded.params, TOKENS_BT)
    want = _torch_logits(model, TOKENS_BT)
    np.testing.assert_allclose(got, want, atol=1e-4, rtol=0)
    assert loaded.tokenizer is not None and loaded.tokenizer.stop_ids == (2, 0)


def test_save_hf_reads_back_and_into_transformers(tmp_path, causal_logits):
    """`save_hf` (how the train_draft job exports a draft LM) writes a directory that
    `checkpoints.load` reads back exactly, scaled RoPE and tokenizer included, and that
    transformers (when installed) loads to the same logits."""
    tok = gguf.load_gguf_tokenizer(gguf.embedded_default_path())
    scaling = RopeScaling('llama3', 32.0, 1.0, 4.0, 8192)  # A draft inherits Llama 3.x's.
    cfg = ModelConfig.smollm2_135m().replace(
        width=8, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=4, mlp_width=12,
        rope_scaling=scaling, dtype='float32', param_dtype='float32',
    )  # fmt: skip
    params = random_params(cfg, seed=1, std=0.3)
    out = checkpoints.save_hf(str(tmp_path), cfg, params, tok, 'float32')
    assert out == {'dir': str(tmp_path), 'bytes': os.path.getsize(tmp_path / 'model.safetensors')}
    loaded = checkpoints.load(str(tmp_path))
    assert loaded.cfg == cfg and loaded.tokenizer.vocab_size == tok.vocab_size
    tokens = TOKENS_BT + 100
    want = causal_logits(cfg, params, tokens)
    np.testing.assert_array_equal(causal_logits(loaded.cfg, loaded.params, tokens), want)
    transformers = pytest.importorskip('transformers', reason='transformers reads it too')
    pytest.importorskip('torch', reason='transformers needs torch')
    model = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path)).eval()
    np.testing.assert_allclose(_torch_logits(model, tokens), want, atol=1e-4, rtol=0)


def test_state_round_trip(numpy_hf_dir):
    directory, cfg, state = numpy_hf_dir('qwen3')
    loaded = checkpoints.load_hf(directory)
    assert loaded.cfg == cfg
    back = checkpoints.params_to_state(loaded.cfg, loaded.params)
    assert sorted(back) == sorted(state)
    for name, w in state.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)


def test_dtype_from_checkpoint(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir('llama', config_changes={'dtype': 'bfloat16'})
    loaded = checkpoints.load(directory, dtype=None)
    assert loaded.cfg.param_dtype == 'bfloat16'
    assert loaded.params['embed_vd'].dtype == 'bfloat16'
    assert checkpoints.load(directory).params['embed_vd'].dtype == 'float32'


def test_config_layouts():
    base = {
        'architectures': ['LlamaForCausalLM'],
        'vocab_size': 128,
        'hidden_size': 64,
        'num_hidden_layers': 2,
        'num_attention_heads': 4,
        'intermediate_size': 96,
    }
    cfg = checkpoints.config_from_hf(base)
    assert (cfg.num_kv_heads, cfg.head_dim, cfg.rope_theta, cfg.tie_embeddings) == (
        4,
        16,
        1e4,
        True,
    )
    v4 = dict(
        base,
        rope_theta=5e5,
        tie_word_embeddings=False,
        rope_scaling={
            'rope_type': 'llama3',
            'factor': 32.0,
            'original_max_position_embeddings': 8192,
        },
    )
    cfg = checkpoints.config_from_hf(v4)
    assert (cfg.rope_theta, cfg.rope_scaling.kind, cfg.rope_scaling.factor) == (5e5, 'llama3', 32.0)
    assert not cfg.tie_embeddings
    old = dict(base, rope_scaling={'type': 'linear', 'factor': 4.0})
    assert checkpoints.config_from_hf(old).rope_scaling.kind == 'linear'
    with pytest.raises(CheckpointError, match="rope type 'yarn'"):
        checkpoints.config_from_hf(dict(base, rope_scaling={'rope_type': 'yarn', 'factor': 4.0}))
    with pytest.raises(CheckpointError, match="'num_hidden_layers'"):
        checkpoints.config_from_hf({k: v for k, v in base.items() if k != 'num_hidden_layers'})


def _snapshot(directory):
    return {
        name: (
            os.path.getsize(os.path.join(directory, name)),
            os.path.getmtime(os.path.join(directory, name)),
        )
        for name in sorted(os.listdir(directory))
    }


def test_unsupported_architecture(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir(config_changes={'architectures': ['MistralForCausalLM']})
    before = _snapshot(directory)
    with pytest.raises(CheckpointError) as e:
        checkpoints.load(directory)
    message = str(e.value)
    assert 'MistralForCausalLM' in message
    for arch in ('LlamaForCausalLM', 'Qwen2ForCausalLM', 'Qwen3ForCausalLM'):
        assert arch in message
    assert _snapshot(directory) == before


def test_garbage_safetensors(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir()
    path = os.path.join(directory, 'model.safetensors')
    with open(path, 'wb') as f:
        f.write(os.urandom(4096))
    before = _snapshot(directory)
    with pytest.raises(CheckpointError, match='corrupt safetensors file .*model.safetensors'):
        checkpoints.load(directory)
    with open(path, 'r+b') as f:  # A plausible header length, then a truncated header.
        f.write((100).to_bytes(8, 'little') + b'{"a": ')
        f.truncate(20)
    with pytest.raises(CheckpointError, match='corrupt safetensors file'):
        checkpoints.load(directory)
    assert set(_snapshot(directory)) == set(before)


def test_truncated_safetensors(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir()
    path = os.path.join(directory, 'model.safetensors')
    size = os.path.getsize(path)
    with open(path, 'r+b') as f:
        f.truncate(size - 100)
    with pytest.raises(CheckpointError, match='out of bounds'):
        checkpoints.load(directory)


def test_missing_tensor(numpy_hf_dir, tmp_path):
    from safetensors.numpy import save_file

    directory, _, state = numpy_hf_dir('qwen2')
    del state['model.layers.1.self_attn.k_proj.bias']
    save_file(state, os.path.join(directory, 'model.safetensors'))
    with pytest.raises(CheckpointError, match=r'model\.layers\.1\.self_attn\.k_proj\.bias'):
        checkpoints.load(directory)


def test_shape_mismatch(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir(config_changes={'intermediate_size': 40})
    with pytest.raises(CheckpointError, match='gate_proj.weight has shape'):
        checkpoints.load(directory)


def test_tokenizer_larger_than_model(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir(tokenizer_vocab=80)
    with pytest.raises(TokenizerError, match='tokenizer vocab size 80 .* model vocab size 67'):
        checkpoints.load(directory)


def test_tokenizer_smaller_than_model_is_fine(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir(tokenizer_vocab=60)
    assert checkpoints.load(directory).tokenizer.vocab_size == 60


def test_no_tokenizer(numpy_hf_dir):
    directory, _, _ = numpy_hf_dir(tokenizer_vocab=0)
    assert checkpoints.load(directory).tokenizer is None


def test_missing_paths(tmp_path):
    with pytest.raises(FileNotFoundError, match='does not exist'):
        checkpoints.load(str(tmp_path / 'nope'))
    with pytest.raises(FileNotFoundError, match='nope.gguf'):
        checkpoints.load('nope.gguf')
    with pytest.raises(FileNotFoundError, match='/no/such/dir'):
        checkpoints.load_hf('/no/such/dir')
    (tmp_path / 'empty').mkdir()
    with pytest.raises(CheckpointError, match='neither a Hugging Face model directory'):
        checkpoints.load(str(tmp_path / 'empty'))
    (tmp_path / 'cfg').mkdir()
    (tmp_path / 'cfg' / 'config.json').write_text(
        json.dumps({'architectures': ['LlamaForCausalLM']})
    )
    with pytest.raises(CheckpointError, match='no safetensors weights'):
        checkpoints.load(str(tmp_path / 'cfg'))
    assert os.listdir(tmp_path / 'cfg') == ['config.json']


@pytest.mark.parametrize(
    'changes, match',
    [
        ({'attention_bias': True}, 'attention_bias'),
        ({'mlp_bias': True}, 'mlp_bias'),
        ({'hidden_act': 'gelu'}, "hidden_act 'gelu'"),
        ({'use_sliding_window': True}, 'sliding-window'),
        ({'architectures': None, 'model_type': 'gemma'}, "model_type 'gemma'"),
    ],
)
def test_unsupported_config_features(numpy_hf_dir, changes, match):
    directory, _, _ = numpy_hf_dir('llama', tokenizer_vocab=0, config_changes=changes)
    with pytest.raises(CheckpointError, match=match):
        checkpoints.load(directory)
