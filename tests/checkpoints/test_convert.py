"""Streaming conversion into orbax: the same parameters as loading, restorable into any
dtype, and one tensor held at a time (peak memory measured in a fresh process)."""

import json
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from safetensors.numpy import save_file

from spec_jax import checkpoints
from spec_jax.checkpoints import CheckpointError, orbax_io, params_to_state
from spec_jax.checkpoints.hf import config_to_hf
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import init_params
from tests.checkpoints.conftest import random_state


def assert_same_params(a, b, dtype=None):
    assert jax.tree.structure(a) == jax.tree.structure(b)
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        assert x.dtype == (dtype or y.dtype)
        np.testing.assert_array_equal(np.asarray(x), np.asarray(y).astype(x.dtype))


@pytest.mark.parametrize('family', ['llama', 'qwen3'])
def test_convert_equals_load(numpy_hf_dir, tmp_path, family):
    directory, _, _ = numpy_hf_dir(family)
    want = checkpoints.load(directory)
    out = checkpoints.convert_to_orbax(directory, tmp_path / 'ckpt')
    assert sorted(os.listdir(out)) == [
        'model_config.json', 'params', 'tokenizer.json', 'tokenizer_config.json'
    ]  # fmt: skip
    got = checkpoints.load(out)
    assert got.cfg == want.cfg
    assert_same_params(got.params, want.params)
    assert got.tokenizer.encode('w1 w2 <|im_end|>') == want.tokenizer.encode('w1 w2 <|im_end|>')
    # Written in bf16, and restored into float32 as it is read.
    out16 = checkpoints.convert_to_orbax(directory, tmp_path / 'ckpt16', dtype='bfloat16')
    half = checkpoints.load(out16, dtype=None)
    assert half.cfg.param_dtype == 'bfloat16'
    assert_same_params(half.params, want.params, dtype=np.dtype('bfloat16'))
    back = checkpoints.load(out16, dtype='float32')
    assert back.cfg.param_dtype == 'float32'
    assert_same_params(back.params, half.params, dtype=np.dtype('float32'))


def test_convert_gguf_equals_load(tiny_gguf, tmp_path):
    path, _, _ = tiny_gguf('llama')
    want = checkpoints.load(path)
    got = checkpoints.load(checkpoints.convert_to_orbax(path, tmp_path / 'ckpt'))
    assert got.cfg == want.cfg
    assert_same_params(got.params, want.params)


def test_convert_refusals(numpy_hf_dir, tmp_path):
    directory, _, _ = numpy_hf_dir('llama')
    out = checkpoints.convert_to_orbax(directory, tmp_path / 'ckpt')
    with pytest.raises(CheckpointError, match='not empty'):
        checkpoints.convert_to_orbax(directory, out)
    with pytest.raises(CheckpointError, match='already an orbax checkpoint'):
        checkpoints.convert_to_orbax(out, tmp_path / 'again')
    # A tensor missing from the source fails before anything is written.
    (tmp_path / 'broken').mkdir()
    state = {k: v for k, v in random_state(checkpoints.load(directory).cfg).items()
             if not k.endswith('layers.1.mlp.up_proj.weight')}  # fmt: skip
    save_file(state, str(tmp_path / 'broken' / 'model.safetensors'))
    (tmp_path / 'broken' / 'config.json').write_text(
        open(os.path.join(directory, 'config.json')).read()
    )
    with pytest.raises(CheckpointError, match='layers.1.mlp.up_proj'):
        checkpoints.convert_to_orbax(tmp_path / 'broken', tmp_path / 'none')
    assert not orbax_io.is_orbax_dir(tmp_path / 'none')


# A model of 220 MB in float32 whose largest tensors (32 MB) are the MLP's, three in a row
# in the middle of the stream.
BIG = ModelConfig(
    family='llama', vocab_size=2048, width=1024, num_layers=2, num_heads=16,
    num_kv_heads=4, head_dim=64, mlp_width=8192, tie_embeddings=True,
)  # fmt: skip

MEASURE = r"""
import json, sys
import jax, numpy as np
from spec_jax import checkpoints
from spec_jax.checkpoints import orbax_io

def status(key):
    with open('/proc/self/status') as f:
        return next(int(line.split()[1]) << 10 for line in f if line.startswith(key))

source, out, how = sys.argv[1:]
# Warm up: JAX's runtime and orbax's (threads, tensorstore) are not what is measured.
orbax_io.ocp_partial.save(out + '.warm', {'x': jax.device_put(np.ones(4))})
orbax_io.ocp_partial.finalize(out + '.warm')
with open('/proc/self/clear_refs', 'w') as f:  # Resets the peak (VmHWM) to the RSS now.
    f.write('5')
before = status('VmRSS')
if how == 'stream':
    checkpoints.convert_to_orbax(source, out)
else:  # Load everything, then save it: what streaming avoids.
    model = checkpoints.load(source)
    checkpoints.save_orbax(out, model.cfg, model.params)
print(json.dumps(dict(peak=status('VmHWM') - before)))
"""


def test_streaming_conversion_holds_one_tensor(tmp_path):
    """Peak resident memory above the process's start, converting a 220 MB model: the
    streaming conversion stays under what one tensor in flight costs, 4 x the largest
    (32 MB: the placed array, and at moments the read buffer or orbax's host copy and
    encoded chunk, see `convert_to_orbax`) + 32 MB (measured 79 MB); loading the whole
    model and saving it, measured the same way, holds more than the model (505 MB). The
    allocator's mmap threshold is fixed, so a freed tensor is returned, not kept in an
    arena (glibc's dynamic threshold would keep some)."""
    source = tmp_path / 'big'
    source.mkdir()
    rng = np.random.default_rng(0)
    abstract = jax.eval_shape(lambda: init_params(BIG, jax.random.key(0)))
    state = params_to_state(
        BIG, jax.tree.map(lambda s: rng.standard_normal(s.shape, np.float32), abstract)
    )
    model_bytes = sum(w.nbytes for w in state.values())
    largest = max(w.nbytes for w in state.values())
    save_file(state, str(source / 'model.safetensors'))
    del state
    (source / 'config.json').write_text(json.dumps(config_to_hf(BIG)))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

    def peak(how):
        run = subprocess.run(
            [sys.executable, '-c', MEASURE, str(source), str(tmp_path / how), how],
            cwd=root, capture_output=True, text=True, timeout=600,
            env=dict(os.environ, JAX_PLATFORMS='cpu', MALLOC_MMAP_THRESHOLD_=str(1 << 20)),
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        return json.loads(run.stdout.strip().splitlines()[-1])['peak']

    bound = 4 * largest + (32 << 20)
    streamed = peak('stream')
    print(
        f'model {model_bytes >> 20} MB, largest tensor {largest >> 20} MB, peak: streaming '
        f'{streamed >> 20} MB (bound {bound >> 20} MB)'
    )
    assert streamed < bound < model_bytes
    whole = peak('whole')
    print(f'load then save: {whole >> 20} MB')
    assert whole > model_bytes
    restored = checkpoints.load(tmp_path / 'stream')
    assert_same_params(restored.params, checkpoints.load(tmp_path / 'whole').params)
