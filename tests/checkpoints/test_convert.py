"""Streaming conversion into orbax: the same parameters as loading, restorable into any
dtype, and one tensor held at a time (peak memory measured in a fresh process)."""

import json
import os
import subprocess
import sys

import gguf as gguf_lib
import jax
import numpy as np
import pytest
from safetensors import safe_open
from safetensors.numpy import save_file

from spec_jax import checkpoints
from spec_jax.checkpoints import CheckpointError, orbax_io, params_to_state, sources
from spec_jax.checkpoints.convert import converted_tensors, sliced_tensors
from spec_jax.checkpoints.gguf import GGUFFile
from spec_jax.checkpoints.hf import config_to_hf
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import init_params
from spec_jax.testing.processes import start_processes
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


def random_index(rng, shape):
    """A region of `shape`: a random non-empty [lo, hi) per axis, or the whole axis."""
    out = []
    for size in shape:
        if rng.random() < 0.3:
            out.append(slice(None))
        else:
            lo = int(rng.integers(0, size))
            out.append(slice(lo, int(rng.integers(lo + 1, size + 1))))
    return tuple(out)


@pytest.mark.parametrize('fmt', ['hf', 'gguf'])
def test_regions_equal_the_whole_tensors(numpy_hf_dir, tiny_gguf, fmt):
    """Every parameter's region, read alone (`convert.sliced_tensors`: safetensors bytes of
    the region, GGUF rows and the quantization blocks the columns overlap, q/k un-permuted
    per head), equals that region of the whole converted tensor, for random regions of
    every axis (cuts inside heads and inside quantization blocks included); safetensors
    regions in HF layout equal safetensors' own `get_slice`."""
    if fmt == 'hf':
        source, _, _ = numpy_hf_dir('qwen2')  # q/k/v biases, an untied LM head.
    else:
        source, _, _ = tiny_gguf('llama')  # Permuted q/k rows, mixed quantizations.
    state = sources.open_source(source, mapped=False)
    cfg = state.cfg
    whole = dict(converted_tensors(cfg, state.read, state.names))
    rng = np.random.default_rng(0)
    seen = 0
    for path, shape, region in sliced_tensors(cfg, state.slices, state.names):
        assert tuple(whole[path].shape) == tuple(shape)
        for index in [(slice(None),) * len(shape)] + [random_index(rng, shape) for _ in range(4)]:
            np.testing.assert_array_equal(region(index), whole[path][index], err_msg=path)
            seen += 1
    assert seen == 5 * len(whole)
    if fmt == 'hf':
        with safe_open(os.path.join(source, 'model.safetensors'), 'numpy') as f:
            for name in state.names:
                index = random_index(rng, state.slices.shape(name))
                np.testing.assert_array_equal(
                    state.slices.read(name, index), f.get_slice(name)[index], err_msg=name
                )


# Two hosts (processes) converting together onto one mesh over both, model 2 (a device
# each): vocabulary, heads and MLP split in halves, norms whole. (The GGUF's vocabulary
# is 68: the fixture's tokenizer has 67 tokens.)
HOSTS_HF = ModelConfig.tiny('qwen2', vocab_size=64, width=32, num_layers=1, num_heads=4,
                            num_kv_heads=2, head_dim=8, mlp_width=48)  # fmt: skip
HOSTS_GGUF = ModelConfig.tiny('llama', vocab_size=68, width=64, num_heads=4, num_kv_heads=2,
                              head_dim=16, mlp_width=96, num_layers=1, rms_eps=1e-6)  # fmt: skip

CONVERT_WORKER = r"""
import json, sys
from absl import flags
from spec_jax import checkpoints, distributed, sharding
from spec_jax.checkpoints import hf, sources

flags.DEFINE_string('coordinator', '', '')
flags.DEFINE_integer('num_processes', 0, '')
flags.DEFINE_integer('process_id', -1, '')
flags.FLAGS(sys.argv[:1] + sys.argv[4:])
F = flags.FLAGS
distributed.initialize(F.coordinator, F.num_processes, F.process_id)
import jax

counted = dict(hf=0, gguf=0)
read_at, copy_rows = hf.read_at, sources.copy_rows

def counting_read_at(fd, into, offset, path):  # Every safetensors byte a region takes.
    counted['hf'] += len(into)
    return read_at(fd, into, offset, path)

def counting_copy_rows(data, rows, cols):  # Every GGUF byte a region takes.
    out = copy_rows(data, rows, cols)
    counted['gguf'] += out.nbytes
    return out

hf.read_at, sources.copy_rows = counting_read_at, counting_copy_rows
mesh = sharding.make_mesh(sharding.mesh_config(data=1, model=-1, hosts='all'))
for source, out in (sys.argv[1:3], (sys.argv[3], sys.argv[3] + '.orbax')):
    checkpoints.convert_to_orbax(source, out, mesh=mesh, progress=False)
with open(f'{sys.argv[2]}.{jax.process_index()}.json', 'w') as f:
    json.dump(dict(counted, devices=jax.device_count(), multi=mesh.is_multi_process), f)
"""


