"""BFCL v4 (Berkeley Function Calling Leaderboard): the AST categories, scored offline.

Tasks. One frozen dataclass per category (`TASKS` maps 'bfcl_<category>' to the class;
`BFCL.for_category(category, root)` builds one), each with the field `root`, the data root a
config names with `data_root` ('' = $SPEC_JAX_DATA, else the samples bundled in the
package). Categories: simple_python, simple_java, simple_javascript, multiple, parallel,
parallel_multiple, live_simple, live_multiple, live_parallel, live_parallel_multiple and
irrelevance (correct iff the text holds no call).

Data. `load('')` reads `bfcl/BFCL_v4_<category>.json` and its
`bfcl/possible_answer/BFCL_v4_<category>.json` (JSON lines; irrelevance has no answer file)
under the data root; `load(path)` reads a local questions file (its answers in
`possible_answer/<same name>` beside it) or a directory holding `bfcl/BFCL_v4_<category>.json`
or `BFCL_v4_<category>.json` (e.g. `bfcl_eval/data/` of the bfcl-eval wheel); `load('hub')`
downloads `BFCL_v3_<category>.json` and its possible answer from the hub repository
`gorilla-llm/Berkeley-Function-Calling-Leaderboard` with `huggingface_hub` (the files mix
value types that `datasets` cannot put in one Arrow column; v3 names simple_python 'simple',
simple_java 'java' and simple_javascript 'javascript').

Prompt (BFCL's default prompting format): a system message asking for the calls alone as
`[func_name1(param1=value1, ...), func_name2(...)]` and listing the functions in JSON, each
description ending with a note on its language (Java and JavaScript parameters are documented
as values in string representation, as BFCL presents them); a question's own system message
is appended to it; then the question's user turn(s).

Decoding (`parse_calls`). A ```python (or any) fence, if the text has one, is read instead of
the text; then, as BFCL's prompting decoder: backticks, newlines and spaces are stripped from
both ends, the text is wrapped in [ ] where it lacks them and parsed with `ast` as a list of
calls: dotted names (math.factorial), keyword arguments only (positional ones are dropped,
as upstream), literal values (strings, numbers incl. negative, True/False/None, lists,
tuples, dicts), bare names as their name string, arithmetic on literals, a nested call as its
source (no keywords) or as {name: {arg: value}}, a subscript as its source. Anything else
(attributes, comparisons, lambdas, f-strings, prose) is unparsable. Unlike upstream, several
bare calls one per line are read too, and fenced code is found. Java and JavaScript texts
are read with a small bracket-aware scanner in place of BFCL's tree-sitter parsers:
`name(arg=value, ...)`, each value as its source text with the quotes of a plain string
literal removed; only the first call counts, as upstream.

Scoring (`check_calls`): a reimplementation of BFCL's AST checker (bfcl_eval
`eval_checker/ast_eval/ast_checker.py`, Apache-2.0). Per call: the function's name; its
required parameters present; no parameter missing from the schema or the possible answer;
each value of the schema's type (int to float allowed for Python floats, a tuple for a
'tuple'; a value of the possible answer's own type counts as a variable and is compared as
is), then in the possible answer's list of allowed values: strings after the checker's
normalisation (lowercase, without spaces and ',./-_*^', ' as "), lists element-wise with
their strings normalised, dicts key by key, lists of dicts dict by dict; '' among the allowed
values marks an optional parameter that may be left out. Java and JavaScript values (source
texts) are first converted as BFCL's type converters do ('5' -> 5 for an integer,
'new int[]{1, 2}' -> [1, 2], 'new HashMap<...>() {{ put("k", v); }}' -> {k: v}, '[1, 2]',
'{a: 1}', '10n', 'true', ...; a text that does not fit stays a string). simple: exactly one
call, of the first function; multiple: one call, of the expected function; parallel and
parallel_multiple: as many calls as expected, matched in any order (each expected call, in
turn, takes the first unmatched model call that passes, as upstream). `Score.detail` holds
the checker's error type and messages and the decoded calls.

Known differences from upstream: the decoder extensions above (fences, bare call lines; unary
plus is not read as minus; arithmetic is evaluated safely, not with eval); Java/JavaScript
decoding without tree-sitter, so whitespace in a value's source is kept (the converters ignore
it) and an anonymous-class body such as `new HashMap<>() {{ put("k", v); }}` reaches the
converter (BFCL's Java decoder drops it, leaving an empty map); types the checker cannot map
(and Java Set/Queue/Stack/Hashtable, which upstream does not convert) are type errors here
instead of exceptions.
"""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import operator
import os
import re
from typing import Any, ClassVar, NamedTuple

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks.base import Item, Score

