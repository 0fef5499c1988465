"""BFCL's prompt (its default prompting format): `messages(row, language)`.

A system message asking for the calls alone as `[func_name1(param1=value1, ...),
func_name2(...)]` and listing the functions in JSON (`prompt_functions`), each description
ending with a note on its language (Java and JavaScript parameters are documented as values in
string representation, as BFCL presents them); a question's own system message is appended to
it; then the question's user turn(s).
"""

from __future__ import annotations

import json

SYSTEM_PROMPT = (
    'You are an expert at composing function calls. You are given a question and a set of '
    'possible functions. Based on the question, make one or more function calls to achieve '
    'the purpose. If none of the functions can be used, say so. If the question lacks '
    'parameters the functions require, say so too.\n'
    'Answer with the function calls only.\n\n'
    'If you decide to invoke any of the functions, you MUST write the calls in the format '
    '[func_name1(param_name1=param_value1, param_name2=param_value2...), '
    'func_name2(params)]. Do NOT include any other text in the response.\n\n'
    'Here is a list of functions in JSON format that you can invoke.\n{functions}\n'
)

_LANGUAGE_NOTE = {
    'python': ' Note that the provided function is in Python 3 syntax.',
    'java': ' Note that the provided function is in Java 8 SDK syntax.',
    'javascript': ' Note that the provided function is in JavaScript syntax.',
}


def prompt_functions(functions: list[dict], language: str) -> list[dict]:
    """The function docs as the prompt shows them: a note on the language in each
    description; Java and JavaScript parameters documented as string representations."""
    out = json.loads(json.dumps(functions))
    for function in out:
        function['description'] = function.get('description', '') + _LANGUAGE_NOTE[language]
        if language == 'python':
            continue
        lang = 'Java' if language == 'java' else 'JavaScript'
        for spec in function['parameters'].get('properties', {}).values():
            kind = spec.get('type')
            note = (
                f' This parameter can be of any type of {lang} object in string representation.'
                if kind == 'any'
                else f' This is {lang} {kind} type parameter in string representation.'
            )
            if kind in (('ArrayList', 'Array') if language == 'java' else ('array',)):
                element = spec.pop('items', {}).get('type')
                note += f' The list elements are of type {element}; they are not in string'
                note += ' representation.'
            if language == 'javascript' and kind == 'dict' and 'properties' in spec:
                schema = json.dumps(spec.pop('properties'))
                note += ' The dictionary entries have the following schema; they are not in'
                note += f' string representation. {schema}'
            spec['description'] = spec.get('description', '') + note
            spec['type'] = 'string'
    return out


def messages(row: dict, language: str) -> tuple[dict, ...]:
    """The chat prompt of a BFCL row: the system message, then the question's turns."""
    system = SYSTEM_PROMPT.format(
        functions=json.dumps(prompt_functions(row['function'], language), indent=4)
    )
    turns = [dict(m) for turn in row['question'] for m in turn]
    if turns and turns[0]['role'] == 'system':
        first = turns.pop(0)
        system = f'{system}\n\n{first["content"]}'
    return ({'role': 'system', 'content': system}, *turns)
