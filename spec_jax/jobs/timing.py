"""Timing helpers of the benches: a warm-up of every program, then interleaved medians.

A program's first execution costs more than its later ones, beyond its compile (buffers,
pages and caches set up on first use: docs/performance.md, "First execution"), so every
bench runs each program it times once, untimed (`warm_up`: its compile and that first
execution), before its first timed call, and says so in its output (`WARMED`).

The compile clock the evaluation runner and the benches read lives a floor down, in
`spec_jax.eval.timing` (the runner may not import from `spec_jax.jobs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np

from spec_jax.eval.timing import CompileClock, CompileSpan

__all__ = ['WARMED', 'CompileClock', 'CompileSpan', 'interleaved_medians', 'warm_up']

# What a bench's output says of its timings.
WARMED = 'each program warmed: run once untimed (compile and first execution) before timing'


def warm_up(fns: dict[str, Callable[[], object]]) -> float:
    """Runs each thunk once, untimed, its results ready: compiles it and pays its first
    execution before any timed call. Returns the seconds it all took (compiles included)."""
    start = time.perf_counter()
    for fn in fns.values():
        jax.block_until_ready(fn())
    return time.perf_counter() - start


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each thunk (each already warmed, `warm_up`), timed in interleaved
    rounds."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}