CATEGORIES = (
    'simple_python',
    'simple_java',
    'simple_javascript',
    'multiple',
    'parallel',
    'parallel_multiple',
    'live_simple',
    'live_multiple',
    'live_parallel',
    'live_parallel_multiple',
    'irrelevance',
)
HUB_ID = 'gorilla-llm/Berkeley-Function-Calling-Leaderboard'
_V3_NAMES = {'simple_python': 'simple', 'simple_java': 'java', 'simple_javascript': 'javascript'}

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


def language_of(category: str) -> str:
    """'java', 'javascript' or 'python': how a category's calls are written and typed."""
    if category == 'simple_java':
        return 'java'
    if category == 'simple_javascript':
        return 'javascript'
    return 'python'


class CallParseError(ValueError):
    """A model's text does not decode into function calls."""


# --------------------------------------------------------------------------- decoding

_FENCE = re.compile(r'```[ \t]*[\w+#.-]*[^\n]*\n(.*?)(?:```|\Z)', re.S)


def _call_text(text: str) -> str:
    """The part of `text` that should hold the calls, bracketed as BFCL's decoder does."""
    fence = _FENCE.search(text)
    if fence:
        text = fence.group(1)
    text = text.strip('`\n ')
    if not text.startswith('['):
        text = '[' + text
    if not text.endswith(']'):
        text += ']'
    return text


_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float, complex)) and not isinstance(x, bool)


def _arithmetic(node: ast.BinOp) -> Any:
    left, right = _py_value(node.left), _py_value(node.right)
    op = _BINOPS.get(type(node.op))
    numbers = _is_number(left) and _is_number(right)
    joinable = isinstance(node.op, ast.Add) and type(left) is type(right)
    joinable = joinable and isinstance(left, (str, list, tuple))
    if op is None or not (numbers or joinable):
        raise CallParseError(f'unsupported expression {ast.unparse(node)!r}')
    if isinstance(node.op, ast.Pow) and (abs(right) > 256 or abs(left) > 1e6):
        raise CallParseError(f'power too large in {ast.unparse(node)!r}')
    try:
        return op(left, right)
    except (ArithmeticError, ValueError) as e:
        raise CallParseError(f'{ast.unparse(node)!r}: {e}') from e


def _py_value(node: ast.expr) -> Any:
    """The Python value of an argument's AST, as BFCL's decoder reads it."""
    if isinstance(node, ast.Constant):
        return '...' if node.value is Ellipsis else node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _py_value(node.operand)
        if _is_number(value):
            return -value if isinstance(node.op, ast.USub) else value
    elif isinstance(node, ast.List):
        return [_py_value(v) for v in node.elts]
    elif isinstance(node, ast.Tuple):
        return tuple(_py_value(v) for v in node.elts)
    elif isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise CallParseError('a ** unpacking inside a dict')
        return {_py_value(k): _py_value(v) for k, v in zip(node.keys, node.values)}
    elif isinstance(node, ast.BinOp):
        return _arithmetic(node)
    elif isinstance(node, ast.Name):
        return node.id
    elif isinstance(node, ast.Call):
        return _py_call(node) if node.keywords else ast.unparse(node)
    elif isinstance(node, ast.Subscript):
        return f'{ast.unparse(node.value)}[{ast.unparse(node.slice)}]'
    raise CallParseError(f'unsupported argument {ast.unparse(node)!r}')


def _py_call(node: ast.Call) -> dict:
    parts = []
    func = node.func
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    try:
        args = {kw.arg: _py_value(kw.value) for kw in node.keywords}
    except (TypeError, RecursionError) as e:  # An unhashable dict key, deep nesting.
        raise CallParseError(f'unsupported argument: {e}') from e
    return {'.'.join(reversed(parts)): args}


def _parse_python(text: str) -> list[dict]:
    source = _call_text(text).strip().strip("'")
    try:
        body = ast.parse(source, mode='eval').body
    except (SyntaxError, ValueError, MemoryError, RecursionError) as e:
        return _parse_python_lines(text, e)
    nodes = [body] if isinstance(body, ast.Call) else getattr(body, 'elts', None)
    if nodes is None or not all(isinstance(n, ast.Call) for n in nodes):
        raise CallParseError('not a list of function calls')
    return [_py_call(n) for n in nodes]


