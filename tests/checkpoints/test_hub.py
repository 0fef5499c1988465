"""Hub ids: an unreachable hub fails fast with an error naming the id."""

import time

import pytest

from spec_jax import checkpoints
from spec_jax.checkpoints import HubUnreachableError

HUB_ID = 'meta-llama/Llama-3.1-8B-Instruct'


def _check_fast_error(load):
    start = time.perf_counter()
    with pytest.raises(HubUnreachableError) as e:
        load()
    assert time.perf_counter() - start < 15
    assert HUB_ID in str(e.value)
    assert 'unreachable' in str(e.value) and 'local' in str(e.value)


def test_hub_offline(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    _check_fast_error(lambda: checkpoints.load(HUB_ID))
    _check_fast_error(lambda: checkpoints.load_hf(HUB_ID))


def test_hub_unreachable(monkeypatch):
    # Not offline, but the endpoint refuses connections: the probe fails at once.
    monkeypatch.delenv('HF_HUB_OFFLINE', raising=False)
    monkeypatch.delenv('TRANSFORMERS_OFFLINE', raising=False)
    monkeypatch.setenv('HF_ENDPOINT', 'http://127.0.0.1:9')
    _check_fast_error(lambda: checkpoints.load(HUB_ID))


def test_hub_error_is_os_error(monkeypatch):
    monkeypatch.setenv('HF_HUB_OFFLINE', '1')
    with pytest.raises(OSError):
        checkpoints.load('org/model')


def test_hub_download_path(monkeypatch, numpy_hf_dir):
    """When the hub answers, the snapshot directory is loaded like a local one."""
    import huggingface_hub

    from spec_jax.checkpoints import hub

    directory, cfg, _ = numpy_hf_dir('qwen2')
    calls = []

    def fake_snapshot_download(repo_id, local_files_only=False, **kwargs):
        calls.append((repo_id, local_files_only, kwargs.get('allow_patterns')))
        if local_files_only:
            raise huggingface_hub.errors.LocalEntryNotFoundError('not cached')
        return directory

    monkeypatch.setattr(huggingface_hub, 'snapshot_download', fake_snapshot_download)
    monkeypatch.setattr(hub, 'hub_reachable', lambda timeout=5.0: True)
    assert checkpoints.load('Qwen/Qwen2.5-0.5B-Instruct').cfg == cfg
    assert [c[:2] for c in calls] == [('Qwen/Qwen2.5-0.5B-Instruct', True)] + [
        ('Qwen/Qwen2.5-0.5B-Instruct', False)
    ]
    assert '*.safetensors' in calls[-1][2]
