"""Timing an evaluation on a machine that does not hold still: the compile clock, the batch
plan and the interleaved schedule (docs/eval.md, timing).

A shared machine's speed drifts (other work starts and stops), so methods run one after
another would each meet a different machine. The runner therefore decodes one batch of rows
with every method (AR included) before the next batch starts, in an order that rotates from
batch to batch: drift lands on every method alike, and each method's seconds on a batch can
be set against AR's seconds on the very same rows (`spec_jax.eval.paired.batch_speedup`).

  batch_plan(...)     the deterministic batches of one seed: rows of one task group each
  interleave(...)     (batch, method) in the order they run, skipping what is done
  CompileClock        what JAX spends compiling (kept out of the decode seconds)

A batch holds rows of one task group (`task_group`: a task, or the family of the 2-prompt
speed sets 'speed_*', which share batches and are timed as one), so a per-task speedup never
depends on another task's rows. Its id (`Batch.id`) is a function of the seed, the group,
its place in the plan and its rows, so a resumed run rebuilds the same batches and keeps the
pairing of methods on them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import threading
from collections.abc import Callable, Iterator, Sequence

from jax import monitoring

# JAX's duration events of turning a traced function into an executable: tracing, lowering
# and the backend compile (a persistent-cache hit records its load instead).
COMPILE_EVENTS = (
    '/jax/core/compile/jaxpr_trace_duration',
    '/jax/core/compile/jaxpr_to_mlir_module_duration',
    '/jax/core/compile/backend_compile_duration',
)
CACHE_HIT_EVENT = '/jax/compilation_cache/cache_hits'
# Task families whose sets are too small to fill batches alone: prefix -> group name.
GROUPS = {'speed_': 'speed'}
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


def task_group(task: str) -> str:
    """The timing group of a task: the family name of tiny sets that share batches
    (GROUPS: every 'speed_*' set is 'speed'), else the task itself."""
    for prefix, group in GROUPS.items():
        if task.startswith(prefix):
            return group
    return task


@dataclasses.dataclass(frozen=True)
class Batch:
    """One batch of the plan: `rows` are (task, item) pairs of one task group.

    Attributes:
      id: 's<seed>/<group>/<index in the group>/<hash of the rows>': the same batch gets
        the same id in every run of the same config, and no other batch gets it.
      index: its place among all batches of its seed (the rotation of its method order).
    """

    id: str
    seed: int
    group: str
    index: int
    rows: tuple


def batch_plan(
    rows: Sequence[tuple[str, object]],
    seed: int,
    batch_size: int,
    sort_key: Callable[[tuple[str, object]], tuple],
    item_id: Callable[[object], str] = lambda it: it.id,
) -> list[Batch]:
    """The batches of one seed over every (task, item) row, done or not (so a resumed run
    rebuilds the same ones): rows sorted by task group, then `sort_key` (the runner's:
    prompt bucket, token limit, prompt length, task, item), cut into batches of
    `batch_size` within each group (only a group's last batch is short)."""
    by_group: dict[str, list] = {}
    for r in sorted(rows, key=lambda r: (task_group(r[0]), sort_key(r))):
        by_group.setdefault(task_group(r[0]), []).append(r)
    out = []
    for group, members in by_group.items():
        for k in range(0, len(members), batch_size):
            chunk = tuple(members[k : k + batch_size])
            blob = '\n'.join(f'{task}/{item_id(it)}' for task, it in chunk)
            digest = hashlib.sha256(blob.encode()).hexdigest()[:8]
            out.append(Batch(f's{seed}/{group}/{k // batch_size}/{digest}', seed, group,
                             len(out), chunk))  # fmt: skip
    return out


def rotation(methods: Sequence, index: int) -> list:
    """The method order of batch `index`: the plan's order rotated by `index`, so over
    len(methods) batches every method runs once at every place of a batch's round."""
    shift = index % len(methods)
    return list(methods[shift:]) + list(methods[:shift])


def interleave(
    batches: Sequence[Batch], methods: Sequence, needs: Callable[[Batch, object], bool]
) -> list[tuple[Batch, object, int]]:
    """(batch, method, place in the batch's round) in the order they run: each batch by
    every method that `needs` it (a method with a row of the batch not yet done reruns the
    whole batch, so its seconds stay those of these rows) before the next batch."""
    return [(b, m, place) for b in batches for place, m in enumerate(rotation(methods, b.index))
            if needs(b, m)]  # fmt: skip