def _parse_python_lines(text: str, error: Exception) -> list[dict]:
    """Bare calls one per line (no brackets), read where the bracketed form fails."""
    fence = _FENCE.search(text)
    source = (fence.group(1) if fence else text).strip('`\n ')
    try:
        tree = ast.parse(source, mode='exec')
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        raise CallParseError(f'not Python calls: {error}') from None
    nodes = [s.value for s in tree.body if isinstance(s, ast.Expr)]
    if len(nodes) < 2 or len(nodes) != len(tree.body):
        raise CallParseError(f'not Python calls: {error}')
    if not all(isinstance(n, ast.Call) for n in nodes):
        raise CallParseError('not a list of function calls')
    return [_py_call(n) for n in nodes]


_OPENERS = {'(': ')', '[': ']', '{': '}'}
_JAVA_GENERIC = re.compile(r'<(?:[\w\s,.?&\[\]]|<(?:[\w\s,.?&\[\]]|<[\w\s,.?&\[\]]*>)*>)*>')
_IDENT = r'[A-Za-z_$][\w$]*'
_CALL_NAME = re.compile(rf'\s*({_IDENT}(?:\s*\.\s*{_IDENT})*)\s*\(')
_NAMED_ARG = re.compile(rf'\s*({_IDENT})\s*=(?!=)(.*)\Z', re.S)


def _group_end(s: str, i: int, java: bool) -> tuple[int, list[int]]:
    """(index of the bracket closing s[i], indices of the commas directly inside it)."""
    stack, commas = [], []
    j = i
    while j < len(s):
        c = s[j]
        if c in '"\'`':
            k = j + 1
            while k < len(s) and s[k] != c:
                k += 2 if s[k] == '\\' else 1
            if k >= len(s):
                raise CallParseError('unterminated string')
            j = k + 1
            continue
        if java and c == '<' and j and (s[j - 1].isalnum() or s[j - 1] in '_$'):
            generic = _JAVA_GENERIC.match(s, j)
            if generic:
                j = generic.end()
                continue
        if c in _OPENERS:
            stack.append(_OPENERS[c])
        elif c in ')]}':
            if not stack or stack.pop() != c:
                raise CallParseError(f'unbalanced {c!r}')
            if not stack:
                return j, commas
        elif c == ',' and len(stack) == 1:
            commas.append(j)
        j += 1
    raise CallParseError('unbalanced brackets')


def _c_like_value(value: str, java: bool) -> str:
    """A Java/JavaScript argument's source as BFCL's decoders give it to the converters."""
    if java:
        literal = re.fullmatch(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\\n]|\\.)*\'', value)
        return value[1:-1] if literal else value
    quoted = len(value) >= 2 and value[0] == value[-1] and value[0] in '"\''
    return value[1:-1] if quoted else value


def _parse_c_like(text: str, java: bool) -> list[dict]:
    s = _call_text(text)[1:-1]
    calls = []
    i = 0
    while True:
        while i < len(s) and (s[i].isspace() or s[i] in ',;'):
            i += 1
        if i == len(s):
            break
        head = _CALL_NAME.match(s, i)
        if not head:
            raise CallParseError(f'no function call at {s[i : i + 40]!r}')
        name = re.sub(r'\s+', '', head.group(1))
        start = head.end() - 1
        end, commas = _group_end(s, start, java)
        bounds = [start, *commas, end]
        pieces = [s[a + 1 : b] for a, b in zip(bounds, bounds[1:])]
        if len(pieces) == 1 and not pieces[0].strip():
            pieces = []  # No arguments.
        args: dict = {}
        for piece in pieces:
            named = _NAMED_ARG.match(piece)
            if named:
                key, value = named.group(1), named.group(2).strip()
                if not value:
                    raise CallParseError(f'no value for {key!r}')
                value = _c_like_value(value, java)
            else:
                value = piece.strip()
                positional = rf'{_IDENT}|[\w$.]+\.class' if java else rf'{_IDENT}'
                if not re.fullmatch(positional, value):
                    continue  # Upstream ignores positional literals.
                key = None
            if key in args:
                raise CallParseError(f'argument {key!r} given twice')
            args[key] = value
        calls.append({name: args})
        i = end + 1
    if not calls:
        raise CallParseError('no function call')
    return calls[:1]  # BFCL's Java and JavaScript decoders read the first call only.


def parse_calls(text: str, language: str = 'python') -> list[dict]:
    """The calls of a model's text as [{name: {arg: value}}, ...] (see the module docstring).

    Raises:
      CallParseError: the text does not decode into calls.
    """
    if language == 'python':
        return _parse_python(text)
    if language in ('java', 'javascript'):
        return _parse_c_like(text, java=language == 'java')
    raise ValueError(f'unknown language {language!r}')


