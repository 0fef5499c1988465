"""Benchmark AR decoding and verify cost on the embedded default.

    python launch/bench.py --config configs/bench.py
    python launch/bench.py --config configs/bench.py:tiny   # seconds, random tiny model

Prints: the memory-bandwidth bound of a decode step, the cost of a forward over
1, 2, 4, 8, 16 new tokens relative to 1, and AR tokens/s at batch 1 and 8 with their
ratio to the bound.
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('forward', 'ar')  # spec_jax.jobs.bench.BENCHES
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'
    c.seed = 0
    c.rounds = 3 if tiny else 15
    c.slots = 256 if tiny else 512  # Cache slots while timing the forward.
    c.verify_tokens = (1, 2, 4, 8, 16)
    c.bandwidth_bytes = (32 if tiny else 512) << 20
    c.ar_batches = (1, 8)
    c.ar_new_tokens = 8 if tiny else 128
    c.ar_prompt_len = 16 if tiny else 64
    c.ar_rounds = 2 if tiny else 3
    # A jax.profiler trace of profile_rounds rounds after warm-up (spec_jax/jobs/profile.py).
    c.profile_dir = ''
    c.profile_rounds = 3
    return c
