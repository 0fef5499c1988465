"""Benchmark chain speculative decoding against AR decoding on the EAGLE speed prompts.

    python launch/bench.py --config configs/bench_chain.py
    python launch/bench.py --config configs/bench_chain.py --config.data_root=/path/to/data
    python launch/bench.py --config configs/bench_chain.py:ngram   # prompt lookup drafting
    python launch/bench.py --config configs/bench_chain.py:eagle3  # the shipped EAGLE-3 head
    python launch/bench.py --config configs/bench_chain.py:tiny    # random models, seconds

Prints, per temperature (0, 0.7) and batch (1, 2, 4, 8, 16): AR and chain tokens/s, the
speedup, block efficiency and acceptance, the cost of a round in AR tokens and the speedup
it would allow if every draft were accepted, and the field's speed table (acceptance length,
per-position acceptance, TTFT, TPOT per engine; a lossy rule's TV and its matched baseline,
timed beside it: spec_jax/jobs/speed_report.py); the engine's overhead (the share of a round
outside the target's and the drafter's forwards); the seconds and compiles of a 6-value
sweep of one rule's parameter and its matched baseline, against compiling each value anew;
then transformers' assisted generation (batch 1) on the same weights and prompts, and our
tokens/s over theirs. transformers cannot put prompt lookup in front of an assistant model:
for a same-drafter comparison add --config.lookup=0.
"""

import ml_collections

from spec_jax import checkpoints


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny', 'ngram', 'eagle3'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny', 'ngram', 'eagle3'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('chain',)  # spec_jax.jobs.bench.BENCHES
    c.model = 'random:tiny' if tiny else 'embedded'
    c.dtype = 'float32'
    c.seed = 0
    c.drafter = arg if arg in ('ngram', 'eagle3') else 'lm'
    c.draft = 'random:tiny' if tiny else checkpoints.DRAFT_LM
    if c.drafter == 'eagle3':
        c.draft = checkpoints.EAGLE3_HEAD
    c.ngram = 3
    # > 0: prompt lookup (n-grams of ngram..lookup tokens) before the model drafter. Measured
    # here at T 0, batch 1, gamma 1 (2026-11-30, one pass each, same session): the EAGLE-3
    # head 0.99x -> 1.21x (block efficiency 1.36 -> 1.48), the draft LM 0.99x -> 1.03x
    # (1.29 -> 1.41).
    c.lookup = 2 if c.drafter in ('lm', 'eagle3') and not tiny else 0
    # Both shipped drafts are fastest at gamma 1: verifying A + 1 tokens costs 1.15x (A = 1)
    # to 1.46x (A = 3) a one-token step on 2 CPU cores, more than a second drafted token
    # saves at their acceptance; see the drafts' cards.
    c.num_draft = 1 if c.drafter in ('lm', 'eagle3') and not tiny else 5
    # :tiny runs a lossy rule, so its speed table shows the TV paid and the matched baseline.
    c.rule = 'lenience:l=0.5' if tiny else 'lossless'
    # A directory with speed/<set>.jsonl (spec_jax/data_files.py); '' = $SPEC_JAX_DATA, else
    # the bundled 10-per-set sample. The full sets have 80 questions each.
    c.data_root = ''
    c.sets = ('mt_bench', 'humaneval', 'gsm8k', 'alpaca', 'sum', 'qa')
    if tiny:  # The tiny model's context (512) is shorter than a CNN/DM article.
        c.sets = ('mt_bench', 'gsm8k')
    c.prompts_per_set = 1 if tiny else 2
    c.max_new_tokens = 8 if tiny else 128
    c.max_prompt_len = 1024
    c.prompt_bucket = 64
    c.temperatures = (0.0, 0.7)
    # The speed sweep (SPEED-Bench's batch axis); on an accelerator up to 64:
    # --config.batches='(1,2,4,8,16,32,64)'. A batch past the prompt count repeats prompts.
    c.batches = (1, 4) if tiny else (1, 2, 4, 8, 16)
    c.rounds = 1 if tiny else 2
    c.hf_peer = not tiny
    # The engine's overhead: the share of a round outside the target's and the drafter's
    # forwards (each timed alone on the round's state), at batch 1 and T 0.
    c.overhead = True
    # One rule swept over 6 values of a parameter, then its matched baseline: seconds and
    # compiles through one engine (the rule's parameters are traced), against the same
    # sweep compiled per value (what a static rule cost before).
    c.sweep_rule = 'lenience'
    c.sweep_param = 'l'
    c.sweep_values = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
    # A jax.profiler trace of profile_rounds rounds after warm-up (spec_jax/jobs/profile.py).
    c.profile_dir = ''
    c.profile_rounds = 3
    return c
