"""Warm-up: every program a timed decode call runs has run once, untimed, before it
(docs/eval.md, "Warm-up").

The first execution of a freshly compiled or freshly loaded XLA executable costs more than
its later ones, beyond the compile (or persistent-cache load) seconds JAX reports and the
runner takes off the clock (docs/performance.md, "First execution", measures it). Left in
a timed call, it lands on whichever method decodes a shape first, and the drift monitor
reads it as the machine speeding up (x1.7 on a quiet machine, issue 49). So before each
timed call whose program has not run yet, the runner decodes the call's own rows once with
a limit of `TOKENS` tokens a row (the prefill call, then one round: both of `generate`'s
programs execute at the call's shapes), output discarded, timed on the wall clock and
reported apart (`Span`), never on the experiment's clock.

A program is what `jax.jit` keys an executable on (`program_key`): the engine's pytree
structure (rule kind, drafter, tree, sampler kind: its static part) with the types of its
leaves (rule parameters, the baseline flag and sampler values are traced, so a sweep over
them shares one program), the batch's rows and its prompt bucket.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

import jax

from spec_jax import decoding
from spec_jax.decoding import batching
from spec_jax.eval import timing

# A warm-up's limit per row: the prefill's token, then one round of the rounds loop.
TOKENS = 2


def program_key(engine: decoding.Engine, prompts: Sequence[Sequence[int]]) -> tuple:
    """What selects the compiled programs of `decoding.generate(engine, params, prompts)`
    in one run (fixed weights and mesh): the engine's tree structure and leaf types, the
    number of prompts (B) and their prompt bucket (P)."""
    leaves, structure = jax.tree.flatten(engine)
    dec = engine.decode
    bucket = batching.prompt_bucket_of(max(len(p) for p in prompts), dec.prompt_bucket,
                                       dec.max_prompt_len)  # fmt: skip
    return structure, tuple(str(jax.typeof(x)) for x in leaves), len(prompts), bucket


@dataclasses.dataclass
class Span:
    """One warm-up before a timed call: whether one ran, `seconds` beyond compile (the
    first executions), `compile_s` what JAX spent making its executables; `cold`: the
    timed call is its program's first execution (warm-ups off: `WarmUp.enabled`)."""

    warmed: bool = False
    cold: bool = False
    seconds: float = 0.0
    compile_s: float = 0.0
    compiled: int = 0
    cache_hits: int = 0


class WarmUp:
    """Runs each program once before its first timed call (`before`), counting what that
    cost: `calls`, `seconds` (beyond compile) and `compile_s`, over its life (one run).
    With `enabled` off (tests: what warm-ups remove) it only marks first executions."""

    enabled = True

    def __init__(self, compiles: timing.CompileClock):
        self.compiles = compiles
        self.done: set[tuple] = set()
        self.calls, self.seconds, self.compile_s = 0, 0.0, 0.0

    def before(
        self, engine: decoding.Engine, params: decoding.Params,
        prompts: Sequence[Sequence[int]], seed: int,
    ) -> Span:  # fmt: skip
        """Decodes `prompts` with `engine` once, `TOKENS` a row, output discarded, unless
        their program has run; returns what it cost."""
        key = program_key(engine, prompts)
        first = key not in self.done
        self.done.add(key)
        if not first or not self.enabled:
            return Span(cold=first)
        limit = min(TOKENS, engine.decode.max_new_tokens)
        with self.compiles.measure() as compiled:
            start = time.perf_counter()
            decoding.generate(engine, params, prompts, seed=seed, max_new_tokens=limit)
            seconds = time.perf_counter() - start
        span = Span(warmed=True, seconds=max(seconds - compiled.seconds, 0.0),
                    compile_s=compiled.seconds, compiled=compiled.compiled,
                    cache_hits=compiled.cache_hits)  # fmt: skip
        self.calls += 1
        self.seconds += span.seconds
        self.compile_s += span.compile_s
        return span


def summary(rows: Sequence[dict]) -> str | None:
    """The report header's 'compile and warm-up' item from a run's rows (each timed call's
    record, `runner._decode`): compile seconds (the warm-ups' and the timed calls'), the
    warm-ups and their seconds beyond compile, and the timed calls that ran a program cold
    (0 when every program was warmed); None for rows from before warm-ups."""
    calls = {}
    for r in rows:
        b = r.get('batch') or {}
        if 'warmed' in b:
            calls[r['batch_id'], r['method'], b.get('invocation')] = b
    if not calls:
        return None
    warmed = [b for b in calls.values() if b['warmed']]
    compile_s = sum(b['compile_s'] + b['warmup_compile_s'] for b in calls.values())
    cold = sum(b['cold'] or b['compile_s'] > 0 for b in calls.values())
    return (f'{compile_s:.1f} s compiling or loading executables (off the clock); '
            f'{len(warmed)} warm-up calls ({TOKENS} tokens a row, untimed) ran programs '
            f'before their first timed call, {sum(b["warmup_s"] for b in warmed):.1f} s '
            f'beyond their compiles; {cold} of {len(calls)} timed calls ran a program cold '
            '(its first execution, or a compile)')  # fmt: skip
