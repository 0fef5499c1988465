"""Distortion and overshoot of every rule family over its parameter, on the speed sets
(no task scores): the paper's grids (docs/paper.md §4) on the embedded default, T 0.7.

    python launch/evaluate.py --config configs/experiments/smollm2_135m_distortion.py
    python launch/evaluate.py --config configs/experiments/smollm2_135m_distortion.py:perfect
        # the target as its own draft (q = p): truncation distortion does not vanish
    python launch/evaluate.py --config configs/experiments/smollm2_135m_distortion.py:tiny

Expected (the theory, rules/theory.py): CoS's TV and overshoot grow with lambda; lenience's
overshoot stays under its ceiling 1/l; min-p and eta verification keep a TV floor against
their matched baselines as the draft improves (chain: (1 - p(A))^2 at q = p). Prompt lookup
is off, so every draft comes from the draft model's own law.
"""

import ml_collections

from spec_jax import checkpoints
from spec_jax.jobs import evaluate

SPEED_SETS = ('mt_bench', 'humaneval', 'gsm8k', 'alpaca', 'sum', 'qa')
GRID = (
    'lenience:l=0.2', 'lenience:l=0.4', 'lenience:l=0.6', 'lenience:l=0.8',
    'cos:lam=0.2', 'cos:lam=0.4', 'cos:lam=0.6', 'cos:lam=0.8',
    'minp_verify:rho=0.1', 'minp_verify:rho=0.5', 'minp_verify:rho=0.9',
    'eta_verify:eta=0.05', 'eta_verify:eta=0.25',
)  # fmt: skip


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny', 'perfect'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny', 'perfect'")
    tiny = arg == 'tiny'
    c = evaluate.default_config(tiny=tiny)
    c.name = 'smollm2_135m_distortion' + (f'_{arg}' if arg else '')
    if not tiny:
        c.draft = 'embedded' if arg == 'perfect' else checkpoints.DRAFT_LM
    c.num_draft = 3
    c.grid = GRID
    if arg == 'perfect':  # The truncation rules only: their floor is the point.
        c.grid = tuple(g for g in GRID if g.startswith(('minp', 'eta')))
    c.batch_size = 4 if tiny else (10 if arg == 'perfect' else 12)
    c.max_new_tokens = 12 if tiny else 64
    for name in SPEED_SETS:
        # CNN/DM articles exceed the tiny model's context (and cost the perfect draft's
        # slow rounds a long prefill).
        if not (arg in ('tiny', 'perfect') and name == 'sum'):
            c.tasks[f'speed_{name}'] = evaluate.task(1 if tiny else 2, c.max_new_tokens)
    c.prompt_bucket = 256 if not tiny else 384
    c.max_prompt_len = 1024 if not tiny else 384
    return c
