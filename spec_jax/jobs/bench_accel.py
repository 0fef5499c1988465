"""The accelerator bench: a preset's real shapes in minutes, measured beside both predictions
(configs/bench_accel.py; `launch/bench.py --config configs/bench_accel.py:llama3_1_8b`).

Weights are drawn on the device at the preset's own shapes and vocabulary (no checkpoint,
no tokenizer, nothing drawn on the host), an EAGLE-3 head beside them for the chain and
tree rounds. Steps run most valuable first, and a step whose expected seconds (its
compiles at its kind's last compile time, else the slowest seen, plus its timed calls)
would overrun `c.budget_s` is skipped and recorded as skipped (`c.scan_layers` compiles
the layers under one scan: a fraction of the unrolled compile, for a tight budget):

1. `ar`: the on-device AR decode loop at each batch of `c.ar_batches`: a step is the
   rounds call's seconds / `c.ar_new_tokens` (`decoding.generate` times the prefill apart);
2. `verify`: one cached forward over T new tokens a row, T in `c.verify_tokens`, at each
   batch of `c.verify_batches` (the verify-cost curve `decoding.tree_budget` reads);
3. `chain`, `tree` (`c.round_modes`): one round on the state after prefill, its target
   forward and its drafter each jitted alone (`bench_chain.round_overhead`,
   `bench_tree.tree_overhead`): the round's time and the share outside the target and
   draft forwards.

Each record: step, shapes, measured_ms, predicted_ms {upper_bound, calibrated} (the
analytic roofline at the chip's peaks, and spec_jax/costs/calibration.py's where the chip is
calibrated; None where no chip is known, e.g. a CPU), fraction_of_bound (upper bound /
measured), compile_s (JAX's own compile clock over the step), and per step kind its extras.
Written to `<workdir>/bench_accel.json` with the device, chip and jax version.
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
from spec_jax.jobs import bench_chain, bench_tree
from spec_jax.jobs.timing import CompileClock, interleaved_medians
from spec_jax.models import eagle3 as e3
from spec_jax.models.cache import KVCache
from spec_jax.models.config import preset
from spec_jax.models.llama import forward, init_params

FIELDS = ('step', 'shapes', 'measured_ms', 'predicted_ms', 'fraction_of_bound', 'compile_s')


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
           **extra) -> dict:  # fmt: skip
    """One JSON record (module docstring); `plan` predicts the step on `chip`."""
    upper = cal = None
    if chip is not None and plan is not None:
        pred = calibration.predict(plan, chip)
        upper, cal = pred['upper_bound_s'] * 1e3, pred['calibrated_s']
        cal = None if cal is None else cal * 1e3
    measured = None if measured_s is None else measured_s * 1e3
    fraction = upper / measured if (upper and measured) else None
    return dict(step=step, shapes=shapes, measured_ms=measured,
                predicted_ms=dict(upper_bound=upper, calibrated=cal),
                fraction_of_bound=fraction, compile_s=compile_s, **extra)  # fmt: skip


def verify_costs(report: dict, batch: int) -> dict[int, float]:
    """{T: measured seconds} of a report's verify-cost curve at `batch` (skipped steps left
    out): `decoding.tree_budget.interpolated` makes it a `verify_s`."""
    return {r['shapes']['T']: r['measured_ms'] / 1e3 for r in report['records']
            if r['step'] == 'verify' and r['shapes']['batch'] == batch and r['measured_ms']}


def _prompts(batch: int, length: int, vocab: int) -> list[list[int]]:
    return [[(7 * i + 3 * b) % (vocab - 2) + 1 for i in range(length)] for b in range(batch)]


def ar_loop(c, cfg, params, batch: int, clock: CompileClock):
    """(seconds a step of the on-device AR loop at `batch`, compile seconds, slots): the
    median over `c.rounds` runs of the rounds call's seconds (`decoding.generate` times the
    prefill apart) / new tokens."""
    settings = decoding.DecodeSettings(max_new_tokens=c.ar_new_tokens, prompt_bucket=c.prompt_len,
                                       max_prompt_len=c.prompt_len)  # fmt: skip
    engine = decoding.Engine(cfg, settings)
    prompts = _prompts(batch, c.prompt_len, cfg.vocab_size)
    run = lambda: decoding.generate(engine, decoding.Params(params), prompts)  # noqa: E731
    with clock.measure() as span:
        run()
    steps = []
    for _ in range(c.rounds):
        result = run()
        steps.append((result.seconds - result.prefill_seconds) / c.ar_new_tokens)
    return float(np.median(steps)), span.seconds, engine.slots(c.prompt_len)


def verify_curve(c, cfg, params, batch: int, tokens: tuple, clock: CompileClock) -> dict:
    """{T: (median seconds of a cached forward over T tokens a row, compile seconds)}: the
    cache donated and carried from call to call, as inside a decode loop."""
    step = jax.jit(lambda params, tokens, cache: forward(
        cfg, params, tokens, cache.positions(tokens.shape[1]), cache,
        cache.causal_mask(tokens.shape[1]))[::2], donate_argnums=2)  # fmt: skip
    caches, fns, compiles = {}, {}, {}
    for t in tokens:
        x = jnp.ones((batch, t), jnp.int32)
        caches[t] = KVCache.init(cfg, batch, c.slots).set_lengths(
            jnp.full((batch,), c.slots // 2, jnp.int32))

        def call(t=t, x=x):
            logits, caches[t] = step(params, x, caches[t])
            return logits

        with clock.measure() as span:
            jax.block_until_ready(call())
        fns[t], compiles[t] = call, span.seconds
    med = interleaved_medians(fns, c.rounds)
    return {t: (med[t], compiles[t]) for t in tokens}


def run(c: ml_collections.ConfigDict, workdir: str | None = None) -> dict:
    """Runs the steps of the module docstring under `c.budget_s`; returns (and writes) the
    report {device, chip, jax, budget_s, seconds, records}."""
    device = jax.devices()[0]
    chip = chips.chip(c.chip) if c.chip else chips.of_device(device)
    clock, budget = CompileClock(), Budget(c.budget_s, c.first_compile_s)
    cfg, params, drafter, draft_params = build_models(c)
    records = []
    cal = calibration.calibration(chip.name) if chip else None
    label = cal.describe() if cal else f'{chip.name if chip else device.platform} uncalibrated'
    print(f'bench_accel on {device.device_kind} ({label}); preset {c.preset} in {c.dtype}, '
          f'budget {c.budget_s:.0f} s')  # fmt: skip

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
        print(f'  {r["step"]} {r["shapes"]}: measured {r["measured_ms"]:.3f} ms{bound}; '
              f'compiles {r["compile_s"]:.1f} s')  # fmt: skip

    for batch in c.ar_batches:
        shapes = dict(batch=batch, T=1, prompt=c.prompt_len, new_tokens=c.ar_new_tokens)
        if not budget.fits('ar', 1, c.rounds + 1, c.ar_new_tokens * c.guess_step_s):
            skip('ar', shapes)
            continue
        with clock.measure() as span:
            step_s, compile_s, slots = ar_loop(c, cfg, params, batch, clock)
        budget.saw('ar', span, 1)
        plan = memory.Plan(cfg, batch, c.prompt_len, slots, 1)
        report(record('ar', dict(shapes, slots=slots), step_s, plan, chip, span.seconds,
                      tokens_per_s=batch / step_s))  # fmt: skip
    for batch in c.verify_batches:
        fitted = [t for i, t in enumerate(c.verify_tokens)
                  if budget.fits('verify', i + 1, c.rounds * (i + 1), c.guess_step_s)]  # fmt: skip
        for t in c.verify_tokens:
            if t not in fitted:
                skip('verify', dict(batch=batch, T=t, slots=c.slots))
        if not fitted:
            continue
        with clock.measure() as span:
            curve = verify_curve(c, cfg, params, batch, tuple(fitted), clock)
        budget.saw('verify', span, len(fitted))
        base = curve[fitted[0]][0]
        for t, (seconds, compile_s) in curve.items():
            plan = memory.Plan(cfg, batch, c.prompt_len, c.slots, t)
            report(record('verify', dict(batch=batch, T=t, slots=c.slots), seconds, plan, chip,
                          compile_s, of_first=seconds / base))  # fmt: skip
    for mode in c.round_modes:
        _round(c, mode, cfg, params, drafter, draft_params, chip, clock, budget, skip, report)
    out = dict(device=device.device_kind, chip=chip.name if chip else None, jax=jax.__version__,
               preset=c.preset, dtype=c.dtype, budget_s=c.budget_s,
               seconds=time.perf_counter() - budget.start, records=records)  # fmt: skip
    if workdir:
        os.makedirs(workdir, exist_ok=True)
        with open(os.path.join(workdir, 'bench_accel.json'), 'w') as f:
            json.dump(out, f, indent=2)
    return out


def _round(c, mode, cfg, params, drafter, draft_params, chip, clock, budget, skip, report):
    """The chain or tree round step at `c.round_batch` (module docstring)."""
    batch = c.round_batch
    tree = TreeShape(*c.tree) if mode == 'tree' else None
    width = tree.nodes if tree else c.num_draft + 1
    shapes = dict(batch=batch, T=width, prompt=c.prompt_len)
    if tree:
        shapes['tree'] = list(c.tree)
    if not budget.fits(mode, 4, 3 * c.rounds * 5, 2 * c.guess_step_s):  # init + 3 parts.
        skip(mode, shapes)
        return
    settings = decoding.DecodeSettings(max_new_tokens=c.ar_new_tokens, prompt_bucket=c.prompt_len,
                                       max_prompt_len=c.prompt_len)  # fmt: skip
    engine = decoding.Engine(cfg, settings, drafter, c.num_draft if mode == 'chain' else 0,
                             tree=tree)  # fmt: skip
    ids = _prompts(batch, c.prompt_len, cfg.vocab_size)
    both = decoding.Params(params, draft_params)
    with clock.measure() as span:
        if tree:
            parts = bench_tree.tree_overhead(engine, both, ids, c.rounds)
        else:
            parts = bench_chain.round_overhead(engine, both, ids, c.rounds)
    budget.saw(mode, span, 4)
    if tree:
        calls = (tree.path_len + 1,) + (tree.branch,) * (tree.levels_drafted - 1)
    else:
        calls = (c.num_draft + 1,) + (1,) * (c.num_draft - 1)
    plan = memory.Plan(cfg, batch, c.prompt_len, engine.slots(c.prompt_len), width,
                       head=drafter.cfg, draft_calls=calls)  # fmt: skip
    report(record(mode, dict(shapes, slots=plan.slots), parts['round_ms'] / 1e3, plan, chip,
                  span.seconds, forward_ms=parts['forward_ms'], drafter_ms=parts['drafter_ms'],
                  share_outside=parts['overhead']))  # fmt: skip
