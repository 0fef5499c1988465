"""spec_jax.eval.acceptance: greedy round lengths from per-depth hits."""

import numpy as np

from spec_jax.checkpoints import LoadedModel
from spec_jax.eval import acceptance
from spec_jax.models.config import ModelConfig
from spec_jax.testing import random_params
from spec_jax.train import shards


def test_chain_lengths():
    hits = np.ones((3, 10), bool)
    assert acceptance.chain_lengths(hits, 0, 9, 3) == [4, 4]  # rounds at r=0, 4; r=8: x_9 last
    hits[1, 0] = False
    assert acceptance.chain_lengths(hits, 0, 9, 3)[0] == 2
    assert acceptance.tree_size((4, 2, 2, 1, 1)) == 60


def test_a_draft_equal_to_its_target_accepts_every_token():
    """The target as its own draft: agreement 1 and full rounds but the response's last; a
    draft of other weights agrees less (so the harness compares the two models)."""
    cfg = ModelConfig.tiny(vocab_size=31)
    target = LoadedModel(cfg, random_params(cfg, seed=3, std=0.16), None)
    rng = np.random.default_rng(0)
    examples = []
    for n, prompt in ((23, 5), (17, 3)):
        tokens = rng.integers(1, 31, n).astype(np.int32)
        examples.append(shards.Example(tokens, np.arange(n) >= prompt))
    kw = dict(chain=3, batch_size=2, seq_len=32)
    same = acceptance.draft_lm(target, cfg, target.params, examples, ['a', 'b'], **kw)
    assert same['per_token_acceptance'] == 1.0 and same['tokens'] == 18 + 14
    assert same['per_set'] == {
        'a': {'agreement': 1.0, 'tokens': 18},
        'b': {'agreement': 1.0, 'tokens': 14},
    }
    # Rounds of 4 tokens (3 drafts + the target's) from the first response token (prefill's)
    # on, the last cut by the text's end: 18 response tokens make 5 rounds, 14 make 4.
    assert same['chain3_rounds'] == 5 + 4
    other = acceptance.draft_lm(
        target, cfg, random_params(cfg, seed=4, std=0.16), examples, ['a', 'b'], **kw
    )
    assert other['per_token_acceptance'] < 0.5 and other['chain3_mean_accept_len'] < 2.0
