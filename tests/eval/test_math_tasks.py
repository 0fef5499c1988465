"""Math tasks (GSM8K, MATH-500, MATH, AIME 2024/2025) on the samples bundled in the package:
loading, prompts, math-verify scoring and the scorer's deadline on any thread (the strict
score, hedges and extraction's limits: test_math_answers.py)."""

import dataclasses
import json
import operator
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from math_items import NAMES, boxed, by_gold, is_int, items

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks import timeouts
from spec_jax.eval.tasks.base import Score
from spec_jax.eval.tasks.math import (
    AIME24,
    AIME25,
    GSM8K,
    MATH,
    MATH500,
    TASKS,
    extract_answer,
    judge,
    last_boxed,
)

# A power tower that sympy evaluates for minutes (CPU-bound, little memory).
PATHOLOGICAL = r'so the answer is \boxed{9^{9^{9^{9}}}}.'


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize('name', NAMES)
def test_load_items_prompts_and_ids(name):
    task = TASKS[name]()
    loaded = items(name)
    rows = data_files.read_jsonl(task.relpath)
    assert len(loaded) == len(rows) > 0
    assert len({item.id for item in loaded}) == len(loaded)
    for item in loaded:
        assert item.task == name == task.name
        system, user = item.messages
        assert system['role'] == 'system' and '\\boxed{}' in system['content']
        assert 'step by step' in system['content']
        assert user['role'] == 'user' and user['content'].strip()
        assert isinstance(item.gold, str) and item.gold
    assert [item.id for item in task.load(limit=3)] == [item.id for item in loaded[:3]]
    assert len(task.load(limit=3)) == 3


def test_gold_answers_and_ids_follow_each_release():
    gsm8k = items('gsm8k')
    assert gsm8k[0].gold == '18' and gsm8k[2].gold == '70000'  # '#### 70000' in the file.
    assert gsm8k[0].id == '0' and gsm8k[0].messages[1]['content'].startswith('Janet')
    math500 = items('math500')
    assert math500[0].id == 'test/precalculus/807.json'
    assert math500[0].gold == '\\left( 3, \\frac{\\pi}{2} \\right)'
    assert math500[0].meta == {'subject': 'Precalculus', 'level': 2}
    math = items('math')
    assert [item.gold for item in math[:3]] == ['2', '10', '\\dfrac{9}{7}']  # Last \boxed{}.
    assert math[0].id == '0' and math[0].meta == {'subject': 'Algebra', 'level': 'Level 3'}
    aime24 = items('aime24')
    assert aime24[0].id == '60' and aime24[7].gold == '25'  # '025' in the file.
    assert all(is_int(item.gold) for item in aime24 + items('aime25'))
    assert items('aime25')[0].gold == '70' and items('aime25')[0].id == '0'


def test_aime25_escape_damage_is_repaired():
    raw = data_files.read_jsonl('aime25/test.jsonl')
    damaged = [i for i, row in enumerate(raw) if '\x0c' in row['problem'] or '\t' in row['problem']]
    assert damaged == [18, 19, 27]  # The bundled file is verbatim, damage included.
    problems = [item.messages[1]['content'] for item in items('aime25')]
    assert not any('\x0c' in p or '\t' in p for p in problems)
    assert '\\frac{\\log_k (5^{k^2 - 1})}' in problems[18]
    assert '\\triangle DEF' in problems[19]
    assert '$\\frac{m}{n}$' in problems[27]
    assert all(
        p == row['problem'] for i, (p, row) in enumerate(zip(problems, raw)) if i not in damaged
    )


@pytest.mark.parametrize('name', NAMES)
def test_load_from_an_empty_data_root_names_the_file_field_and_hub(name, tmp_path):
    task = TASKS[name](root=str(tmp_path))
    with pytest.raises(DataFileError) as e:
        task.load()
    message = str(e.value)
    assert task.relpath in message and 'data_root' in message and task.hub[0] in message


