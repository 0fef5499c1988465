"""BFCL on the real items bundled in the package: loading, prompts, decoding model text into
calls, and the AST checker (references score correct, perturbations wrong), compared with
BFCL's own checker where the bfcl-eval wheel is importable."""

import copy
import functools
import json
import os
import shutil
import sys
import types

import pytest

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks import bfcl
from spec_jax.eval.tasks.bfcl import (
    BFCL,
    CATEGORIES,
    TASKS,
    CallParseError,
    check_calls,
    java_convert,
    js_convert,
    parse_calls,
    reference_calls,
    reference_response,
    render_calls,
)

NAMES = sorted(TASKS)
AST_NAMES = [name for name in NAMES if name != 'bfcl_irrelevance']
PARALLEL = [name for name in NAMES if 'parallel' in name]
UNPARSABLE = [
    'Sure! Here is the call: f(',
    'I would call the function with the numbers given.',
    '[1, 2, 3]',
    'x = 5',
]


@functools.cache
def items(name: str) -> tuple:
    return tuple(TASKS[name]().load())


def text_of(item, calls) -> str:
    return render_calls(calls, item.gold['functions'], item.meta['language'])


def score(item, calls):
    return TASKS[f'bfcl_{item.meta["category"]}']().score(item, text_of(item, calls))


def norm(x):
    return bfcl.normalize_string(x) if isinstance(x, str) else x


def schema(item, name: str) -> dict:
    function = next(f for f in item.gold['functions'] if f['name'] == name)
    return function['parameters']


def allowed_values(item, call_index: int, param: str) -> list:
    answer = item.gold['ground_truth'][call_index]
    return next(iter(answer.values()))[param]


# --------------------------------------------------------------------------- loading


def test_registry():
    assert NAMES == sorted(f'bfcl_{c}' for c in CATEGORIES)
    for name, cls in TASKS.items():
        task = cls()
        assert task.name == name and TASKS[task.name] is cls
        assert task.relpath == f'bfcl/BFCL_v4_{task.category}.json'
        assert BFCL.for_category(task.category, root='/r') == cls(root='/r')
    assert TASKS['bfcl_irrelevance'].answer_relpath == ''
    assert TASKS['bfcl_simple_python'].hub[1:] == (
        'BFCL_v3_simple.json',
        'possible_answer/BFCL_v3_simple.json',
    )
    with pytest.raises(ValueError, match='unknown BFCL category'):
        BFCL.for_category('exec_simple')


@pytest.mark.parametrize('name', NAMES)
def test_load_the_bundled_items(name):
    task = TASKS[name]()
    loaded = items(name)
    rows = data_files.read_jsonl(task.relpath)
    bundled = {'bfcl_live_multiple': 40, 'bfcl_simple_python': 30}.get(name, 5)
    assert len(loaded) == len(rows) == bundled
    assert [item.id for item in loaded] == [row['id'] for row in rows]
    answers = data_files.read_jsonl(task.answer_relpath) if task.answer_relpath else None
    for k, (item, row) in enumerate(zip(loaded, rows)):
        assert item.task == name
        assert item.meta == {'category': task.category, 'language': task.language}
        assert item.gold['functions'] == row['function']  # The checker sees the real schema.
        if answers is None:
            assert item.gold['ground_truth'] is None
        else:
            assert item.gold['ground_truth'] == answers[k]['ground_truth']
        system, *turns = item.messages
        assert system['role'] == 'system'
        assert '[func_name1(param_name1=param_value1' in system['content']
        for function in row['function']:
            assert json.dumps(function['name']) in system['content']
        question = [m for m in row['question'][0] if m['role'] != 'system']
        assert turns == question
        own_system = [m for m in row['question'][0] if m['role'] == 'system']
        if own_system:  # The question's own system message follows the function list.
            assert system['content'].endswith('\n\n' + own_system[0]['content'])
    assert task.load(limit=2) == list(loaded[:2])
    with pytest.raises(ValueError, match='limit'):
        task.load(limit=-1)


