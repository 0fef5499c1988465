"""Timing helpers shared by the benches and the evaluation runner."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator

import jax
import numpy as np
from jax import monitoring

# JAX's duration events of turning a traced function into an executable: tracing, lowering
# and the backend compile (a persistent-cache hit records its load instead).
COMPILE_EVENTS = (
    '/jax/core/compile/jaxpr_trace_duration',
    '/jax/core/compile/jaxpr_to_mlir_module_duration',
    '/jax/core/compile/backend_compile_duration',
)
CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'
_totals = {'seconds': 0.0, 'executables': 0, 'cache_hits': 0}
_listening = threading.Lock()
_registered = [False]


def _on_duration(event: str, duration: float, **kwargs) -> None:
    del kwargs
    if event in COMPILE_EVENTS:
        _totals['seconds'] += duration
        _totals['executables'] += event == COMPILE_EVENTS[-1]


def _on_event(event: str, **kwargs) -> None:
    del kwargs
    _totals['cache_hits'] += event == CACHE_HIT_EVENT


class CompileClock:
    """What JAX spends making executables over a `measure()` block: seconds (trace, lower,
    backend compile or persistent-cache load), executables compiled and loaded from the
    persistent cache. Process-wide: the listeners are registered once.

        with CompileClock().measure() as span:
            run()
        span.seconds, span.compiled, span.cache_hits
    """

    def __init__(self):
        with _listening:
            if not _registered[0]:
                monitoring.register_event_duration_secs_listener(_on_duration)
                monitoring.register_event_listener(_on_event)
                _registered[0] = True

    @contextlib.contextmanager
    def measure(self) -> Iterator[CompileSpan]:
        before = dict(_totals)
        span = CompileSpan()
        try:
            yield span
        finally:
            span.seconds = _totals['seconds'] - before['seconds']
            span.cache_hits = _totals['cache_hits'] - before['cache_hits']
            span.compiled = _totals['executables'] - before['executables'] - span.cache_hits


class CompileSpan:
    """The result of one `CompileClock.measure()` block (filled when the block exits)."""

    seconds: float = 0.0
    compiled: int = 0
    cache_hits: int = 0


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each thunk (each already compiled), timed in interleaved rounds."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}
