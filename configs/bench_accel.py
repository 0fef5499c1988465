"""The accelerator bench at a preset's real shapes, in about three minutes (spec_jax/jobs/
bench_accel.py): the rounds first (the tree round's target call is the cost model's test),
then the verify-cost curve at the points that decide the model's form, then the AR decode
loop, each measured beside its upper-bound and calibrated prediction.

    python launch/bench.py --config configs/bench_accel.py:llama3_1_8b --workdir /tmp/accel
    python launch/bench.py --config configs/bench_accel.py:cpu  # this CPU's curve (minutes)
    python launch/bench.py --config configs/bench_accel.py:tiny    # every step, CPU (CI)

The argument is a model preset (spec_jax.models.config.PRESETS): its own shapes and
vocabulary in bf16, weights drawn on the device; 'tiny' runs in fp32 on a CPU, and 'cpu' is
the embedded default (smollm2_135m) in fp32 at CPU shapes (bf16 is 7-10x slower under
XLA:CPU): the CPU's calibration (spec_jax/assets/costs/). Writes <workdir>/bench_accel.json:
one record per step, with its provenance (commit, config, jax, device, the calibration
compared with).
"""

import ml_collections

from spec_jax.models.config import PRESETS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = arg or 'llama3_1_8b'
    if arg not in PRESETS and arg != 'cpu':
        raise ValueError(f"unknown config arg {arg!r}; valid: {sorted(PRESETS) + ['cpu']}")
    tiny, cpu = arg == 'tiny', arg == 'cpu'
    small = tiny or cpu  # On a CPU: fp32, smaller shapes than an accelerator's.
    c = ml_collections.ConfigDict()
    c.kinds = ('accel',)  # spec_jax.jobs.bench.BENCHES
    c.preset = 'smollm2_135m' if cpu else arg
    c.dtype = 'float32' if small else 'bfloat16'
    c.seed = 0
    c.chip = ''  # A spec_jax.costs.chips name for the predictions ('' = the device's own).
    c.budget_s = {'tiny': 180.0, 'cpu': 900.0}.get(arg, 180.0)  # Steps past it are skipped.
    c.first_compile_s = 2.0 if small else 40.0  # The budget's guess until a compile is seen.
    # Layers under one scan: a compile a fraction of the unrolled one's (32 layers), for a
    # budget the unrolled compiles would not fit; the timing is then the scanned program's.
    c.scan_layers = False
    c.guess_step_s = 0.01  # The budget's guess of one timed call.
    # Timed calls a point (their median): this CPU's first calls of a program run up to
    # 1.5x slow, and 3 calls gave a T 1 forward 1.65x too slow (docs/performance.md).
    c.rounds = {'tiny': 3, 'cpu': 9}.get(arg, 5)
    c.prompt_len = 16 if tiny else 128
    c.round_modes = ('tree', 'chain')  # First: the tree round's target call is the test.
    c.round_batch = 1 if small else 8
    c.num_draft = 3 if tiny else 5  # The chain round's gamma.
    # (nodes, depth, branch): EAGLE's at 8B on an accelerator.
    c.tree = {'tiny': (4, 2, 2), 'cpu': (16, 4, 4)}.get(arg, (60, 6, 10))
    c.draft_vocab = 0 if small else 32000  # The head's draft vocabulary (0: the target's).
    # The verify curve: batches x T less the skipped points (batch 8 at T 1, 16, 64 and
    # batch 1 at T 1, 64 decide the form of the cost model: spec_jax/costs/fit.py).
    c.slots = 128 if tiny else (1024 if cpu else 4096)  # Half filled; padded to the chip's.
    c.verify_batches = (8, 1)
    # The CPU's also at T 2, 3 and 5: at batch 1 its curve steps at T 2 (a GEMM after the
    # matrix-vector product at T 1: costs/efficiency.py's matvec fraction).
    c.verify_tokens = {'tiny': (1, 4, 16), 'cpu': (1, 2, 3, 5, 16, 64)}.get(arg, (1, 16, 64))
    c.verify_skip = ((1, 4),) if tiny else ((1, 16),)
    c.ar_batches = (1, 8)
    c.ar_new_tokens = 8 if tiny else 64
    return c