def is_empty(calls: list[dict]) -> bool:
    """Whether decoded calls hold no call at all (BFCL: [] and [{}] count as none)."""
    return not calls or (len(calls) == 1 and not calls[0])


# --------------------------------------------------------------------------- type converters
# Java and JavaScript values arrive as source text; these follow BFCL's type converters.

_JAVA_TYPES = {
    'byte': int, 'short': int, 'integer': int, 'long': int, 'float': float, 'double': float,
    'boolean': bool, 'char': str, 'String': str, 'any': str, 'Array': list, 'ArrayList': list,
    'Queue': list, 'Stack': list, 'Set': set, 'HashMap': dict, 'Hashtable': dict,
}  # fmt: skip
_JS_TYPES = {
    'String': str, 'integer': int, 'float': float, 'Bigint': int, 'Boolean': bool,
    'dict': dict, 'array': list, 'any': str,
}  # fmt: skip
_PYTHON_TYPES = {
    'string': str, 'integer': int, 'float': float, 'boolean': bool, 'array': list,
    'tuple': list, 'dict': dict, 'any': str,
}  # fmt: skip
_NESTED = {
    'python': ('array', 'tuple'),
    'java': ('Array', 'ArrayList', 'array'),
    'javascript': ('Array', 'ArrayList', 'array'),
}
_TYPE_MAPS = {'python': _PYTHON_TYPES, 'java': _JAVA_TYPES, 'javascript': _JS_TYPES}

_INT = re.compile(r'-?\d+$')
_JAVA_FLOAT = re.compile(r'-?\d+(\.\d+)?([eE][+-]?\d+)?[fF]$')
_JAVA_DOUBLE = re.compile(r'-?\d+(\.\d+)?([eE][+-]?\d+)?$')
_JAVA_LONG = re.compile(r'-?\d+[lL]$')


def _int_or_float(text: str) -> Any:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def _java_plain(text: str) -> Any:
    """A Java literal read without a declared type."""
    if text in ('true', 'false'):
        return text == 'true'
    if text.startswith('"') and text.endswith('"'):
        return text[1:-1]
    if _JAVA_LONG.match(text):
        return int(text[:-1])
    if _JAVA_FLOAT.match(text):
        return float(text[:-1])
    return _int_or_float(text)


def _java_elements(texts: list[str], nested: str | None, unquote: bool) -> list:
    out = []
    for text in texts:
        if unquote and nested in ('char', 'String'):
            out.append(text[1:-1])
        else:
            out.append(java_convert(text, nested) if nested else _java_plain(text))
    return out


def _java_arraylist(text: str, nested: str | None) -> Any:
    as_list = re.search(r'new\s+ArrayList<\w*>\(Arrays\.asList\((.+?)\)\)', text)
    if as_list:
        return _java_elements([e.strip() for e in as_list.group(1).split(',')], nested, True)
    adds = re.search(r'new\s+ArrayList<\w*>\(\)\s*\{\{\s*(.+?)\s*\}\}', text, re.S)
    if adds:
        found = [v.strip() for v in re.findall(r'add\((.+?)\)', adds.group(1))]
        return _java_elements(found, nested, True)
    if re.search(r'new\s+ArrayList<\w*>\(\)', text):
        return []
    return text


def _java_array(text: str, nested: str | None) -> Any:
    array = re.search(r'new\s+\w+\[\]\s*\{(.*?)\}', text)
    if not array:
        return text
    elements = [e.strip() for e in array.group(1).split(',') if e.strip()]
    return _java_elements(elements, nested, False)


def _java_hashmap(text: str) -> Any:
    body = re.search(r'new\s+HashMap<.*?>\s*\(\)\s*\{\s*\{?\s*(.*?)\s*\}?\s*\}', text, re.S)
    if body:
        puts = re.findall(r'put\("(.*?)",\s*(.*?)\)', body.group(1))
        return {key: _java_plain(value.strip()) for key, value in puts}
    if re.search(r'new\s+HashMap<.*?>\s*\(\)', text):
        return {}
    return text


