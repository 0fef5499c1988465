"""HumanEval, MBPP and MBPP+: scoring of full functions and bodies, MBPP+'s base and plus
results and float tolerance; extraction, prompts, loading and pass@k."""

import concurrent.futures
import dataclasses
import gzip
import json
import os
import threading

import pytest

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks import code, pyast
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.bfcl.parse import parse_calls
from spec_jax.eval.tasks.code.extract import sanitize

WORKERS = 3  # Sandbox runs mostly wait on interpreter start-up: a few at a time.

# References passing and mutants failing on a stratified subset, the same verdicts as the old
# in-box harness, forgeries: test_code_verdicts.py.


def score_all(task, pairs: list[tuple[Item, str]]) -> list[Score]:
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        return list(pool.map(lambda p: task.score(*p), pairs))


# --------------------------------------------------------------------------- HumanEval


def test_humaneval_full_function_fenced_and_unindented_body():
    task = code.HumanEval()
    items = task.load(limit=3)
    texts = [
        # A whole function in a fenced block, with prose and a demo call around it.
        'Here you go:\n```python\n'
        + items[0].gold['prompt']
        + items[0].meta['reference']
        + '\nprint(has_close_elements([1.0], 0.5))\n```\nThis checks every pair.',
        # A body that continues the prompt, without its indentation.
        '\n'.join(line[4:] for line in items[1].meta['reference'].splitlines()),
        # A whole function that is wrong.
        f'```python\ndef {items[2].gold["entry_point"]}(number):\n    return 0.0\n```',
    ]
    scores = score_all(task, list(zip(items, texts)))
    assert [s.correct for s in scores] == [True, True, False]
    assert scores[0].extracted.startswith('from typing import List')


def test_humaneval_items():
    items = code.HumanEval().load()
    assert len(items) == 164 and items[0].id == 'HumanEval/0' and items[0].task == 'humaneval'
    system, user = items[0].messages
    assert system == {'role': 'system', 'content': code.CODE_SYSTEM_PROMPT}
    assert user['role'] == 'user' and user['content'].endswith(items[0].gold['prompt'])
    assert items[0].meta['entry_point'] == 'has_close_elements'


# --------------------------------------------------------------------------- MBPP


def test_mbpp_items_are_the_test_split():
    items = code.MBPP().load()
    assert len(items) == 20  # The bundled test rows (the other 170 are other splits).
    assert all(int(item.id) in code.MBPP_TEST_IDS for item in items)
    user = items[0].messages[1]['content']
    assert user.endswith('The function should be named remove_Occ.')
    assert 'assert remove_Occ("hello","l") == "heo"' in user


def test_mbpp_test_imports_are_run():
    task = code.MBPP()
    gold = {'test_imports': ['import math'], 'test_list': ['assert math.isclose(area(1), math.pi)']}
    item = Item('mbpp', 'x', (), gold, {'entry_point': 'area'})
    assert task.score(item, 'def area(r):\n    return math.pi * r * r').correct
    assert not task.score(item, 'def area(r):\n    return 3.14 * r * r').correct


# --------------------------------------------------------------------------- MBPP+


def test_mbppplus_base_and_plus_reported_separately():
    task = code.MBPPPlus()
    items = {item.id: item for item in task.load()}
    octagonal = items['Mbpp/59']  # Base inputs 5, 10, 15; plus inputs up to 108.
    only_small = 'def is_octagonal(n):\n    return 3 * n * n - 2 * n if n < 50 else 0'
    s = task.score(octagonal, only_small)
    assert (s.correct, s.detail['base_pass'], s.detail['plus_pass']) == (False, True, False)
    assert 0 < s.detail['plus_passed'] < s.detail['plus_total']
    # The base results survive a plus input that never returns.
    stuck = 'def is_octagonal(n):\n    while n > 50: pass\n    return 3 * n * n - 2 * n'
    s = dataclasses.replace(task, timeout_s=4.0).score(octagonal, stuck)
    assert s.detail['status'] == 'timeout'
    assert (s.correct, s.detail['base_pass'], s.detail['plus_pass']) == (False, True, False)


