"""Benchmark AR and chain decoding on one device against a data-parallel mesh.

    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python launch/bench.py --config configs/bench_mesh.py
    XLA_FLAGS=--xla_force_host_platform_device_count=8 \
        python launch/bench.py --config configs/bench_mesh.py:tiny   # random models

Prints tokens/s of AR and chain decoding at batch 8 on one device and on a 8 x 1 mesh
(data parallel: every device a row), their ratio, and the compile time of every entry
point (AR, chain and tree decode loops, the draft LM's and EAGLE-3 head's training steps).
With fake CPU devices sharing 2 cores the ratio is the mesh's overhead, not a speedup
(docs/sharding.md). On a TPU/GPU slice set --config.mesh.data to its device count.
"""

import ml_collections

from spec_jax import checkpoints, decoding, sharding


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('mesh',)  # spec_jax.jobs.bench.BENCHES
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'
    c.seed = 0
    c.draft = 'random:tiny' if tiny else checkpoints.DRAFT_LM  # The chain's draft LM.
    c.head = 'random' if tiny else checkpoints.EAGLE3_HEAD  # The tree's EAGLE-3 head.
    c.tree = decoding.tree_config(nodes=8, depth=4, branch=2)
    c.train_len = 64 if not tiny else 16  # Tokens per row of the training steps' batch.
    c.rule = 'lossless'
    c.num_draft = 3
    c.temperature = 0.0
    c.mesh = sharding.mesh_config(data=-1, model=1)  # Data parallel over every device.
    c.batch = 8
    c.data_root = ''  # speed/<set>.jsonl; '' = bundled samples.
    c.sets = ('mt_bench', 'gsm8k') if tiny else ('mt_bench', 'humaneval', 'gsm8k', 'alpaca')
    c.prompts_per_set = 2
    c.max_new_tokens = 8 if tiny else 64
    c.max_prompt_len = 512
    c.prompt_bucket = 64
    c.rounds = 1 if tiny else 3
    c.modes = ('ar',) if tiny else ('ar', 'chain')  # Tokens/s on one device and the mesh.
    # Compile times of (spec_jax.jobs.bench_mesh.ENTRY_POINTS): decode loops, train steps.
    c.entry_points = ('train_lm',) if tiny else ('ar', 'chain', 'tree', 'train_lm',
                                                        'train_eagle3')  # fmt: skip
    c.compilation_cache = 'off'  # Compile times are measured: no persistent cache loads.
    return c
