"""The paper's chain setup (PAPER.md §1.4, §1.7, §7.2): Qwen2.5-72B-Instruct with a
Qwen2.5-0.5B-Instruct draft, gamma 10, T 0.7, max_new_tokens 2048, three seeds; MATH,
MBPP+, INCLUDE and BFCL parallel_multiple with the paper's grids.

    python launch/evaluate.py --config configs/experiments/qwen25_72b_chain.py --dry_run
    python launch/evaluate.py --config configs/experiments/qwen25_72b_chain.py \
        --config.model=/models/Qwen2.5-72B-Instruct --config.draft=/models/Qwen2.5-0.5B-Instruct

Needs the weights (hub ids below, or local HF directories) and accelerators that hold a 72B
model in bf16 (about 145 GB); runs on this repository's meshes once the mesh issue lands.
The paper ran GPTQ-Int8 checkpoints, which spec_jax does not read: the bf16 weights of the
same models are used. The paper's MATH is the first 500 *train* rows of competition_math;
ours is the first 500 of the MATH test set (`source` may name a local file of those rows).
The two embedding tables differ in size (152,064 and 151,936 rows; the paper clamps both to
the smaller): spec_jax fits the draft's to the target's (drafters.fit_vocab).
"""

import ml_collections

from spec_jax.jobs import evaluate

GRIDS = {  # PAPER.md §1.7.
    'lenience': ('l', (0.2, 0.4, 0.6, 0.8)),
    'cos': ('lam', (0.2, 0.4, 0.6, 0.8)),
    'minp_verify': ('rho', (0.1, 0.3, 0.5, 0.7, 0.9)),  # SpecCascade (Fast-HSD chain rule)
    'eta_verify': ('eta', (0.05, 0.1, 0.15, 0.2, 0.25)),  # Medusa (lossy eta)
}


def paper_grid() -> tuple[str, ...]:
    """Every rule at every grid value; the plan adds min-p + SD and eta + SD at each."""
    return tuple(f'{rule}:{name}={v}' for rule, (name, values) in GRIDS.items() for v in values)


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
    c.temperature = 0.7
    c.grid = paper_grid()
    c.seeds = (0, 1, 2)
    c.max_new_tokens = 2048
    c.max_prompt_len = 2048
    c.prompt_bucket = 256
    c.batch_size = 8
    c.tasks.math = evaluate.task(500, 2048, 'hub')
    c.tasks.mbppplus = evaluate.task(378, 2048, 'hub')
    c.tasks.include = evaluate.task(220, 2048, 'hub')
    c.tasks.bfcl_parallel_multiple = evaluate.task(200, 2048)  # The bfcl-eval wheel's data.
    return c