def test_load_from_local_files_and_directories(tmp_path):
    task = MATH500()
    rows = data_files.read_jsonl(task.relpath)[:5]
    expected = task.load(limit=5)
    (tmp_path / 'math500').mkdir()
    jsonl = tmp_path / 'math500' / 'test.jsonl'
    jsonl.write_text(''.join(json.dumps(row) + '\n' for row in rows))
    as_list = tmp_path / 'rows.json'
    as_list.write_text(json.dumps(rows))
    pq = pytest.importorskip('pyarrow.parquet')
    pa = pytest.importorskip('pyarrow')
    parquet = tmp_path / 'test-00000-of-00001.parquet'
    pq.write_table(pa.Table.from_pylist(rows), parquet)
    for source in (jsonl, as_list, parquet, tmp_path, tmp_path / 'math500'):
        assert task.load(str(source)) == expected, source
    assert MATH500(root=str(tmp_path)).load() == expected  # The root, through data_files.
    with pytest.raises(DataFileError, match='not found'):
        task.load(str(tmp_path / 'missing.jsonl'))
    (tmp_path / 'empty').mkdir()
    with pytest.raises(DataFileError, match="'math500/test.jsonl' nor 'test.jsonl'"):
        task.load(str(tmp_path / 'empty'))


def test_hub_rows_are_mapped_like_the_release(monkeypatch):
    import datasets

    calls = []

    def fake_load_dataset(hub_id, config=None, split=None):
        calls.append((hub_id, config, split))
        if hub_id == 'EleutherAI/hendrycks_math':  # One config per subject, no ids.
            rows = data_files.read_jsonl('math/test.jsonl')
            return [{k: v for k, v in row.items() if k != 'idx'} for row in rows[:2]]
        relpath = next(t.relpath for t in TASKS.values() if t.hub[0] == hub_id)
        return data_files.read_jsonl(relpath)

    monkeypatch.setattr(datasets, 'load_dataset', fake_load_dataset)
    for name in NAMES:
        if name != 'math':
            assert TASKS[name]().load('hub') == list(items(name))
    assert calls[0] == ('HuggingFaceH4/aime_2024', None, 'train')
    math = MATH().load('hub', limit=3)
    assert [item.id for item in math] == ['algebra/0', 'algebra/1', 'counting_and_probability/0']
    assert [item.gold for item in math] == ['2', '10', '2']
    assert len(MATH().load('hub')) == 14


def test_hub_unreachable_is_a_clear_error(monkeypatch):
    import datasets

    def unreachable(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'openai/gsm8k' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, 'load_dataset', unreachable)
    with pytest.raises(DataFileError, match="could not load 'openai/gsm8k'.*source ''"):
        GSM8K().load('hub')


def test_hub_offline_is_a_clear_error():
    assert os.environ.get('HF_HUB_OFFLINE') == '1'  # tests/conftest.py
    try:
        loaded = AIME25().load('hub')
    except DataFileError as e:
        assert "could not load 'math-ai/aime25'" in str(e) and "HF_HUB_OFFLINE='1'" in str(e)
    else:  # A machine with the hub copy cached loads it offline.
        assert len(loaded) == 30 and all(is_int(item.gold) for item in loaded)


# --------------------------------------------------------------------------- scoring


@pytest.mark.parametrize('name', NAMES)
def test_gold_in_a_plausible_response_scores_correct(name):
    task = TASKS[name]()
    for item in items(name):
        for text in (boxed(item.gold), boxed(item.gold) + ' Check: \\boxed{' + item.gold + '}.'):
            score = task.score(item, text)
            assert score.correct and score.detail['strict'], (item.id, item.gold, score)
            assert score.extracted == item.gold and score.detail['hedges'] == []
            json.dumps(score.detail)  # JSON-ready.
        if name == 'gsm8k':
            for text in (f'So 9 * 2 = 18 in all.\n#### {item.gold}', f'the answer is {item.gold}.'):
                score = task.score(item, text)
                assert score.correct and score.detail['strict'], (item.id, text, score)


@pytest.mark.parametrize('name', NAMES)
def test_perturbed_answers_score_wrong(name):
    task = TASKS[name]()
    for item in items(name):
        g = item.gold
        if is_int(g):
            wrong = [str(int(g) + 1), str(int(g) - 1), str(-int(g))]
        else:
            wrong = [f'{g}+1', f'-({g})', f'2{g}']
        for answer in wrong:
            score = task.score(item, boxed(answer))
            assert not score.correct, (item.id, g, answer, score)