def test_questions_with_a_system_message_are_merged():
    rows = data_files.read_jsonl(TASKS['bfcl_live_multiple'].relpath)
    own = {row['id'] for row in rows if row['question'][0][0]['role'] == 'system'}
    assert own  # Some live rows carry a system message of their own.
    for item in items('bfcl_live_multiple'):
        assert [m['role'] for m in item.messages] == ['system', 'user']  # One system message.
        assert ('\n\n' in item.messages[0]['content'].split('can invoke.')[-1]) == (item.id in own)


def test_prompt_notes_the_language():
    java = items('bfcl_simple_java')[1].messages[0]['content']
    assert 'Java 8 SDK syntax' in java and 'This is Java boolean type parameter' in java
    assert '"type": "boolean"' not in java  # Shown as string representations, as BFCL does.
    js = items('bfcl_simple_javascript')[0].messages[0]['content']
    assert 'JavaScript syntax' in js
    python = items('bfcl_simple_python')[0].messages[0]['content']
    assert 'Python 3 syntax' in python and '"type": "integer"' in python


def test_local_layouts(tmp_path):
    bundled = os.path.join(data_files.BUNDLED, 'bfcl')
    shutil.copytree(bundled, tmp_path / 'bfcl')
    task = TASKS['bfcl_parallel']()
    expected = list(items('bfcl_parallel'))
    for source in (tmp_path, tmp_path / 'bfcl', tmp_path / 'bfcl' / 'BFCL_v4_parallel.json'):
        assert task.load(str(source)) == expected, source
    assert TASKS['bfcl_parallel'](root=str(tmp_path)).load() == expected
    irrelevance = tmp_path / 'bfcl' / 'BFCL_v4_irrelevance.json'
    assert TASKS['bfcl_irrelevance']().load(str(irrelevance)) == list(items('bfcl_irrelevance'))
    os.remove(tmp_path / 'bfcl' / 'possible_answer' / 'BFCL_v4_parallel.json')
    with pytest.raises(DataFileError, match='possible answers'):
        task.load(str(tmp_path / 'bfcl'))
    with pytest.raises(DataFileError, match="'bfcl/possible_answer/BFCL_v4_parallel.json'"):
        TASKS['bfcl_parallel'](root=str(tmp_path)).load()
    with pytest.raises(DataFileError, match="'bfcl/BFCL_v4_multiple.json'.*data_root"):
        TASKS['bfcl_multiple'](root=str(tmp_path / 'nothing')).load()
    with pytest.raises(DataFileError, match='not found'):
        task.load(str(tmp_path / 'missing.json'))


def test_hub_unreachable_is_a_clear_error(monkeypatch):
    import huggingface_hub

    def unreachable(*args, **kwargs):
        raise ConnectionError('offline')

    monkeypatch.setattr(huggingface_hub, 'hf_hub_download', unreachable)
    with pytest.raises(DataFileError, match=f"{bfcl.HUB_ID!r}.*source ''"):
        TASKS['bfcl_simple_python']().load('hub')


def test_hub_files_are_read(monkeypatch, tmp_path):
    import huggingface_hub

    bundled = os.path.join(data_files.BUNDLED, 'bfcl')
    wanted = []

    def download(repo, filename, repo_type=None):
        wanted.append((repo, filename, repo_type))
        v4 = filename.replace('BFCL_v3_simple.', 'BFCL_v4_simple_python.')
        return os.path.join(bundled, v4)

    monkeypatch.setattr(huggingface_hub, 'hf_hub_download', download)
    assert TASKS['bfcl_simple_python']().load('hub') == list(items('bfcl_simple_python'))
    assert wanted == [
        (bfcl.HUB_ID, 'BFCL_v3_simple.json', 'dataset'),
        (bfcl.HUB_ID, 'possible_answer/BFCL_v3_simple.json', 'dataset'),
    ]


def test_hub_offline_is_a_clear_error():
    assert os.environ.get('HF_HUB_OFFLINE') == '1'  # tests/conftest.py
    try:
        loaded = TASKS['bfcl_live_parallel']().load('hub')
    except DataFileError as e:
        assert 'could not download' in str(e) and "HF_HUB_OFFLINE='1'" in str(e)
    else:  # A machine with the hub files cached reads them offline.
        assert loaded and all(item.gold['ground_truth'] for item in loaded)


