"""The generate job end to end on the :tiny configs (random tiny models, real tokenizer)."""

import json
import os

import chex
import jax
import numpy as np
import pytest
from tokenizers import Tokenizer as Backend
from tokenizers.models import WordLevel

from spec_jax import checkpoints, decoding
from spec_jax.checkpoints import eagle_formats
from spec_jax.decoding import drafters, engine, host
from spec_jax.jobs import generate
from spec_jax.models import eagle3 as e3
from spec_jax.tokenizer import Tokenizer


@pytest.fixture(scope='module')
def tiny_config():
    c = generate.default_config(tiny=True)
    c.prompts = ('Hello there', 'What is 2 + 2?', 'Name a colour.')
    c.batch_size = 2
    return c


def test_generate_writes_and_resumes(tiny_config, tmp_path, monkeypatch):
    # 3 prompts in batches of 2: the short last batch is padded and reuses the first's loop.
    for name, donate in (('prefill_call', ()), ('rounds_call', 3)):  # Each traced once.
        once = chex.assert_max_traces(getattr(engine, name).__wrapped__, n=1)
        monkeypatch.setattr(host, name, jax.jit(once, donate_argnums=donate))
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


def test_sampled_generation_is_the_same_resumed_or_rebatched(tiny_config, tmp_path):
    """At T 0.7, chain decoding with a draft LM: a prompt's text depends on the seed and
    its index only, not on the batch size or on resuming after a lost batch."""
    c = generate.default_config(tiny=True)
    c.prompts = ('Hello there', 'What is 2 + 2?', 'Name a colour.', 'Count to three.')
    c.sampling.temperature, c.max_new_tokens = 0.7, 12
    c.spec.mode, c.spec.drafter, c.spec.draft, c.spec.num_draft = 'chain', 'lm', 'random:tiny', 3
    c.spec.rule = 'lenience:l=0.5'
    c.batch_size = 4
    whole = [r['text'] for r in generate.run(c, str(tmp_path / 'a'))]
    assert len(set(whole)) > 1
    c.batch_size = 3  # Re-batched: rows move to other batches and rows.
    assert [r['text'] for r in generate.run(c, str(tmp_path / 'b'))] == whole
    path = tmp_path / 'b' / 'generations.jsonl'
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(''.join(lines[:1]))  # Resumed after losing prompts 1-3.
    assert [r['text'] for r in generate.run(c, str(tmp_path / 'b'))] == whole


def test_generate_speculative_matches_plain_greedy(tiny_config):
    plain = generate.run(tiny_config)
    c = generate.default_config(tiny=True)
    c.prompts = tiny_config.prompts
    c.spec.mode = 'chain'
    c.spec.drafter = 'ngram'
    c.spec.num_draft = 3
    spec = generate.run(c)
    assert [r['text'] for r in spec] == [r['text'] for r in plain]
    assert all(r['blocks'] >= 1 for r in spec)


def test_the_config_quantizes_the_target_and_scans_its_layers(tiny_config):
    """`c.weights = 'int8'` and `c.scan_layers` reach the loaded target: int8 projections
    with their scales, one stacked layer tree, and the job still decodes every prompt."""
    c = generate.default_config(tiny=True)
    c.prompts, c.batch_size = tiny_config.prompts, tiny_config.batch_size
    c.weights, c.scan_layers = 'int8', True
    built = decoding.build(c)
    assert built.engine.cfg.weights == 'int8' and built.engine.cfg.scan_layers
    layers = built.params.target['layers']
    assert layers['attn']['q_dnh'].dtype == np.int8 and 'q_scale_nh' in layers['attn']
    assert len(generate.run(c)) == len(c.prompts)


def test_generate_with_an_eagle3_head_matches_plain_greedy(tiny_config, tmp_path):
    """A head saved in the official layout drafts through `spec.drafter='eagle3'`."""
    target = checkpoints.load(tiny_config.model, tiny_config.dtype, tiny_config.seed)
    cfg = e3.Eagle3Config.for_target(target.cfg, 64)
    d2t, t2d = e3.vocab_maps(np.arange(0, 640, 10), target.cfg.vocab_size)
    head = e3.Eagle3Head(cfg, e3.init_params(cfg, jax.random.PRNGKey(0)), d2t, t2d)
    eagle_formats.save_head(str(tmp_path), head, 'official', 'float32')
    plain = generate.run(tiny_config)
    c = generate.default_config(tiny=True)
    c.prompts = tiny_config.prompts
    c.spec.mode, c.spec.drafter, c.spec.draft, c.spec.num_draft = (
        'chain',
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
    c.spec.mode = 'beam'
    with pytest.raises(ValueError, match=r"spec.mode='beam' is not one of \('ar', 'chain', 'tree'"):
        generate.run(c)
    c.spec.mode = 'tree'
    bad_drafter = "set spec.drafter to 'eagle3', 'dflash' or 'self' \\(got 'lm'\\)"
    with pytest.raises(ValueError, match=bad_drafter):
        generate.run(c)
    c.spec.drafter, c.spec.draft, c.spec.tree.static = 'eagle3', 'random', '0,0,x'
    with pytest.raises(ValueError, match="spec.tree.static='0,0,x': give the parents"):
        generate.run(c)
    c.spec.mode = 'chain'
    c.spec.drafter = 'oracle'
    with pytest.raises(ValueError, match=r"drafter 'oracle' is not one of \('none', 'lm'"):
        generate.run(c)
    for kind in ('lm', 'eagle3'):
        c.spec.drafter, c.spec.draft = kind, ''
        with pytest.raises(ValueError, match=f"drafter '{kind}' needs a draft"):
            generate.run(c)
    c.spec.drafter, c.spec.lookup = 'ngram', 2
    with pytest.raises(ValueError, match="drafter 'ngram' has none"):
        generate.run(c)
    c.spec.drafter, c.spec.draft, c.spec.lookup = 'lm', 'random:tiny', 4
    with pytest.raises(ValueError, match=r'lookup=4 must be in \[0, ngram=3\]'):
        generate.run(c)


def test_draft_with_another_tokenizer_is_refused(caplog):
    check_same_tokenizer = drafters.check_same_tokenizer

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
    cache = tmp_path / 'jax_cache'  # The launcher's persistent compilation cache.
    run = subprocess.run(
        [sys.executable, os.path.join(root, 'launch', 'generate.py'),
         f'--config={os.path.join(root, "configs", "smollm2_135m_chain.py")}:tiny',
         f'--workdir={tmp_path}', *flags],
        cwd=root, capture_output=True, text=True,
        env={**os.environ, 'SPEC_JAX_COMPILATION_CACHE': str(cache)},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert os.listdir(cache)  # The compiled loop is on disk for the next run.
    with open(os.path.join(tmp_path, 'generations.jsonl')) as f:
        chain = [json.loads(line) for line in f]
    plain = generate.run(generate.default_config(tiny=True))
    assert [r['text'] for r in chain] == [r['text'] for r in plain]
    assert all(r['blocks'] >= 1 for r in chain)


def test_prompts_draw_their_own_noise():
    """Sampling one prompt four times in batches of two: every copy differs (each prompt's
    noise comes from its index), and a second run reproduces the first."""
    c = generate.default_config(tiny=True)
    c.prompts, c.batch_size = ('Hello there',) * 4, 2
    c.sampling.temperature = 1.0
    texts = [r['text'] for r in generate.run(c)]
    assert len(set(texts)) == 4
    assert [r['text'] for r in generate.run(c)] == texts
