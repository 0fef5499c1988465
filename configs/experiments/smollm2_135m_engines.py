"""The lossy rules the serving engines ship (issue 32), beside the paper's, on the embedded
default: each against its matched baseline and against plain lossless SD.

    python launch/evaluate.py --config configs/experiments/smollm2_135m_engines.py
    python launch/evaluate.py --config configs/experiments/smollm2_135m_engines.py:tree
    python launch/evaluate.py --config configs/experiments/smollm2_135m_engines.py:greedy
    python launch/evaluate.py --config configs/experiments/smollm2_135m_engines.py --dry_run
    python launch/evaluate.py --config configs/experiments/smollm2_135m_engines.py:tiny
        # CI: random tiny models, two of the grid's rules ('tree,tiny', 'greedy,tiny' too)

Target SmolLM2-135M-Instruct with its shipped draft LM behind prompt lookup, as the main
job (configs/experiments/smollm2_135m.py), but 3 drafts a round, not 1: at one draft block
verification is token-level SD (docs/laws.md §7.4) and FLy's window cannot fit
(i + W < A, §7.5), so the block-level rules would show nothing. The argument picks the
variant (words joined by ','):

  ''      chain, T 0.7: every engine rule at its engine's default preset and one more
          setting (the lossless rules once: onehot_q, block_verify), the single-factor
          overshoot ablations beside lenience, the paper's lenience, min-p verification and
          CoS at one value each; 27 methods with AR, lossless SD and the matched baselines
          (relaxed acceptance's top-K-within-delta set and MARS's gated top 2 imposed on the
          target, min-p sampling; the others pair with lossless SD, docs/laws.md §5)
  tree    EAGLE-3 tree rounds with the shipped head (configs/smollm2_135m_tree.py's shape:
          M 8, depth 4, branch 2), T 0.7: the rules with a tree form (SGLang's thresholds,
          one-hot q, MARS; lenience and min-p verification beside them); 12 methods
  greedy  chain, T 0: the rules that reduce to greedy (relaxed acceptance, MARS, fuzzy SD)
          at their default and one more setting; 12 methods. The plan has one temperature
          per run (the engine's sampler is shared by every method), so T 0 is its own run.
  tiny    random tiny models (and a random head in tree mode), two items of two speed sets,
          two rules of the variant's grid (TINY_GRIDS: one of each pairing)

Speed sets only (the 10 bundled prompts of alpaca, qa and mt_bench, 24 tokens, batch 6:
five batches, so every speedup and paired Δ has an interval): this target is near floor on
every bundled task (the main job's docstring), and the rules' trade-off needs no score.
The report's section "Rules the engines ship" (spec_jax/eval/engine_rules.py) puts each
rule's ΔBE, speedup and TV against its matched baseline beside its ΔBE and speedup against
plain lossless SD, and says by how much the plain-SD comparison flatters it.

Wall clock on 2 cores: 23:01 for '' (timed whole, quiet AMD machine, empty compilation
cache: decode 701 s, compile 621 s for 45 loops; docs/performance.md, "The engines'
rules", with its results). 'greedy' (12 methods, 5 rule kinds) 9:30 and 'tree' (12
methods, 7 kinds) 13:11, each timed whole after it (a warm cache for a few loops, a TPU
compile beside them for some minutes).
"""

import ml_collections

from spec_jax import checkpoints, decoding
from spec_jax.jobs import evaluate

