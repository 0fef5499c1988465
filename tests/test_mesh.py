"""Runs tests/mesh (AR, chain and tree decoding on meshes of 8 fake CPU devices) in one
subprocess, the only way to give JAX 8 devices beside a suite that started with one.

Under pytest-xdist the controller starts that subprocess with the session (tests/conftest.py,
`processes.MESH_RUN_ENV`) and this test waits for it: run here, as the suite's last file, it
was a tail of 7-9 minutes beside idle workers. Elsewhere (one process, or a selection) it
starts it here."""

import os
import shutil
import tempfile

from spec_jax.testing import processes

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_mesh_checks_pass_on_eight_fake_devices():
    out_dir = os.environ.get(processes.MESH_RUN_ENV)
    if out_dir:
        status, output = processes.wait_pytest(out_dir, timeout_s=1800)
    else:
        out_dir = tempfile.mkdtemp(prefix='spec_jax_mesh_')
        env = processes.eight_device_env()
        processes.start_pytest([processes.MESH_TESTS], env, ROOT, out_dir)
        try:
            status, output = processes.wait_pytest(out_dir, timeout_s=1800)
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
    assert status == 0, output[-9000:]
    assert ' passed' in output and 'skipped' not in output, output[-2000:]