# --------------------------------------------------------------------------- decoding


def test_python_decoding():
    expected = [{'math.factorial': {'number': 5}}]
    for text in (
        '[math.factorial(number=5)]',
        'math.factorial(number=5)',
        '```python\n[math.factorial(number=5)]\n```',
        'Here you go:\n```\nmath.factorial(number=5)\n```',
        '  `[math.factorial(number=5)]`\n',
    ):
        assert parse_calls(text) == expected, text
    assert parse_calls('f(a=-3, b=[1, -2.5], c={"k": "v", "n": [1]}, d=(1, 2), e=-0.5)') == [
        {'f': {'a': -3, 'b': [1, -2.5], 'c': {'k': 'v', 'n': [1]}, 'd': (1, 2), 'e': -0.5}}
    ]
    assert parse_calls("[f(a=True, b=None, c='it''s', d=x, e=g(), h=k(z=1), i=2*3+1, j=d[0])]") == [
        {'f': {'a': True, 'b': None, 'c': 'its', 'd': 'x', 'e': 'g()', 'h': {'k': {'z': 1}}, 'i': 7,
               'j': 'd[0]'}}
    ]  # fmt: skip
    assert parse_calls('[a.b(x=1), c(y="two")]') == [{'a.b': {'x': 1}}, {'c': {'y': 'two'}}]
    assert parse_calls('a.b(x=1)\nc(y="two")') == [{'a.b': {'x': 1}}, {'c': {'y': 'two'}}]
    assert parse_calls('f(5, a=1)') == [{'f': {'a': 1}}]  # Positional arguments are dropped.
    assert parse_calls('[]') == [] and parse_calls('') == []
    for text in (*UNPARSABLE, 'f(a=math.pi)', 'f(a=lambda x: x)', 'f(a=1 < 2)', '[f(a=1)] ok'):
        with pytest.raises(CallParseError):
            parse_calls(text)


def test_java_and_javascript_decoding():
    hashmap = 'new HashMap<String, Integer>() {{ put("k", 1); }}'
    text = f'[Foo.bar(a="x, y", b=true, c={hashmap})]'
    assert parse_calls(text, 'java') == [{'Foo.bar': {'a': 'x, y', 'b': 'true', 'c': hashmap}}]
    assert parse_calls("f(a='q', b=[1, 2], c={x: 1, y: 'z'}, d=10n)", 'javascript') == [
        {'f': {'a': 'q', 'b': '[1, 2]', 'c': "{x: 1, y: 'z'}", 'd': '10n'}}
    ]
    assert parse_calls('f(a=1); g(b=2)', 'javascript') == [{'f': {'a': '1'}}]  # The first only.
    assert parse_calls('f(x)', 'java') == [{'f': {None: 'x'}}]
    for text in ('f(a=)', 'f(a="x)', 'f(a=1) and more', 'no call here', 'f(a=1, a=2)'):
        for language in ('java', 'javascript'):
            with pytest.raises(CallParseError):
                parse_calls(text, language)


def test_type_converters():
    assert java_convert('42', 'integer') == 42 and java_convert('4.2', 'integer') == '4.2'
    assert java_convert('3.5f', 'float') == 3.5 and java_convert('3.5', 'float') == '3.5'
    assert java_convert('7L', 'long') == 7 and java_convert('2.5e3', 'double') == 2500.0
    assert java_convert('true', 'boolean') is True and java_convert('1', 'boolean') == '1'
    assert java_convert('new int[]{1, 2, 3}', 'Array', 'integer') == [1, 2, 3]
    assert java_convert('new ArrayList<>(Arrays.asList("a", "b"))', 'ArrayList', 'String') == [
        'a',
        'b',
    ]
    hashmap = 'new HashMap<String, Object>() {{ put("k", 1); put("s", "v"); }}'
    assert java_convert(hashmap, 'HashMap') == {'k': 1, 's': 'v'}
    assert java_convert('new HashMap<>()', 'HashMap') == {}
    assert js_convert('"abc"', 'String') == 'abc' and js_convert('12', 'integer') == 12
    assert js_convert('12', 'float') == 12.0 and js_convert('5n', 'Bigint') == 5
    assert js_convert('[1, "two", true]', 'array') == [1, 'two', True]
    assert js_convert('["a", "b"]', 'array', 'String') == ['a', 'b']
    assert js_convert('[[1, 2], [3, 4]]', 'array', 'array') == [[1, 2], [3, 4]]
    assert js_convert("{'k': 'v', n: 2}", 'dict') == {'k': 'v', 'n': 2}
    with pytest.raises(ValueError, match='unsupported'):
        java_convert('1', 'int')


