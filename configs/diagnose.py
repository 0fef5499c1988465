"""Diagnose, theory mode: TV(pi, matched baseline) against draft quality for every rule.

Run:
  python launch/diagnose.py --config=configs/diagnose.py --workdir=runs/diagnose
  python launch/diagnose.py --config=configs/diagnose.py:tiny --workdir=/tmp/diag  # ~10 s

Writes diagnose_theory.csv, diagnose_theory.png and diagnose_claims.json. Expected: every
claim in the JSON holds ('lossless_exact', 'chain_truncation_floor', 'tree_truncation_greedy',
'lenience_ceiling', 'cos_no_ceiling'); see spec_jax/rules/theory.py.
"""

import ml_collections

ALL_RULES = (
    'lossless',
    'greedy',
    'lenience:l=0.5',
    'lenience:l=0.2',
    'cos:lam=0.2',
    'cos:lam=0.6',
    'overshoot_only:l=0.5',
    'overshoot_tail:l=0.5,rho=0.5',
    'uniform_interp:w=0.5',
    'minp_verify:rho=0.3',
    'eta_verify:eta=0.1',
    'typical:eps=0.09',
    'typical:eps=0.09,mode=sample',
    'speccascade:deferral=chow,alpha=0.3',
    'speccascade:deferral=diff,alpha=0.1',
    'speccascade:deferral=opt,alpha=0.5',
    'speccascade:deferral=token_v1,alpha=0.1',
    'speccascade:deferral=token_v2,alpha=0.1',
    'speccascade:deferral=token_v3,alpha=0.7',
)

TINY_RULES = (
    'lossless',
    'lenience:l=0.5',
    'cos:lam=0.5',
    'minp_verify:rho=0.3',
)


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    """Returns the diagnose config; arg 'tiny' shrinks it for tests (<~20 s on 2 CPU cores)."""
    tiny = arg == 'tiny'
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"configs/diagnose.py: unknown arg {arg!r}; use '' or 'tiny'")
    cfg = ml_collections.ConfigDict()
    cfg.mode = 'theory'
    cfg.seed = 0
    cfg.vocab = 16 if tiny else 64
    cfg.num_pairs = 8 if tiny else 64
    cfg.num_points = 6 if tiny else 21
    cfg.logit_scale = 3.0  # Std of the synthetic logits: peaked p with a long tail.
    cfg.num_siblings = 3 if tiny else 4  # Tree mode: the draft's top-C tokens, in order.
    cfg.rules = TINY_RULES if tiny else ALL_RULES
    return cfg
