"""Processes for tests: processes joined as one JAX job over loopback, for tests of several
hosts on one machine (spec_jax/distributed.py), and pytest run in a background process (the
checks that need 8 fake devices, which JAX fixes at start-up)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time


def free_port() -> int:
    """A TCP port on the loopback interface nobody listens on (for a test's coordinator)."""
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def start_processes(argv: list[str], count: int, env: dict | None = None, cwd: str | None = None):
    """`count` processes of `argv` joined as one JAX job over loopback: each gets
    `--coordinator 127.0.0.1:<port> --num_processes count --process_id i` appended (the
    flags of spec_jax's launchers, spec_jax/distributed.py). Returns the Popen objects,
    stdout and stderr merged into a pipe."""
    coordinator = f'127.0.0.1:{free_port()}'
    env = dict(os.environ, JAX_PLATFORMS='cpu', **(env or {}))
    return [
        subprocess.Popen(
            [
                *argv,
                '--coordinator',
                coordinator,
                '--num_processes',
                str(count),
                '--process_id',
                str(i),
            ],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )  # fmt: skip
        for i in range(count)
    ]


# The checks that need 8 devices (tests/mesh): JAX fixes its device count at start-up, so they
# run in a pytest process of their own (tests/test_mesh.py).
MESH_TESTS = 'tests/mesh'
# The folder of a `start_pytest` run of them that the session started (tests/conftest.py).
MESH_RUN_ENV = 'SPEC_JAX_MESH_RUN'


def eight_device_env(env: dict | None = None) -> dict:
    """`env` (default os.environ) with 8 fake CPU devices and the mesh tests switched on."""
    env = dict(os.environ if env is None else env, SPEC_JAX_MESH_TESTS='1', JAX_PLATFORMS='cpu')
    flags = env.get('XLA_FLAGS', '') + ' --xla_force_host_platform_device_count=8'
    env['XLA_FLAGS'] = flags.strip()
    return env


def start_pytest(paths: list[str], env: dict, cwd: str, out_dir: str) -> subprocess.Popen:
    """`python -m pytest -q -p no:cacheprovider <paths>` in the background: its output goes
    to `out_dir`/output, and its exit status to `out_dir`/status once it has ended (written
    whole, so a reader never sees half of it); `wait_pytest` reads both. It runs in a
    process group of its own (`os.killpg(proc.pid, ...)` stops the shell and pytest)."""
    script = (
        '"$0" -m pytest -q -p no:cacheprovider "$@" > "$PYTEST_OUT/output" 2>&1; '
        'echo $? > "$PYTEST_OUT/status.tmp" && mv "$PYTEST_OUT/status.tmp" "$PYTEST_OUT/status"'
    )
    env = dict(env, PYTEST_OUT=out_dir)
    argv = ['/bin/sh', '-c', script, sys.executable, *paths]
    return subprocess.Popen(argv, env=env, cwd=cwd, start_new_session=True)  # Its own group.


def wait_pytest(out_dir: str, timeout_s: float) -> tuple[int, str]:
    """(exit status, output) of a `start_pytest` run, once it has ended.

    Raises:
      TimeoutError: it has not ended within `timeout_s`.
    """
    deadline = time.monotonic() + timeout_s
    status = os.path.join(out_dir, 'status')
    while not os.path.exists(status):
        if time.monotonic() > deadline:
            raise TimeoutError(f'pytest in {out_dir} still running after {timeout_s} s')
        time.sleep(1.0)
    with open(status) as f, open(os.path.join(out_dir, 'output')) as g:
        return int(f.read()), g.read()
