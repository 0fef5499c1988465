"""The prior bench (a drafter's acceptance on held-out prompts, written beside it) and the
build reading it back as the adaptive engine's first prior."""

import json

import jax
import numpy as np
import pytest

from configs import bench_prior as bench_prior_config
from spec_jax import checkpoints, decoding
from spec_jax.checkpoints import eagle_formats
from spec_jax.decoding.drafters import measured
from spec_jax.jobs import bench_prior, generate
from spec_jax.models import eagle3 as e3


def tiny(**kw):
    c = bench_prior_config.get_config('tiny')
    c.update(kw)
    return c


def test_a_draft_that_is_the_target_accepts_every_draft_and_a_random_head_few(tmp_path):
    # The tiny draft LM is the tiny target (same preset, same seed): greedy accepts all.
    same = bench_prior.run(tiny(out=str(tmp_path / 'lm.json')))
    rec = same['by_lookup']['0']
    assert rec['depth_1'] == 1.0 and rec['accepted_at_position'] == rec['reached_at_position']
    assert rec['reached_at_position'][0] > 0 and set(rec['by_set']) == {'mt_bench', 'gsm8k'}
    # A random head over the whole vocabulary is rarely the target's argmax.
    other = bench_prior.run(tiny(drafter='eagle3', draft='random', out=str(tmp_path / 'h.json')))
    rec = other['by_lookup']['0']
    assert rec['depth_1'] < 0.5 and rec['accepted_at_position'][0] < rec['reached_at_position'][0]
    card = json.loads((tmp_path / 'h.json').read_text())
    assert card['kind'] == 'eagle3' and card['measured']['start'] == 8 and card['commit']
    assert card['measured']['prompts'] == 4 and card['by_lookup']['0'] == rec


def test_held_out_prompts_start_past_the_benches_and_say_when_a_set_is_short():
    tok = checkpoints.load('random:tiny').tokenizer
    got = bench_prior.held_out(tiny(), tok)
    assert [name for name, _ in got] == ['mt_bench'] * 2 + ['gsm8k'] * 2
    first = bench_prior.held_out(tiny(start=0, prompts_per_set=10), tok)
    assert [ids for _, ids in got] == [ids for _, ids in first[8:10] + first[18:20]]
    with pytest.raises(ValueError, match="speed set 'mt_bench' has 10 prompts; start=9"):
        bench_prior.held_out(tiny(start=9), tok)


def test_the_build_starts_an_adaptive_engine_from_the_measured_prior(tmp_path, capsys):
    target = checkpoints.load('random:tiny')
    cfg = e3.Eagle3Config.for_target(target.cfg, 64)
    d2t, t2d = e3.vocab_maps(np.arange(0, 640, 10), target.cfg.vocab_size)
    head = e3.Eagle3Head(cfg, e3.init_params(cfg, jax.random.PRNGKey(0)), d2t, t2d)
    eagle_formats.save_head(str(tmp_path), head, 'official', 'float32')
    c = generate.default_config(tiny=True)
    s = c.spec
    s.mode, s.drafter, s.draft, s.num_draft = 'chain', 'eagle3', str(tmp_path), 2
    c.spec.adaptive.tiers = 'auto'
    assert decoding.build(c).engine.adaptive.prior == 0.7  # No acceptance.json yet.
    assert 'the drafter has no measured acceptance' in capsys.readouterr().out
    card = bench_prior.run(tiny(drafter='eagle3', draft=str(tmp_path)))
    assert (tmp_path / measured.FILE).exists()
    want, _ = measured.prior(str(tmp_path), 'eagle3', 0)  # Per depth, while reached 20 times.
    assert want[0] == pytest.approx(np.clip(card['by_lookup']['0']['depth_1'], 0.01, 0.99))
    capsys.readouterr()
    np.testing.assert_allclose(decoding.build(c).engine.adaptive.prior, want, rtol=1e-6)
    assert f'adaptive prior {want[0]:.3f}' in capsys.readouterr().out
    c.spec.lookup = 2  # Not measured behind lookup: the configured prior.
    assert decoding.build(c).engine.adaptive.prior == 0.7
    c.spec.lookup, c.spec.adaptive.prior_from = 0, ''
    assert decoding.build(c).engine.adaptive.prior == 0.7
    c.spec.adaptive.prior_from = 'card'
    with pytest.raises(ValueError, match="prior_from='card': give 'drafter'"):
        decoding.build(c)


def write(path, card):
    path.mkdir(exist_ok=True)
    (path / measured.FILE).write_text(json.dumps(card))


def test_a_measured_prior_is_read_by_kind_and_lookup_and_refused_when_malformed(tmp_path):
    card = dict(kind='lm', target='embedded', commit='abc',
                measured=dict(sets=['qa'], start=5, prompts=5, chain=4, rule='lossless',
                              temperature=0.0),
                by_lookup={'0': dict(depth_1=0.31), '2': dict(depth_1=1.0)})
    write(tmp_path / 'd', card)
    value, said = measured.prior(str(tmp_path / 'd'), 'lm', 0)
    assert value == (0.31,) and 'behind lookup 0' in said  # No counts: depth 1 alone.
    assert '5 held-out prompts of qa (from prompt 6 of each)' in said
    assert measured.prior(str(tmp_path / 'd'), 'lm', 2)[0] == (0.99,)  # Never sure.
    assert measured.prior(str(tmp_path / 'd'), 'lm', 1) is None  # Not measured there.
    assert measured.prior(str(tmp_path / 'none'), 'lm', 0) is None
    assert measured.prior('embedded', 'lm', 0) is None  # A checkpoint spec, no directory.
    with pytest.raises(measured.MeasuredPriorError, match="measured a 'lm' drafter; this "
                                                          "engine drafts with 'eagle3'"):
        measured.prior(str(tmp_path / 'd'), 'eagle3', 0)
    write(tmp_path / 'e', dict(card, by_lookup={'0': dict(depth_1=1.5)}))
    with pytest.raises(measured.MeasuredPriorError, match=r'depth_1 1.5 at lookup 0: give a rate'):
        measured.prior(str(tmp_path / 'e'), 'lm', 0)
    write(tmp_path / 'f', dict(kind='lm', by_lookup=[]))
    with pytest.raises(measured.MeasuredPriorError, match='not a measured acceptance record'):
        measured.prior(str(tmp_path / 'f'), 'lm', 0)
