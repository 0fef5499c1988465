"""`ast.parse` for scorers that run on several threads (`runner`'s score workers).

CPython 3.11 keeps the AST-to-object converter's recursion depth in interpreter-wide
state, so two threads parsing at once can leave it unbalanced and raise
`SystemError: AST constructor recursion depth mismatch` (seen once in the suite, in
tests/eval/test_fast_hsd.py, which scores BFCL's golds on two threads). One lock
serialises every parse of the scorers (BFCL calls, code extraction, MBPP's test names);
parses inside third-party scorers (math-verify's sympy) are not covered.
"""

from __future__ import annotations

import ast
import threading

_LOCK = threading.Lock()


def parse(source: str, mode: str = 'exec') -> ast.AST:
    """`ast.parse(source, mode=mode)`, one thread at a time."""
    with _LOCK:
        return ast.parse(source, mode=mode)
