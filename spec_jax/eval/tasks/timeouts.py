"""Calls with a wall-clock deadline on any thread: persistent worker subprocesses.

A scorer that runs sympy (math-verify) can get stuck in one call for minutes (a huge power
or factorial in a model's answer), often inside C code that holds the GIL. math-verify's own
timeouts use `signal.alarm`, which works on the main thread only; a thread cannot be
interrupted at all. So a `DeadlinePool` runs each call in a worker *process* and kills the
worker when the deadline passes: the caller gets `CallTimeout` at the deadline (plus the few
milliseconds a kill takes), whatever the call was doing, and the next call starts a fresh
worker.

Workers are plain `python -c` subprocesses (fork + exec), not `multiprocessing` children: they
never re-import the caller's `__main__`, and forking a parent that runs JAX threads is not an
issue. They are started lazily, kept warm between calls, and reused; each serves one call at a
time, so a pool of `workers` processes serves that many threads at once (others wait for a free
worker; the wait does not count against their deadline, nor does a worker's start-up). A call
is `fn(*args, **kwargs)` with `fn` a module-level function (pickled by reference: the worker
imports its module, with the caller's `sys.path`) and picklable arguments and result.

Workers get an address-space limit (`memory_limit`, default 4 GiB; exceeding it is a
`MemoryError` inside the call), quiet math-verify loggers, and exit when their parent does.
"""

from __future__ import annotations

import atexit
import os
import pickle
import queue
import select
import struct
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

_HEADER = struct.Struct('>Q')
_PACKAGE_PARENT = os.path.dirname(
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
)
_SERVE = 'from spec_jax.eval.tasks.timeouts import _serve; _serve()'


class CallTimeout(TimeoutError):
    """The call did not finish before its deadline (its worker was killed)."""


class WorkerError(RuntimeError):
    """The call raised in the worker (message: the worker's traceback), or the worker died."""


class WorkerStartError(WorkerError):
    """A worker could not start (e.g. a preload module is not installed)."""


# --------------------------------------------------------------------------- parent side


class _Worker:
    """One worker subprocess and its pipes; used by one thread at a time."""

    def __init__(self, setup: dict, start_timeout_s: float):
        env = dict(os.environ)
        env['PYTHONPATH'] = os.pathsep.join(
            [_PACKAGE_PARENT] + ([env['PYTHONPATH']] if env.get('PYTHONPATH') else [])
        )
        try:
            self.proc = subprocess.Popen(
                [sys.executable, '-c', _SERVE],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                cwd=_PACKAGE_PARENT,
                env=env,
                close_fds=True,
            )
        except OSError as e:
            raise WorkerStartError(f'could not start a worker ({sys.executable}): {e}') from e
        self.dead = False
        try:
            self._send(setup)
            status, payload = self._receive(time.monotonic() + start_timeout_s)
        except BaseException as e:
            self.kill()
            raise WorkerStartError(f'the worker did not start: {e!r}') from e
        if status != 'ready':
            self.kill()
            raise WorkerStartError(f'the worker failed to start:\n{payload}')

    def _send(self, obj: Any) -> None:
        data = obj if isinstance(obj, bytes) else pickle.dumps(obj, pickle.HIGHEST_PROTOCOL)
        self.proc.stdin.write(_HEADER.pack(len(data)) + data)
        self.proc.stdin.flush()

    def _read_exact(self, n: int, deadline: float) -> bytes:
        fd = self.proc.stdout.fileno()
        chunks, left = [], n
        while left:
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not select.select([fd], [], [], remaining)[0]:
                raise CallTimeout
            chunk = os.read(fd, min(left, 1 << 20))
            if not chunk:
                raise WorkerError(f'the worker died (exit status {self.proc.wait()})')
            chunks.append(chunk)
            left -= len(chunk)
        return b''.join(chunks)

    def _receive(self, deadline: float) -> tuple[str, Any]:
        (size,) = _HEADER.unpack(self._read_exact(_HEADER.size, deadline))
        return pickle.loads(self._read_exact(size, deadline))

    def call(self, request: bytes, timeout_s: float) -> Any:
        try:
            self._send(request)
            status, payload = self._receive(time.monotonic() + timeout_s)
        except CallTimeout:
            self.kill()
            raise
        except (OSError, EOFError, pickle.UnpicklingError, WorkerError) as e:
            self.kill()
            raise WorkerError(f'the worker failed: {e}') from e
        except BaseException:  # E.g. KeyboardInterrupt: its reply would answer the next call.
            self.kill()
            raise
        if status == 'error':
            raise WorkerError(payload)
        return payload

    def kill(self) -> None:
        self.dead = True
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass


