"""The generate job end to end on the :tiny configs (random tiny models, real tokenizer)."""

import json
import os

import pytest

from spec_jax.jobs import generate


@pytest.fixture(scope='module')
def tiny_config():
    c = generate.default_config(tiny=True)
    c.prompts = ('Hello there', 'What is 2 + 2?', 'Name a colour.')
    c.batch_size = 2
    return c


def test_generate_writes_and_resumes(tiny_config, tmp_path):
    records = generate.run(tiny_config, str(tmp_path))
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


def test_bad_spec_options(tiny_config):
    c = generate.default_config(tiny=True)
    c.spec.enabled = True
    c.spec.drafter = 'oracle'
    with pytest.raises(ValueError, match="spec.drafter='oracle'"):
        generate.run(c)
    c.spec.drafter = 'lm'
    c.spec.draft = ''
    with pytest.raises(ValueError, match='needs spec.draft'):
        generate.run(c)
