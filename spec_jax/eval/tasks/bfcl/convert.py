"""BFCL's type converters: Java and JavaScript values, which the decoder leaves as source
text, as values of a parameter's declared type (`java_convert`, `js_convert`); and the tables
of each language's schema type names and the Python types the checker expects of them.

As BFCL's converters (bfcl_eval `eval_checker/ast_eval/type_convertor/`): '5' -> 5 for an
integer, 'new int[]{1, 2}' -> [1, 2], 'new HashMap<...>() {{ put("k", v); }}' -> {k: v},
'[1, 2]', '{a: 1}', '10n', 'true', ...; a text that does not fit the type stays a string, and
so do Java Set/Queue/Stack/Hashtable values, which upstream does not convert (it raises).
"""

from __future__ import annotations

import re
from typing import Any

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
