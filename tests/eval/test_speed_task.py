"""The speed sets on their bundled samples (spec_jax/assets/data/speed/): loading, local
files in EAGLE's layout, and the unscored verdict."""

import json
import os

import pytest

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks import speed
from spec_jax.eval.tasks.base import Score

SETS = data_files.SPEED_SETS


def bundled_rows(set_name: str) -> list[dict]:
    return data_files.read_jsonl(f'speed/{set_name}.jsonl')


def test_registry():
    assert sorted(speed.TASKS) == sorted(f'speed_{s}' for s in SETS)
    for name, cls in speed.TASKS.items():
        assert cls.name == name and cls().name == name
        assert cls.relpath == data_files.speed_files([cls.set_name])[0]
        assert cls.scored is False
    assert speed.SpeedSet.for_set('qa', root='/r') == speed.SpeedQA(root='/r')
    with pytest.raises(ValueError, match="unknown speed set 'nope'.*mt_bench"):
        speed.SpeedSet.for_set('nope')


@pytest.mark.parametrize('set_name', SETS)
def test_load_the_bundled_rows(set_name):
    task = speed.SpeedSet.for_set(set_name)
    rows = bundled_rows(set_name)
    items = task.load()
    assert len(items) == len(rows) == 10
    assert [item.id for item in items] == [str(i) for i in range(len(rows))]
    assert len({item.id for item in items}) == len(items)
    for item, row in zip(items, rows):
        assert item.task == f'speed_{set_name}'
        assert len(item.messages) == 1
        (message,) = item.messages
        assert message['role'] == 'user'
        assert message['content'].strip() and message['content'] == row['turns'][0]
        assert item.gold is None
        assert item.meta == {'set': set_name}
    # The prompts the bench and draft-training jobs read from the same files.
    prompts = data_files.speed_prompts([set_name], len(rows))
    assert [(set_name, item.messages[0]['content']) for item in items] == prompts


def test_mt_bench_keeps_the_first_turn_only():
    rows = bundled_rows('mt_bench')
    assert all(len(row['turns']) == 2 for row in rows)
    items = speed.SpeedMTBench().load()
    assert [item.messages[0]['content'] for item in items] == [row['turns'][0] for row in rows]


@pytest.mark.parametrize('set_name', ['mt_bench', 'sum'])
def test_limit(set_name):
    task = speed.SpeedSet.for_set(set_name)
    full = task.load()
    assert task.load(limit=3) == full[:3]
    assert task.load(limit=100) == full
    with pytest.raises(ValueError, match='limit must be >= 0'):
        task.load(limit=-1)


def test_unscored():
    task = speed.SpeedGSM8K()
    (item,) = task.load(limit=1)
    assert task.scored is False
    for text in ('', 'The answer is 42.', item.messages[0]['content']):
        assert task.score(item, text) == Score(False, None, {'unscored': True})


def test_hub_is_refused():
    with pytest.raises(ValueError, match="speed_alpaca.*not loaded from the hub.*source ''"):
        speed.SpeedAlpaca().load('hub')


def test_load_on_an_empty_data_root_names_the_file(tmp_path, monkeypatch):
    with pytest.raises(DataFileError, match='speed/qa.jsonl'):
        speed.SpeedQA(root=str(tmp_path)).load()
    monkeypatch.setenv(data_files.ENV_VAR, str(tmp_path))
    with pytest.raises(DataFileError, match='speed/qa.jsonl'):
        speed.SpeedQA().load()
    with pytest.raises(DataFileError, match='qa.jsonl'):
        speed.SpeedQA().load(str(tmp_path))


def write_rows(path, rows: list[dict]) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, 'w') as f:
        f.writelines(json.dumps(row) + '\n' for row in rows)
    return str(path)


def test_load_local_files_and_directories(tmp_path):
    rows = bundled_rows('humaneval')[:4]
    expected = [row['turns'][0] for row in rows]
    task = speed.SpeedHumanEval()

    def prompts(source: str) -> list[str]:
        return [item.messages[0]['content'] for item in task.load(source)]

    # A file, a data root, a folder of <set>.jsonl files, and EAGLE's eagle/data/.
    assert prompts(write_rows(tmp_path / 'mine.jsonl', rows)) == expected
    write_rows(tmp_path / 'root' / 'speed' / 'humaneval.jsonl', rows)
    assert prompts(str(tmp_path / 'root')) == expected
    write_rows(tmp_path / 'flat' / 'humaneval.jsonl', rows)
    assert prompts(str(tmp_path / 'flat')) == expected
    write_rows(tmp_path / 'eagle' / 'humaneval' / 'question.jsonl', rows)
    assert prompts(str(tmp_path / 'eagle')) == expected
    # A folder without this set names the files it looked for.
    with pytest.raises(DataFileError, match="'speed/gsm8k.jsonl', 'gsm8k.jsonl', 'gsm8k/ques"):
        speed.SpeedGSM8K().load(str(tmp_path / 'eagle'))