class DeadlinePool:
    """Runs module-level functions in worker subprocesses, each call under a deadline.

    Args:
      workers: how many calls may run at once (one process each, started on demand).
      preload: modules each worker imports when it starts (before any deadline runs).
      warmup: a module-level function each worker calls once when it starts (e.g. to load a
        parser), or None.
      memory_limit: each worker's address-space limit in bytes (RLIMIT_AS; 0 = none).
      start_timeout_s: how long a worker may take to start (import, preload, warmup).
    """

    def __init__(
        self,
        workers: int = 2,
        preload: Sequence[str] = (),
        warmup: Callable[[], Any] | None = None,
        memory_limit: int = 4 << 30,
        start_timeout_s: float = 120.0,
    ):
        if workers < 1:
            raise ValueError(f'workers must be >= 1, got {workers}')
        self.workers = workers
        self._setup = {
            'sys_path': [p or os.getcwd() for p in sys.path],
            'preload': tuple(preload),
            'warmup': warmup,
            'memory_limit': int(memory_limit),
            'parent': os.getpid(),
        }
        self._start_timeout_s = start_timeout_s
        self._idle: queue.LifoQueue = queue.LifoQueue()
        for _ in range(workers):
            self._idle.put(None)  # A slot without a started worker.
        self._lock = threading.Lock()
        self._live: set[_Worker] = set()
        self._closed = False
        atexit.register(self.close)

    def call(self, fn: Callable, *args: Any, timeout_s: float, **kwargs: Any) -> Any:
        """`fn(*args, **kwargs)` in a worker; its result.

        Raises:
          CallTimeout: not done `timeout_s` seconds after it was handed to a worker.
          WorkerError: it raised there (the message holds the worker's traceback), or the
            worker died; WorkerStartError (a WorkerError) when no worker could start.
        """
        if self._closed:
            raise RuntimeError('the DeadlinePool is closed')
        request = pickle.dumps((fn, args, kwargs), protocol=pickle.HIGHEST_PROTOCOL)
        worker = self._idle.get()
        try:
            if worker is None or worker.dead:
                worker = _Worker(self._setup, self._start_timeout_s)
                with self._lock:
                    self._live.add(worker)
            return worker.call(request, timeout_s)
        finally:
            if worker is not None and worker.dead:
                with self._lock:
                    self._live.discard(worker)
                worker = None
            self._idle.put(worker)

    def close(self) -> None:
        """Ends every worker (calls in progress fail with WorkerError)."""
        self._closed = True
        with self._lock:
            live, self._live = list(self._live), set()
        for worker in live:
            worker.kill()


# --------------------------------------------------------------------------- worker side


def _serve() -> None:  # pragma: no cover - runs in the worker process
    """The worker loop: a setup frame, then (fn, args, kwargs) frames until stdin closes."""
    import logging

    inp = sys.stdin.buffer
    out = os.fdopen(os.dup(1), 'wb')
    os.dup2(2, 1)  # Stray prints go to stderr, not into the protocol.

    def read() -> Any:
        header = inp.read(_HEADER.size)
        if len(header) < _HEADER.size:
            raise EOFError
        return pickle.loads(inp.read(_HEADER.unpack(header)[0]))

    def write(status: str, payload: Any) -> None:
        try:
            data = pickle.dumps((status, payload), protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:
            data = pickle.dumps(('error', 'unpicklable result:\n' + traceback.format_exc()))
        out.write(_HEADER.pack(len(data)) + data)
        out.flush()

    try:
        setup = read()
    except EOFError:
        return
    try:
        sys.path[:] = [p for p in setup['sys_path'] if p] + [
            p for p in sys.path if p and p not in setup['sys_path']
        ]
        if setup['memory_limit']:
            import resource

            limit = setup['memory_limit']
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        for name in ('math_verify', 'latex2sympy2_extended'):
            logging.getLogger(name).setLevel(logging.ERROR)
        _watch_parent(setup['parent'])
        import importlib

        for module in setup['preload']:
            importlib.import_module(module)
        if setup['warmup'] is not None:
            setup['warmup']()
    except BaseException:
        write('error', traceback.format_exc())
        return
    write('ready', None)
    while True:
        try:
            fn, args, kwargs = read()
        except EOFError:
            return
        except BaseException:
            write('error', traceback.format_exc())
            continue
        try:
            write('ok', fn(*args, **kwargs))
        except BaseException:
            write('error', traceback.format_exc())


def _watch_parent(parent: int) -> None:  # pragma: no cover - runs in the worker process
    """Exits the worker soon after its parent is gone, even in the middle of a call."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()