@pytest.mark.parametrize(
    'name, gold, answer',
    [
        ('math500', '90^\\circ', '\\frac{\\pi}{2}'),  # Radians where degrees were asked.
        ('math500', '10', '0.1'),  # A rate as a fraction where a percentage was asked.
        ('gsm8k', '70000', '70'),  # Thousands of dollars for dollars.
        ('math500', '\\left( 3, \\frac{\\pi}{2} \\right)', '(-3, \\frac{\\pi}{2})'),
        ('math500', '\\left( 3, \\frac{\\pi}{2} \\right)', '(\\frac{\\pi}{2}, 3)'),  # Order.
        ('math500', '6 - 5i', '6 + 5i'),
        ('math500', '\\text{Evelyn}', '\\text{Bob}'),
        ('math500', '1,-2', '1, 2'),
        ('math500', '1.25', '1.26'),
    ],
)
def test_wrong_units_signs_and_orders_score_wrong(name, gold, answer):
    item = by_gold(name, gold)
    assert not TASKS[name]().score(item, boxed(answer)).correct


@pytest.mark.parametrize(
    'name, gold, answer',
    [
        ('math500', '\\frac{14}{3}', '14/3'),
        ('math500', '\\frac{14}{3}', '4\\frac{2}{3}'),
        ('math500', '\\frac{14}{3}', '\\frac{28}{6}'),  # Unsimplified.
        ('math500', '\\frac{3}{2}', '1.5'),
        ('math500', '1.25', '\\frac54'),
        ('math500', '3\\sqrt{13}', '\\sqrt{117}'),
        ('math500', '11\\sqrt2', '11\\sqrt{2}'),
        ('math500', '90^\\circ', '90'),
        ('math500', '1,-2', '-2, 1'),  # A set of solutions, in any order.
        ('math500', 'x=5', '5'),
        ('math500', '\\left( 3, \\frac{\\pi}{2} \\right)', '(3, \\frac{\\pi}{2})'),
        ('math500', '6 - 5i', '6-5i'),
        ('math500', 'p - q', '-q + p'),
        ('math', '\\dfrac{9}{7}', '\\frac{9}{7}'),
        ('math', '\\dfrac{9}{7}', '9/7'),
        ('gsm8k', '70000', '70,000'),
        ('gsm8k', '70000', '\\$70,000.00'),
        ('gsm8k', '18', '18 \\text{ dollars}'),
        ('aime24', '25', '025'),
        ('aime24', '204', '204 \\text{ minutes}'),
    ],
)
def test_equivalent_forms_score_correct(name, gold, answer):
    item = by_gold(name, gold)
    score = TASKS[name]().score(item, boxed(answer))
    assert score.correct, score


@pytest.mark.parametrize(
    'gold, answer',
    [
        ('\\frac{1}{2}', '0.5'),
        ('\\frac{1}{2}', '1/2'),
        ('0.5', '\\frac12'),
        ('3/4', '\\dfrac34'),
        ('2\\sqrt{2}', '\\sqrt{8}'),
        ('x^2+2x+1', '(x+1)^2'),
        ('\\frac{x^2-1}{x-1}', 'x+1'),
    ],
)
def test_math_verify_equivalences(gold, answer):
    assert judge('latex', gold, boxed(answer)).correct
    assert not judge('latex', gold, boxed(f'{answer}+1')).correct


def test_aime_compares_integers():
    assert judge('integer', '73', boxed('73.0')).correct
    assert not judge('integer', '73', boxed('73.5')).correct
    assert not judge('integer', '73', boxed('\\frac{146}{3}')).correct


def test_answers_without_a_box():
    gsm8k, math500, aime25 = GSM8K(), MATH500(), AIME25()
    janet = items('gsm8k')[0]  # 18
    for text, method in [
        ('She sells 9 eggs at $2 each.\n#### 18', '####'),
        ('9 * 2 = 18, so the answer is $18 per day.', 'answer is'),
        ('She keeps 16-3-4 = 9 eggs and sells them: 9 * 2 = 18', 'last number'),
        ('Step 1: 9 eggs. The final answer is 18. Let me know if you need more.', 'answer is'),
    ]:
        score = gsm8k.score(janet, text)
        assert score.correct and score.detail['method'] == method, (text, score)
    assert not gsm8k.score(
        janet, 'Janet sells 9 eggs for 2 dollars each: 20 - 2 = 18? No, 9'
    ).correct
    none = {'method': 'none', 'strict': False, 'hedges': []}
    assert gsm8k.score(janet, 'I cannot tell.') == Score(False, None, none)
    item = by_gold('math500', '\\frac{14}{3}')
    score = math500.score(item, 'Therefore the final answer is $\\frac{14}{3}$.')
    assert score.correct and score.detail['method'] == 'answer is' and score.extracted
    score = math500.score(item, 'Therefore $x = \\frac{14}{3}$.')
    assert score.correct and score.detail['method'] == 'math_verify' and score.extracted
    assert not math500.score(item, 'Therefore the final answer is $\\frac{13}{3}$.').correct
    assert aime25.score(items('aime25')[0], 'The sum of the bases is 21 + 49 = 70.').correct
    # The last box counts, not an earlier one.
    assert not math500.score(item, boxed('\\frac{14}{3}') + ' Wait, no: \\boxed{5}.').correct


