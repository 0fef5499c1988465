"""Extracting the code of a model's text: fenced blocks, prose around code, demo code.

`extract_code(text, entry_point)`: the first fenced block (```python, ```py or a bare ```; the
first one that defines the entry point when there are several; an unclosed fence runs to the
end) if the text has one, else the text itself without the prose around its code (from the
first line that starts a definition or import, without trailing unindented lines that do not
parse). `sanitize` then drops top-level calls, asserts and `if __name__ == '__main__':` blocks
(a model's demo code), keeping imports, definitions and assignments.

This runs in the trusted caller (holding the GIL), on hostile text, so its work per sample is
bounded: the text is cut to `MAX_TEXT_CHARS` before anything else, every pattern is anchored
to one line (no repetition crosses a newline: `\\s*` from a line start over 500,000 blank
lines was quadratic), and `_trim_prose` parses at most `TRIM_PARSES` + 1 times (it cuts at
the line of each syntax error instead of trying 51 prefixes).
"""

from __future__ import annotations

import ast
import re

from spec_jax.eval.tasks import pyast

_FENCE = re.compile(r'^[ \t]*```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^[ \t]*```|\Z)', re.S | re.M)
_PYTHON_TAGS = ('python', 'py', 'python3', 'py3', '')
_CODE_LINE = re.compile(r'^(?:def |async def |class |import |from |@)')
# The longest text extracted (characters; longer is cut): 30x HumanEval's longest prompt and
# reference, and a 1 MB parse takes about a second of the caller's CPU.
MAX_TEXT_CHARS = 32 << 10
TRIM_PARSES = 3  # Cuts at syntax errors `_trim_prose` tries.


def _defines(code: str, name: str) -> bool:
    pattern = rf'^[ \t]*(?:async[ \t]+)?def[ \t]+{re.escape(name)}[ \t]*\('
    return re.search(pattern, code, re.M) is not None


def _parses(code: str) -> bool:
    try:
        pyast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def _error_line(code: str) -> int | None:
    """The line of `code`'s first syntax error (1-based), 0 if unknown, None if it parses."""
    try:
        pyast.parse(code)
    except SyntaxError as e:
        return e.lineno or 0
    except (ValueError, MemoryError, RecursionError):
        return 0
    return None


def _trim_prose(text: str) -> str:
    """An unfenced text without the prose around its code: from the first line that starts a
    definition or import, cut before the line of each syntax error (`TRIM_PARSES` times)."""
    if _parses(text):
        return text
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if _CODE_LINE.match(line)), None)
    if start is None:
        return text
    lines = code_lines = lines[start:]
    for _ in range(TRIM_PARSES):
        line = _error_line('\n'.join(code_lines))
        if line is None:
            return '\n'.join(code_lines)
        if line <= 1 or line > len(code_lines):
            break
        code_lines = code_lines[: line - 1]
    return '\n'.join(lines)


def extract_code(text: str, entry_point: str | None = None) -> str:
    """The code of a model's text (see the module docstring); leading indentation is kept
    (a HumanEval body). The text is cut to `MAX_TEXT_CHARS` first."""
    text = text[:MAX_TEXT_CHARS]
    blocks = [(tag.lower(), body) for tag, body in _FENCE.findall(text)]
    if blocks:
        python = [body for tag, body in blocks if tag in _PYTHON_TAGS] or [b for _, b in blocks]
        if entry_point:
            python = [b for b in python if _defines(b, entry_point)] or python
        code = python[0]
    else:
        code = _trim_prose(text)
    return code.strip('\n').rstrip()


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If):
        return False
    test = node.test
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == '__name__'
        and any(isinstance(c, ast.Constant) and c.value == '__main__' for c in test.comparators)
    )


def sanitize(code: str) -> str:
    """`code` without top-level expression statements other than docstrings (calls, prints),
    asserts and `if __name__ == '__main__':` blocks; unchanged if it does not parse."""
    try:
        tree = pyast.parse(code)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return code
    lines = code.splitlines()
    keep = []
    for node in tree.body:
        if isinstance(node, ast.Assert) or _is_main_guard(node):
            continue
        if isinstance(node, ast.Expr) and not isinstance(node.value, ast.Constant):
            continue
        first = min([node.lineno] + [d.lineno for d in getattr(node, 'decorator_list', [])])
        keep.append('\n'.join(lines[first - 1 : node.end_lineno]))
    return '\n'.join(keep)


def _compiles(code: str) -> bool:
    try:
        compile(code, '<solution>', 'exec', dont_inherit=True)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True
