"""The accelerator bench at a preset's real shapes, in about three minutes (spec_jax/jobs/
bench_accel.py): the AR decode loop, the verify-cost curve, chain and tree rounds, each
measured beside its upper-bound and calibrated prediction.

    python launch/bench.py --config configs/bench_accel.py:llama3_1_8b --workdir /tmp/accel
    python launch/bench.py --config configs/bench_accel.py:tiny    # seconds, on CPU (CI)

The argument is a model preset (spec_jax.models.config.PRESETS): its own shapes and
vocabulary in bf16, weights drawn on the device; 'tiny' runs in fp32 on a CPU. Writes
<workdir>/bench_accel.json: one record per step.
"""

import ml_collections

from spec_jax.models.config import PRESETS


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = arg or 'llama3_1_8b'
    if arg not in PRESETS:
        raise ValueError(f'unknown config arg {arg!r}; valid: {sorted(PRESETS)}')
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('accel',)  # spec_jax.jobs.bench.BENCHES
    c.preset = arg
    c.dtype = 'float32' if tiny else 'bfloat16'
    c.seed = 0
    c.chip = ''  # A spec_jax.costs.chips name for the predictions ('' = the device's own).
    c.budget_s = 60.0 if tiny else 180.0  # Steps that would overrun it are skipped.
    c.first_compile_s = 2.0 if tiny else 40.0  # The budget's guess until a compile is seen.
    # Layers under one scan: a compile a fraction of the unrolled one's (32 layers), for a
    # budget the unrolled compiles would not fit; the timing is then the scanned program's.
    c.scan_layers = False
    c.guess_step_s = 0.01  # The budget's guess of one timed call.
    c.rounds = 3 if tiny else 5
    c.prompt_len = 16 if tiny else 128
    c.ar_batches = (1, 8)
    c.ar_new_tokens = 8 if tiny else 64
    c.slots = 128 if tiny else 4096  # Cache slots of the verify-cost curve (half filled).
    c.verify_batches = (1, 8)
    c.verify_tokens = (1, 2, 4, 8) if tiny else (1, 2, 4, 8, 16, 32, 48, 64)
    c.round_batch = 1 if tiny else 8
    c.round_modes = ('chain', 'tree')
    c.num_draft = 3 if tiny else 5  # The chain round's gamma.
    c.tree = (8, 4, 2) if tiny else (60, 6, 10)  # (nodes, depth, branch): EAGLE's at 8B.
    c.draft_vocab = 0 if tiny else 32000  # The head's draft vocabulary (0: the target's).
    return c
