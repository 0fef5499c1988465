"""BFCL's AST checker: decoded calls against a possible answer (`check_calls`, `check_call`).

A reimplementation of BFCL's AST checker (bfcl_eval `eval_checker/ast_eval/ast_checker.py`,
Apache-2.0). Per call: the function's name; its required parameters present; no parameter
missing from the schema or the possible answer; each value of the schema's type (int to float
allowed for Python floats, a tuple for a 'tuple'; a value of the possible answer's own type
counts as a variable and is compared as is), then in the possible answer's list of allowed
values: strings after the checker's normalisation (`normalize_string`: lowercase, without
spaces and ',./-_*^', ' as "), lists element-wise with their strings normalised, dicts key by
key, lists of dicts dict by dict; '' among the allowed values marks an optional parameter that
may be left out. Java and JavaScript values (source texts) are first converted as BFCL's type
converters do (see `convert`). simple: exactly one call, of the first function; multiple: one
call, of the expected function; parallel and parallel_multiple: as many calls as expected,
matched in any order (each expected call, in turn, takes the first unmatched model call that
passes, as upstream). A category's language is `language_of(category)`.

Known differences from upstream: types the checker cannot map (and Java Set/Queue/Stack/
Hashtable, which upstream does not convert) are type errors here instead of exceptions.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from spec_jax.eval.tasks.bfcl.convert import _NESTED, _TYPE_MAPS, java_convert, js_convert


def language_of(category: str) -> str:
    """'java', 'javascript' or 'python': how a category's calls are written and typed."""
    if category == 'simple_java':
        return 'java'
    if category == 'simple_javascript':
        return 'javascript'
    return 'python'


def is_empty(calls: list[dict]) -> bool:
    """Whether decoded calls hold no call at all (BFCL: [] and [{}] count as none)."""
    return not calls or (len(calls) == 1 and not calls[0])


class Verdict(NamedTuple):
    """A checker's result: valid, BFCL's error type ('' when valid) and messages."""

    valid: bool
    error_type: str = ''
    errors: tuple[str, ...] = ()


_OK = Verdict(True)


def _bad(error_type: str, *errors: str) -> Verdict:
    return Verdict(False, error_type, tuple(errors))


def normalize_string(s: str) -> str:
    """BFCL's string normalisation: no spaces or ',./-_*^', lowercase, ' as "."""
    return re.sub(r'[ ,./\-_*^]', '', s).lower().replace("'", '"')


def _norm(x: Any) -> Any:
    return normalize_string(x) if type(x) is str else x


def _answer_type(allowed: list) -> type | None:
    """The type of the first allowed value that is not '' (optional)."""
    return next((type(a) for a in allowed if a != ''), None)


def _check_type(
    param: str, value: Any, allowed: list, type_name: str, expected: type, nested: type | None
) -> tuple[Verdict, bool]:
    """(verdict, is_variable): the value is of the schema's type (one level of nesting), or of
    the type of the possible answer (then a 'variable', compared as is)."""
    answer_type = _answer_type(allowed)
    variable = answer_type is not None and answer_type is not expected
    nested_error = None
    if type(value) is expected:
        if nested is None:
            return _OK, variable
        for alternative in allowed:
            if type(alternative) is list and not all(
                _check_type(param, v, alternative, str(nested), nested, None)[0].valid
                for v in value
            ):
                continue
            return _OK, variable
        nested_error = (
            f'nested type check failed for {param!r}: expected {type_name} of '
            f'{nested.__name__}, got {value!r}'
        )
        if type(value) is answer_type:
            return _bad('type_error:nested', nested_error), True
    elif answer_type is not None and type(value) is answer_type:
        return _OK, True
    message = f'wrong type for {param!r}: expected {type_name}, got {type(value).__name__}'
    errors = (nested_error,) if nested_error else ()
    return _bad('type_error:simple', *errors, f'{message} ({value!r})'), variable


def _check_string(param: str, value: str, allowed: list) -> Verdict:
    if normalize_string(value) in [normalize_string(a) for a in allowed if type(a) is str]:
        return _OK
    return _bad('value_error:string', f'{param!r}={value!r} is not one of {allowed!r}')


def _check_list(param: str, value: list, allowed: list) -> Verdict:
    normalized = [_norm(v) for v in value]
    options = []
    for alternative in allowed:
        try:
            options.append([_norm(a) for a in alternative])
        except TypeError:  # Not a sequence: matches nothing.
            pass
    if normalized in options:
        return _OK
    return _bad('value_error:list/tuple', f'{param!r}={value!r} is not one of {allowed!r}')


def _check_dict(param: str, value: dict, allowed: list) -> Verdict:
    verdict = _bad('dict_checker:unclear')
    for alternative in allowed:
        if not isinstance(alternative, dict):  # '' (optional) or a variable's name.
            continue
        errors, error_type = [], 'dict_checker:unclear'
        for key, item in value.items():
            if key not in alternative:
                errors.append(f'unexpected key {key!r} in {param!r}')
                error_type = 'value_error:dict_key'
                break
            if _norm(item) not in [_norm(a) for a in alternative[key]]:
                errors.append(f'{param!r}[{key!r}]={item!r} is not one of {alternative[key]!r}')
                error_type = 'value_error:dict_value'
                break
        for key, options in alternative.items():
            if key not in value and '' not in options:
                errors.append(f'missing key {key!r} in {param!r}')
                error_type = 'value_error:dict_key'
                break
        if not errors:
            return _OK
        verdict = _bad(error_type, *errors)
    return verdict


