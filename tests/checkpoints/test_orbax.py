"""Orbax: converted params and config round-trip exactly; bad directories fail clearly."""

import json
import os

import jax
import numpy as np
import pytest
from etils.epath import testing as epath_testing

from spec_jax import checkpoints
from spec_jax.checkpoints import CheckpointError, sources


@pytest.mark.parametrize('family', ['llama', 'qwen2'])
def test_orbax_round_trip(numpy_hf_dir, tmp_path, family):
    directory, _, _ = numpy_hf_dir(family)
    model = checkpoints.load(directory)
    out = checkpoints.save_orbax(tmp_path / 'ckpt', model.cfg, model.params, model.tokenizer)
    restored = checkpoints.load(out)
    assert restored.cfg == model.cfg
    assert jax.tree.structure(restored.params) == jax.tree.structure(model.params)
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(model.params), strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    tok, want = restored.tokenizer, model.tokenizer
    assert tok.chat_template == want.chat_template
    assert (tok.eos_id, tok.pad_id, tok.stop_ids) == (want.eos_id, want.pad_id, want.stop_ids)
    assert tok.encode('w1 w2 <|im_end|>') == want.encode('w1 w2 <|im_end|>')


def test_config_json_round_trip(tiny_cfg):
    cfg = tiny_cfg.replace(rope_scaling=tiny_cfg.rope_scaling.__class__('llama3', 8.0))
    text = json.dumps(checkpoints.config_to_dict(cfg))
    assert checkpoints.config_from_dict(json.loads(text)) == cfg
    with pytest.raises(CheckpointError, match='unknown fields'):
        checkpoints.config_from_dict({**checkpoints.config_to_dict(cfg), 'sliding_window': 4})


def test_orbax_dtype_cast(numpy_hf_dir, tmp_path):
    directory, _, _ = numpy_hf_dir('qwen3', tokenizer_vocab=0)
    model = checkpoints.load(directory)
    out = checkpoints.save_orbax(tmp_path / 'ckpt', model.cfg, model.params)
    restored = checkpoints.load_orbax(out, dtype='bfloat16')
    assert restored.cfg.param_dtype == 'bfloat16' and restored.tokenizer is None
    assert {x.dtype for x in jax.tree.leaves(restored.params)} == {np.dtype('bfloat16')}


def test_refuses_to_overwrite(numpy_hf_dir, tmp_path):
    directory, _, _ = numpy_hf_dir('llama', tokenizer_vocab=0)
    model = checkpoints.load(directory)
    target = tmp_path / 'busy'
    target.mkdir()
    (target / 'notes.txt').write_text('keep me')
    with pytest.raises(CheckpointError, match='not empty'):
        checkpoints.save_orbax(target, model.cfg, model.params)
    assert os.listdir(target) == ['notes.txt']


def test_bad_orbax_dirs(tmp_path):
    with pytest.raises(FileNotFoundError):
        checkpoints.load_orbax(tmp_path / 'missing')
    broken = tmp_path / 'broken'
    broken.mkdir()
    (broken / 'model_config.json').write_text('{"family": "llama", "width": ')
    with pytest.raises(CheckpointError, match='model_config.json'):
        checkpoints.load(str(broken))
    (broken / 'model_config.json').write_text(json.dumps({'family': 'llama'}))
    with pytest.raises(CheckpointError, match='cannot restore the orbax params'):
        checkpoints.load(str(broken))


def test_bf16_round_trip_keeps_dtypes(numpy_hf_dir, tmp_path):
    directory, _, _ = numpy_hf_dir('qwen3', tokenizer_vocab=0)
    model = checkpoints.load(directory, dtype='bfloat16')
    out = checkpoints.save_orbax(tmp_path / 'ckpt', model.cfg, model.params)
    restored = checkpoints.load(out, dtype=None)
    assert restored.cfg == model.cfg
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(model.params), strict=True):
        assert a.dtype == b.dtype == np.dtype('bfloat16')
        np.testing.assert_array_equal(np.asarray(a, np.float32), np.asarray(b, np.float32))


def test_params_config_mismatch(numpy_hf_dir, tmp_path):
    directory, _, _ = numpy_hf_dir('llama', tokenizer_vocab=0)
    model = checkpoints.load(directory)
    out = checkpoints.save_orbax(tmp_path / 'ckpt', model.cfg, model.params)
    config = checkpoints.config_to_dict(model.cfg.replace(mlp_width=40))
    with open(os.path.join(out, 'model_config.json'), 'w') as f:
        json.dump(config, f)
    with pytest.raises(CheckpointError, match='do not match'):
        checkpoints.load(out)


def test_save_and_restore_go_through_epath(numpy_hf_dir, tmp_path):
    """Every file operation of a save, a conversion and a restore goes through etils.epath's
    backend table, the layer that serves gs:// (gcsfs) too: under `epath.testing.
    mock_epath`, which swaps every backend (gs:// included) for a local one that records
    each call, the directory checks, the config, the tokenizer files and orbax's own
    metadata are all seen there, and the checkpoint restores exactly. A local path stands
    in for the bucket (nothing here reaches Cloud Storage; epath has no in-memory
    filesystem, and orbax's array chunks are written by tensorstore's own file or gcs
    driver, below epath)."""
    directory, _, _ = numpy_hf_dir('llama')
    model = checkpoints.load(directory)
    seen = []

    def record(name):
        def call(original, path, *args, **kwargs):
            seen.append((name, os.fspath(path)))
            return original(path, *args, **kwargs)

        return call

    names = ('open', 'exists', 'isdir', 'listdir', 'makedirs', 'mkdir', 'rename', 'replace',
             'rmtree', 'remove', 'glob', 'walk', 'stat', 'copy')  # fmt: skip
    out = tmp_path / 'ckpt'
    with epath_testing.mock_epath(**{n: record(n) for n in names}):
        saved = checkpoints.save_orbax(out, model.cfg, model.params, model.tokenizer)
        restored = checkpoints.load(saved)
        converted = checkpoints.convert_to_orbax(directory, tmp_path / 'conv', progress=False)
    opened = {os.path.basename(p) for n, p in seen if n == 'open'}
    assert {'model_config.json', 'tokenizer.json', 'tokenizer_config.json'} <= opened
    assert '_CHECKPOINT_METADATA' in opened  # orbax's own metadata, through the same table.
    assert ('exists', str(out)) in seen and ('exists', converted) in seen
    assert any(n == 'rename' and p.startswith(converted) for n, p in seen)
    for a, b in zip(jax.tree.leaves(restored.params), jax.tree.leaves(model.params), strict=True):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert restored.tokenizer.encode('w1 w2') == model.tokenizer.encode('w1 w2')


def test_urls_are_kept_as_urls():
    """A gs:// checkpoint path is kept whole for epath (os.path.abspath made it a local
    'cwd/gs:/bucket' path before); a local one is made absolute."""
    assert os.fspath(sources.as_path('gs://bucket/ckpt/llama8b')) == 'gs://bucket/ckpt/llama8b'
    assert os.fspath(sources.as_path('ckpt')) == os.path.abspath('ckpt')
