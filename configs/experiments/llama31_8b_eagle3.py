"""The paper's tree setup (docs/paper.md §1, §4, §5.1): Llama-3.1-8B-Instruct with its
public EAGLE-3 head, the paper's tree (total_token 60, depth 5, top_k 10: "block size 7"),
T 0.7, max_new_tokens 2048, one run; MATH, MBPP+, INCLUDE and BFCL parallel_multiple.

    python launch/evaluate.py --config configs/experiments/llama31_8b_eagle3.py --dry_run
    python launch/aot.py --config configs/experiments/llama31_8b_eagle3.py:v5e8 --topology v5e:2x4

The argument picks the hardware (batch 8, prompts and outputs up to 2048 tokens: 4,156
cache slots a row; per-chip memory from `launch/aot.py --dry_run`, spec_jax/costs/memory.py,
and docs/performance.md "Compiled for TPU"), bf16 throughout:

  ''     one device, as the paper's single GPU (the same as h100)
  v5e8   a v5e-8 slice (8 chips, one host), mesh 1 x 8, the head's attention split over
         'model' as the target's (draft_sharding 'heads'): the 60-node tree loop compiles
         to 7.5 GiB a chip of 16 (with the head whole on every chip its prefill's attention
         scores over 2,048 tokens were two 8.1 GiB buffers and the TPU compiler refused
         the loop: 20.8 GB of temporaries; docs/performance.md)
  v5e4   a v5e-4 slice, mesh 1 x 4, the head split as on v5e8
  h100   one H100 80 GB: estimated ~48 GiB (the prefill's attention scores of 8 rows x 2048
         tokens over 4,156 slots in fp32 are half of it): no GPU compile

Matched baselines follow the tree convention (the target truncated, the deterministic
draft tree not). EAGLE's depth 5 counts expansions after the first level: the tree here is
`tree_config(nodes=60, depth=6, branch=10)`. CoS has no tree form in the paper's code and
none here (docs/engine.md, "Tree rounds"), so it is not in this grid.
"""

import ml_collections

from spec_jax import decoding, sharding
from spec_jax.eval import paper
from spec_jax.jobs import evaluate

HARDWARE = {'': (1, 1), 'v5e8': (1, 8), 'v5e4': (1, 4), 'h100': (1, 1)}  # (data, model)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    arg = arg or ''
    if arg not in HARDWARE:
        raise ValueError(f'unknown config arg {arg!r}; valid: {tuple(HARDWARE)}')
    c = evaluate.default_config()
    c.name = 'llama31_8b_eagle3'
    c.model = 'meta-llama/Llama-3.1-8B-Instruct'
    c.drafter = 'eagle3'
    c.draft = 'yuhuili/EAGLE3-LLaMA3.1-Instruct-8B'
    c.dtype = 'bfloat16'
    c.mode = 'tree'
    c.tree = decoding.tree_config(nodes=60, depth=6, branch=10)  # Root + 6: "block size 7".
    c.grid = paper.grid(('lenience', 'minp_verify', 'eta_verify'))
    c.seeds = (0,)
    c = evaluate.paper_setup(c)
    c.mesh = sharding.mesh_config(*HARDWARE[arg])
    if HARDWARE[arg][1] > 1:  # The head's 8 KV heads split as the target's (its prefill).
        c.draft_sharding = 'heads'
    return c
