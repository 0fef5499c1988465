"""Builders of tiny checkpoints (HF directories, GGUF files, tokenizers) for the loader tests."""

import functools
import json
import os

import jax
import numpy as np
import pytest

from spec_jax.checkpoints import params_to_state
from spec_jax.checkpoints.hf import config_to_hf
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import init_params

CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
    "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ('<|endoftext|>', '<|im_start|>', '<|im_end|>')


def hf_tiny_cfg(family: str) -> ModelConfig:
    """The tiny HF test model: V 67, D 30 (transformers needs D % N == 0), L 3, N 6, K 2,
    H 14 (qwen3: 10), F 38; llama3 RoPE scaling on llama, linear on qwen2."""
    from spec_jax.models.config import RopeScaling

    scaling = {
        'llama': RopeScaling('llama3', 8.0, 1.0, 4.0, 64),
        'qwen2': RopeScaling('linear', 2.0),
        'qwen3': RopeScaling(),
    }[family]
    return ModelConfig.tiny(family, width=30, rms_eps=1e-6, rope_scaling=scaling)


def write_tokenizer(directory, vocab_size=67, chat_template=CHATML):
    """A word-level tokenizer.json ('w0', 'w1', ... plus ChatML specials) and its config."""
    import tokenizers
    from tokenizers import models, pre_tokenizers

    words = [f'w{i}' for i in range(vocab_size - len(SPECIALS) - 1)] + ['<unk>']
    vocab = {t: i for i, t in enumerate(SPECIALS + tuple(words))}
    tok = tokenizers.Tokenizer(models.WordLevel(vocab, unk_token='<unk>'))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens([tokenizers.AddedToken(s, special=True) for s in SPECIALS])
    os.makedirs(directory, exist_ok=True)
    tok.save(os.path.join(directory, 'tokenizer.json'))
    config = {'eos_token': '<|im_end|>', 'pad_token': '<|endoftext|>', 'bos_token': None}
    if chat_template is not None:
        config['chat_template'] = chat_template
    with open(os.path.join(directory, 'tokenizer_config.json'), 'w') as f:
        json.dump(config, f)


hf_config_dict = config_to_hf  # The name these tests use.