def test_two_hosts_convert_reading_only_their_shards(tmp_path, monkeypatch, tiny_gguf):
    """Two processes joined over loopback convert an HF directory and a GGUF file onto one
    mesh over both (model 2, a device each): each reads, through the wrapped readers every
    region passes (`hf.read_at`, `sources.copy_rows`), exactly the bytes of its own
    halves (norms whole), about half of the tensors; each writes its own shards (orbax's
    per-process data, process 1's included); and the checkpoints restore in one process to
    the parameters a plain load gives."""
    hf_dir = tmp_path / 'hf'
    hf_dir.mkdir()
    hf_state = random_state(HOSTS_HF)
    save_file(hf_state, str(hf_dir / 'model.safetensors'))
    (hf_dir / 'config.json').write_text(json.dumps(config_to_hf(HOSTS_HF)))
    # The fixture builds its config by this name; model 2 needs an even vocabulary.
    monkeypatch.setitem(tiny_gguf.__globals__, 'gguf_tiny_cfg', lambda family: HOSTS_GGUF)
    gguf_path, _, _ = tiny_gguf('llama')
    out = str(tmp_path / 'orbax')
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    procs = start_processes([sys.executable, '-c', CONVERT_WORKER, str(hf_dir), out, gguf_path],
                            2, dict(PYTHONPATH=root), root)  # fmt: skip
    logs = [p.communicate(timeout=600)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], [log[-3000:] for log in logs]
    counts = []
    for i in range(2):
        with open(f'{out}.{i}.json') as f:
            counts.append(json.load(f))
    assert all(c['devices'] == 2 and c['multi'] for c in counts)
    # What each host must read, from the files' own layout.
    hf_want = sum(w.nbytes if name.endswith(('layernorm.weight', 'model.norm.weight'))
                  else w.nbytes // 2 for name, w in hf_state.items())  # fmt: skip
    hf_total = sum(w.nbytes for w in hf_state.values())
    gguf_want, gguf_total = gguf_own_bytes(gguf_path)
    for c in counts:
        assert c['hf'] == hf_want < 0.6 * hf_total, (c, hf_want, hf_total)
        assert c['gguf'] == gguf_want < 0.7 * gguf_total, (c, gguf_want, gguf_total)
    print(f'bytes read per host: HF {hf_want} of {hf_total}, GGUF {gguf_want} of {gguf_total}')
    for source, ckpt in ((str(hf_dir), out), (gguf_path, gguf_path + '.orbax')):
        got, want = checkpoints.load(ckpt), checkpoints.load(source)
        # orbax's data of each partial save (a tensor), per process: process 1 wrote data
        # for every tensor split across the hosts (all but the one layer's and final norms).
        params = os.path.join(ckpt, 'params')
        own = [d for d in os.listdir(params) if d.startswith('ocdbt.process_1')
               and os.listdir(os.path.join(params, d, 'd'))]  # fmt: skip
        assert len(own) >= len(jax.tree.leaves(got.params)) - 3, sorted(os.listdir(params))
        assert got.cfg == want.cfg
        assert_same_params(got.params, want.params)


def gguf_own_bytes(path):
    """(bytes one host's regions take from a GGUF file on a model-2 mesh, the bytes of all
    its tensors): per tensor, half its rows (a row split: embedding, q/k/v, gate/up) or,
    in every row, the quantization blocks half its columns overlap (o_proj, down_proj; a
    cut inside a block takes that block on both sides); norms whole."""
    f = GGUFFile(path)
    want = total = 0
    for t in f.tensors.values():
        rows, row_bytes = t.data.shape
        total += rows * row_bytes
        kind = t.name.split('.')[-2]
        if kind in ('attn_norm', 'ffn_norm', 'output_norm'):
            want += rows * row_bytes
        elif kind in ('attn_output', 'ffn_down'):
            block, type_size = gguf_lib.GGML_QUANT_SIZES[t.qtype]
            cols = t.shape[-1]
            blocks = -(-(cols // 2) // block)  # The first half; the second is the same count.
            assert blocks == cols // block - (cols // 2) // block
            want += rows * blocks * type_size
        else:
            want += rows * row_bytes // 2
    return want, total