def test_mbppplus_float_tolerance():
    """Mbpp/80 returns floats (atol 0): EvalPlus allows 1e-6 for floats, not more."""
    task = code.MBPPPlus()
    item = next(i for i in task.load() if i.id == 'Mbpp/80')
    body = 'def tetrahedral_number(n):\n    return (n * (n + 1) * (n + 2)) / 6'
    assert task.score(item, body + ' + 1e-9').correct
    assert not task.score(item, body + ' + 1e-3').correct
    assert task.score(item, body.replace('/ 6', '// 6')).correct  # 35 == 35.0, as in EvalPlus


def test_mbppplus_items_and_inputs():
    items = code.MBPPPlus().load()
    assert len(items) == 10 and items[0].id == 'Mbpp/59'
    assert items[0].messages[1]['content'].endswith('The function should be named is_octagonal.')
    assert '"""' not in items[0].messages[1]['content']
    assert items[-1].gold['counts'] == {'base': 3, 'plus': 0}  # Mbpp/793: plus_input is {}.
    assert code.mbpp_plus_inputs('Mbpp/2', [[[1, 2], [3]]]) == [[(1, 2), (3,)]]
    assert code.mbpp_plus_inputs('Mbpp/252', [['1+2j']]) == [[1 + 2j]]
    assert code.mbpp_plus_inputs('Mbpp/791', [[[1, [2]]]]) == [((1, (2,)),)]


# --------------------------------------------------------------------------- extraction


def test_extract_code():
    fenced = 'Sure!\n```python\ndef f(x):\n    return x\n```\nDone.'
    assert code.extract_code(fenced) == 'def f(x):\n    return x'
    two = '```python\nprint(f(1))\n```\nand\n```python\ndef f(x):\n    return 2\n```'
    assert code.extract_code(two, 'f') == 'def f(x):\n    return 2'
    assert code.extract_code(two) == 'print(f(1))'
    assert code.extract_code('```\ndef g():\n    pass\n```') == 'def g():\n    pass'
    assert code.extract_code('```py\ndef g():\n    return 1') == 'def g():\n    return 1'
    shell = '```bash\npip install x\n```\n```python\ndef h(): pass\n```'
    assert code.extract_code(shell) == 'def h(): pass'
    assert code.extract_code('def f(x):\n    return x\n\n') == 'def f(x):\n    return x'
    assert code.extract_code('\n    return x + 1\n') == '    return x + 1'  # A body.
    prose = 'Here is the code:\ndef f(x):\n    return x\nIt returns x.'
    assert code.extract_code(prose) == 'def f(x):\n    return x'


def test_sanitize():
    source = (
        'import math\n\n@functools.cache\ndef f(x):\n    """Doc."""\n    return x\n\n'
        'K = 3\nprint(f(2))\nassert f(1) == 1\nif __name__ == "__main__":\n    f(0)\n'
    )
    assert code.sanitize(source) == (
        'import math\n@functools.cache\ndef f(x):\n    """Doc."""\n    return x\nK = 3'
    )
    assert code.sanitize('def f(:') == 'def f(:'


def test_no_code_scores_without_a_run():
    item = code.HumanEval().load(limit=1)[0]
    assert code.HumanEval().score(item, '```python\n```') == Score(
        False, None, {'status': 'no code'}
    )


def test_humaneval_solution():
    prompt = 'def f(x):\n    """Doc."""\n'
    assert code.humaneval_solution(prompt, '    return x', 'f') == prompt + '    return x\n'
    assert code.humaneval_solution(prompt, 'return x', 'f') == prompt + '    return x\n'
    full = 'def f(x):\n    return x\nprint(1)'
    assert code.humaneval_solution(prompt, full, 'f') == prompt + '\ndef f(x):\n    return x\n'


