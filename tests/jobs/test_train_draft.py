"""The train_draft job end to end on its :tiny configs: data -> train -> eval -> export."""

import json
import os

import numpy as np
import pytest

from spec_jax import checkpoints, data_files
from spec_jax.jobs import train_draft
from spec_jax.jobs.runtime import load_config
from spec_jax.train import fit

CONFIGS = os.path.join(os.path.dirname(__file__), '..', '..', 'configs')


@pytest.mark.parametrize('name', ['smollm2_135m_draft', 'smollm2_135m_eagle3'])
def test_tiny_job_runs_and_exports(name, tmp_path):
    c = load_config(os.path.join(CONFIGS, f'{name}.py'), 'tiny')
    c.export.dir = str(tmp_path / 'export')
    summary = train_draft.run(c, str(tmp_path / 'work'))
    assert os.path.exists(tmp_path / 'work' / 'summary.json')
    assert os.listdir(tmp_path / 'export')
    _check_per_set(summary['eval'], c.eval.sets)
    if summary['kind'] == 'eagle3':  # Its :tiny trains on stored taps and top-k labels.
        (stored,) = summary['teacher_taps'].values()
        assert stored['shards_written'] >= 1 and stored['tokens'] > 0
        assert summary['steps'] == c.train.steps
        _check_init_from(c, tmp_path)
    if summary['kind'] == 'draft_lm':  # An HF directory that spec_jax loads back.
        assert checkpoints.load(c.export.dir).cfg.num_layers >= 1
        _check_extra_dirs(summary, tmp_path)


def _check_per_set(ev, sets):
    """The held-out agreement broken down by speed set adds up to the overall figure."""
    per_set = ev['per_set']
    assert per_set and set(per_set) <= set(sets)
    tokens = sum(x['tokens'] for x in per_set.values())
    hits = sum(x['agreement'] * x['tokens'] for x in per_set.values())
    overall = ev['depth_agreement'][0] if 'depth_agreement' in ev else ev['per_token_acceptance']
    if 'tokens' in ev:
        assert tokens == ev['tokens']
    assert abs(hits / tokens - overall) < 1e-3


def _check_init_from(c, tmp_path):
    """model.init_from fine-tunes an exported head: with no steps it exports it unchanged,
    draft vocabulary included, whatever model.draft_vocab_size says."""
    from spec_jax.checkpoints import eagle_formats

    c.model.init_from, c.model.draft_vocab_size = c.export.dir, 7
    c.export.dir, c.train.steps, c.eval.enabled = str(tmp_path / 'again'), 0, False
    train_draft.run(c, str(tmp_path / 'finetune'))
    first = eagle_formats.read_state(c.model.init_from)
    again = eagle_formats.read_state(c.export.dir)
    assert sorted(first) == sorted(again)
    for key, value in first.items():
        np.testing.assert_array_equal(again[key], value, err_msg=key)


def _check_extra_dirs(summary, tmp_path):
    """data.extra_dirs adds another run's finished shards; an empty one is an error."""
    data_dir = str(tmp_path / 'work' / 'data')
    c = load_config(os.path.join(CONFIGS, 'smollm2_135m_draft.py'), 'tiny')
    c.data.generate, c.data.dir, c.data.extra_dirs = False, data_dir, (data_dir,)
    c.train.steps, c.eval.enabled = 0, False
    again = train_draft.run(c, str(tmp_path / 'again'))
    assert again['examples'] == 2 * summary['examples']
    c.data.extra_dirs = (str(tmp_path),)
    with pytest.raises(ValueError, match='no finished shards'):
        train_draft.run(c, str(tmp_path / 'again'))
    # Soft labels: stored next to the shards once, then the cheap steps train on them.
    c.data.extra_dirs, c.train.steps, c.train.teacher_topk = (), 3, 4
    soft = train_draft.run(c, str(tmp_path / 'soft'))
    assert soft['teacher_topk'][data_dir]['shards_written'] >= 1
    assert soft['steps'] == 3 and 'soft_ce' in soft['last']
    c.data.reference = ('gsm8k',)
    with pytest.raises(ValueError, match='data.reference'):
        train_draft.run(c, str(tmp_path / 'soft'))
    c.train.teacher_topk, c.train.ce_steps = 0, -1  # Dataset answers need KL steps.
    with pytest.raises(ValueError, match='they need KL steps'):
        train_draft.run(c, str(tmp_path / 'soft'))
    # Checkpoints trained on one example list never resume on another.
    c.data.reference, c.data.extra_dirs, c.train.steps = (), (data_dir,), 6
    with pytest.raises(ValueError, match='training examples changed'):
        train_draft.run(c, str(tmp_path / 'soft'))


def test_metrics_log_drops_what_a_crashed_run_wrote_after_its_checkpoint(tmp_path):
    log = fit.metrics_logger(str(tmp_path))
    for step in (5, 10, 15):  # Checkpoint at 10, crash after logging 15.
        log(step, {'loss': float(step)})
    resumed = fit.metrics_logger(str(tmp_path))
    resumed(15, {'loss': -1.0})
    resumed(20, {'loss': -2.0})
    with open(tmp_path / 'metrics.jsonl') as f:
        rows = [json.loads(line) for line in f]
    assert [(r['step'], r['loss']) for r in rows] == [(5, 5.0), (10, 10.0), (15, -1.0), (20, -2.0)]


def test_full_size_draft_trains_with_ce_for_every_step():
    """Overriding train.steps never switches the full-size recipe to KL; :tiny tests both."""
    c = load_config(os.path.join(CONFIGS, 'smollm2_135m_draft.py'))
    c.train.steps = 1400
    assert fit.ce_step_count(c.train) == 1400
    tiny = load_config(os.path.join(CONFIGS, 'smollm2_135m_draft.py'), 'tiny')
    assert 0 < fit.ce_step_count(tiny.train) < tiny.train.steps


def test_summarize_source_needs_data_dirs():
    c = load_config(os.path.join(CONFIGS, 'smollm2_135m_draft.py'), 'tiny')
    c.data.sources = ('summarize', 'gsm8k')
    with pytest.raises(ValueError, match='set data.summarize_dirs'):
        train_draft.check_config(c)


@pytest.mark.parametrize('name', ['smollm2_135m_draft', 'smollm2_135m_eagle3'])
def test_missing_data_fails_before_any_model_loads(name, tmp_path):
    """An empty data root: the job names the first missing file and the field to set before
    it loads the target (a target path that does not exist would fail otherwise)."""
    c = load_config(os.path.join(CONFIGS, f'{name}.py'), 'tiny')
    c.data.root, c.target = str(tmp_path), str(tmp_path / 'no_such_model')
    with pytest.raises(data_files.DataFileError, match=r"'gsm8k/train.jsonl' .*--config.data.root"):
        train_draft.run(c, str(tmp_path / 'work'))
    c.data.generate = False  # Held-out speed prompts are data too.
    with pytest.raises(data_files.DataFileError, match=r"'speed/mt_bench.jsonl'.*EAGLE"):
        train_draft.run(c, str(tmp_path / 'work'))
