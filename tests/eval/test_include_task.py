"""INCLUDE on a small file in its schema (tests/eval/data/include_sample.jsonl): loading,
prompts, the three-pass letter extraction and the seeded guess."""

import json
import os

import pytest

from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks import include
from spec_jax.eval.tasks.base import Score
from spec_jax.eval.tasks.include import HUB_ID, INCLUDE, TASKS, extract_choice

SAMPLE = os.path.join(os.path.dirname(__file__), 'data', 'include_sample.jsonl')
LANGUAGES = ['German', 'Spanish', 'Chinese', 'Japanese', 'Arabic', 'Hindi', 'Swahili']


def rows() -> list[dict]:
    with open(SAMPLE) as f:
        return [json.loads(line) for line in f]


def test_registry():
    assert TASKS == {'include': INCLUDE}
    assert INCLUDE().name == 'include'


def test_load_a_local_file():
    items = INCLUDE().load(SAMPLE)
    assert len(items) == len(rows()) == 9
    # Grouped by language in order of first appearance; ids count rows per language.
    assert [item.id for item in items[:3]] == ['German/0', 'German/1', 'Spanish/0']
    assert sorted({item.meta['language'] for item in items}) == sorted(LANGUAGES)
    by_id = {item.id: item for item in items}
    assert by_id['German/0'].gold == 'B' and by_id['Hindi/0'].gold == 'D'
    assert by_id['Spanish/1'].gold == 'B' and by_id['Spanish/0'].gold == 'A'
    item = by_id['Chinese/0']
    assert item.task == 'include'
    assert item.meta == {
        'language': 'Chinese',
        'country': 'China',
        'domain': 'Social Science',
        'subject': 'Geography',
        'regional_feature': 'region explicit',
        'level': 'Middle school',
    }
    system, user = item.messages
    assert system == {'role': 'system', 'content': include.DEFAULT_SYSTEM_PROMPT}
    assert user['role'] == 'user'
    content = user['content']
    assert content.endswith("Answer: Let's think step by step.")
    assert 'about Geography' in content and '中国的首都是哪座城市？' in content
    assert '\nA. 上海\nB. 广州\nC. 北京\nD. 深圳\n' in content
    assert INCLUDE(system_prompt='You are Qwen.').load(SAMPLE)[0].messages[0]['content'] == (
        'You are Qwen.'
    )


def test_limit_languages_and_per_language_sample():
    everything = INCLUDE().load(SAMPLE)
    assert INCLUDE().load(SAMPLE, limit=3) == everything[:3]
    with pytest.raises(ValueError, match='limit'):
        INCLUDE().load(SAMPLE, limit=-1)
    spanish = INCLUDE(languages=('Spanish', 'Hindi')).load(SAMPLE)
    assert [item.id for item in spanish] == ['Spanish/0', 'Spanish/1', 'Hindi/0']
    one = INCLUDE(per_language=1).load(SAMPLE)
    assert len(one) == len(LANGUAGES)
    assert [item.meta['language'] for item in one] == [
        'German', 'Spanish', 'Chinese', 'Japanese', 'Arabic', 'Hindi', 'Swahili'
    ]  # fmt: skip
    assert one == INCLUDE(per_language=1).load(SAMPLE)  # Seeded: the same sample each time.
    assert all(item in everything for item in one)  # Ids of the full file are kept.
    draws = set()
    for sample_seed in range(8):
        sample = INCLUDE(per_language=1, sample_seed=sample_seed).load(SAMPLE)
        draws.add(tuple(item.id for item in sample))
    assert len(draws) > 1


def test_other_local_layouts(tmp_path):
    expected = INCLUDE().load(SAMPLE)
    data = rows()
    (tmp_path / 'include').mkdir()
    (tmp_path / 'include' / 'test.jsonl').write_text(open(SAMPLE).read())
    as_list = tmp_path / 'rows.json'
    as_list.write_text(json.dumps(data, ensure_ascii=False))
    sources = [tmp_path, tmp_path / 'include', as_list]
    pq = pytest.importorskip('pyarrow.parquet')
    pa = pytest.importorskip('pyarrow')
    parquet = tmp_path / 'test-00000-of-00001.parquet'
    pq.write_table(pa.Table.from_pylist(data), parquet)
    for source in [*sources, parquet]:
        assert INCLUDE().load(str(source)) == expected, source
    assert INCLUDE(root=str(tmp_path)).load() == expected  # The data root.
    with pytest.raises(DataFileError, match='not found'):
        INCLUDE().load(str(tmp_path / 'missing.jsonl'))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(DataFileError, match="'include/test.jsonl' nor 'test.jsonl'"):
        INCLUDE().load(str(tmp_path / 'empty'))


