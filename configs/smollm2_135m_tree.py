"""EAGLE-3 tree decoding on the embedded default with its shipped head.

    python launch/generate.py --config configs/smollm2_135m_tree.py
    python launch/generate.py --config configs/smollm2_135m_tree.py \
        --config.spec.rule='minp_verify:rho=0.3' --config.sampling.temperature=0.7
    python launch/generate.py --config configs/smollm2_135m_tree.py --config.spec.baseline=True \
        --config.spec.rule='minp_verify:rho=0.3'   # its matched baseline (target truncated)
    python launch/generate.py --config configs/smollm2_135m_tree.py:accel   # TPU/GPU shape
    python launch/generate.py --config configs/smollm2_135m_tree.py:static  # a fixed tree
    python launch/generate.py --config configs/smollm2_135m_tree.py:tiny    # random models

Tree shape (spec.tree; docs/engine.md, "Tree rounds"): `nodes` M verified per round (the
root included), `depth` (the most drafts a round accepts), `branch` (the head's top-k per
expanded node and the frontier per level). On this CPU a verification of M tokens costs
1.5x (M 2) to 2.3x (M 16) a one-token step (XLA:CPU's small-M matmul), so the default is
small: M 8, depth 4, branch 2 (configs/bench_tree.py measures others). On TPU/GPU
verifying dozens of tokens costs about one step: `:accel` is EAGLE's (60 nodes, EAGLE
depth 5 = depth 6 here, top-k 10), in bf16.
The head (spec_jax/assets/drafts/smollm2_135m_eagle3) was trained with
launch/train_draft.py and configs/smollm2_135m_eagle3.py.
"""

import ml_collections

from spec_jax import checkpoints, decoding
from spec_jax.jobs import generate

ARGS = ('', 'tiny', 'accel', 'static')


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = arg or ''
    if arg not in ARGS:
        raise ValueError(f'unknown config arg {arg!r}; valid: {ARGS}')
    c = generate.default_config(tiny=arg == 'tiny')
    c.spec.mode, c.spec.drafter, c.spec.lookup = 'tree', 'eagle3', 0
    c.spec.draft = 'random' if arg == 'tiny' else checkpoints.EAGLE3_HEAD
    c.spec.tree = decoding.tree_config(nodes=8, depth=4, branch=2)
    if arg == 'accel':
        c.dtype = 'bfloat16'
        c.spec.tree = decoding.tree_config(nodes=60, depth=6, branch=10)
    elif arg == 'static':  # Two root children, two under the best, one under each of those.
        c.spec.tree = decoding.tree_config(static='0,0,1,1,3,4')
    return c
