"""The paper's tree setup (docs/paper.md §1, §4, §5.1): Llama-3.1-8B-Instruct with its
public EAGLE-3 head, the paper's tree (total_token 60, depth 5, top_k 10: "block size 7"),
T 0.7, max_new_tokens 2048, one run; MATH, MBPP+, INCLUDE and BFCL parallel_multiple.

    python launch/evaluate.py --config configs/experiments/llama31_8b_eagle3.py --dry_run

Matched baselines follow the tree convention (the target truncated, the deterministic
draft tree not). EAGLE's depth 5 counts expansions after the first level: the tree here is
`tree_config(nodes=60, depth=6, branch=10)`. CoS has no tree form in the paper's code and
none here (docs/engine.md, "Tree rounds"), so it is not in this grid.
"""

import ml_collections

from spec_jax import decoding
from spec_jax.eval import paper
from spec_jax.jobs import evaluate


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, ''):
        raise ValueError(f"unknown config arg {arg!r}; valid: ''")
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
    return evaluate.paper_setup(c)
