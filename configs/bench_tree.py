"""Benchmark EAGLE-3 tree decoding against AR and chain decoding with the same head.

    python launch/bench.py --config configs/bench_tree.py
    python launch/bench.py --config configs/bench_tree.py --config.data_root=/path/to/data
    python launch/bench.py --config configs/bench_tree.py:tiny    # random models, seconds

Prints, per temperature (0, 0.7) and batch (1, 2, 4, 8, 16): AR, chain and tree tokens/s,
the tree's speedup over AR and over the chain, acceptance lengths (tokens per target
forward, the bonus counted), the cost of a round in AR tokens and the speedup ceiling, and
the field's speed table (per-position acceptance, TTFT, TPOT; a lossy rule's TV and matched
baseline); the tree round's engine overhead; then, at equal verified width (tree M = chain A
+ 1 for A = 3, 5, 7), acceptance lengths with 95% intervals over the prompts and of their
per-prompt difference; then tokens/s of a few tree shapes (the best one on this machine). On
this CPU verifying M tokens costs 1.5x (M 2) to 2.3x (M 16) a one-token step, so a tree's
speedup over AR is capped near its ceiling, not its acceptance length (docs/performance.md).
"""

import ml_collections

from spec_jax import checkpoints, decoding


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('tree',)  # spec_jax.jobs.bench.BENCHES
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'
    c.seed = 0
    c.draft = 'random' if tiny else checkpoints.EAGLE3_HEAD  # An EAGLE-3 head directory.
    c.rule = 'lossless'
    c.num_draft = 3  # The chain's gamma in the speed table.
    # The tree in the speed table (tiny: the equal-width tree, so its loop is reused).
    c.tree = decoding.tree_config(*((4, 3, 2) if tiny else (8, 4, 2)))
    c.data_root = ''  # speed/<set>.jsonl (spec_jax/data_files.py); '' = bundled samples.
    c.sets = ('mt_bench', 'humaneval', 'gsm8k', 'alpaca', 'sum', 'qa')
    if tiny:  # The tiny model's context (512) is shorter than a CNN/DM article.
        c.sets = ('mt_bench', 'gsm8k')
    c.prompts_per_set = 1 if tiny else 2
    c.max_new_tokens = 8 if tiny else 96
    c.max_prompt_len = 1024
    c.prompt_bucket = 64
    c.temperatures = (0.0,) if tiny else (0.0, 0.7)
    # The speed sweep (SPEED-Bench's batch axis; on an accelerator up to 64:
    # --config.batches='(1,2,4,8,16,32,64)'). A batch past the prompt count repeats prompts.
    c.batches = (1,) if tiny else (1, 2, 4, 8, 16)
    c.rounds = 1 if tiny else 2
    c.overhead = True
    # Equal verified width: chain A against a tree of A + 1 nodes: (A, the tree at T 0, the
    # tree at T > 0) as 'dynamic:depth,branch' or 'static:' / 'iid:' / 'distinct:' + the
    # parents of nodes 1..A (`bench_tree.width_tree`). At T > 0 EAGLE's deterministic
    # siblings accept c with P(c), a chain's sampled draft with min(1, p/q), so there the
    # tree's siblings are drawn from q without replacement: the chain of A - 1 with a
    # second draw for the first token (A 3, 5), three root draws (A 7).
    c.width_trees = (
        (3, 'dynamic:3,2', 'distinct:0,1,0'),
        (5, 'dynamic:4,2', 'distinct:0,1,2,3,0'),
        (7, 'dynamic:5,2', 'distinct:0,1,2,0,1,0,4'),
    )
    if tiny:
        c.width_trees = c.width_trees[:1]
    c.width_prompts_per_set = 1 if tiny else 4  # More prompts for the intervals.
    c.width_seeds = (1,) if tiny else (1, 2)
    # Tree shapes (nodes, depth, branch) timed at T 0, batch 1.
    c.shapes = ((4, 3, 2),) if tiny else (
        (4, 3, 2), (6, 4, 2), (8, 4, 2), (8, 6, 2), (12, 5, 3), (16, 6, 4)
    )  # fmt: skip
    # A jax.profiler trace of profile_rounds rounds after warm-up (spec_jax/jobs/profile.py).
    c.profile_dir = ''
    c.profile_rounds = 3
    return c