# --------------------------------------------------------------------------- checking


@pytest.mark.parametrize('name', NAMES)
def test_the_possible_answer_scores_correct(name):
    for item in items(name):
        text = reference_response(item)
        result = TASKS[name]().score(item, text)
        assert result.correct, (item.id, text, result.detail)
        json.dumps(result.detail)
        if name != 'bfcl_irrelevance':
            assert json.loads(result.extracted) == json.loads(json.dumps(parse_calls(
                text, item.meta['language'])))  # fmt: skip
            fenced = TASKS[name]().score(item, f'```python\n{text}\n```')
            assert fenced.correct, (item.id, fenced.detail)  # In a fence too.


def _wrong_value(value, allowed):
    if isinstance(value, bool):
        candidates = [not value]
    elif isinstance(value, (int, float)):
        candidates = [value + 1, value + 17, -value - 3]
    elif isinstance(value, str):
        candidates = [value + ' zq', 'zq']
    elif isinstance(value, list):
        candidates = [value[:-1], [*value, value[0] if value else 1]]
    elif isinstance(value, dict):
        candidates = [{**value, 'zq_key': 1}]
    else:
        return None
    for candidate in candidates:
        if candidate not in allowed and norm(candidate) not in [norm(a) for a in allowed]:
            return candidate
    return None


@pytest.mark.parametrize('name', AST_NAMES)
def test_a_wrong_argument_value_scores_wrong(name):
    checked = 0
    for item in items(name):
        calls = reference_calls(item)
        for i, call in enumerate(calls):
            fname, args = next(iter(call.items()))
            for param, value in args.items():
                wrong = _wrong_value(value, allowed_values(item, i, param))
                if wrong is None:
                    continue
                perturbed = copy.deepcopy(calls)
                perturbed[i][fname][param] = wrong
                result = score(item, perturbed)
                assert not result.correct, (item.id, param, wrong, text_of(item, perturbed))
                assert result.detail['error_type'], result.detail
                checked += 1
    assert checked >= len(items(name))


def _typed_params(item, language):
    """(call index, param, wrong-typed value) where the schema's type is strict."""
    for i, call in enumerate(reference_calls(item)):
        fname, args = next(iter(call.items()))
        properties = schema(item, fname)['properties']
        for param, value in args.items():
            kind = properties[param]['type']
            allowed = allowed_values(item, i, param)
            if type(next(a for a in allowed if a != '')) is not type(value):
                continue  # A 'variable' answer: compared as is.
            if language == 'python' and kind == 'integer':
                yield i, fname, param, str(value)  # '5' for 5
                yield i, fname, param, float(value)  # 5.0 where an int is required
            elif language == 'python' and kind == 'string':
                yield i, fname, param, 12345
            elif language == 'python' and kind == 'boolean':
                yield i, fname, param, int(value)  # 1 is not True
            elif language != 'python' and kind in ('boolean', 'Boolean'):
                yield i, fname, param, 17  # Renders as `17`: not true/false.


@pytest.mark.parametrize('name', AST_NAMES)
def test_a_wrong_type_scores_wrong(name):
    checked = 0
    for item in items(name):
        calls = reference_calls(item)
        for i, fname, param, value in _typed_params(item, item.meta['language']):
            perturbed = copy.deepcopy(calls)
            perturbed[i][fname][param] = value
            result = score(item, perturbed)
            assert not result.correct, (item.id, param, value)
            if item.meta['language'] == 'python' and 'parallel' not in name:
                assert result.detail['error_type'] == 'type_error:simple', result.detail
            checked += 1
    assert checked >= (1 if name in ('bfcl_simple_java', 'bfcl_simple_javascript') else 5)


