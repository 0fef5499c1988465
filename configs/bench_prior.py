"""Measure a drafter's acceptance on held-out prompts and write it beside the drafter: the
adaptive engine's first prior (spec.adaptive.prior_from='drafter').

    python launch/bench.py --config configs/bench_prior.py          # the shipped draft LM
    python launch/bench.py --config configs/bench_prior.py:eagle3   # the shipped EAGLE-3 head
    python launch/bench.py --config configs/bench_prior.py:dflash   # the shipped DFlash drafter
    python launch/bench.py --config configs/bench_prior.py:tiny --config.out=/tmp/a.json

Prints, per prompt-lookup setting, the depth-1 acceptance (counts, per set) and the
conditional acceptance at each draft position, and writes the drafter's acceptance.json
(spec_jax/jobs/bench_prior.py).
"""

import ml_collections

from spec_jax import checkpoints


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny', 'eagle3', 'dflash'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny', 'eagle3', 'dflash'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('prior',)  # spec_jax.jobs.bench.BENCHES
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'
    c.seed = 0
    c.drafter = arg if arg in ('eagle3', 'dflash') else 'lm'
    shipped = dict(lm=checkpoints.DRAFT_LM, eagle3=checkpoints.EAGLE3_HEAD,
                   dflash=checkpoints.DFLASH_DRAFTER)  # fmt: skip
    c.draft = 'random:tiny' if tiny else shipped[c.drafter]
    c.out = ''  # '' = the drafter's directory, acceptance.json (a file path: elsewhere).
    c.ngram = 3
    # Prompt-lookup settings, each its own record (DFlash drafts a block: no lookup).
    c.lookups = (0,) if tiny or c.drafter == 'dflash' else (0, 2)
    c.chain = 4  # The fixed draft length measured (the adaptive presets' longest tier).
    c.temperature = 0.0
    c.data_root = ''
    # Prompts start..start + prompts_per_set - 1 (0-based) of each set: the adaptive bench
    # times the first 2, the drafters' cards the first 4; the bundled sample has 10.
    c.sets = ('mt_bench', 'gsm8k') if tiny else ('mt_bench', 'humaneval', 'gsm8k', 'alpaca',
                                                  'qa', 'sum')  # fmt: skip
    c.start = 8 if tiny else 5
    c.prompts_per_set = 2 if tiny else 5
    c.batch = 2 if tiny else 6
    c.max_new_tokens = 8 if tiny else 64
    c.max_prompt_len = 384 if tiny else 1536
    c.prompt_bucket = 64
    return c
