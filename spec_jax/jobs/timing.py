"""Timing helpers of the benches: interleaved medians of compiled thunks.

The compile clock the evaluation runner and the benches read lives a floor down, in
`spec_jax.eval.timing` (the runner may not import from `spec_jax.jobs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import jax
import numpy as np

from spec_jax.eval.timing import CompileClock, CompileSpan

__all__ = ['CompileClock', 'CompileSpan', 'interleaved_medians']


def interleaved_medians(fns: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median seconds of each thunk (each already compiled), timed in interleaved rounds."""
    times = {name: [] for name in fns}
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            jax.block_until_ready(fn())
            times[name].append(time.perf_counter() - start)
    return {name: float(np.median(t)) for name, t in times.items()}
