"""The accelerator bench: a preset's real shapes in minutes, measured beside both predictions
(configs/bench_accel.py; `launch/bench.py --config configs/bench_accel.py:llama3_1_8b`).

Weights are drawn on the device at the preset's own shapes and vocabulary (no checkpoint,
no tokenizer, nothing drawn on the host), an EAGLE-3 head beside them for the chain and
tree rounds. Steps run in the order of what decides the cost model
(spec_jax/costs/calibration.py), one KV cache alive at a time, and a step whose expected
seconds (its programs' compiles, each at its kind's last compile time, else the slowest
seen, plus its timed calls) would overrun `c.budget_s` is skipped and recorded as skipped
(`c.scan_layers` compiles the layers under one scan, for a tight budget):

1. `tree`, `chain` (`c.round_modes`, in order): one round at `c.round_batch` on the state
   after prefill, its target forward and its drafter each jitted alone
   (`bench_chain.round_overhead`, `bench_tree.tree_overhead`; 4 programs): the round's
   time, and outside the target and draft forwards `outside_ms` and `share_outside` (both
   0 where the parts timed alone sum past the round: `parts_over_round` says by how much).
   The tree round's target call is the cost model's test: never fitted for its prediction;
2. `verify`: one cached forward over T new tokens a row at each point of
   `c.verify_batches` x `c.verify_tokens` less `c.verify_skip` (batch 8 T 1, 16, 64 and
   batch 1 T 1, 64: the points that decide the model's form), its cache made, timed
   `c.rounds` calls (donated and carried, as inside a decode loop) and freed before the next
   (1 program each);
3. `ar`: the on-device AR decode loop at each batch of `c.ar_batches`: a step is the rounds
   call's seconds over its `c.ar_new_tokens - 1` rounds (the prefill, timed apart, draws
   the first token; 2 programs: `prefill_call`, `rounds_call`).

Cache slots are padded to the chip's multiple (`Chip.slot_multiple`: 128 on accelerators)
through the output buffer. Each record: step, shapes, measured_ms, predicted_ms
{upper_bound, calibrated} (spec_jax/costs/calibration.py: the analytic roofline at the
chip's peaks, and the calibrated time where the chip is calibrated; a CPU is a chip too),
fraction_of_bound (upper bound / measured), compile_s (JAX's own compile clock over the
step), programs (how many it compiled), and per step kind its extras. Written to
`<workdir>/bench_accel.json` with the device, chip, jax version, commit, config and the
calibration it compares with (`spec_jax.costs.points.from_bench` reads it back as points).
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from spec_jax import decoding, sharding
from spec_jax.costs import calibration, chips, memory
from spec_jax.decoding.drafters import Eagle3Drafter
from spec_jax.decoding.trees import TreeShape
from spec_jax.eval import machine
from spec_jax.jobs import bench_chain, bench_tree
from spec_jax.jobs.timing import CompileClock
from spec_jax.models import eagle3 as e3
from spec_jax.models.cache import KVCache
from spec_jax.models.config import preset
from spec_jax.models.llama import forward, init_params

FIELDS = ('step', 'shapes', 'measured_ms', 'predicted_ms', 'fraction_of_bound', 'compile_s',
          'programs')
PROGRAMS = dict(ar=2, verify=1, chain=4, tree=4)  # Compiled programs a step of each kind.


def device_params(shapes, seed: int, std: float = 0.02, dtype: str = '') -> dict:
    """Random weights of a parameter tree in shapes, drawn on the default device: normal(std)
    matrices, norms near 1, biases near 0 (`testing.random_params`' law), in their own
    dtypes or `dtype` (a head is held in the compute dtype, as `load_head` casts it)."""
    draws, keys = {}, iter(range(1 << 30))

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        loc, scale = (1.0, 0.1) if 'norm' in name else (0.0, 0.1 if 'bias' in name else std)
        kind = (leaf.shape, dtype or str(leaf.dtype))
        if kind not in draws:  # One small compile a shape; the draw runs where jit places it.
            draws[kind] = jax.jit(lambda k, loc, scale, s=kind[0], d=kind[1]: (
                loc + scale * jax.random.normal(k, s, jnp.float32)).astype(d))  # fmt: skip
        return draws[kind](jax.random.fold_in(jax.random.PRNGKey(seed), next(keys)), loc, scale)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def build_models(c: ml_collections.ConfigDict):
    """(target cfg, target params, EAGLE-3 drafter, draft params), drawn on the device."""
    cfg = preset(c.preset).replace(dtype=c.dtype, param_dtype=c.dtype,
                                   scan_layers=bool(c.scan_layers))  # fmt: skip
    params = device_params(jax.eval_shape(init_params, cfg, jax.random.PRNGKey(0)), c.seed)
    head_cfg = e3.Eagle3Config.for_target(cfg, draft_vocab_size=c.draft_vocab or cfg.vocab_size)
    head_cfg = head_cfg.replace(dtype=c.dtype)
    d2t, t2d = e3.vocab_maps(np.arange(head_cfg.draft_vocab_size), cfg.vocab_size)
    head_params = device_params(memory.head_shapes(head_cfg), c.seed + 1, dtype=c.dtype)
    head = e3.Eagle3Head(head_cfg, head_params, jnp.asarray(d2t), jnp.asarray(t2d))
    drafter = Eagle3Drafter(head_cfg, sharding.draft_rules('batch'))
    return cfg, params, drafter, drafter.params_for(head, params)


class Budget:
    """Seconds left of `budget_s`, and whether a step of `compiles` compiles of its kind and
    `calls` timed calls of about `call_s` each still fits: a compile of a kind takes what
    that kind's last took, a kind not yet seen the slowest seen (`first_compile_s` before
    any)."""

    def __init__(self, budget_s: float, first_compile_s: float):
        self.start, self.budget_s, self.first = time.perf_counter(), budget_s, first_compile_s
        self.compile_s: dict[str, float] = {}

    def fits(self, kind: str, compiles: int, calls: int, call_s: float) -> bool:
        left = self.budget_s - (time.perf_counter() - self.start)
        each = self.compile_s.get(kind, max(self.compile_s.values(), default=self.first))
        return compiles * each + calls * call_s <= left

    def saw(self, kind: str, span, compiles: int) -> None:
        if compiles and span.seconds:
            self.compile_s[kind] = span.seconds / compiles


def record(step: str, shapes: dict, measured_s, plan: memory.Plan | None, chip, compile_s,
           programs: int = 0, **extra) -> dict:  # fmt: skip
    """One JSON record (module docstring); `plan` predicts the step on `chip` (a round of the
    step's mode: its engine work included)."""
    upper = cal = None
    if chip is not None and plan is not None:
        mode = step if step in ('ar', 'chain', 'tree') else ''
        pred = calibration.predict(plan, chip, mode=mode)
        upper, cal = pred['upper_bound_s'] * 1e3, pred['calibrated_s']
        cal = None if cal is None else cal * 1e3
    measured = None if measured_s is None else measured_s * 1e3
    fraction = upper / measured if (upper and measured) else None
    return dict(step=step, shapes=shapes, measured_ms=measured,
                predicted_ms=dict(upper_bound=upper, calibrated=cal),
                fraction_of_bound=fraction, compile_s=compile_s, programs=programs,
                **extra)  # fmt: skip


def verify_costs(report: dict, batch: int) -> dict[int, float]:
    """{T: measured seconds} of a report's verify-cost curve at `batch` (skipped steps left
    out): `decoding.tree_budget.interpolated` makes it a `verify_s`."""
    return {r['shapes']['T']: r['measured_ms'] / 1e3 for r in report['records']
            if r['step'] == 'verify' and r['shapes']['batch'] == batch and r['measured_ms']}


def _prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    return [[(7 * i + 3 * b) % (vocab - 2) + 1 for i in range(length)] for b in range(batch)]


def settings(c, multiple: int, room: int) -> decoding.DecodeSettings:
    """`c`'s prompt and new tokens, the output buffer grown so that the slots (prompt +
    buffer + a round's `room`: `Engine.slots`) are a multiple of `multiple`."""
    slots = -(-(c.prompt_len + c.ar_new_tokens + room) // multiple) * multiple
    buffer = slots - c.prompt_len - room
    return decoding.DecodeSettings(max_new_tokens=c.ar_new_tokens, prompt_bucket=c.prompt_len,
                                   max_prompt_len=c.prompt_len, new_tokens_bucket=buffer)


def ar_loop(c, cfg, params, batch: int, multiple: int):
    """(seconds a step of the on-device AR loop at `batch`, slots): the median over
    `c.rounds` runs of the rounds call's seconds (`decoding.generate` times the prefill
    apart) over its `c.ar_new_tokens - 1` rounds (the prefill draws the first token)."""
    engine = decoding.Engine(cfg, settings(c, multiple, 0))
    prompts = _prompts(batch, c.prompt_len, cfg.vocab_size)
    run = lambda: decoding.generate(engine, decoding.Params(params), prompts)  # noqa: E731
    run()  # Compiles both programs.
    steps = []
    for _ in range(c.rounds):
        result = run()
        steps.append((result.seconds - result.prefill_seconds) / (c.ar_new_tokens - 1))
    return float(np.median(steps)), engine.slots(c.prompt_len)


def verify_point(c, cfg, params, batch: int, tokens: int, slots: int) -> float:
    """Median seconds of a cached forward over `tokens` a row at `batch` rows and `slots`
    slots (half filled) over `c.rounds` calls after a compile call, the cache donated and
    carried from call to call as inside a decode loop, and freed at the end."""
    step = jax.jit(lambda params, x, cache: forward(
        cfg, params, x, cache.positions(x.shape[1]), cache,
        cache.causal_mask(x.shape[1]))[::2], donate_argnums=2)  # fmt: skip
    x = jnp.ones((batch, tokens), jnp.int32)
    cache = KVCache.init(cfg, batch, slots).set_lengths(jnp.full((batch,), slots // 2, jnp.int32))
    times = []
    for _ in range(c.rounds + 1):  # The first call compiles.
        start = time.perf_counter()
        logits, cache = step(params, x, cache)
        jax.block_until_ready(logits)
        times.append(time.perf_counter() - start)  # The call commits nothing: same lengths.
    del cache, logits
    return float(np.median(times[1:]))


def verify_points(c) -> list[tuple[int, int]]:
    """(batch, T) of the verify curve: `c.verify_batches` x `c.verify_tokens`, less
    `c.verify_skip`."""
    skip = {tuple(p) for p in c.verify_skip}
    return [(b, t) for b in c.verify_batches for t in c.verify_tokens if (b, t) not in skip]


def provenance(c, device, chip) -> dict:
    """What a report is: device, chip, jax version, commit, the config, and the calibration
    its predictions compare with."""
    cal = calibration.calibration(chip.name) if chip else None
    compared = dict(chip=chip.name if chip else None, calibrated=cal is not None,
                    describe=cal.describe() if cal else 'uncalibrated: upper bounds only',
                    fitted_on=list(cal.fitted_on) if cal else [],
                    file=calibration.CALIBRATED.get(chip.name) if chip else None)  # fmt: skip
    return dict(device=device.device_kind, platform=device.platform,
                chip=chip.name if chip else None, jax=jax.__version__,
                commit=machine.commit(), config=c.to_dict(), calibration=compared)  # fmt: skip


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the steps of the module docstring under `c.budget_s`; returns (and writes) the
    report {provenance..., preset, dtype, budget_s, seconds, records}."""
    device = jax.devices()[0]
    chip = chips.chip(c.chip) if c.chip else chips.of_device(device)
    multiple = chip.slot_multiple if chip else 1
    clock, budget = CompileClock(), Budget(c.budget_s, c.first_compile_s)
    cfg, params, drafter, draft_params = build_models(c)
    records = []
    head = provenance(c, device, chip)
    print(f'bench_accel on {device.device_kind} ({head["calibration"]["describe"]}); preset '
          f'{c.preset} in {c.dtype}, budget {c.budget_s:.0f} s')  # fmt: skip

    def skip(step, shapes):
        records.append(dict(record(step, shapes, None, None, None, None), skipped='budget'))
        print(f'  {step} {shapes}: skipped (over the {c.budget_s:.0f} s budget)')

    def report(r):
        records.append(r)
        p = r['predicted_ms']
        bound = '' if p['upper_bound'] is None else (
            f'; predicted {p["upper_bound"]:.3f} ms upper bound, ' + (
                'uncalibrated' if p['calibrated'] is None else f'{p["calibrated"]:.3f} calibrated')
            + f'; measured at {r["fraction_of_bound"]:.2f} of the bound\'s speed')  # fmt: skip
        print(f'  {r["step"]} at batch {r["shapes"]["batch"]} {r["shapes"]}: measured '
              f'{r["measured_ms"]:.3f} ms{bound}; {r["programs"]} programs compiled in '
              f'{r["compile_s"]:.1f} s')  # fmt: skip

    def timed(kind, shapes, calls, call_s, fn):
        """fn() under the budget and the compile clock, or the step skipped: (result, span)."""
        if not budget.fits(kind, PROGRAMS[kind], calls, call_s):
            skip(kind, shapes)
            return None, None
        with clock.measure() as span:
            out = fn()
        budget.saw(kind, span, PROGRAMS[kind])
        return out, span

    for mode in c.round_modes:
        _round(c, mode, cfg, params, drafter, draft_params, chip, multiple, timed, report)
    slots = chip.slots(c.slots) if chip else c.slots
    for batch, t in verify_points(c):
        shapes = dict(batch=batch, T=t, slots=slots)
        seconds, span = timed('verify', shapes, c.rounds + 1, c.guess_step_s,
                              lambda b=batch, t=t: verify_point(c, cfg, params, b, t, slots))
        if span is not None:
            plan = memory.Plan(cfg, batch, c.prompt_len, slots, t)
            report(record('verify', shapes, seconds, plan, chip, span.seconds, 1))
    for batch in c.ar_batches:
        shapes = dict(batch=batch, T=1, prompt=c.prompt_len, new_tokens=c.ar_new_tokens)
        out, span = timed('ar', shapes, 2 * (c.rounds + 1), c.ar_new_tokens * c.guess_step_s,
                          lambda b=batch: ar_loop(c, cfg, params, b, multiple))  # fmt: skip
        if span is not None:
            step_s, slots = out
            plan = memory.Plan(cfg, batch, c.prompt_len, slots, 1)
            report(record('ar', dict(shapes, slots=slots), step_s, plan, chip, span.seconds, 2,
                          tokens_per_s=batch / step_s))  # fmt: skip
    out = dict(head, preset=c.preset, dtype=c.dtype, budget_s=c.budget_s,
               seconds=time.perf_counter() - budget.start, records=records)  # fmt: skip
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_accel.json'), 'w') as f:
            json.dump(out, f, indent=2)
    return out


def _round(c, mode, cfg, params, drafter, draft_params, chip, multiple, timed, report):
    """The chain or tree round step at `c.round_batch` (module docstring)."""
    batch = c.round_batch
    tree = TreeShape(*c.tree) if mode == 'tree' else None
    width = tree.nodes if tree else c.num_draft + 1
    num_draft = c.num_draft if mode == 'chain' else 0
    room = tree.room if tree else num_draft + 1
    engine = decoding.Engine(cfg, settings(c, multiple, room), drafter, num_draft, tree=tree)
    slots = engine.slots(c.prompt_len)
    shapes = dict(batch=batch, T=width, prompt=c.prompt_len, slots=slots)
    if tree:
        shapes['tree'] = list(c.tree)
    ids = _prompts(batch, c.prompt_len, cfg.vocab_size)
    both = decoding.Params(params, draft_params)
    overhead = bench_tree.tree_overhead if tree else bench_chain.round_overhead
    parts, span = timed(mode, shapes, 3 * (c.rounds + 1) * 5, 2 * c.guess_step_s,
                        lambda: overhead(engine, both, ids, c.rounds))  # fmt: skip
    if span is None:
        return
    if tree:
        calls = (tree.path_len + 1,) + (tree.branch,) * (tree.levels_drafted - 1)
    else:
        calls = (c.num_draft + 1,) + (1,) * (c.num_draft - 1)
    plan = memory.Plan(cfg, batch, c.prompt_len, slots, width, head=drafter.cfg,
                       draft_calls=calls)  # fmt: skip
    round_ms, inside = parts['round_ms'], parts['forward_ms'] + parts['drafter_ms']
    outside = max(round_ms - inside, 0.0)
    report(record(mode, shapes, round_ms / 1e3, plan, chip, span.seconds, 4,
                  forward_ms=parts['forward_ms'], drafter_ms=parts['drafter_ms'],
                  outside_ms=outside, share_outside=outside / round_ms,
                  parts_over_round=max(inside / round_ms - 1, 0.0),
                  draft_calls=list(calls)))  # fmt: skip