def test_int_to_float_is_allowed_but_not_float_to_int():
    item = next(i for i in items('bfcl_parallel_multiple') if i.id == 'parallel_multiple_1')
    calls = reference_calls(item)  # area_rectangle.calculate(length=7.0, breadth=3.0), ...
    as_ints = copy.deepcopy(calls)
    as_ints[0]['area_rectangle.calculate'] = {'length': 7, 'breadth': 3}
    assert score(item, as_ints).correct  # Python auto-converts an int to a float.
    item = items('bfcl_simple_python')[0]  # calculate_triangle_area(base=10, height=5)
    assert score(item, [{'calculate_triangle_area': {'base': 10.0, 'height': 5}}]).correct is False


def test_bool_is_not_an_int():
    item = items('bfcl_simple_python')[1]  # math.factorial(number=5)
    assert score(item, [{'math.factorial': {'number': 5}}]).correct
    result = score(item, [{'math.factorial': {'number': True}}])
    assert not result.correct and result.detail['error_type'] == 'type_error:simple'


def test_an_optional_parameter_without_an_empty_choice_must_be_given():
    item = items('bfcl_live_simple')[0]  # special is optional, but the answer expects 'black'
    assert 'special' not in schema(item, 'get_user_info')['required']
    assert score(item, [{'get_user_info': {'user_id': 7890, 'special': 'black'}}]).correct
    result = score(item, [{'get_user_info': {'user_id': 7890}}])
    assert not result.correct
    assert result.detail['error_type'] == 'simple_function_checker:missing_optional'
    item = items('bfcl_simple_python')[0]  # unit: ['units', ''] may be left out
    assert score(item, [{'calculate_triangle_area': {'base': 10, 'height': 5}}]).correct


def test_strings_are_normalised():
    item = next(i for i in items('bfcl_live_parallel') if i.id == 'live_parallel_1-0-1')
    calls = [
        {'get_current_weather': {'location': 'boston ma'}},
        {'get_current_weather': {'location': 'San-Francisco, CA.', 'unit': 'Fahrenheit'}},
    ]
    assert score(item, calls).correct
    calls[0]['get_current_weather']['location'] = 'Boston, MAA'
    assert not score(item, calls).correct


@pytest.mark.parametrize('name', AST_NAMES)
def test_a_missing_required_argument_scores_wrong(name):
    checked = 0
    for item in items(name):
        calls = reference_calls(item)
        for i, call in enumerate(calls):
            fname, args = next(iter(call.items()))
            for param in schema(item, fname).get('required', []):
                perturbed = copy.deepcopy(calls)
                perturbed[i][fname].pop(param, None)
                result = score(item, perturbed)
                assert not result.correct, (item.id, param)
                checked += 1
    assert checked >= len(items(name))


@pytest.mark.parametrize('name', AST_NAMES)
def test_an_unknown_argument_scores_wrong(name):
    for item in items(name):
        calls = reference_calls(item)
        for i in range(len(calls)):
            perturbed = copy.deepcopy(calls)
            next(iter(perturbed[i].values()))['zq_unknown'] = 1
            result = score(item, perturbed)
            assert not result.correct, item.id
            if 'parallel' not in name:
                assert result.detail['error_type'] == 'simple_function_checker:unexpected_param'


@pytest.mark.parametrize('name', AST_NAMES)
def test_a_wrong_function_name_scores_wrong(name):
    for item in items(name):
        calls = reference_calls(item)
        for i, call in enumerate(calls):
            perturbed = copy.deepcopy(calls)
            fname, args = next(iter(call.items()))
            perturbed[i] = {fname + '_v2': args}
            assert not score(item, perturbed).correct, item.id


@pytest.mark.parametrize('name', ['bfcl_multiple', 'bfcl_live_multiple'])
def test_multiple_needs_the_one_right_function(name):
    checked = 0
    for item in items(name):
        (call,) = reference_calls(item)
        fname, args = next(iter(call.items()))
        for function in item.gold['functions']:
            if function['name'] != fname:
                assert not score(item, [{function['name']: args}]).correct, item.id
                checked += 1
        assert not score(item, [call, call]).correct  # One call, not two.
    assert checked


