"""Chain speculative decoding on the embedded default: its shipped draft LM behind prompt lookup.

    python launch/generate.py --config configs/smollm2_135m_chain.py
    python launch/generate.py --config configs/smollm2_135m_chain.py \
        --config.spec.rule='lenience:l=0.5' --config.sampling.temperature=0.7
    python launch/generate.py --config configs/smollm2_135m_chain.py:ngram  # prompt lookup
    python launch/generate.py --config configs/smollm2_135m_chain.py:eagle3  # the EAGLE-3 head
    python launch/generate.py --config configs/smollm2_135m_chain.py --config.spec.lookup=0
        # the draft alone, without prompt lookup in front of it
    python launch/generate.py --config configs/smollm2_135m_chain.py:tiny   # random models
    python launch/generate.py --config configs/smollm2_135m_chain.py:adaptive
        # each round's draft length (0, 1, 2 or 4) chosen online (spec.adaptive; give
        # --config.spec.adaptive.costs a bench's seconds per round, one per length)

The draft LM (spec_jax/assets/drafts/smollm2_135m_draft, see its README.md) was
distilled from the target with launch/train_draft.py and configs/smollm2_135m_draft.py;
the EAGLE-3 head (spec_jax/assets/drafts/smollm2_135m_eagle3) with
configs/smollm2_135m_eagle3.py.
"""

import ml_collections

from spec_jax import checkpoints
from spec_jax.jobs import generate

DRAFT_DIR, HEAD_DIR = checkpoints.DRAFT_LM, checkpoints.EAGLE3_HEAD


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny', 'ngram', 'eagle3', 'adaptive'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny', 'ngram', 'eagle3', "
                         "'adaptive'")
    c = generate.default_config(tiny=arg == 'tiny')
    c.spec.mode = 'chain'
    # The shipped draft accepts about 0.3 of its tokens (see its README.md): gamma 1 is its
    # fastest setting (configs/bench_chain.py). Raise it with a better draft.
    c.spec.num_draft = 1 if arg in (None, '', 'eagle3') else 4 if arg == 'adaptive' else 5
    # Prompt lookup drafts copied spans (2- and 3-gram matches) and the model the rest:
    # +12 points of acceptance for either shipped draft on the bench prompts
    # (configs/bench_chain.py).
    c.spec.lookup = 2 if arg in (None, '', 'eagle3', 'adaptive') else 0
    if arg == 'adaptive':  # Lengths 0 (AR), 1, 2 and 4, one chosen each round.
        c.spec.adaptive.tiers = 'auto'
    if arg == 'tiny':
        c.spec.draft = 'random:tiny'
    elif arg == 'ngram':
        c.spec.drafter = 'ngram'
    elif arg == 'eagle3':
        c.spec.drafter, c.spec.draft = 'eagle3', HEAD_DIR
    else:
        c.spec.draft = DRAFT_DIR
    return c
