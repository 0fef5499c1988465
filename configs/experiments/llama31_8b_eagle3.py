"""The paper's tree setup (PAPER.md §1.4, §1.7, §7.1): Llama-3.1-8B-Instruct with its
public EAGLE-3 head, the paper's tree (total_token 60, depth 5, top_k 10: "block size 7"),
T 0.7, max_new_tokens 2048, one run; MATH, MBPP+, INCLUDE and BFCL parallel_multiple.

    python launch/evaluate.py --config configs/experiments/llama31_8b_eagle3.py --dry_run

Tree verification joins the engine with the EAGLE-3 tree issue (19): until then the dry
run prints the plan (matched baselines in the tree convention: the target truncated, the
deterministic draft tree not) and a run stops with that message. CoS has no tree form in
the paper's code and is not in this grid.
"""

import ml_collections

from spec_jax.jobs import evaluate

GRIDS = {  # PAPER.md §1.7 (the tree rows of §7.1).
    'lenience': ('l', (0.2, 0.4, 0.6, 0.8)),
    'minp_verify': ('rho', (0.1, 0.3, 0.5, 0.7, 0.9)),  # SpecCascade
    'eta_verify': ('eta', (0.05, 0.1, 0.15, 0.2, 0.25)),  # Typical (lossy eta)
}


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
    c.tree.total_tokens, c.tree.depth, c.tree.top_k = 60, 5, 10
    c.num_draft = 6  # Tree depth in drafted levels (root + 6: "block size 7").
    c.temperature = 0.7
    c.grid = tuple(f'{r}:{n}={v}' for r, (n, values) in GRIDS.items() for v in values)
    c.seeds = (0,)
    c.max_new_tokens = 2048
    c.max_prompt_len = 2048
    c.prompt_bucket = 256
    c.batch_size = 8
    c.tasks.math = evaluate.task(500, 2048, 'hub')
    c.tasks.mbppplus = evaluate.task(378, 2048, 'hub')
    c.tasks.include = evaluate.task(220, 2048, 'hub')
    c.tasks.bfcl_parallel_multiple = evaluate.task(200, 2048)
    return c