def test_nothing_bundled_is_a_clear_error():
    with pytest.raises(DataFileError) as e:
        INCLUDE().load('')
    message = str(e.value)
    assert "'include/test.jsonl'" in message and HUB_ID in message and 'data_root' in message
    assert 'no known public source' not in message


def test_hub_rows_one_config_per_language(monkeypatch):
    import datasets

    data = rows()
    calls = []

    def fake_load_dataset(hub_id, config=None, split=None):
        calls.append((hub_id, config, split))
        return [row for row in data if row['language'] == config]

    monkeypatch.setattr(datasets, 'load_dataset', fake_load_dataset)
    monkeypatch.setattr(datasets, 'get_dataset_config_names', lambda hub_id: LANGUAGES)
    assert INCLUDE().load('hub') == INCLUDE().load(SAMPLE)
    assert calls[0] == (HUB_ID, 'German', 'test') and len(calls) == len(LANGUAGES)
    calls.clear()
    items = INCLUDE(languages=('Swahili',), split='validation').load('hub')
    assert calls == [(HUB_ID, 'Swahili', 'validation')] and [i.id for i in items] == ['Swahili/0']


def test_hub_offline_is_a_clear_error():
    assert os.environ.get('HF_HUB_OFFLINE') == '1'  # tests/conftest.py
    try:
        loaded = INCLUDE(languages=('German',)).load('hub')
    except DataFileError as e:
        assert f'could not load {HUB_ID!r}' in str(e) and "HF_HUB_OFFLINE='1'" in str(e)
    else:  # A machine with the hub copy cached loads it offline.
        assert loaded and all(item.gold in 'ABCD' for item in loaded)


# --------------------------------------------------------------------------- scoring


@pytest.mark.parametrize(
    'form',
    [
        'Let me think. Berlin is the seat of government. The answer is ({})',
        'So the answer is {}.',
        'Therefore, the answer is: **{}**',
        'Step 1: recall the facts.\nAnswer: {}',
        'After weighing the options, I pick {}.',
        '{}',
    ],
)
def test_the_right_letter_in_each_form_scores_correct(form):
    task = INCLUDE()
    for item in task.load(SAMPLE):
        score = task.score(item, form.format(item.gold))
        assert score.correct and score.extracted == item.gold, (item.id, form, score)
        assert score.detail['guessed'] is False
        json.dumps(score.detail)
        wrong = 'ABCD'[('ABCD'.index(item.gold) + 1) % 4]
        score = task.score(item, form.format(wrong))
        assert not score.correct and score.extracted == wrong


def test_extraction_passes_in_order():
    assert extract_choice('The answer is (B). Answer: C. Maybe D') == ('B', 'answer is')
    assert extract_choice('First the answer is A; on reflection the answer is C') == (
        'C',
        'answer is',
    )
    assert extract_choice('A looks wrong.\nAnswer: D\nNot B.') == ('D', 'Answer:')
    assert extract_choice('Options A and C are close; C wins, not B') == ('B', 'standalone')
    assert extract_choice('答案是 C') == ('C', 'standalone')
    assert extract_choice('The answer is Bob, not Alice') == (None, 'none')
    assert extract_choice('ABCD are letters; BAD') == (None, 'none')
    assert extract_choice('') == (None, 'none')


def test_no_letter_is_a_seeded_guess():
    items = INCLUDE().load(SAMPLE)
    texts = [f'I am not sure about this one ({k}).' for k in range(40)]
    task = INCLUDE(seed=7)
    scores = [task.score(items[0], text) for text in texts]
    for text, score in zip(texts, scores):
        assert isinstance(score, Score) and score.extracted is None
        assert score.detail['method'] == 'guess' and score.detail['guessed'] is True
        assert score.detail['seed'] == 7 and score.detail['guess'] in 'ABCD'
        assert score.correct == (score.detail['guess'] == items[0].gold)
        assert task.score(items[0], text) == score  # Deterministic for a seed.
        assert INCLUDE(seed=7).score(items[0], text) == score
    guesses = [s.detail['guess'] for s in scores]
    assert set(guesses) == set('ABCD')  # Spread over the options, not a constant.
    other = [INCLUDE(seed=8).score(items[0], t).detail['guess'] for t in texts]
    assert other != guesses
