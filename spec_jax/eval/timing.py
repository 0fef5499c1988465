"""Timing an evaluation on a machine that does not hold still: the compile clock, the batch
plan and the interleaved schedule (docs/eval.md, timing).

A shared machine's speed drifts (other work starts and stops), so methods run one after
another would each meet a different machine. The runner therefore decodes one batch of rows
with every method (AR included) before the next batch starts, in an order its task group's
design sets (`spec_jax.eval.stats.design`: every method's places sum alike over the group,
each pair of batches relabelled at random from the seed): drift lands on every method
alike, and each method's seconds on a batch can be set against AR's seconds on the very
same rows (`spec_jax.eval.stats.paired.speedup`).

  batch_plan(...)     the deterministic batches of one seed: rows of one task group each
  order               the methods in the order a batch runs them (`stats.design`)
  interleave(...)     (batch, method) in the order they run, skipping what is done, and
                      the drift monitor (AR again on a group's first batch at its start
                      and its end, `START_MONITORS`, `END_MONITORS`)
  drift(rows)         the monitor's reading: AR on the same rows at a group's start and
                      end, a median of MONITOR_CALLS calls at each
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
import statistics
import threading
from collections.abc import Callable, Iterator, Sequence

from jax import monitoring

from spec_jax.eval.stats import design

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
# The drift monitor (`interleave`, `drift`): AR timed on a group's first batch
# MONITOR_CALLS times at each end, each end read as the median of its calls (a host burst
# moves one call, not the median): at the start AR's own call in the batch's round and the
# START_MONITORS just before that round, at the end the END_MONITORS after the group's last
# round. Their method names keep their rows apart in a store.
MONITOR = 'ar_monitor'
MONITOR_CALLS = 3
START_MONITORS = tuple(f'{MONITOR}_start_{k}' for k in range(2, MONITOR_CALLS + 1))
END_MONITORS = (MONITOR,) + tuple(f'{MONITOR}_end_{k}' for k in range(2, MONITOR_CALLS + 1))
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

    @staticmethod
    def total() -> float:
        """Seconds JAX has spent making executables in this process so far (a clock less
        this is a clock of everything else)."""
        return _totals['seconds']

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
      id: 's<seed>/<group>/<number>/<hash of the rows>': the same batch gets the same id in
        every run of the same config, and no other batch gets it.
      index: its place among all batches of its seed.
      number: its place among its group's batches (0 .. group_size - 1), and group_size
        their count: the batch's method order (`order`).
    """

    id: str
    seed: int
    group: str
    index: int
    rows: tuple
    number: int = 0
    group_size: int = 1


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
        size = -(-len(members) // batch_size)
        for k in range(size):
            chunk = tuple(members[k * batch_size : (k + 1) * batch_size])
            blob = '\n'.join(f'{task}/{item_id(it)}' for task, it in chunk)
            digest = hashlib.sha256(blob.encode()).hexdigest()[:8]
            out.append(Batch(f's{seed}/{group}/{k}/{digest}', seed, group, len(out), chunk,
                             k, size))  # fmt: skip
    return out


def order(methods: Sequence, batch: Batch) -> list:
    """The methods in the order they decode `batch` (`stats.design.design` of its seed and
    group)."""
    orders = design.design(len(methods), batch.group_size, batch.seed, batch.group)
    return [methods[i] for i in orders[batch.number]]


def is_monitor(method: str) -> bool:
    """Whether a row's method name is one of the drift monitor's calls (not a sample)."""
    return method in START_MONITORS or method in END_MONITORS


def interleave(
    batches: Sequence[Batch],
    methods: Sequence,
    needs: Callable[[Batch, object], bool],
    monitor: Callable[[str], object] | None = None,
) -> list[tuple[Batch, object, int]]:
    """(batch, method, place in the batch's round) in the order they run: each batch by
    every method that `needs` it (a method with a row of the batch not yet done reruns the
    whole batch, so its seconds stay those of these rows), in its group's design (`order`),
    before the next batch. With a `monitor` (a monitor name -> AR under that name), the
    drift monitor's calls on each group's first batch: START_MONITORS just before its round
    (places -2, -1), END_MONITORS after the group's last round (places len(methods), ...):
    AR's seconds on the same rows at the group's start and at its end."""
    out = []
    for k, b in enumerate(batches):
        if monitor is not None and b.number == 0:
            starts = [monitor(name) for name in START_MONITORS]
            out += [(b, m, place - len(starts)) for place, m in enumerate(starts) if needs(b, m)]
        out += [(b, m, place) for place, m in enumerate(order(methods, b)) if needs(b, m)]
        last = k + 1 == len(batches) or (batches[k + 1].seed, batches[k + 1].group) != (
            b.seed, b.group)  # fmt: skip
        first = batches[k - b.number] if k >= b.number else None
        if monitor is not None and last and first is not None and first.number == 0:
            ends = [monitor(name) for name in END_MONITORS]
            out += [(first, m, len(methods) + place) for place, m in enumerate(ends)
                    if needs(first, m)]  # fmt: skip
    return out


def drift(rows: Sequence[dict]) -> dict[str, dict]:
    """The drift monitor's reading per (seed, group), from a run's rows: AR's tokens/s on a
    group's first batch at the group's start ('start': the median of AR's call in its round
    and the START_MONITORS' calls) and at its end ('end': the median of the END_MONITORS'
    calls after the group's last round), their ratio end / start (> 1: the machine sped
    up), each end's calls' rates ('start_rates', 'end_rates', sorted), the scheduled calls
    between AR's call and the first end call ('calls') and whether one invocation timed them
    all ('same_invocation'). Keys 's<seed>/<group>'; groups without both readings are left
    out."""
    sums: dict[tuple[str, str], list] = {}
    slots: dict[tuple[str, str], int] = {}
    invocation: dict[tuple[str, str], str | None] = {}
    for r in rows:
        if (r['method'] != 'ar' and not is_monitor(r['method'])) or r.get('batch_id') is None:
            continue
        key = (r['batch_id'], r['method'])
        acc = sums.setdefault(key, [0, 0.0])
        acc[0] += r['num_tokens']
        acc[1] += r['seconds']
        b = r.get('batch') or {}
        slots[key], invocation[key] = b.get('slot', 0), b.get('invocation')

    def rates(batch_id: str, names: Sequence[str]) -> list[float]:
        return sorted(sums[batch_id, m][0] / sums[batch_id, m][1] for m in names
                      if sums.get((batch_id, m), (0, 0.0))[1] > 0)  # fmt: skip

    out = {}
    for batch_id in sorted({b for b, m in sums if m in END_MONITORS}):
        start, end = rates(batch_id, ('ar',) + START_MONITORS), rates(batch_id, END_MONITORS)
        if not start or not end:
            continue
        seed, group = batch_id.split('/')[:2]
        a, z = statistics.median(start), statistics.median(end)
        timed = [m for b, m in sums if b == batch_id]
        first_end = min(slots[batch_id, m] for m in END_MONITORS if (batch_id, m) in slots)
        out[f'{seed}/{group}'] = dict(
            start=a, end=z, ratio=z / a, start_rates=start, end_rates=end,
            calls=first_end - slots.get((batch_id, 'ar'), first_end),
            same_invocation=len({invocation[batch_id, m] for m in timed}) == 1)  # fmt: skip
    return out


def _reading(rate: float, rates: Sequence[float]) -> str:
    """One end of a drift reading: its median and, over several calls, their range."""
    if len(rates) == 1:
        return f'{rate:.1f} (one call)'
    return f'{rate:.1f} (median of {len(rates)} calls, {rates[0]:.1f}-{rates[-1]:.1f})'


def drift_lines(rows: Sequence[dict]) -> dict[str, str]:
    """`drift` as header items: {'drift_<seed>/<group>': text}."""
    return {f'drift {key}': (
        f"AR {_reading(d['start'], d['start_rates'])} tokens/s at the start, "
        f"{_reading(d['end'], d['end_rates'])} at the end on the same rows "
        f"(x{d['ratio']:.3f}, a ratio of medians: no interval; {d['calls']} calls apart"
        + ('' if d['same_invocation'] else '; two invocations') + ')')
        for key, d in drift(rows).items()}  # fmt: skip