def _check_dict_list(param: str, value: list, allowed: list) -> Verdict:
    verdict = _bad('list_dict_checker:unclear')
    for alternative in allowed:
        if len(value) != len(alternative):
            verdict = _bad('value_error:list_dict_count', f'wrong number of dicts in {param!r}')
            continue
        verdict = _OK
        for item, expected in zip(value, alternative):
            verdict = _check_dict(param, item, [expected])
            if not verdict.valid:
                break
        if verdict.valid:
            return _OK
    return verdict


def _convert(value: Any, spec: dict, language: str) -> tuple[Any, type, type | None] | Verdict:
    """(value converted for checking, expected type, expected element type), or a Verdict
    for a value that cannot be of the schema's type."""
    type_name = spec.get('type')
    types = _TYPE_MAPS[language]
    if type_name not in types:
        return _bad('type_error:unknown', f'parameter type {type_name!r} is not checked')
    expected, nested_name, nested = types[type_name], None, None
    if type_name in _NESTED[language]:
        nested_name = spec.get('items', {}).get('type')
        nested = types.get(nested_name)
        if nested_name is not None and nested is None:
            return _bad('type_error:unknown', f'element type {nested_name!r} is not checked')
    if language != 'python':
        if type(value) is not str:
            kind = 'java' if language == 'java' else 'js'
            return _bad(f'type_error:{kind}', f'expected source text, got {value!r}')
        convert = java_convert if language == 'java' else js_convert
        value = convert(value, type_name, nested_name)
    if type_name == 'tuple' and type(value) is tuple:
        value = list(value)
    if language == 'python' and type_name == 'float' and type(value) is int:
        value = float(value)
    return value, expected, nested


def check_call(function: dict | None, call: dict, answer: dict, language: str) -> Verdict:
    """One decoded call {name: {arg: value}} against one possible answer
    {name: {arg: [allowed values]}} for the function's schema (BFCL's simple checker)."""
    if not function:
        return _bad('simple_function_checker:wrong_func_name', 'no such function documented')
    allowed_params = next(iter(answer.values()))
    name = function['name']
    properties = function['parameters'].get('properties', {})
    if name not in call:
        return _bad('simple_function_checker:wrong_func_name', f'{name!r} not called')
    args = call[name]
    for param in function['parameters'].get('required', []):
        if param not in args:
            return _bad('simple_function_checker:missing_required', f'missing {param!r}')
    for param, value in args.items():
        if param not in properties or param not in allowed_params:
            return _bad('simple_function_checker:unexpected_param', f'unexpected {param!r}')
        allowed = allowed_params[param]
        converted = _convert(value, properties[param], language)
        if isinstance(converted, Verdict):
            return converted
        value, expected, nested = converted
        verdict, variable = _check_type(
            param, value, allowed, properties[param]['type'], expected, nested
        )
        if not verdict.valid:
            return verdict
        if not variable:
            if expected is dict:
                verdict = _check_dict(param, value, allowed)
            elif expected is list and nested is dict:
                verdict = _check_dict_list(param, value, allowed)
            elif expected is str:
                verdict = _check_string(param, value, allowed)
            elif expected is list:
                verdict = _check_list(param, value, allowed)
            else:
                verdict = None
            if verdict is not None:
                if not verdict.valid:
                    return verdict
                continue
        if value not in allowed:
            return _bad('value_error:others', f'{param!r}={value!r} is not one of {allowed!r}')
    for param, allowed in allowed_params.items():
        if param not in args and '' not in allowed:
            return _bad('simple_function_checker:missing_optional', f'missing {param!r}')
    return _OK


def _find(functions: list[dict], name: str) -> dict | None:
    return next((f for f in functions if f['name'] == name), None)


def check_calls(
    functions: list[dict], calls: list[dict], ground_truth: list[dict], category: str
) -> Verdict:
    """Decoded calls against a BFCL possible answer (see the module docstring)."""
    language = language_of(category)
    if 'parallel' in category:
        if len(calls) != len(ground_truth):
            return _bad('parallel_function_checker_no_order:wrong_count', 'wrong call count')
        matched: set[int] = set()
        for i, answer in enumerate(ground_truth):
            function = _find(functions, next(iter(answer)))
            errors = []
            for j, call in enumerate(calls):
                if j in matched:
                    continue
                verdict = check_call(function, call, answer, language)
                if verdict.valid:
                    matched.add(j)
                    break
                errors.append(f'call {j}: {verdict.error_type}: {"; ".join(verdict.errors)}')
            else:
                return _bad(
                    'parallel_function_checker_no_order:cannot_find_match',
                    f'no call matches expected call {i}',
                    *errors,
                )
        return _OK
    if 'multiple' in category:
        if len(calls) != len(ground_truth):
            return _bad('multiple_function_checker:wrong_count', 'wrong call count')
        answer = ground_truth[0]
        return check_call(_find(functions, next(iter(answer))), calls[0], answer, language)
    if len(calls) != 1:
        return _bad('simple_function_checker:wrong_count', 'wrong call count')
    return check_call(functions[0], calls[0], ground_truth[0], language)
