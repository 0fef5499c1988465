"""Decoding the embedded default (SmolLM2-135M-Instruct): parity with transformers, and
greedy speculative decoding equal to greedy AR decoding."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from spec_jax import checkpoints, decoding
from spec_jax.checkpoints import eagle_formats
from spec_jax.decoding.drafters import Eagle3Drafter, LMDrafter
from spec_jax.jobs import generate
from spec_jax.models.config import ModelConfig
from spec_jax.testing import random_params

pytestmark = [pytest.mark.slow]

CHAT_PROMPTS = [
    'What is the capital of France?',
    'Explain how a bicycle works.',
    'Write a Python function that returns the n-th Fibonacci number.',
    'Natalia sold clips to 48 of her friends in April, and then she sold half as many clips '
    'in May. How many clips did Natalia sell altogether in April and May?',
    'Give me three tips for staying focused while studying.',
]
NEW_TOKENS = 64
DRAFT_DIR, HEAD_DIR = checkpoints.DRAFT_LM, checkpoints.EAGLE3_HEAD
DEC = decoding.DecodeSettings(max_new_tokens=NEW_TOKENS, stop_tokens=())


@pytest.fixture(scope='module')
def prompt_ids(embedded):
    return [embedded.tokenizer.encode_chat([{'role': 'user', 'content': p}]) for p in CHAT_PROMPTS]


@pytest.fixture(scope='module')
def greedy_ar(embedded, prompt_ids):
    """Greedy AR on all five prompts in one batch (rows of different lengths)."""
    ar = decoding.Engine(embedded.cfg, DEC)
    return decoding.generate(ar, decoding.Params(embedded.params), prompt_ids).tokens


@pytest.mark.parity
def test_greedy_generation_matches_transformers(embedded, hf_embedded, prompt_ids, greedy_ar):
    import torch

    tok = embedded.tokenizer
    for prompt, ids, ours in zip(CHAT_PROMPTS, prompt_ids, greedy_ar):
        with torch.no_grad():
            out = hf_embedded.generate(
                torch.tensor([ids]),
                max_new_tokens=NEW_TOKENS,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
        theirs = out[0, len(ids) :].tolist()
        assert len(ours) == NEW_TOKENS
        assert tok.decode(ours) == tok.decode(theirs), prompt
        assert ours == theirs


def drafters(embedded):
    random_cfg = ModelConfig.tiny(vocab_size=embedded.cfg.vocab_size)
    yield 'random', LMDrafter(random_cfg), random_params(random_cfg, seed=1)
    draft = checkpoints.load(DRAFT_DIR)  # The shipped drafts are part of the package.
    yield 'shipped', LMDrafter(draft.cfg), draft.params
    head = eagle_formats.load_head(HEAD_DIR, embedded.cfg)
    yield 'eagle3', Eagle3Drafter(head.cfg), Eagle3Drafter.params_for(head, embedded.params)


def test_greedy_speculative_equals_greedy_ar(embedded, prompt_ids, greedy_ar):
    """The model drafters at gamma 3 on the real model: the shipped draft LM and head at
    batch 5, a random draft (most drafts rejected) at batch 1. Other gammas and the n-gram
    drafter are the tiny models' (each real-size loop is another 45-85 s of compiles:
    tests/decoding/test_speculative.py)."""
    for name, drafter, params in drafters(embedded):
        chain = decoding.Engine(embedded.cfg, DEC, drafter, 3)
        both = decoding.Params(embedded.params, params)
        ids, want = (prompt_ids[:1], greedy_ar[:1]) if name == 'random' else (prompt_ids, greedy_ar)
        result = decoding.generate(chain, both, ids)
        assert result.tokens == want, name
        assert np.isfinite(result.stats['block_efficiency'])


def test_greedy_tree_equals_greedy_ar(embedded, prompt_ids, greedy_ar):
    """The shipped head's tree, 9 deep (it was trained for 7 steps), at batch 5 (batch 1:
    the tiny models', tests/decoding/test_tree.py)."""
    head = eagle_formats.load_head(HEAD_DIR, embedded.cfg)
    both = decoding.Params(embedded.params, Eagle3Drafter.params_for(head, embedded.params))
    tree = decoding.Engine(embedded.cfg, DEC, Eagle3Drafter(head.cfg),
                           tree=decoding.TreeShape(nodes=12, depth=9, branch=2))  # fmt: skip
    result = decoding.generate(tree, both, prompt_ids)
    assert result.tokens == greedy_ar
    assert result.stats['block_efficiency'] > 1.5


def test_tree_preset_through_the_launcher(tmp_path):
    """`launch/generate.py --config configs/smollm2_135m_tree.py` (the embedded default, the
    shipped head, its CPU tree) writes plain greedy decoding's text."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = subprocess.run(
        [sys.executable, os.path.join(root, 'launch', 'generate.py'),
         f'--config={os.path.join(root, "configs", "smollm2_135m_tree.py")}',
         '--config.max_new_tokens=48', f'--workdir={tmp_path}'],
        cwd=root, capture_output=True, text=True,  # The session's compilation cache.
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    with open(os.path.join(tmp_path, 'generations.jsonl')) as f:
        tree = [json.loads(line) for line in f]
    plain = generate.default_config()
    plain.max_new_tokens = 48
    assert [r['text'] for r in tree] == [r['text'] for r in generate.run(plain)]
    assert sum(r['emitted'] for r in tree) > 1.5 * sum(r['blocks'] for r in tree)


@pytest.mark.parametrize('directory', [DRAFT_DIR, HEAD_DIR])
def test_shipped_drafts_are_small_and_documented(directory):
    """Each shipped draft is one bf16 safetensors file under 30 MB with a model card that
    says how to reproduce it."""
    from safetensors import safe_open

    weights = os.path.join(directory, 'model.safetensors')
    assert os.path.getsize(weights) < 30e6
    with safe_open(weights, 'numpy') as f:
        floats = [f.get_slice(k).get_dtype() for k in f.keys() if k not in ('d2t', 't2d')]
    assert set(floats) == {'BF16'}
    with open(os.path.join(directory, 'README.md')) as f:
        card = f.read()
    assert '## Reproduce' in card and 'launch/train_draft.py' in card