def java_convert(text: str, java_type: str, nested: str | None = None) -> Any:
    """A Java argument's source text as a value of `java_type` (BFCL's rules; a text that
    does not fit the type stays a string).

    Raises:
      ValueError: `java_type` is not a Java type BFCL knows.
    """
    if java_type not in _JAVA_TYPES:
        raise ValueError(f'unsupported Java type {java_type!r}')
    if java_type in ('byte', 'short', 'integer'):
        return int(text) if _INT.match(text) else text
    if java_type == 'float':
        return float(text[:-1]) if _JAVA_FLOAT.match(text) else text
    if java_type == 'double':
        return float(text) if _JAVA_DOUBLE.match(text) else text
    if java_type == 'long':
        return int(text[:-1]) if _JAVA_LONG.match(text) else text
    if java_type == 'boolean':
        return text == 'true' if text in ('true', 'false') else text
    if java_type == 'ArrayList':
        return _java_arraylist(text, nested)
    if java_type == 'Array':
        return _java_array(text, nested)
    if java_type == 'HashMap':
        return _java_hashmap(text)
    return text  # char (BFCL's char pattern never matches), String, any; others unconverted.


def _js_plain(text: str) -> Any:
    """A JavaScript literal read without a declared type."""
    text = text.strip()
    if text in ('true', 'false'):
        return text == 'true'
    if len(text) >= 1 and text[0] == text[-1] and text[0] in '"\'':
        return text[1:-1]
    return _int_or_float(text)


_JS_2D = re.compile(
    r'\[\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\]|\bnew\s+Array\(\s*\[.*?\]\s*(,\s*\[.*?\]\s*)*\)'
)
_JS_1D = re.compile(r'\[(.*?)\]|\bnew\s+Array\((.*?)\)')


def _js_array(code: str, nested: str | None) -> Any:
    code = code.strip()
    try:
        grid = _JS_2D.match(code)
        if grid:
            rows = []
            for k, row in enumerate(re.findall(r'\[(.*?)\]', grid.group(0))):
                row = row.strip()
                if k == 0 and row.startswith('['):
                    row = row[1:]
                rows.append([_js_plain(e.strip()) for e in row.split(',')])
            return rows
        flat = _JS_1D.match(code)
        if not flat:
            return code
        inner = flat.group(1) if flat.group(1) is not None else flat.group(2) or ''
        elements = [e.strip() for e in inner.strip().split(',')] if inner.strip() else []
        if not nested:
            return [_js_plain(e) for e in elements]
        return [js_convert(e, nested, 'String' if e[:1] in ('"', "'") else None) for e in elements]
    except Exception:  # As upstream: anything unreadable stays source text.
        return code


def _js_dict(code: str) -> Any:
    code = code.strip()
    if code == '{}':
        return {}
    body = re.match(r'\{(.*?)\}', code)
    if not body:
        return code
    out = {}
    for key, value in re.findall(r'([^:]+):\s*(.*?)(?:,\s*(?=[^,]+:)|$)', body.group(1)):
        key, value = key.strip().strip('\'"'), value.strip()
        if value.startswith('[') and value.endswith(']'):
            out[key] = _js_array(value, None)
        elif value.startswith('{') and value.endswith('}'):
            out[key] = _js_dict(value)
        else:
            out[key] = _js_plain(value.strip('\'"'))
    return out


def js_convert(text: str, js_type: str, nested: str | None = None) -> Any:
    """A JavaScript argument's source text as a value of `js_type` (BFCL's rules; a text
    that does not fit the type stays a string).

    Raises:
      ValueError: `js_type` is not a JavaScript type BFCL knows.
    """
    if js_type not in _JS_TYPES:
        raise ValueError(f'unsupported JavaScript type {js_type!r}')
    if js_type == 'String':
        quoted = text[:1] == text[-1:] and text[:1] in ('"', "'")
        return text[1:-1] if quoted else text
    if js_type == 'integer':
        return int(text) if _INT.match(text) else text
    if js_type == 'float':
        return float(text) if re.match(r'-?\d+(\.\d+)?$', text) else text
    if js_type == 'Bigint':
        return int(text[:-1]) if re.match(r'-?\d+n$', text) else text
    if js_type == 'Boolean':
        return text == 'true' if text in ('true', 'false') else text
    if js_type == 'dict':
        return _js_dict(text)
    if js_type == 'array':
        return _js_array(text, nested)
    return text


# --------------------------------------------------------------------------- checking


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


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k if isinstance(k, str) else repr(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (str, bool, int)):
        return x
    if isinstance(x, float) and math.isfinite(x):
        return x
    return repr(x)


