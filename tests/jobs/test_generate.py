"""The generate job end to end on the :tiny configs (random tiny models, real tokenizer)."""

import json
import os

import numpy as np
import pytest

from spec_jax.jobs import generate


@pytest.fixture(scope='module')
def tiny_config():
    c = generate.default_config(tiny=True)
    c.prompts = ('Hello there', 'What is 2 + 2?', 'Name a colour.')
    c.batch_size = 2
    return c


def test_generate_writes_and_resumes(tiny_config, tmp_path, monkeypatch):
    import chex
    import jax

    from spec_jax.decoding import autoregressive as ar

    # 3 prompts in batches of 2: the short last batch is padded and reuses the first's loop.
    once = chex.assert_max_traces(ar.ar_generate.__wrapped__, n=1)
    monkeypatch.setattr(ar, 'ar_generate', jax.jit(once, static_argnames=('cfg', 'settings')))
    records = generate.run(tiny_config, str(tmp_path))
    monkeypatch.undo()
    assert [r['index'] for r in records] == [0, 1, 2]
    assert all(1 <= r['num_tokens'] <= tiny_config.max_new_tokens for r in records)
    path = os.path.join(tmp_path, 'generations.jsonl')
    with open(path) as f:
        lines = f.readlines()
    assert len(lines) == 3
    # Drop the last record as if the run had died before its batch: the rerun does only it.
    with open(path, 'w') as f:
        f.writelines(lines[:2])
    again = generate.run(tiny_config, str(tmp_path))
    assert [r['text'] for r in again] == [r['text'] for r in records]
    with open(path) as f:
        assert [json.loads(line)['index'] for line in f] == [0, 1, 2]


def test_generate_speculative_matches_plain_greedy(tiny_config):
    plain = generate.run(tiny_config)
    c = generate.default_config(tiny=True)
    c.prompts = tiny_config.prompts
    c.spec.enabled = True
    c.spec.drafter = 'ngram'
    c.spec.num_draft = 3
    spec = generate.run(c)
    assert [r['text'] for r in spec] == [r['text'] for r in plain]
    assert all(r['blocks'] >= 1 for r in spec)


def test_generate_with_an_eagle3_head_matches_plain_greedy(tiny_config, tmp_path):
    """A head saved in the official layout drafts through `spec.drafter='eagle3'`."""
    import jax

    from spec_jax.checkpoints import eagle_formats
    from spec_jax.jobs import common
    from spec_jax.models import eagle3 as e3

    target = common.load_model(tiny_config.model, tiny_config.dtype, tiny_config.seed)
    cfg = e3.Eagle3Config.for_target(target.cfg, 64)
    d2t, t2d = e3.vocab_maps(np.arange(0, 640, 10), target.cfg.vocab_size)
    head = e3.Eagle3Head(cfg, e3.init_params(cfg, jax.random.PRNGKey(0)), d2t, t2d)
    eagle_formats.save_head(str(tmp_path), head, 'official', 'float32')
    plain = generate.run(tiny_config)
    c = generate.default_config(tiny=True)
    c.prompts = tiny_config.prompts
    c.spec.enabled, c.spec.drafter, c.spec.draft, c.spec.num_draft = (
        True,
        'eagle3',
        str(tmp_path),
        3,
    )
    c.spec.lookup = 2  # Behind prompt lookup, as the shipped preset runs it.
    spec = generate.run(c)
    assert [r['text'] for r in spec] == [r['text'] for r in plain]
    assert all(r['blocks'] >= 1 for r in spec)


def test_bad_spec_options(tiny_config):
    c = generate.default_config(tiny=True)
    c.spec.enabled = True
    c.spec.drafter = 'oracle'
    with pytest.raises(ValueError, match=r"drafter 'oracle' is not one of \('lm', 'eagle3'"):
        generate.run(c)
    for kind in ('lm', 'eagle3'):
        c.spec.drafter, c.spec.draft = kind, ''
        with pytest.raises(ValueError, match=f"drafter '{kind}' needs a draft"):
            generate.run(c)
    c.spec.drafter, c.spec.lookup = 'ngram', 2
    with pytest.raises(ValueError, match="drafter 'ngram' is prompt lookup alone"):
        generate.run(c)
    c.spec.drafter, c.spec.draft, c.spec.lookup = 'lm', 'random:tiny', 4
    with pytest.raises(ValueError, match=r'lookup=4 must be in \[0, ngram=3\]'):
        generate.run(c)


def test_draft_with_another_tokenizer_is_refused(caplog):
    from tokenizers import Tokenizer as Backend
    from tokenizers.models import WordLevel

    from spec_jax.jobs.common import check_same_tokenizer
    from spec_jax.tokenizer import Tokenizer

    def word_level(words):
        return Tokenizer(Backend(WordLevel({w: i for i, w in enumerate(words)}, unk_token='a')))

    target = word_level(['a', 'b', 'c'])
    check_same_tokenizer(target, word_level(['a', 'b', 'c']))
    # Same vocabulary size, other ids: the engine's size check alone would let it through.
    with pytest.raises(ValueError, match="the draft's tokenizer differs from the target's"):
        check_same_tokenizer(target, word_level(['a', 'c', 'b']))
    check_same_tokenizer(target, None)
    assert 'the draft checkpoint has no tokenizer' in caplog.text


def test_chain_preset_through_the_launcher(tmp_path):
    """`launch/generate.py` with the chain preset's :tiny variant and --config.spec.* flags:
    the draft LM behind prompt lookup reproduces plain greedy decoding."""
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    flags = ['--config.spec.num_draft=2', '--config.spec.lookup=2', '--config.spec.rule=lossless']
    run = subprocess.run(
        [sys.executable, os.path.join(root, 'launch', 'generate.py'),
         f'--config={os.path.join(root, "configs", "smollm2_135m_chain.py")}:tiny',
         f'--workdir={tmp_path}', *flags],
        cwd=root, capture_output=True, text=True,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    with open(os.path.join(tmp_path, 'generations.jsonl')) as f:
        chain = [json.loads(line) for line in f]
    plain = generate.run(generate.default_config(tiny=True))
    assert [r['text'] for r in chain] == [r['text'] for r in plain]
    assert all(r['blocks'] >= 1 for r in chain)


def test_batches_draw_their_own_noise():
    """Sampling one prompt four times in batches of two: row 0 of each batch differs (each
    batch has its own seed), and a second run reproduces the first."""
    c = generate.default_config(tiny=True)
    c.prompts, c.batch_size = ('Hello there',) * 4, 2
    c.sampling.temperature = 1.0
    texts = [r['text'] for r in generate.run(c)]
    assert texts[0] != texts[2] and texts[1] != texts[3]
    assert [r['text'] for r in generate.run(c)] == texts
