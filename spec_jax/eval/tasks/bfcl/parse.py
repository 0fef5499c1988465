"""BFCL decoding: a model's text -> function calls [{name: {arg: value}}, ...] (`parse_calls`).

A ```python (or any) fence, if the text has one, is read instead of the text; then, as BFCL's
prompting decoder: backticks, newlines and spaces are stripped from both ends, the text is
wrapped in [ ] where it lacks them and parsed with `ast` as a list of calls: dotted names
(math.factorial), keyword arguments only (positional ones are dropped, as upstream), literal
values (strings, numbers incl. negative, True/False/None, lists, tuples, dicts), bare names as
their name string, arithmetic on literals, a nested call as its source (no keywords) or as
{name: {arg: value}}, a subscript as its source. Anything else (attributes, comparisons,
lambdas, f-strings, prose) is unparsable. Unlike upstream, several bare calls one per line are
read too, and fenced code is found. Java and JavaScript texts are read with a small
bracket-aware scanner in place of BFCL's tree-sitter parsers: `name(arg=value, ...)`, each
value as its source text with the quotes of a plain string literal removed (the checker
converts it, see `convert`); only the first call counts, as upstream.

Known differences from upstream: the decoder extensions above (fences, bare call lines; unary
plus is not read as minus; arithmetic is evaluated safely, not with eval); Java/JavaScript
decoding without tree-sitter, so whitespace in a value's source is kept (the converters ignore
it) and an anonymous-class body such as `new HashMap<>() {{ put("k", v); }}` reaches the
converter (BFCL's Java decoder drops it, leaving an empty map).
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from spec_jax.eval.tasks import pyast


class CallParseError(ValueError):
    """A model's text does not decode into function calls."""


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
        body = pyast.parse(source, mode='eval').body
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
        tree = pyast.parse(source, mode='exec')
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
