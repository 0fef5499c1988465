"""The paper's own items (source 'fast_hsd', `spec_jax.eval.tasks.fast_hsd`): the bundled
files are Fast-HSD's (sha256 against the prefixes of the README that came with them), each
task yields the paper's selection in its own schema, every item's gold scores correct with our
scorers, and the sources without the paper's items say why."""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import os
from collections import Counter

import pytest

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval import tasks
from spec_jax.eval.tasks import fast_hsd
from spec_jax.eval.tasks.bfcl import reference_response

# The sha256 prefixes of ../shared/data/fast_hsd/README.md (the files as rebuilt and checked
# against Fast-HSD's), and the row counts of its table.
SHA256 = {
    'gsm8k': ('7772ef38', 1319),
    'bfcl': ('8c435ead', 200),
    'mbppplus': ('9e3a309e', 378),
    'include': ('42d1bd84', 220),
    'competition_math': ('e43add5b', 240),
}

# A model answer that states the gold, per task, and the number of items of the selection.
GOLD_ANSWERS = {
    'gsm8k': (lambda item: f'#### {item.gold}', 1319),
    'math': (lambda item: f'\\boxed{{{item.gold}}}', 240),
    'include': (lambda item: f'The answer is ({item.gold})', 220),
    'bfcl_parallel_multiple': (reference_response, 200),
}


def _bundled(relpath: str) -> list[dict]:
    with open(os.path.join(data_files.BUNDLED, relpath)) as f:
        return [json.loads(line) for line in f if line.strip()]


@pytest.mark.parametrize('bench', sorted(SHA256))
def test_the_bundled_files_are_fast_hsds(bench):
    prefix, count = SHA256[bench]
    relpath, expected = fast_hsd.FILES[bench]
    with open(os.path.join(fast_hsd.BUNDLED, relpath), 'rb') as f:
        assert hashlib.sha256(f.read()).hexdigest().startswith(prefix)
    assert expected == count
    rows = fast_hsd.questions(bench)
    assert [r['question_id'] for r in rows] == list(range(count))


@pytest.mark.parametrize('name', sorted(GOLD_ANSWERS))
def test_every_gold_scores_correct_with_our_scorers(name):
    """The paper's items through our prompts and scorers: the gold, written as a model would
    state it, is correct on every item (MATH at 240: what is bundled)."""
    answer, count = GOLD_ANSWERS[name]
    task = tasks.make(name)
    items = task.load('fast_hsd', 240 if name == 'math' else 0)
    assert len(items) == count and len({it.id for it in items}) == count
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # The math scorers' two workers.
        scores = list(pool.map(lambda it: task.score(it, answer(it)), items))
    wrong = [(it.id, it.gold, s.detail) for it, s in zip(items, scores) if not s.correct]
    assert wrong == []


def test_gsm8k_and_math_rows_are_the_releases():
    """GSM8K: the whole test split in file order (its first 50 are the bundled test sample);
    MATH: the competition_math train rows 0-239, all Algebra, ids 'train/<row>'."""
    items = tasks.make('gsm8k').load('fast_hsd')
    sample = tasks.make('gsm8k').load('')
    assert items[: len(sample)] == sample
    math = tasks.make('math').load('fast_hsd', 240)
    assert [it.id for it in math] == [f'train/{k}' for k in range(240)]
    assert {it.meta['subject'] for it in math} == {'Algebra'}
    assert math[0].gold == '0' and math[0].messages[1]['content'].startswith('Let \\[f(x)')


def test_include_is_the_papers_220_parsed_back():
    rows = fast_hsd.include_rows()
    source = fast_hsd.questions('include')
    assert Counter(Counter(r['language'] for r in rows).values()) == {5: 44}
    for row, record in zip(rows, source):
        options = [row[f'option_{c}'] for c in 'abcd']
        assert all(options) and len(options) == 4
        assert 'ABCD'[row['answer']] == record['reference'][0]
        assert row['subject'] == record['category'] and row['language'] == record['language']
        rebuilt = (
            f'Question:\n{row["question"]}\nOptions:\n'
            + '\n'.join(f'{c}. {o}' for c, o in zip('ABCD', options))
            + "\nAnswer: Let's think step by step."
        )
        assert rebuilt == record['turns'][0]
    items = tasks.make('include', languages=('Greek', 'Urdu')).load('fast_hsd')
    assert [it.meta['language'] for it in items] == ['Greek'] * 5 + ['Urdu'] * 5
    assert items[0].id.startswith('fast_hsd/') and items[0].gold in 'ABCD'
    with pytest.raises(ValueError, match="per_language=5 with source 'fast_hsd'"):
        tasks.make('include', per_language=5).load('fast_hsd')
    with pytest.raises(DataFileError, match='exactly 4 options'):
        fast_hsd.parse_include("Question:\nq\nOptions:\nA. a\nB. b\nC. c\nAnswer: Let's think "
                               'step by step.')  # fmt: skip


