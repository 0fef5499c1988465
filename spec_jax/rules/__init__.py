"""Verification rules for speculative decoding, importable alone (depends on jax only).

  import spec_jax.rules as rules
  rule = rules.make('lenience', l=0.5)              # or rules.make('lenience:l=0.5')
  out = rules.verify_chain(rule, key, p_bav1, q_bav, x_ba)   # out.tokens [B, A+1]
  pi = rule.induced(p, q)                           # closed-form per-position law
  base = rules.matched_baseline(rule)               # truncation + lossless verifier
  rules.tv(pi, base.law(p))

Rules (registry names; docs/laws.md sections in each docstring):
  lossless: lossless, greedy
  collaborative: lenience (l), cos (lam), overshoot_only (l), overshoot_tail (l, rho),
    uniform_interp (w)
  truncation: minp_verify (rho), eta_verify (eta), typical (eps, delta, mode);
    minp_verify_chainform, eta_verify_chainform (their chain form in trees)
  cascade: speccascade (deferral in chow/diff/opt/token_v1/token_v2/token_v3, alpha)
  engines: static_ensemble (w), logit_ensemble (w_d), sglang (t_s, t_a), onehot_q
    (presets: 'sglang:preset=default')
  ablations: lenience_flat (l), interp_ceiling (w) (the overshoot ablation's single factors)
  logit_rules (read the raw logits, `rules.Raw`): relaxed (delta, top_k, bonus_mode;
    'relaxed:preset=max'), mars (theta), fuzzy (threshold, divergence)
  block (decide the whole block, `Rule.accept_block`): block_verify, fly (theta, window)
  budget: tv_budget (eps, l): on the distortion frontier, TV to p capped per position
  cactus: cactus (delta; block-level, its residual reads the rejected draft)
  entropy_verify: entropy_verify (posterior_threshold, posterior_alpha; vllm-ascend)

Tree verification: `verify_node` (one node's ordered siblings) and `verify_tree` (a whole
static tree from parent pointers; see `spec_jax.rules.tree`; the `Tree` type and
`children_from_parents` in `spec_jax.rules.tree_pointers`).

Modules: base (the Rule contract, YieldRule, tree-scan helpers), contract (what rules that
read raw logits or decide a whole block meet: Raw, Block and its helpers), registry (`make`,
`names`, `register`), lossless, collaborative, truncation, cascade, engines, ablations,
logit_rules, block, budget (the rule families), chain (`verify_chain`), tree,
tree_pointers, baselines (`matched_baseline`), distortion (TV, KL, JS, the meter, the
frontier), theory (closed-form curves and the paper's claims, for jobs/diagnose.py), audit
(`rules.audit`: any verifier's emitted law against its claim by Monte Carlo, on random and
adversarial laws, u at its bounds; docs/laws.md §9), audit_laws (the laws it runs on),
audit_examples (four upstream verifier bugs as small verifiers). The contract and adding a
rule: docs/rules.md; every rule's law: docs/laws.md. """

from spec_jax.rules import audit
from spec_jax.rules.ablations import InterpCeiling, LenienceFlat
from spec_jax.rules.base import Rule, YieldRule
from spec_jax.rules.baselines import MatchedBaseline, matched_baseline
from spec_jax.rules.block import BlockVerify, FLy
from spec_jax.rules.budget import TVBudget
from spec_jax.rules.cactus import Cactus
from spec_jax.rules.cascade import SpecCascade
from spec_jax.rules.chain import ChainResult, verify_chain
from spec_jax.rules.collaborative import CoS, Lenience, OvershootOnly, OvershootTail, UniformInterp
from spec_jax.rules.contract import Block, Raw
from spec_jax.rules.distortion import (
    Distortion,
    Metered,
    compare,
    frontier,
    frontier_gap,
    js,
    kl,
    measure,
    measure_tree_node,
    meter,
    overshoot_ratio,
    tv,
)
from spec_jax.rules.engines import LogitEnsemble, OneHotQ, SGLangThresholds, StaticEnsemble
from spec_jax.rules.entropy_verify import EntropyVerify
from spec_jax.rules.logit_rules import Fuzzy, Mars, Relaxed
from spec_jax.rules.lossless import Greedy, Lossless
from spec_jax.rules.registry import make, names, register
from spec_jax.rules.tree import (
    NodeResult,
    Tree,
    TreeResult,
    children_from_parents,
    verify_node,
    verify_tree,
)
from spec_jax.rules.truncation import EtaVerify, MinPVerify, Typical

__all__ = [
    'Block',
    'BlockVerify',
    'Cactus',
    'ChainResult',
    'CoS',
    'Distortion',
    'EntropyVerify',
    'EtaVerify',
    'FLy',
    'Fuzzy',
    'Greedy',
    'InterpCeiling',
    'Lenience',
    'LenienceFlat',
    'LogitEnsemble',
    'Lossless',
    'Mars',
    'MatchedBaseline',
    'Metered',
    'MinPVerify',
    'NodeResult',
    'OneHotQ',
    'OvershootOnly',
    'OvershootTail',
    'Raw',
    'Relaxed',
    'TVBudget',
    'Rule',
    'SGLangThresholds',
    'SpecCascade',
    'StaticEnsemble',
    'Tree',
    'TreeResult',
    'Typical',
    'UniformInterp',
    'YieldRule',
    'audit',
    'children_from_parents',
    'compare',
    'frontier',
    'frontier_gap',
    'js',
    'kl',
    'make',
    'matched_baseline',
    'measure',
    'measure_tree_node',
    'meter',
    'names',
    'overshoot_ratio',
    'register',
    'tv',
    'verify_chain',
    'verify_node',
    'verify_tree',
]
