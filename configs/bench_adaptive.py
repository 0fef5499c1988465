"""Benchmark verification sized online (spec.adaptive) against every fixed draft length.

    python launch/bench.py --config configs/bench_adaptive.py          # the embedded default
    python launch/bench.py --config configs/bench_adaptive.py:eagle3   # its EAGLE-3 head
    python launch/bench.py --config configs/bench_adaptive.py:tiny     # random models, seconds

Prints, per batch (1, 8) and workload (speed sets, MBPP, the long-context CNN/DM set, and
all of them together): tokens/s of AR, the chain at each fixed length and the adaptive
chain (priced by this machine's calibration, and by round costs measured just before), each
adaptive engine over the best fixed length and over AR, and the issue's goals met or not
(spec_jax/jobs/bench_adaptive.py).
"""

import ml_collections

from spec_jax import checkpoints


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny', 'eagle3'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny', 'eagle3'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('adaptive',)  # spec_jax.jobs.bench.BENCHES
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'
    c.seed = 0
    c.drafter = 'eagle3' if arg == 'eagle3' else 'lm'
    c.draft = 'random:tiny' if tiny else (checkpoints.EAGLE3_HEAD if arg == 'eagle3'
                                           else checkpoints.DRAFT_LM)  # fmt: skip
    c.ngram = 3
    c.lookup = 0 if tiny else 2  # Prompt lookup first (MBPP's code repeats its prompt).
    c.rule = 'lossless'
    # The adaptive chain's first prior: 'drafter' what the drafter was measured to accept on
    # held-out prompts (its acceptance.json: configs/bench_prior.py) where it has one, else
    # spec.adaptive.prior's 0.7; '' always 0.7.
    c.prior_from = 'drafter'
    c.tiers = '0,1,2,4'  # Draft lengths; 0 is AR's step. The fixed chains: 1, 2, 4.
    # The tiers' round costs: 'auto' the platform's calibrated chip ('cpu' here:
    # spec_jax/costs, from this machine's bench); '' the relative model.
    c.costs = '' if tiny else 'auto'
    # Also the adaptive chain priced by each fixed tier's seconds a round, measured on the
    # workload's first batch ('adaptive measured').
    c.measured_costs = True
    c.cost_calls = 1 if tiny else 3  # Timed calls per tier, their median (after a warm one).
    c.temperature = 0.0
    c.data_root = ''
    c.sets = ('mt_bench', 'gsm8k') if tiny else ('mt_bench', 'humaneval', 'gsm8k', 'alpaca', 'qa')
    c.prompts_per_set = 1 if tiny else 2
    c.long_sets = ('mt_bench',) if tiny else ('sum',)  # The tiny model's context is 512.
    c.long_prompts = 1 if tiny else 2
    c.mbpp_prompts = 2 if tiny else 6
    c.max_new_tokens = 8 if tiny else 64
    c.max_prompt_len = 384 if tiny else 1536
    c.prompt_bucket = 64
    c.batches = (1, 2) if tiny else (1, 8)
    # Which workloads (spec_jax.jobs.bench_adaptive.WORKLOADS), in order; 'mixed' sums them
    # where there are two or more.
    c.workloads = ('speed', 'mbpp', 'long')
    c.rounds = 1 if tiny else 3
    return c
