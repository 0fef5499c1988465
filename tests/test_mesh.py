"""Runs tests/mesh (AR, chain and tree decoding on meshes of 8 fake CPU devices) in one
subprocess, the only way to give JAX 8 devices beside a suite that started with one."""

import os
import subprocess
import sys


def test_mesh_checks_pass_on_eight_fake_devices():
    env = dict(os.environ, SPEC_JAX_MESH_TESTS='1', JAX_PLATFORMS='cpu')
    flags = env.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
    env['XLA_FLAGS'] = flags.strip()
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    run = subprocess.run(
        [sys.executable, '-m', 'pytest', '-q', '-p', 'no:cacheprovider', 'tests/mesh'],
        cwd=root, env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-3000:]
    assert ' passed' in run.stdout and 'skipped' not in run.stdout, run.stdout[-2000:]