def test_bfcl_is_the_papers_200_parsed_back():
    """All 200 parse (the functions re-serialise to the prompt's JSON); the first 5 equal
    the bundled BFCL v4 parallel_multiple sample, questions, functions and answers."""
    rows, answers = fast_hsd.bfcl_rows('parallel_multiple')
    assert [r['id'] for r in rows] == [f'parallel_multiple_{k}' for k in range(200)]
    v4 = _bundled('bfcl/BFCL_v4_parallel_multiple.json')
    v4_answers = _bundled('bfcl/possible_answer/BFCL_v4_parallel_multiple.json')
    assert rows[: len(v4)] == v4 and answers[: len(v4)] == v4_answers[: len(v4)]
    with pytest.raises(DataFileError, match='re-serialise'):
        fast_hsd.parse_bfcl(fast_hsd.questions('bfcl')[0]['turns'][0].replace('  {', ' {', 1))


def test_mbppplus_is_v020_in_task_id_order():
    """The paper's MBPP+ is v0.2.0 in task_id order: question k is the k-th v0.2.0 id, and
    the bundled v0.2.0 rows' canonical solutions are its reference code."""
    ids = json.load(open(os.path.join(data_files.BUNDLED, 'mbppplus/task_ids.json')))['v0.2.0']
    records = fast_hsd.questions('mbppplus')
    assert len(ids) == len(records) == 378
    for row in _bundled('mbppplus/MbppPlus-v0.2.0.jsonl'):
        record = records[ids.index(row['task_id'])]
        assert record['reference'][0].strip() == row['canonical_solution'].strip()
        assert f'The function must be named `{row["entry_point"]}`.' in record['turns'][0]


def test_math_beyond_240_reads_the_hub_in_order():
    """Rows 240.. come from the hub's train split in its order, after its first 240 are
    checked against the bundled ones; offline (no hub here) that is a DataFileError."""
    bundled = fast_hsd.math_rows(240)
    extra = [{'problem': f'p{k}', 'solution': f'\\boxed{{{k}}}', 'type': 'Algebra',
              'level': 'Level 1'} for k in range(240, 600)]  # fmt: skip
    hub = [{k: r[k] for k in ('problem', 'solution', 'type', 'level')} for r in bundled] + extra
    rows = fast_hsd.math_rows(0, lambda: hub)
    assert len(rows) == fast_hsd.MATH_SIZE and rows[:240] == bundled
    assert rows[240]['id'] == 'train/240' and rows[240]['problem'] == 'p240'
    with pytest.raises(DataFileError, match="differs from the paper's row 1"):
        fast_hsd.math_rows(300, lambda: [hub[0], hub[2], hub[1], *hub[3:]])
    assert fast_hsd.needs_hub('math', 0) and not fast_hsd.needs_hub('math', 240)

    def offline():
        raise DataFileError('offline')

    with pytest.raises(DataFileError, match='offline, use a limit of at most 240'):
        fast_hsd.math_rows(241, offline)


@pytest.mark.parametrize(
    'name, match',
    [
        ('mbppplus', "no tests, so it cannot be scored.*source ''.*'hub'"),
        ('humaneval', "the paper has no items of this task.*'bfcl_parallel_multiple'"),
        ('aime24', 'the paper has no items of this task'),
        ('bfcl_simple_python', 'for bfcl_parallel_multiple only'),
    ],
)
def test_tasks_without_the_papers_items_say_why(name, match):
    with pytest.raises(DataFileError, match=match):
        tasks.make(name).load('fast_hsd')


@pytest.mark.parametrize('name', ['gsm8k', 'include', 'bfcl_parallel_multiple', 'mbppplus'])
def test_an_unknown_source_names_the_valid_ones(name):
    with pytest.raises(DataFileError, match="'hub', 'fast_hsd'"):
        tasks.make(name).load('fasthsd')
