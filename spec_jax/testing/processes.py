"""Processes joined as one JAX job over loopback, for tests of several hosts on one machine
(spec_jax/distributed.py)."""

from __future__ import annotations

import os
import socket
import subprocess


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