def judge(item: Item, text: str) -> Score:
    """Scores a model's text for a BFCL item (any thread; pure)."""
    category, language = item.meta['category'], item.meta['language']
    try:
        calls = parse_calls(text, language)
    except CallParseError as e:
        if category == 'irrelevance':
            return Score(True, None, {'error_type': '', 'errors': [], 'decoded': False})
        return Score(False, None, {'error_type': 'ast_decoder:decoder_failed', 'errors': [str(e)]})
    decoded = _jsonable(calls)
    extracted = json.dumps(decoded, ensure_ascii=False)
    if category == 'irrelevance':
        empty = is_empty(calls)
        detail = {'error_type': '', 'errors': [], 'decoded': True, 'calls': decoded}
        if not empty:
            detail['error_type'] = 'irrelevance_error:decoder_success'
            detail['errors'] = ['a function was called where none applies']
        return Score(empty, extracted, detail)
    verdict = check_calls(item.gold['functions'], calls, item.gold['ground_truth'], category)
    detail = {'error_type': verdict.error_type, 'errors': list(verdict.errors), 'calls': decoded}
    return Score(verdict.valid, extracted, detail)


# --------------------------------------------------------------------------- prompts


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


# --------------------------------------------------------------------------- reference calls


def _pick(allowed: list, spec: dict) -> Any:
    """The first allowed value, with the allowed-value lists inside dicts resolved too."""
    value = allowed[0]
    kind = spec.get('type')
    dict_like = kind in ('dict', 'HashMap')
    element_dicts = kind in ('array', 'ArrayList', 'Array') and (
        spec.get('items', {}).get('type') == 'dict'
    )

    def resolve(d: Any) -> Any:
        if not isinstance(d, dict) or not all(isinstance(v, list) for v in d.values()):
            return d
        return {k: v[0] for k, v in d.items() if v and v[0] != ''}

    if dict_like:
        return resolve(value)
    if element_dicts and isinstance(value, list):
        return [resolve(v) for v in value]
    return value


def reference_calls(item: Item) -> list[dict]:
    """The possible answer of `item` as concrete calls: the first allowed value of each
    parameter (left out where that is '' or the schema lacks the parameter, unless the schema
    requires it); [] for irrelevance."""
    functions = item.gold['functions']
    calls = []
    for answer in item.gold['ground_truth'] or []:
        name, params = next(iter(answer.items()))
        schema = (_find(functions, name) or {}).get('parameters', {})
        properties, required = schema.get('properties', {}), schema.get('required', [])
        args = {}
        for param, allowed in params.items():
            if '' in allowed and (param not in properties or allowed[0] == ''):
                if param not in required:
                    continue  # Optional (or undocumented): left out.
            values = [a for a in allowed if a != '']
            if values:
                args[param] = _pick(values, properties.get(param, {}))
        calls.append({name: args})
    return calls


def _java_literal(value: Any) -> str:
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, str):
        return f'"{value}"'
    return repr(value)


def _java_source(value: Any, spec: dict) -> str:
    kind = spec.get('type')
    element = spec.get('items', {}).get('type')
    if kind in ('String', 'any') and isinstance(value, str):
        return f'"{value}"'
    if kind == 'char':
        return f"'{value}'"
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if kind == 'long':
        return f'{value}L'
    if kind == 'float':
        return f'{float(value)!r}f'
    if kind == 'double':
        return repr(float(value))
    if kind == 'Array' and isinstance(value, list):
        bare = element in ('String', 'any', 'char')
        items = [str(v) if bare else _java_source(v, {'type': element}) for v in value]
        return f'new {element or "Object"}[]{{{", ".join(items)}}}'
    if kind == 'ArrayList' and isinstance(value, list):
        if not value:
            return 'new ArrayList<>()'
        items = [_java_source(v, {'type': element}) for v in value]
        return f'new ArrayList<>(Arrays.asList({", ".join(items)}))'
    if kind == 'HashMap' and isinstance(value, dict):
        puts = ' '.join(f'put("{k}", {_java_literal(v)});' for k, v in value.items())
        return f'new HashMap<String, Object>() {{{{ {puts} }}}}' if puts else 'new HashMap<>()'
    return _java_literal(value)


def _js_source(value: Any, spec: dict) -> str:
    kind = spec.get('type')
    if isinstance(value, bool):
        return 'true' if value else 'false'
    if isinstance(value, str):
        return f"'{value}'" if '"' in value else f'"{value}"'
    if kind == 'Bigint':
        return f'{value}n'
    if isinstance(value, list):
        element = {'type': spec.get('items', {}).get('type')}
        return '[' + ', '.join(_js_source(v, element) for v in value) + ']'
    if isinstance(value, dict):
        pairs = ', '.join(f'"{k}": {_js_source(v, {})}' for k, v in value.items())
        return '{' + pairs + '}'
    return repr(value)