@functools.cache
def _random_state(cfg: ModelConfig, seed: int) -> dict:
    abstract = jax.eval_shape(lambda: init_params(cfg, jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def fill(path, leaf):
        name = jax.tree_util.keystr(path)
        base = 1.0 if ('scale' in name or 'norm_h' in name) else 0.0
        return (base + rng.normal(0, 0.1, leaf.shape)).astype(np.float32)

    return params_to_state(cfg, jax.tree_util.tree_map_with_path(fill, abstract))


def random_state(cfg: ModelConfig, seed: int = 0) -> dict:
    """HF-named random tensors for `cfg` (norm scales around 1, biases non-zero).

    Built from the abstract parameter tree: eager `init_params` takes seconds.
    """
    return dict(_random_state(cfg, seed))


@pytest.fixture
def numpy_hf_dir(tmp_path):
    """Factory: writes a tiny HF directory with numpy only (no torch). Returns (dir, cfg, state)."""

    def make(family='llama', name='hf', tokenizer_vocab=67, config_changes=None):
        cfg = hf_tiny_cfg(family)
        directory = tmp_path / name
        directory.mkdir()
        from safetensors.numpy import save_file

        state = random_state(cfg)
        save_file(state, str(directory / 'model.safetensors'))
        config = hf_config_dict(cfg)
        config.update(config_changes or {})
        (directory / 'config.json').write_text(json.dumps(config))
        if tokenizer_vocab:
            write_tokenizer(directory, tokenizer_vocab)
        return str(directory), cfg, state

    return make


@pytest.fixture
def torch_hf_dir(tmp_path):
    """Factory: a tiny random transformers model saved with save_pretrained.

    Returns (dir, torch model in eval mode, the equivalent spec_jax cfg).
    """
    torch = pytest.importorskip('torch', reason='torch is needed to build HF reference models')
    transformers = pytest.importorskip(
        'transformers', reason='transformers is needed to build HF reference models'
    )

    def make(family, shard=False, seed=0):
        cfg = hf_tiny_cfg(family)
        config = hf_config_dict(cfg)
        arch = config.pop('architectures')[0]
        config.pop('model_type')
        config.pop('dtype')
        config['rope_scaling'] = config.pop('rope_parameters')
        config['rope_theta'] = cfg.rope_theta
        config_cls = getattr(transformers, arch.replace('ForCausalLM', 'Config'))
        torch.manual_seed(seed)
        model = getattr(transformers, arch)(config_cls(**config)).eval()
        with torch.no_grad():
            for p in model.parameters():  # Perturb norms (ones) and biases (zeros) too.
                p.add_(torch.randn_like(p) * 0.05)
        directory = tmp_path / f'{family}{"_sharded" if shard else ""}'
        model.save_pretrained(str(directory), max_shard_size='20KB' if shard else '5GB')
        write_tokenizer(directory)
        return str(directory), model, cfg

    return make


def gguf_tiny_cfg(family: str) -> ModelConfig:
    """A tiny config whose matrix rows are multiples of 32 (GGUF quant blocks)."""
    return ModelConfig.tiny(
        family, width=64, num_heads=4, num_kv_heads=2, head_dim=16, mlp_width=96, rms_eps=1e-6
    )


# GGUF type of each tensor in the tiny GGUF: a mix of what llama.cpp writes.
GGUF_QTYPES = {
    'token_embd': 'Q8_0',
    'attn_q': 'F16',
    'attn_k': 'Q4_1',
    'attn_v': 'Q4_0',
    'attn_output': 'Q5_1',
    'ffn_gate': 'Q8_0',
    'ffn_up': 'Q5_0',
    'ffn_down': 'Q4_1',
    'output': 'Q8_0',
}


@pytest.fixture
def tiny_gguf(tmp_path):
    """Factory: writes a tiny GGUF like llama.cpp does (q/k rows permuted for llama).

    Returns (path, cfg, expected HF-layout state after quantization round trip).
    """
    import gguf

    from spec_jax.checkpoints.gguf import hf_name

    def make(family='llama', arch=None, name='tiny.gguf', tokenizer=True):
        cfg = gguf_tiny_cfg(family)
        arch = arch or family
        state = random_state(cfg)
        path = str(tmp_path / name)
        w = gguf.GGUFWriter(path, arch)
        w.add_uint32(f'{arch}.block_count', cfg.num_layers)
        w.add_uint32(f'{arch}.context_length', cfg.max_position)
        w.add_uint32(f'{arch}.embedding_length', cfg.width)
        w.add_uint32(f'{arch}.feed_forward_length', cfg.mlp_width)
        w.add_uint32(f'{arch}.attention.head_count', cfg.num_heads)
        w.add_uint32(f'{arch}.attention.head_count_kv', cfg.num_kv_heads)
        w.add_uint32(f'{arch}.attention.key_length', cfg.head_dim)
        w.add_uint32(f'{arch}.attention.value_length', cfg.head_dim)
        w.add_float32(f'{arch}.rope.freq_base', cfg.rope_theta)
        w.add_float32(f'{arch}.attention.layer_norm_rms_epsilon', cfg.rms_eps)
        if tokenizer:
            tokens = list(SPECIALS) + [chr(ord('a') + i % 26) * (1 + i // 26) for i in range(64)]
            w.add_string('tokenizer.ggml.model', 'gpt2')
            w.add_string('tokenizer.ggml.pre', 'smollm')
            w.add_array('tokenizer.ggml.tokens', tokens)
            w.add_array('tokenizer.ggml.token_type', [3] * 3 + [1] * 64)
            w.add_array('tokenizer.ggml.merges', ['a a'])
            w.add_uint32('tokenizer.ggml.eos_token_id', 2)
            w.add_string('tokenizer.chat_template', CHATML)
        gguf_names = {}
        for t in [f'blk.{i}.{s}' for i in range(cfg.num_layers) for s in _LAYER_SUFFIXES]:
            gguf_names[hf_name(t)] = t
        for t in ('token_embd.weight', 'output_norm.weight', 'output.weight'):
            gguf_names[hf_name(t)] = t
        expected = {}
        for hf, x in state.items():
            g = gguf_names[hf]
            kind = g.split('.')[-2]
            qtype = gguf.GGMLQuantizationType[GGUF_QTYPES.get(kind, 'F32')] if x.ndim == 2 else None
            if x.ndim == 2 and qtype not in (
                gguf.GGMLQuantizationType.F16,
                gguf.GGMLQuantizationType.F32,
            ):
                data = gguf.quants.quantize(x, qtype)
                expected[hf] = gguf.quants.dequantize(data, qtype)
            elif qtype == gguf.GGMLQuantizationType.F16:
                data = x.astype(np.float16)
                expected[hf] = data.astype(np.float32)
            else:
                data, expected[hf] = x, x
            if family == 'llama' and kind in ('attn_q', 'attn_k'):  # llama.cpp's permute.
                n = cfg.num_heads if kind == 'attn_q' else cfg.num_kv_heads
                rows = expected[hf].shape[0]
                data = data.reshape(n, 2, rows // n // 2, -1).swapaxes(1, 2).reshape(rows, -1)
            w.add_tensor(g, data, raw_dtype=qtype)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return path, cfg, expected

    return make


_LAYER_SUFFIXES = (
    'attn_norm.weight',
    'ffn_norm.weight',
    'attn_q.weight',
    'attn_k.weight',
    'attn_v.weight',
    'attn_output.weight',
    'attn_q.bias',
    'attn_k.bias',
    'attn_v.bias',
    'attn_q_norm.weight',
    'attn_k_norm.weight',
    'ffn_gate.weight',
    'ffn_up.weight',
    'ffn_down.weight',
)


@pytest.fixture(scope='session')
def causal_logits():
    """fn(cfg, params, tokens [B, T]) -> fp32 logits [B, T, V] (no cache, causal mask)."""
    import jax.numpy as jnp

    from spec_jax.models.llama import forward

    def run(cfg, params, tokens_bt):
        b, t = np.shape(tokens_bt)
        positions_bt = jnp.broadcast_to(jnp.arange(t), (b, t))
        mask_btt = jnp.broadcast_to(jnp.tril(jnp.ones((t, t), bool)), (b, t, t))
        logits, _, _ = forward(cfg, params, jnp.asarray(tokens_bt), positions_bt, None, mask_btt)
        return np.asarray(logits)

    return run