# The speed sets whose prompts fit 128 tokens (alpaca and qa 37-45, mt_bench 52-126; the
# embedded chat template's): two prompt buckets, not the main job's four, since every bucket
# is a compiled loop per rule kind and this grid has 18 kinds (~20 s a loop at load 4 here).
SPEED_SETS = ('alpaca', 'qa', 'mt_bench')
PAPER_RULES = ('lenience:l=0.4', 'minp_verify:rho=0.3', 'cos:lam=0.4')  # One value each.
# Each engine's default preset first, then one more setting (ours where upstream names none).
CHAIN_GRID = (
    'static_ensemble:preset=default', 'static_ensemble:preset=docs',    # HF: w 1 (lossless), 0.7
    'logit_ensemble:preset=default', 'logit_ensemble:preset=readme',    # DIVERSED: w_d 0.5, 0.3
    'sglang:preset=default', 'sglang:t_s=0.5,t_a=0.5',                  # (1, 1) is lossless
    'onehot_q',                                                         # vLLM, lossless
    'relaxed:preset=trtllm', 'relaxed:preset=max',                      # K 10, delta 0.6
    'mars', 'mars:theta=0.8',                                           # theta 0.9
    'fuzzy', 'fuzzy:threshold=0.2',                                     # js_div <= 0.4
    'block_verify',                                                     # lossless
    'fly', 'fly:window=2',                          # W 6 cannot fit 3 drafts: lossless here
    'lenience_flat:l=0.4', 'interp_ceiling:w=0.5',  # The ablations, beside lenience l 0.4.
    *PAPER_RULES,
)  # fmt: skip
TREE_GRID = (
    'sglang:preset=default', 'sglang:t_s=0.5,t_a=0.5', 'onehot_q', 'mars', 'mars:theta=0.8',
    'lenience:l=0.4', 'minp_verify:rho=0.3',  # CoS has no tree form.
)  # fmt: skip
GREEDY_GRID = (
    'relaxed:preset=trtllm', 'relaxed:preset=trtllm,delta=0.3',  # At T 0 'max' is 'trtllm'.
    'mars', 'mars:theta=0.8', 'fuzzy', 'fuzzy:threshold=0.2',
)  # fmt: skip
VARIANTS = {'': CHAIN_GRID, 'tree': TREE_GRID, 'greedy': GREEDY_GRID}
# ':tiny' runs two rules of the variant's grid, one of each pairing (a compiled loop per rule
# kind, ~10 s of CPU each for the tiny models: every kind of the full grid would take
# minutes on 2 cores): MARS (a set read from the target's logits, block-level, matched with
# that set on the target) and one-hot q (per position, lossless, matched with lossless SD).
TINY_GRIDS = {
    '': ('mars', 'onehot_q'),
    'tree': ('mars', 'onehot_q'),
    'greedy': ('relaxed:preset=trtllm', 'fuzzy'),
}


def parse_arg(arg: str | None) -> tuple[str, bool]:
    """(variant, tiny) of a config argument: at most one of VARIANTS' words and 'tiny',
    joined by ',' ('tree,tiny').

    Raises:
      ValueError: an unknown word, or two variants at once.
    """
    words = [w.strip() for w in (arg or '').split(',') if w.strip()]
    valid = ('tiny', *(v for v in VARIANTS if v))
    unknown = [w for w in words if w not in valid]
    variants = [w for w in words if w != 'tiny']
    if unknown or len(variants) > 1 or len(set(words)) < len(words):
        raise ValueError(f'unknown config arg {arg!r}; valid: words of {valid} joined by ",", '
                         'at most one variant (tree or greedy) and tiny')  # fmt: skip
    return (variants[0] if variants else ''), 'tiny' in words


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    variant, tiny = parse_arg(arg)
    c = evaluate.default_config(tiny=tiny)
    c.name = '_'.join(['smollm2_135m_engines', *filter(None, (variant, 'tiny' if tiny else ''))])
    c.grid = TINY_GRIDS[variant] if tiny else VARIANTS[variant]
    c.temperature = 0.0 if variant == 'greedy' else 0.7
    if variant == 'tree':
        c.mode, c.drafter, c.lookup = 'tree', 'eagle3', 0
        c.draft = 'random' if tiny else checkpoints.EAGLE3_HEAD
        c.tree = decoding.tree_config(nodes=8, depth=4, branch=2)
    else:
        c.num_draft = 3
        if not tiny:
            c.draft, c.lookup = checkpoints.DRAFT_LM, 2
    if tiny:  # Random tiny models, the same code path; seconds, not results.
        c.batch_size = 4
        for name in SPEED_SETS[:2]:
            c.tasks[f'speed_{name}'] = evaluate.task(2, 8)
        c.max_new_tokens = 8
        c.prompt_bucket = c.max_prompt_len = 384
    else:  # 30 prompts in five batches of 6: four in bucket 64, one in 128.
        c.batch_size = 6
        for name in SPEED_SETS:
            c.tasks[f'speed_{name}'] = evaluate.task(10, 24)
        c.max_new_tokens = 24
        c.prompt_bucket, c.max_prompt_len = 64, 128
    return c