def test_last_boxed():
    assert last_boxed('a \\boxed{1} b \\boxed{\\frac{1}{2}} c') == '\\frac{1}{2}'
    assert last_boxed('\\boxed{\\left\\{ 1, 2 \\right\\}}') == '\\left\\{ 1, 2 \\right\\}'
    assert last_boxed('\\fbox{204} minutes') == '204'
    assert last_boxed('\\boxed 5.') == '5'
    assert last_boxed('\\boxed{3} and then \\boxed{\\frac{1}{') == '3'  # Truncated last box.
    assert last_boxed('no box here') is None
    assert last_boxed('\\boxedx{3}') is None
    assert extract_answer('no number', gsm8k=True) == (None, 'none')
    assert extract_answer('x is 20-18 = 2 or 7', gsm8k=True) == ('7', 'last number')
    assert extract_answer('no box', gsm8k=False) == ('no box', 'math_verify')


# --------------------------------------------------------------------------- threads, deadlines


def test_scoring_from_other_threads():
    task = MATH500()
    loaded = items('math500')
    result = {}
    thread = threading.Thread(target=lambda: result.update(s=task.score(loaded[2], boxed('14/3'))))
    thread.start()
    thread.join(60)
    assert result['s'].correct
    with ThreadPoolExecutor(4) as pool:
        scores = list(pool.map(lambda item: task.score(item, boxed(item.gold)), loaded))
    assert all(score.correct for score in scores)


def test_a_stuck_sympy_call_times_out_and_scores_wrong_on_any_thread():
    task = dataclasses.replace(MATH500(), timeout_s=1.0)
    item = items('math500')[3]  # Gold 9.
    task.score(item, boxed('9'))  # A warm worker.
    results = {}

    def run():
        start = time.monotonic()
        results['score'] = task.score(item, PATHOLOGICAL)
        results['seconds'] = time.monotonic() - start

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(30)
    assert not thread.is_alive()
    score = results['score']
    assert not score.correct and score.detail['timeout'] is True
    assert score.detail['strict'] is False and score.extracted is None  # Extracted in the worker.
    # The 1 s timeout fired (the call alone runs for hours); the slack is a loaded runner's.
    assert 1.0 <= results['seconds'] < 10.0
    start = time.monotonic()
    score = task.score(item, PATHOLOGICAL)  # On the main thread too.
    assert score.detail['timeout'] and time.monotonic() - start < 15.0  # Includes a restart.
    assert task.score(item, boxed('9')).correct  # A fresh worker takes over.


def test_deadline_pool():
    pool = timeouts.DeadlinePool(workers=1)
    try:
        assert pool.call(operator.add, 2, 3, timeout_s=30) == 5
        start = time.monotonic()
        with pytest.raises(timeouts.CallTimeout):
            pool.call(time.sleep, 60, timeout_s=0.5)
        assert time.monotonic() - start < 3.0
        with pytest.raises(timeouts.WorkerError, match='ValueError'):
            pool.call(int, 'not a number', timeout_s=30)
        with pytest.raises(timeouts.WorkerError, match='died'):
            pool.call(os._exit, 3, timeout_s=30)
        assert pool.call(operator.mul, 6, 7, timeout_s=30) == 42
    finally:
        pool.close()
    with pytest.raises(RuntimeError, match='closed'):
        pool.call(operator.add, 1, 1, timeout_s=1)


def test_tasks_are_frozen_dataclasses():
    for cls in (GSM8K, MATH500, MATH, AIME24, AIME25):
        task = cls(root='/nowhere', timeout_s=3.0)
        with pytest.raises(dataclasses.FrozenInstanceError):
            task.root = ''
        assert TASKS[task.name] is cls