def render_calls(calls: list[dict], functions: list[dict], language: str = 'python') -> str:
    """Concrete calls [{name: {arg: value}}] as the text a model would write: Python
    literals, or Java/JavaScript source for the parameters' declared types."""
    out = []
    for call in calls:
        name, args = next(iter(call.items()))
        properties = (_find(functions, name) or {}).get('parameters', {}).get('properties', {})
        parts = []
        for param, value in args.items():
            spec = properties.get(param, {})
            if language == 'python':
                source = repr(value)
            elif language == 'java':
                source = _java_source(value, spec)
            else:
                source = _js_source(value, spec)
            parts.append(f'{param}={source}')
        out.append(f'{name}({", ".join(parts)})')
    return '[' + ', '.join(out) + ']'


def reference_response(item: Item) -> str:
    """A response that the checker accepts for `item` (its reference calls, rendered)."""
    return render_calls(reference_calls(item), item.gold['functions'], item.meta['language'])


# --------------------------------------------------------------------------- data


def _read_rows(path: str) -> list[dict]:
    with open(path) as f:
        text = f.read()
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        data = None  # JSON lines, as BFCL ships them.
    if isinstance(data, list):
        return data
    if isinstance(data, dict) and 'id' not in data:
        data = data.get('data', data.get('rows'))
        if isinstance(data, list):
            return data
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _answers_beside(path: str) -> str:
    return os.path.join(os.path.dirname(path), 'possible_answer', os.path.basename(path))


