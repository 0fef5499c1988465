"""The evaluation runner: every method of a plan on every task, one JSONL line per sample.

Data flow (docs/eval.md):

  config --plan--> methods (AR, lossless SD, the grid's rules, their matched baselines)
         --tasks--> items (chat prompts, gold) --tokenizer--> prompt ids
  for seed, batch of B (task, item) rows of one task group (`plan_batches`):
    for method in its group's design (`timing.interleave`), unless done:
      warm-up, the first time a program runs     the same rows, 2 tokens, untimed (`warmup`)
      generate(engine of the method, ...)        decoding on device, noise per (seed, item)
    the drift monitor: AR on a group's first batch before it and after its last round
    score(item, text) of the round in threads    after the round: no scoring while timed
    ResultStore.append(row)                      one line per (method, task, item, seed)
  several processes: each runs its share of the items (`process_share`) into its own
      results file, or (mesh.hosts 'all') all decode every batch and process 0 writes;
      a barrier, then process 0 merges the files (records.ResultStore.merge)
  metrics.aggregate(rows) -> report.write_report(...)

One target and drafter are loaded once; a method is `engine.replace(rule=..., baseline=...)`,
so a rule's parameter values and its matched baseline reuse one compiled loop (rule
parameters are traced), and short last batches are padded to B rows that stop after one
token. Every batch is decoded by every method before the next batch starts, in its task
group's balanced design, so a machine whose speed drifts slows all methods alike and each
method's seconds on a batch pair with AR's on the same rows (`spec_jax.eval.timing`); the
decode and prefill seconds are read from an injectable `clock` (tests give a fake one)
less JAX's compile seconds, each program run once untimed before its first timed call
(`warmup`: a first execution costs more), and each row records the invocation, host and
start time that decoded it (`records.PROVENANCE`). A row's noise depends only on (seed,
task, item id), so every method meets the same random numbers on the same item (common
random numbers sharpen the paired comparisons), and a resumed run redoes a sample as an
uninterrupted one would (exactly so with drafters whose tokens do not depend on the batch;
prompt lookup's filler drafts do, docs/engine.md).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import itertools
import threading
import time
from collections.abc import Callable

import jax
import ml_collections
from tqdm import tqdm

from spec_jax import data_files, decoding, distributed, rules
from spec_jax.decoding import batching
from spec_jax.eval import plan as plan_lib
from spec_jax.eval import sandbox, timing, warmup
from spec_jax.eval import tasks as tasks_lib
from spec_jax.eval.records import PROVENANCE, ResultStore, row_key
from spec_jax.eval.stats import design
from spec_jax.eval.tasks.base import Item, Task

SPEC_MODES = ('chain', 'tree')
PER_ROW_STATS = ('blocks', 'drafted', 'accepted', 'emitted', 'full_blocks', 'full_accepted',
                 'full_drafted', 'reached', 'accepted_at_position', 'reached_at_position')
METER_SUMS = ('metered', 'tv_sum', 'kl_sum', 'outside_sum', 'overshoot_sum', 'kl_inf',
              'overshoot_inf', 'max_overshoot', 'metered_at_offset', 'tv_at_offset',
              'js_sum', 'tv_plain_sum', 'overlap_sum')  # fmt: skip
Items = dict[str, tuple[Task, list[Item]]]  # Task name -> (the task, its items).


def monitor(name: str) -> plan_lib.Method:
    """The drift monitor's call `name`: AR re-timed on a group's first batch."""
    return plan_lib.Method(name, 'ar', 'lossless')


def sample_id(task: str, item_id: str) -> int:
    """A stable id in [0, 2**31) of an item: its noise is fold_in(PRNGKey(seed), id)."""
    digest = hashlib.sha256(f'{task}/{item_id}'.encode()).digest()
    return int.from_bytes(digest[:4], 'little') & 0x7FFFFFFF


def methods_of(c: ml_collections.ConfigDict) -> list[plan_lib.Method]:
    """The plan of an experiment config (see `spec_jax.jobs.evaluate.default_config`)."""
    if c.mode not in SPEC_MODES:
        raise ValueError(f'mode={c.mode!r} is not one of {SPEC_MODES}')
    return plan_lib.plan(list(c.grid), c.mode)


def task_limits(c: ml_collections.ConfigDict) -> dict[str, dict]:
    """{task name: {'limit', 'max_new_tokens', 'source', 'options'}} of a config, names
    checked."""
    out = {}
    for name, spec in c.tasks.items():
        if name not in tasks_lib.TASKS:
            raise ValueError(f'tasks.{name}: unknown task; valid: {sorted(tasks_lib.TASKS)}')
        limit, new = int(spec.limit), int(spec.max_new_tokens)
        if limit < 0 or new < 1:
            raise ValueError(f'tasks.{name}: limit must be >= 0 and max_new_tokens >= 1')
        if new > c.max_new_tokens:
            raise ValueError(
                f'tasks.{name}.max_new_tokens={new} exceeds max_new_tokens='
                f'{c.max_new_tokens} (the output buffer); raise max_new_tokens'
            )
        out[name] = dict(limit=limit, max_new_tokens=new, source=spec.get('source', ''),
                         options=dict(spec.get('options', None) or {}))  # fmt: skip
    if not out:
        raise ValueError('tasks is empty: name at least one task')
    return out


def load_items(c: ml_collections.ConfigDict) -> Items:
    """Each task of the config with its first `limit` items.

    Raises:
      ValueError: a task with fewer items than its limit (a sample where the full set was
        meant), naming where it was read.
    """
    out = {}
    for name, spec in task_limits(c).items():
        task = tasks_lib.make(name, c.data_root, **spec['options'])
        its = task.load(spec['source'], spec['limit'])
        if len(its) < spec['limit']:
            where = spec['source'] or f'the data root ({data_files.data_root(c.data_root)})'
            raise ValueError(
                f'tasks.{name}: {len(its)} items in {where}, fewer than its limit '
                f'{spec["limit"]}; point data_root (or ${data_files.ENV_VAR}) at the full set, '
                f'use source "hub", or lower the limit'
            )
        out[name] = (task, its)
    return out


def decoding_block(c: ml_collections.ConfigDict) -> ml_collections.ConfigDict:
    """The `decoding.build` block of an experiment config (the lossless engine)."""
    block = ml_collections.ConfigDict()
    block.model, block.dtype, block.seed = c.model, c.dtype, c.seed
    block.weights, block.scan_layers = c.weights, c.scan_layers
    block.max_new_tokens = c.max_new_tokens
    block.max_prompt_len, block.prompt_bucket = c.max_prompt_len, c.prompt_bucket
    block.sampling = decoding.sampling_config(c.temperature)
    block.spec = decoding.spec_config(c.mode, c.draft)
    for field in ('drafter', 'num_draft', 'ngram', 'lookup', 'draft_seed', 'draft_sharding',
                  'tree'):  # fmt: skip
        block.spec[field] = c[field]
    # A config from before `adaptive` keeps the block's default (off).
    block.spec.adaptive = c.get('adaptive', block.spec.adaptive)
    block.spec.meter_distortion = c.meter_distortion
    block.mesh = c.mesh
    return block


def engine_for(base: decoding.Engine, method: plan_lib.Method) -> decoding.Engine:
    """The engine of one method: AR drops the drafter (the tree, the adaptive sizing); the
    others set rule and baseline."""
    if method.mode == 'ar':
        return base.replace(drafter=None, num_draft=0, tree=None, adaptive=None,
                            rule=rules.Lossless(), baseline=False)  # fmt: skip
    return base.replace(rule=rules.make(method.rule), baseline=method.baseline)


@dataclasses.dataclass
class Progress:
    """What a run did: samples of the plan written (the drift monitor's rows apart),
    generated tokens, decode, prefill, compile (warm-ups' included) and scoring seconds,
    warm-up calls and their seconds beyond compile, timed calls that compiled (0 when every
    program was warmed) and that scoring overlapped (0 by construction: scoring waits for
    a batch's round to end; counted to show it)."""

    samples: int = 0
    tokens: int = 0
    decode_s: float = 0.0
    prefill_s: float = 0.0
    compile_s: float = 0.0
    compiled: int = 0
    cache_hits: int = 0
    warmups: int = 0
    warmup_s: float = 0.0
    cold_calls: int = 0
    score_s: float = 0.0
    overlapped: int = 0
    wall_s: float = 0.0

    @property
    def throughput_ratio(self) -> float | None:
        """Tokens/s over the run's wall time (compiles excepted) against tokens/s of its
        decode calls alone: what scoring, sandboxing and writing cost the decoding."""
        busy = self.wall_s - self.compile_s
        return self.decode_s / busy if busy > 0 and self.decode_s > 0 else None


def run(
    c: ml_collections.ConfigDict, workdir: str, clock: Callable[[], float] = time.perf_counter
) -> tuple[ResultStore, list[plan_lib.Method], Progress]:
    """Runs (or resumes) experiment `c` in `workdir`; returns the store, plan and progress.

    `clock` times the decode calls: `decoding.generate` reads it three times per scheduled
    (batch, method) of `schedule` (before the prefill call, after it, after the rounds),
    and nothing else reads it (a test's fake clock can therefore hand out the seconds of
    each; the warm-ups, `spec_jax.eval.warmup`, run on the wall clock). JAX's compile
    seconds are taken off it.

    On several processes (spec_jax/distributed.py) each decodes its share of the items
    (`process_share`) into its own results file, or with a mesh over every host
    (`c.mesh.hosts='all'`) all decode every batch together and process 0 writes; after a
    barrier process 0 merges the results files, and its store then holds every result.

    Raises:
      ValueError: a bad config (mode, grid, task names, limits) before any model loads.
      records.ConfigMismatchError: `workdir` holds another config's results and `c.mix`
        is not set.
    """
    methods = methods_of(c)
    limits = task_limits(c)
    # A mesh over every host ('all') runs every batch on all processes together; process 0
    # alone scores and writes. Otherwise each process decodes its share on its own devices.
    spans_hosts = c.mesh.get('hosts', 'local') == 'all'
    items = load_items(c) if spans_hosts else process_share(load_items(c))
    store = ResultStore(
        workdir, c.to_dict(), [dataclasses.asdict(m) for m in methods], mix=bool(c.mix),
        process=(jax.process_index(), jax.process_count()),
    )  # fmt: skip
    if spans_hosts:  # Every process must build the same batches: process 0's view.
        store.done = {tuple(key) for key in distributed.from_main(sorted(store.done))}
    progress = Progress()
    if not all(store.is_done((m.name, name, it.id, seed)) for seed in c.seeds
               for name, (_, its) in items.items() for it in its for m in methods):  # fmt: skip
        writes = distributed.is_main() or not spans_hosts
        _decode_and_score(c, items, limits, methods, store, progress, writes, clock)
    # Every process has written its share; process 0 merges the results files.
    distributed.barrier(f'evaluate:{workdir}')
    if distributed.is_main():
        store.merge()
    return store, methods, progress


def process_share(items: Items) -> Items:
    """This process's share of the items (all of them with one process): every
    process_count-th (task, item) in config order, so each sample's methods and seeds run
    on one process and a restarted run gives each process the same share."""
    rows = [(name, it) for name, (_, its) in items.items() for it in its]
    mine = distributed.share(rows)
    return {name: (task, [it for n, it in mine if n == name]) for name, (task, _) in items.items()}


def _decode_and_score(
    c: ml_collections.ConfigDict,
    items: Items,
    limits: dict[str, dict],
    methods: list[plan_lib.Method],
    store: ResultStore,
    progress: Progress,
    writes: bool = True,
    clock: Callable[[], float] = time.perf_counter,
) -> None:
    """Decodes every batch of `items` not yet in `store`, scoring and writing each sample
    (unless `writes` is off: a process of a mesh over several hosts other than process 0)."""
    built = decoding.build(decoding_block(c))
    tok = built.tokenizer
    encoded = {
        (name, it.id): tok.encode_chat(list(it.messages))
        for name, (_, its) in items.items()
        for it in its
    }
    check_prompts(built.engine, encoded, c)
    entries = schedule(c, methods, items, store, lambda r: len(encoded[r[0], r[1].id]))
    start, compiles = time.perf_counter(), timing.CompileClock()
    scoring, warm = Scoring(), warmup.WarmUp(compiles)

    def compile_free() -> float:  # The clock less what JAX has spent compiling so far.
        return clock() - compiles.total()

    bar = tqdm(total=len(entries), desc='evaluate', unit='batch', disable=not c.progress)
    with concurrent.futures.ThreadPoolExecutor(max(1, c.score_workers)) as pool:
        # A batch's round (its methods; a one-batch group's monitor too), then its scoring.
        for _, round_ in itertools.groupby(enumerate(entries), key=lambda e: e[1][0].id):
            pending = []
            for slot, (planned, method, place) in round_:
                bar.set_postfix_str(f'{method.name} seed {planned.seed}', refresh=False)
                rows = _decode(c, built, encoded, limits, planned, method, place, slot,
                               compile_free, compiles, scoring, progress, warm)  # fmt: skip
                bar.update()
                if writes:  # Else process 0 scores and writes this batch.
                    pending += [(items[r['task']][0], it, r) for it, r in rows
                                if not store.is_done(row_key(r))]  # fmt: skip
            began = time.perf_counter()
            for done in pool.map(lambda job: scoring.score(*job), pending):
                store.append([done])
            progress.score_s += time.perf_counter() - began
            progress.samples += sum(not timing.is_monitor(r['method']) for _, _, r in pending)
    bar.close()
    progress.warmups, progress.warmup_s = warm.calls, warm.seconds
    progress.overlapped = scoring.overlapped
    progress.wall_s = time.perf_counter() - start


class Scoring:
    """Scores samples (`_scored`; the drift monitor's rows are not scored) and counts the
    timed decode calls that began or ended while a sample was being scored."""

    def __init__(self):
        self._lock, self._active, self.overlapped = threading.Lock(), 0, 0

    def score(self, task: Task, item: Item, row: dict) -> dict:
        if timing.is_monitor(row['method']):
            return dict(row, correct=None, extracted=None, detail={})
        with self._lock:
            self._active += 1
        try:
            return _scored(task, item, row['text'], row)
        finally:
            with self._lock:
                self._active -= 1

    def check(self) -> None:
        """Called as a timed call begins and ends."""
        with self._lock:
            self.overlapped += self._active > 0


def _decode(c, built, encoded, limits, planned, method, place, slot, clock, compiles, scoring,
            progress, warm) -> list[tuple[Item, dict]]:  # fmt: skip
    """Decodes one scheduled (batch, method), its program warmed first; its (item, row)s."""
    seed, batch = planned.seed, list(planned.rows)
    ids = [encoded[name, it.id] for name, it in batch]
    pad = padded_size(len(ids), c.batch_size) - len(ids)
    engine, prompts = engine_for(built.engine, method), ids + ids[-1:] * pad
    warmed = warm.before(engine, built.params, prompts, seed)
    with compiles.measure() as compiled:
        scoring.check()
        result = decoding.generate(
            engine, built.params, prompts, seed=seed, clock=clock,
            max_new_tokens=[limits[name]['max_new_tokens'] for name, _ in batch] + [1] * pad,
            sample_ids=[sample_id(name, it.id) for name, it in batch] + [0] * pad,
        )  # fmt: skip
        scoring.check()
    # The clock less JAX's compile seconds: the seconds of decoding, and of its prefill.
    decode_s = max(result.seconds, 0.0)
    prefill_s = min(max(result.prefill_seconds, 0.0), decode_s)
    out = result.tokens[: len(batch)]
    num_tokens = sum(len(t) for t in out)
    progress.tokens += num_tokens
    progress.decode_s += decode_s
    progress.prefill_s += prefill_s
    progress.compile_s += compiled.seconds + warmed.compile_s
    progress.compiled += compiled.compiled + warmed.compiled
    progress.cache_hits += compiled.cache_hits + warmed.cache_hits
    progress.cold_calls += warmed.cold or compiled.compiled + compiled.cache_hits > 0
    timing_row = dict(
        id=planned.id, seconds=decode_s, prefill_s=prefill_s, compile_s=compiled.seconds,
        warmup_s=warmed.seconds, warmup_compile_s=warmed.compile_s, warmed=warmed.warmed,
        cold=warmed.cold, rows=len(batch), pad=pad, tokens=num_tokens, slot=slot, place=place,
        unit=design.unit(planned.number, planned.group_size), **PROVENANCE,
    )  # fmt: skip
    per_row = result.stats['per_row']
    # A row's share of its batch's decode time: by its target forwards (prefill and
    # rounds), so its tokens/s reflects its own acceptance.
    forwards = [per_row['blocks'][row] + 1 for row in range(len(batch))]
    tok = built.tokenizer
    return [(it, dict(
        method=method.name, task=name, item=it.id, seed=seed,
        text=tok.decode(tokens, skip_special=True), num_tokens=len(tokens), batch=timing_row,
        batch_id=planned.id, seconds=decode_s * forwards[row] / sum(forwards),
        stats={k: per_row[k][row] for k in PER_ROW_STATS + METER_SUMS if k in per_row},
    )) for row, ((name, it), tokens) in enumerate(zip(batch, out))]  # fmt: skip


def plan_batches(
    c: ml_collections.ConfigDict,
    seed: int,
    items: Items,
    prompt_len: Callable[[tuple[str, Item]], int],
) -> list[timing.Batch]:
    """The batches of (task, item) rows of one seed, done or not (`timing.batch_plan`).

    A batch holds rows of one task group, sorted by prompt bucket, then token limit, then
    prompt length: its rows fall in one bucket (its prefill and cache are as long as its
    longest prompt) and stop at about the same step (a finished row still costs its share
    of every step: a step at batch 10 is compute-bound on CPU); only a group's last batch
    is short (the caller pads it to `padded_size`).
    """
    limits = task_limits(c)

    def key(r):
        bucket = batching.prompt_bucket_of(prompt_len(r), c.prompt_bucket, c.max_prompt_len)
        return (bucket, limits[r[0]]['max_new_tokens'], prompt_len(r), r[0], r[1].id)

    rows = [(name, it) for name, (_, its) in items.items() for it in its]
    return timing.batch_plan(rows, seed, c.batch_size, key)


def schedule(
    c: ml_collections.ConfigDict,
    methods: list[plan_lib.Method],
    items: Items,
    store: ResultStore,
    prompt_len: Callable[[tuple[str, Item]], int],
) -> list[tuple[timing.Batch, plan_lib.Method, int]]:
    """(batch, method, place in the batch's round) in the order the run decodes them: seed
    by seed, each batch by every method with a row of it not yet in `store`, in its task
    group's design (`timing.interleave`), and the drift monitor's calls (`monitor`): AR
    again on each group's first batch before its round and after the group's last."""

    def needs(batch: timing.Batch, m: plan_lib.Method) -> bool:
        return not all(store.is_done((m.name, name, it.id, batch.seed)) for name, it in batch.rows)

    return [entry for seed in c.seeds for entry in timing.interleave(
        plan_batches(c, seed, items, prompt_len), methods, needs, monitor)]  # fmt: skip


def padded_size(rows: int, batch_size: int) -> int:
    """The batch a short batch of `rows` runs at: the smallest of B, ceil(B/2), ceil(B/4),
    ..., 1 that holds it. Each size is one more compiled loop (per rule kind and bucket),
    but a few rows padded to B would cost B rows of prefill and of every step (a step at
    batch 10 is compute-bound on CPU; 2 CNN/DM prompts at bucket 768 padded to 10 cost 31 s
    of prefill in the README's run)."""
    sizes = sorted({-(-batch_size // 2**k) for k in range(batch_size.bit_length() + 1)})
    return next(s for s in sizes if s >= rows)


def check_prompts(engine: decoding.Engine, encoded: dict, c: ml_collections.ConfigDict):
    """Every prompt fits `max_prompt_len`, and the largest bucket fits the models' context,
    before anything compiles (a clear error naming the item and the knobs)."""
    longest = 0
    for (name, item_id), ids in encoded.items():
        if len(ids) > c.max_prompt_len:
            raise ValueError(
                f'{name} item {item_id}: its prompt has {len(ids)} tokens, more than '
                f'max_prompt_len={c.max_prompt_len}; raise max_prompt_len or lower the '
                f"task's limit"
            )
        longest = max(longest, len(ids))
    engine.check(batching.prompt_bucket_of(longest, c.prompt_bucket, c.max_prompt_len))


def _scored(task: Task, item: Item, text: str, row: dict) -> dict:
    """The result line of one sample; a scorer that raises scores it wrong (the error in
    `detail`), so one bad item cannot stop every resumed run at the same place. A sandbox
    too weak to score code (`sandbox.WeakSandboxError`) is the machine's, not the sample's:
    it stops the run with its message instead of scoring every sample wrong."""
    if not getattr(task, 'scored', True):
        return dict(row, correct=None, extracted=None, detail={})
    try:
        score = task.score(item, text)
    except sandbox.WeakSandboxError:
        raise
    except Exception as e:  # noqa: BLE001  (any scorer failure is this sample's)
        return dict(row, correct=False, extracted=None, detail={'error': repr(e)})
    return dict(row, correct=bool(score.correct), extracted=score.extracted, detail=score.detail)


def results(store: ResultStore) -> list[dict]:
    """The store's rows, one per sample key (what metrics aggregate)."""
    return sorted(store.rows, key=row_key)