@pytest.mark.parametrize('name', PARALLEL)
def test_parallel_calls_in_another_order_score_correct(name):
    reordered = 0
    for item in items(name):
        calls = reference_calls(item)
        if len(calls) < 2:
            continue
        for order in (calls[::-1], calls[1:] + calls[:1]):
            assert score(item, order).correct, (item.id, order)
        assert not score(item, calls[:-1]).correct  # One call missing.
        assert not score(item, [*calls, calls[0]]).correct  # One call too many.
        reordered += 1
    assert reordered >= 3


def test_irrelevance_correct_iff_no_call():
    task = TASKS['bfcl_irrelevance']()
    for item in items('bfcl_irrelevance'):
        for text in ('I cannot help with that: none of the functions applies.', '[]', ''):
            result = task.score(item, text)
            assert result.correct, (item.id, text)
        function = item.gold['functions'][0]
        args = {p: 1.0 for p in function['parameters'].get('required', [])}
        text = render_calls([{function['name']: args}], item.gold['functions'])
        result = task.score(item, text)
        assert not result.correct and result.detail['error_type'] == (
            'irrelevance_error:decoder_success'
        )
        assert not task.score(item, f'[{function["name"]}()]').correct


@pytest.mark.parametrize('name', AST_NAMES)
def test_unparsable_text_scores_wrong(name):
    task = TASKS[name]()
    for item in items(name):
        for text in UNPARSABLE:
            result = task.score(item, text)
            assert not result.correct and result.extracted is None, (item.id, text)
            assert result.detail['error_type'] == 'ast_decoder:decoder_failed'


def test_check_calls_directly():
    item = items('bfcl_simple_python')[0]
    gold, functions = item.gold['ground_truth'], item.gold['functions']
    good = [{'calculate_triangle_area': {'base': 10, 'height': 5, 'unit': 'units'}}]
    assert check_calls(functions, good, gold, 'simple_python').valid
    too_many = good * 2
    assert check_calls(functions, too_many, gold, 'simple_python').error_type == (
        'simple_function_checker:wrong_count'
    )
    wrong_unit = [{'calculate_triangle_area': {'base': 10, 'height': 5, 'unit': 'cm'}}]
    assert check_calls(functions, wrong_unit, gold, 'simple_python').error_type == (
        'value_error:string'
    )


# --------------------------------------------------------------------------- upstream


def _upstream_checker():
    """BFCL's own checker (bfcl_eval), with its model-config import stubbed; skips when the
    package is not importable (install it with `pip install --no-deps bfcl-eval`, or point
    $SPEC_JAX_BFCL_EVAL at a downloaded bfcl_eval wheel or the folder holding bfcl_eval/)."""
    path = os.environ.get('SPEC_JAX_BFCL_EVAL')
    if path and path not in sys.path:
        sys.path.insert(0, path)
    stub_name = 'bfcl_eval.constants.model_config'
    if stub_name not in sys.modules:
        stub = types.ModuleType(stub_name)

        class _Config(dict):  # No model maps dots in function names to underscores here.
            def __getitem__(self, key):
                return types.SimpleNamespace(underscore_to_dot=False)

        stub.MODEL_CONFIG_MAPPING = _Config()
        sys.modules[stub_name] = stub
    try:
        from bfcl_eval.constants.enums import Language
        from bfcl_eval.eval_checker.ast_eval import ast_checker
    except ImportError as e:
        sys.modules.pop(stub_name, None)
        pytest.skip(
            f'bfcl_eval is not importable ({e}): `pip download --no-deps bfcl-eval==2026.3.23` '
            'and set SPEC_JAX_BFCL_EVAL to the wheel to compare with the upstream checker'
        )
    return ast_checker, Language