@dataclasses.dataclass(frozen=True)
class BFCL:
    """What the BFCL category tasks share; a subclass sets `category` (see the module
    docstring)."""

    root: str = ''

    category: ClassVar[str] = ''
    name: ClassVar[str] = ''
    relpath: ClassVar[str] = ''  # The questions file under a data root.
    answer_relpath: ClassVar[str] = ''  # Its possible answers ('' for irrelevance).
    hub: ClassVar[tuple[str, str, str]] = ('', '', '')  # (repo, questions, answers) files.

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        category = cls.__dict__.get('category')
        if category:
            answers = category != 'irrelevance'
            v3 = f'BFCL_v3_{_V3_NAMES.get(category, category)}.json'
            cls.name = f'bfcl_{category}'
            cls.relpath = f'bfcl/BFCL_v4_{category}.json'
            cls.answer_relpath = f'bfcl/possible_answer/BFCL_v4_{category}.json' if answers else ''
            cls.hub = (HUB_ID, v3, f'possible_answer/{v3}' if answers else '')

    @staticmethod
    def for_category(category: str, root: str = '') -> BFCL:
        """The task of one category, e.g. `BFCL.for_category('parallel')`."""
        if f'bfcl_{category}' not in TASKS:
            raise ValueError(f'unknown BFCL category {category!r}; valid: {list(CATEGORIES)}')
        return TASKS[f'bfcl_{category}'](root=root)

    @property
    def language(self) -> str:
        return language_of(self.category)

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the module docstring), the first `limit` (0 = all)."""
        if limit < 0:
            raise ValueError(f'limit must be >= 0, got {limit}')
        if source == '':
            rows = data_files.read_jsonl(self.relpath, self.root, 'data_root')
            answers = (
                data_files.read_jsonl(self.answer_relpath, self.root, 'data_root')
                if self.answer_relpath
                else None
            )
        elif source == 'hub':
            rows, answers = self._hub_rows()
        else:
            path = self._local_file(source)
            answers = None
            if self.answer_relpath:
                answer_path = _answers_beside(path)
                if not os.path.isfile(answer_path):
                    raise DataFileError(
                        f'the possible answers of {path} are missing: expected {answer_path}'
                    )
                answers = _read_rows(answer_path)
            rows = _read_rows(path)
        if limit:
            rows = rows[:limit]
        by_id = {a['id']: a['ground_truth'] for a in answers} if answers is not None else None
        items = []
        for row in rows:
            if by_id is not None and row['id'] not in by_id:
                raise DataFileError(f'BFCL {self.category}: no possible answer for {row["id"]!r}')
            items.append(self._item(row, by_id[row['id']] if by_id is not None else None))
        return items

    def score(self, item: Item, text: str) -> Score:
        """Decodes the calls of `text` and checks them (see the module docstring)."""
        return judge(item, text)

    def _item(self, row: dict, ground_truth: list | None) -> Item:
        return Item(
            task=self.name,
            id=str(row['id']),
            messages=messages(row, self.language),
            gold={'functions': row['function'], 'ground_truth': ground_truth},
            meta={'category': self.category, 'language': self.language},
        )

    def _local_file(self, source: str) -> str:
        base = os.path.basename(self.relpath)
        if os.path.isdir(source):
            for candidate in (self.relpath, base):
                for path in (candidate, candidate + 'l'):  # .json, or .jsonl
                    if os.path.isfile(os.path.join(source, path)):
                        return os.path.join(source, path)
            raise DataFileError(f'neither {self.relpath!r} nor {base!r} found under {source}')
        if not os.path.isfile(source):
            raise DataFileError(
                f"data file {source!r} not found (a task's source is '' for the data root, "
                f"'hub', or a local {base} file or a directory holding it)"
            )
        return source

    def _hub_rows(self) -> tuple[list[dict], list[dict] | None]:
        repo, questions, answers = self.hub
        try:
            from huggingface_hub import hf_hub_download

            rows = _read_rows(hf_hub_download(repo, questions, repo_type='dataset'))
            gold = None
            if answers:
                gold = _read_rows(hf_hub_download(repo, answers, repo_type='dataset'))
        except Exception as e:
            offline = os.environ.get('HF_HUB_OFFLINE', '')
            raise DataFileError(
                f'could not download {questions!r} from the hub dataset {repo!r}: '
                f'{type(e).__name__}: {e}. Offline (HF_HUB_OFFLINE={offline!r}) or without a '
                "cached copy, use source '' (the data root, set with data_root or "
                f'${data_files.ENV_VAR}) or a local BFCL_v4_{self.category}.json.'
            ) from e
        return rows, gold


@dataclasses.dataclass(frozen=True)
class BFCLSimplePython(BFCL):
    """simple_python: one call of the one Python function given (400 items)."""

    category: ClassVar[str] = 'simple_python'


@dataclasses.dataclass(frozen=True)
class BFCLSimpleJava(BFCL):
    """simple_java: one call of a Java method, values as Java source (100 items)."""

    category: ClassVar[str] = 'simple_java'


@dataclasses.dataclass(frozen=True)
class BFCLSimpleJavaScript(BFCL):
    """simple_javascript: one call of a JavaScript function, values as JS source (50)."""

    category: ClassVar[str] = 'simple_javascript'


@dataclasses.dataclass(frozen=True)
class BFCLMultiple(BFCL):
    """multiple: one call of the right function among several (200 items)."""

    category: ClassVar[str] = 'multiple'


@dataclasses.dataclass(frozen=True)
class BFCLParallel(BFCL):
    """parallel: several calls of one function, in any order (200 items)."""

    category: ClassVar[str] = 'parallel'


@dataclasses.dataclass(frozen=True)
class BFCLParallelMultiple(BFCL):
    """parallel_multiple: several calls of several functions, in any order (200 items)."""

    category: ClassVar[str] = 'parallel_multiple'


@dataclasses.dataclass(frozen=True)
class BFCLLiveSimple(BFCL):
    """live_simple: user-contributed, one call of one function (258 items)."""

    category: ClassVar[str] = 'live_simple'


@dataclasses.dataclass(frozen=True)
class BFCLLiveMultiple(BFCL):
    """live_multiple: user-contributed, one call of the right function (1,053 items)."""

    category: ClassVar[str] = 'live_multiple'


@dataclasses.dataclass(frozen=True)
class BFCLLiveParallel(BFCL):
    """live_parallel: user-contributed, several calls of one function (16 items)."""

    category: ClassVar[str] = 'live_parallel'


@dataclasses.dataclass(frozen=True)
class BFCLLiveParallelMultiple(BFCL):
    """live_parallel_multiple: user-contributed, several calls of several functions (24)."""

    category: ClassVar[str] = 'live_parallel_multiple'


@dataclasses.dataclass(frozen=True)
class BFCLIrrelevance(BFCL):
    """irrelevance: no function applies; correct iff the text holds no call (240 items)."""

    category: ClassVar[str] = 'irrelevance'


TASKS = {
    task.name: task
    for task in (
        BFCLSimplePython,
        BFCLSimpleJava,
        BFCLSimpleJavaScript,
        BFCLMultiple,
        BFCLParallel,
        BFCLParallelMultiple,
        BFCLLiveSimple,
        BFCLLiveMultiple,
        BFCLLiveParallel,
        BFCLLiveParallelMultiple,
        BFCLIrrelevance,
    )
}
