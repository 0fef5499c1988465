"""The paper's chain setup (docs/paper.md §1, §4, §5.2): Qwen2.5-72B-Instruct with a
Qwen2.5-0.5B-Instruct draft, gamma 10, T 0.7, max_new_tokens 2048, three seeds; MATH,
MBPP+, INCLUDE and BFCL parallel_multiple with the paper's grids.

    python launch/evaluate.py --config configs/experiments/qwen25_72b_chain.py --dry_run
    python launch/evaluate.py --config configs/experiments/qwen25_72b_chain.py \
        --config.model=/models/Qwen2.5-72B-Instruct --config.draft=/models/Qwen2.5-0.5B-Instruct

Needs the weights (hub ids below, or local HF directories) and accelerators that hold a 72B
model in bf16 (about 145 GB); runs on this repository's meshes once the mesh issue lands.
The paper ran GPTQ-Int8 checkpoints, which spec_jax does not read: the bf16 weights of the
same models are used. The tasks read the paper's own items (`paper.TASK_SOURCES`: source
'fast_hsd' for MATH, the first 500 *train* rows of competition_math, 240 bundled and the rest
from the hub; INCLUDE's exact 220; BFCL's 200; MBPP+ v0.2.0 from the hub).
The two embedding tables differ in size (152,064 and 151,936 rows; the paper clamps both to
the smaller): spec_jax fits the draft's to the target's (drafters.fit_vocab).
"""

import ml_collections

from spec_jax.eval import paper
from spec_jax.jobs import evaluate


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, ''):
        raise ValueError(f"unknown config arg {arg!r}; valid: ''")
    c = evaluate.default_config()
    c.name = 'qwen25_72b_chain'
    c.model = 'Qwen/Qwen2.5-72B-Instruct'
    c.draft = 'Qwen/Qwen2.5-0.5B-Instruct'
    c.dtype = 'bfloat16'
    c.mode = 'chain'
    c.num_draft = 10
    c.grid = paper.grid(paper.GRIDS)  # Every rule at every value.
    c.seeds = (0, 1, 2)
    return evaluate.paper_setup(c)
