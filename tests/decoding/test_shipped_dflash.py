"""The shipped DFlash drafter (checkpoints.DFLASH_DRAFTER): small, bf16, documented, loads
in the released layout for the embedded default, and its greedy chain is greedy AR."""

import os

import numpy as np
from safetensors import safe_open

from spec_jax import checkpoints, decoding
from spec_jax.checkpoints import dflash_format
from spec_jax.decoding.drafters import DFlashDrafter

PROMPT = 'Natalia sold clips to 48 of her friends in April, and then she sold half as many.'
DEC = decoding.DecodeSettings(max_new_tokens=16, stop_tokens=())


def test_shipped_dflash_is_small_bf16_and_documented():
    weights = os.path.join(checkpoints.DFLASH_DRAFTER, 'model.safetensors')
    assert os.path.getsize(weights) < 20e6
    with safe_open(weights, 'numpy') as f:
        assert {f.get_slice(k).get_dtype() for k in f.keys()} == {'BF16'}
    with open(os.path.join(checkpoints.DFLASH_DRAFTER, 'README.md')) as f:
        card = f.read()
    assert '## Reproduce' in card and 'launch/train_dflash.py' in card


def test_shipped_dflash_greedy_chain_is_greedy_ar(embedded):
    """A 16-token greedy chain with the full block (7 drafts a round) on the embedded
    default gives greedy AR's tokens (about 22 s, most of it compiling both programs)."""
    cfg, params = dflash_format.load(checkpoints.DFLASH_DRAFTER, embedded.cfg)
    ids = [embedded.tokenizer.encode_chat([{'role': 'user', 'content': PROMPT}])]
    ar = decoding.generate(
        decoding.Engine(embedded.cfg, DEC), decoding.Params(embedded.params), ids
    )
    chain = decoding.Engine(embedded.cfg, DEC, DFlashDrafter(cfg), cfg.max_drafts)
    both = decoding.Params(embedded.params, DFlashDrafter.params_for(params, embedded.params))
    result = decoding.generate(chain, both, ids)
    assert result.tokens == ar.tokens
    assert np.isfinite(result.stats['block_efficiency'])
