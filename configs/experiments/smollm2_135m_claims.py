"""The paper's six claims on the embedded default, claim by claim (issue 42; docs/claims.md).

    python launch/claims.py --config configs/experiments/smollm2_135m_claims.py
    python launch/claims.py --config configs/experiments/smollm2_135m_claims.py:tiny  # CI

Target SmolLM2-135M-Instruct (the main job's GGUF) with its shipped EAGLE-3 head, T 0.7,
the 16 speed prompts that fit one prompt bucket (the 10 of alpaca and 6 of qa; 16 >= the
verdicts' minimum of 10 items), 32 new tokens, one seed. Arms (`spec_jax.jobs.claims`):

  chain   the head as a chain, gamma 3: min-p and eta verification at two values each
          with their matched baselines (C2, C5), lenience and CoS (C4), the single-factor
          ablations at matched acceptance (lenience_flat beside lenience at l 0.5,
          interp_ceiling beside uniform_interp at w 0.5), and the budgeted rule tv_budget
          where `spec_jax.rules` has it; every rule's point against the distortion frontier
  tree    the same head as EAGLE's dynamic tree (8 nodes, depth 4, branch 2) on the same
          prompts and seeds: the truncation rules and lenience (C3's tree/chain ratios)
  dflash_chain, ddtree
          the trained DFlash drafter (`checkpoints.DFLASH_DRAFTER`) as a chain of 3 and as
          DDTree (its best-first tree under the same budget: 8 nodes, depth 4, branch 2),
          on the same prompts and seeds: the truncation rules in both (lenience beside
          them in the tree, as the tree arm): C3 asked of DDTree against the same drafter's
          chain, the pair that isolates the tree
  greedy  T 0: AR, chain and tree decoding, the DFlash chain and DDTree, token for token (C1)
  floors  the target as its own draft (q = p, `SelfDrafter`) in chain (gamma 3) and tree
          (the same shape) form under min-p verification, against the per-position floors
          of docs/laws.md §3.2-3.3 on the target's own p at the emitted positions (C3)

Every claim ends as one line, `C1:` .. `C6:`, shown / not shown / cannot be tested here,
with its numbers and intervals; `<workdir>/claims.md` holds them with their tables and
`frontier.png` beside it. Wall clock: docs/claims.md.
"""

import os

import ml_collections

from spec_jax import checkpoints, decoding, rules
from spec_jax.jobs import evaluate

TRUNCATION = ('minp_verify:rho=0.1', 'minp_verify:rho=0.3',
              'eta_verify:eta=0.05', 'eta_verify:eta=0.2')  # fmt: skip
LENIENCE, COS = 'lenience:l=0.5', 'cos:lam=0.4'
# The single-factor ablations (docs/laws.md §4.7), each pair at equal acceptance by
# construction: lenience_flat has lenience's, uniform_interp interp_ceiling's.
ABLATIONS = ('lenience_flat:l=0.5', 'interp_ceiling:w=0.5', 'uniform_interp:w=0.5')
# The budgeted rule (issue 42 item 2) at three budgets: the one whose mean TV is nearest
# lenience's is set beside it. Absent from a checkout without it.
BUDGETS = tuple(f'tv_budget:eps={e},l=0.5' for e in (0.02, 0.05, 0.1))
FLOOR_RULES = ('minp_verify:rho=0.1', 'minp_verify:rho=0.3')


def chain_grid() -> tuple[str, ...]:
    budgets = BUDGETS if 'tv_budget' in rules.names() else ()
    return (*TRUNCATION, LENIENCE, COS, *ABLATIONS, *budgets)


def dflash_drafter() -> str:
    """The trained DFlash drafter's directory (FileNotFoundError naming it when absent)."""
    path = checkpoints.DFLASH_DRAFTER
    if not os.path.isdir(path):
        raise FileNotFoundError(
            f'the DFlash arms (dflash_chain, ddtree) draft with the trained DFlash drafter '
            f'{path}, a missing directory: train and export it first (docs/training.md, '
            "launch/train_dflash.py), or run ':tiny' (a random drafter)"
        )
    return path


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    tiny = arg == 'tiny'
    c = evaluate.default_config(tiny=tiny)
    c.name = 'smollm2_135m_claims' + ('_tiny' if tiny else '')
    c.mode, c.drafter, c.lookup = 'chain', 'eagle3', 0
    c.draft = 'random' if tiny else checkpoints.EAGLE3_HEAD
    c.dflash_draft = 'random' if tiny else dflash_drafter()  # The DFlash arms' drafter.
    c.num_draft = 3
    c.tree = decoding.tree_config(nodes=8, depth=4, branch=2)
    c.temperature = 0.7
    c.arms = ml_collections.ConfigDict(dict(
        chain=chain_grid(),
        tree=(*TRUNCATION, LENIENCE),
        dflash_chain=TRUNCATION,  # C3's chain side for DDTree: the same drafter's chain.
        ddtree=(*TRUNCATION, LENIENCE),
    ))  # fmt: skip
    c.floor_rules = FLOOR_RULES
    c.arm_reports = True  # Each arm's tables (`jobs.claims.arm_report`: no verdicts).
    if tiny:  # Random tiny models and a random head: the whole path in seconds, no results.
        c.arms.chain = (TRUNCATION[0], LENIENCE, COS)
        c.arms.tree = c.arms.dflash_chain = c.arms.ddtree = (TRUNCATION[0],)
        c.floor_rules = FLOOR_RULES[:1]
        c.batch_size = 4
        c.tasks.speed_alpaca = evaluate.task(3, 8)
        c.max_new_tokens = 8
        c.prompt_bucket = c.max_prompt_len = 384
    else:  # 16 prompts in two batches of 8, all in bucket 64: one compiled loop per kind.
        c.batch_size = 8
        c.tasks.speed_alpaca = evaluate.task(10, 32)
        c.tasks.speed_qa = evaluate.task(6, 32)
        c.max_new_tokens = 32
        c.prompt_bucket, c.max_prompt_len = 64, 64
    return c