def _variants(item):
    """The reference calls (decoded from their text) and perturbations of them."""
    language = item.meta['language']
    decoded = parse_calls(reference_response(item), language)
    yield decoded
    for i, call in enumerate(decoded):
        fname, args = next(iter(call.items()))
        yield [*decoded[:i], {fname + 'x': args}, *decoded[i + 1 :]]
        for param in args:
            dropped = copy.deepcopy(decoded)
            del dropped[i][fname][param]
            yield dropped
            for wrong in ('zq', 5, 2.5, True, [1], {'k': 1}, '7', 'true', '[1, 2]', '{}'):
                if language != 'python' and not isinstance(wrong, str):
                    continue
                changed = copy.deepcopy(decoded)
                changed[i][fname][param] = wrong
                yield changed
        extra = copy.deepcopy(decoded)
        extra[i][fname]['zq'] = 1
        yield extra
    yield decoded[::-1]
    yield decoded[:-1]


def test_agrees_with_the_upstream_checker():
    ast_checker, Language = _upstream_checker()
    languages = {
        'python': Language.PYTHON,
        'java': Language.JAVA,
        'javascript': Language.JAVASCRIPT,
    }
    compared = 0
    for name in AST_NAMES:
        for item in items(name):
            category, language = item.meta['category'], item.meta['language']
            for calls in _variants(item):
                ours = check_calls(
                    item.gold['functions'], calls, item.gold['ground_truth'], category
                )
                theirs = ast_checker.ast_checker(
                    copy.deepcopy(item.gold['functions']),
                    copy.deepcopy(calls),
                    copy.deepcopy(item.gold['ground_truth']),
                    languages[language],
                    category,
                    'stub-model',
                )
                assert ours.valid == theirs['valid'], (item.id, calls, ours, theirs)
                if not ours.valid:
                    assert ours.error_type == theirs['error_type'], (item.id, calls, ours, theirs)
                compared += 1
    assert compared > 1000
    from bfcl_eval.eval_checker.ast_eval.type_convertor import (
        java_type_converter,
        js_type_converter,
    )

    java_cases = [
        ('42', 'integer', None), ('-3', 'short', None), ('x', 'integer', None),
        ('3.5f', 'float', None), ('3.5', 'float', None), ('1e3', 'double', None),
        ('9L', 'long', None), ('true', 'boolean', None), ('yes', 'boolean', None),
        ('abc', 'String', None), ("'c'", 'char', None), ('obj', 'any', None),
        ('new int[]{1, 2, 3}', 'Array', 'integer'), ('new String[] {a, b}', 'Array', 'String'),
        ('new Object[]{1, "x", true}', 'Array', None),
        ('new ArrayList<>(Arrays.asList("a", "b"))', 'ArrayList', 'String'),
        ('new ArrayList<Integer>() {{ add(1); add(2); }}', 'ArrayList', 'integer'),
        ('new ArrayList<>()', 'ArrayList', None), ('list', 'ArrayList', None),
        ('new HashMap<String, Object>() {{ put("k", 1); put("s", "v"); }}', 'HashMap', None),
        ('new HashMap<>()', 'HashMap', None), ('map', 'HashMap', None),
    ]  # fmt: skip
    for text, kind, nested in java_cases:
        expected = java_type_converter.java_type_converter(text, kind, nested)
        assert java_convert(text, kind, nested) == expected, (text, kind)
    js_cases = [
        ('"abc"', 'String', None), ('abc', 'String', None), ('12', 'integer', None),
        ('1.5', 'float', None), ('1e5', 'float', None), ('10n', 'Bigint', None),
        ('false', 'Boolean', None), ('[1, "two", true]', 'array', None), ('[]', 'array', None),
        ('["a", "b"]', 'array', 'String'), ('[1.5, 2]', 'array', 'float'),
        ('new Array(1, 2)', 'array', 'integer'), ('[[1, 2], [3, 4]]', 'array', 'array'),
        ("{'k': 'v', n: 2}", 'dict', None), ('{}', 'dict', None), ('{a: [1, 2]}', 'dict', None),
        ('obj', 'dict', None), ('x', 'any', None),
    ]  # fmt: skip
    for text, kind, nested in js_cases:
        expected = js_type_converter.js_type_converter(text, kind, nested)
        assert js_convert(text, kind, nested) == expected, (text, kind)