# --------------------------------------------------------------------------- pass@k


def test_pass_at_k():
    assert code.pass_at_k(5, 2, 1) == pytest.approx(0.4)
    assert code.pass_at_k(5, 2, 2) == pytest.approx(0.7)
    assert code.pass_at_k(5, 0, 1) == 0.0
    assert code.pass_at_k(5, 0, 5) == 0.0
    assert code.pass_at_k(5, 5, 1) == 1.0
    assert code.pass_at_k(5, 4, 2) == 1.0  # n - c < k
    assert code.pass_at_k(10, 3, 5) == pytest.approx(1 - 21 / 252)
    for bad in ((5, 6, 1), (5, 2, 0), (5, 2, 6), (5, -1, 1)):
        with pytest.raises(ValueError):
            code.pass_at_k(*bad)


def test_aggregate():
    samples = {
        'a': [Score(True), Score(False), Score(False), Score(True), Score(False)],
        'b': [False] * 5,
        'c': [Score(False, detail={'base_pass': True})] * 5,
    }
    out = code.aggregate(samples, ks=(1, 2, 10))
    assert out['items'] == 3 and out['samples'] == 15
    assert out['pass@1'] == pytest.approx(0.4 / 3)
    assert out['pass@2'] == pytest.approx(0.7 / 3)
    assert 'pass@10' not in out  # More than the 5 samples per item.
    assert out['per_item'] == {'a': [5, 2], 'b': [5, 0], 'c': [5, 0]}
    assert code.aggregate(samples, key='base_pass')['pass@1'] == pytest.approx(1 / 3)


# --------------------------------------------------------------------------- loading


@pytest.mark.parametrize('task', list(code.TASKS.values()))
def test_load_on_an_empty_data_root_names_the_file(task, tmp_path, monkeypatch):
    with pytest.raises(DataFileError, match=task.relpath):
        task(root=str(tmp_path)).load()
    monkeypatch.setenv(data_files.ENV_VAR, str(tmp_path))
    with pytest.raises(DataFileError, match=task.relpath):
        task().load()
    with pytest.raises(DataFileError, match=os.path.basename(task.relpath)):
        task().load(str(tmp_path))


def test_load_from_a_local_file_and_directory(tmp_path):
    rows = [json.loads(line) for line in gzip.open(data_files.locate(code.HumanEval.relpath))]
    path = tmp_path / 'he.jsonl'
    path.write_text(''.join(json.dumps(row) + '\n' for row in rows[:3]))
    assert [i.id for i in code.HumanEval().load(str(path))] == [
        'HumanEval/0',
        'HumanEval/1',
        'HumanEval/2',
    ]
    root = os.path.dirname(os.path.dirname(data_files.locate(code.MBPP.relpath)))
    assert len(code.MBPP().load(root, limit=5)) == 5
    assert code.MBPPPlus().load(data_files.locate(code.MBPPPlus.relpath))[0].id == 'Mbpp/59'
    with pytest.raises(ValueError):
        code.MBPP().load(limit=-1)


def test_registry():
    assert set(code.TASKS) == {'humaneval', 'mbpp', 'mbppplus'}
    for name, task in code.TASKS.items():
        assert task.name == name and task().name == name


def test_the_scorers_parse_python_one_thread_at_a_time():
    """BFCL's call parser and code extraction parse through one lock (spec_jax.eval.tasks
    .pyast: CPython 3.11's AST converter keeps its recursion depth interpreter-wide, and two
    scoring threads parsing at once raised SystemError in the suite): while the lock is
    held, a parse on another thread waits; released, it finishes."""
    for parse in (lambda: parse_calls('[f(a=1)]'), lambda: sanitize('def f():\n    return 1\n')):
        done = threading.Event()

        def run(parse=parse, done=done):
            parse()
            done.set()

        with pyast._LOCK:
            worker = threading.Thread(target=run)
            worker.start()
            assert not done.wait(0.3)
        assert done.wait(10)
        worker.join()
