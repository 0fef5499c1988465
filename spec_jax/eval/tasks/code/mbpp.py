"""MBPP (sanitized), test split: code that passes the task's asserts.

The prompt is the description and the tests, ending "The function should be named X." (the
function the tests call). The candidate's box runs `test_imports` and the sanitized code (a
candidate may use a module the tests import); the checker's box
runs `test_imports`, then each `test_list` assert (one check each) with the functions the
tests call bound to proxies (every free name of the tests that is not a builtin; a
standard-library module name is imported instead, as the candidate's imports would have
provided it).
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import re
from typing import ClassVar

from spec_jax.eval.tasks import pyast
from spec_jax.eval.tasks.base import Item
from spec_jax.eval.tasks.code.boxes import fill
from spec_jax.eval.tasks.code.extract import sanitize
from spec_jax.eval.tasks.code.task import _CodeTask

MBPP_TEST_IDS = range(11, 511)  # The test split of (sanitized) MBPP.


def _mbpp_entry_point(row: dict) -> str:
    """The function the tests call: a function of `code` named in the first test."""
    names = re.findall(r'^\s*def\s+(\w+)\s*\(', row.get('code', ''), re.M)
    tests = '\n'.join(row['test_list'])
    for name in names:
        if re.search(rf'\b{re.escape(name)}\s*\(', tests):
            return name
    called = re.findall(r'(\w+)\s*\(', row['test_list'][0])
    skip = {'set', 'sorted', 'list', 'tuple', 'abs', 'round', 'isclose', 'math', 'str', 'len'}
    return next((c for c in called if c not in skip), names[0] if names else '')


# The checks (the checker's box, see `boxes`): the test imports, proxies, each assert.
_CHECKS = """
def checks():
    import sys
    g = {'__name__': '__checker__'}
    exec(compile(@IMPORTS@, 'test_imports.py', 'exec'), g)
    for name in @NAMES@:
        if name not in g:
            g[name] = __import__(name) if name in sys.stdlib_module_names else Proxy(name)
    for test in @TESTS@:
        exec(compile(test, 'test.py', 'exec'), g)
        CHECKS[0] += 1

_run_checks(checks)
"""


def _free_names(imports: str, tests: list[str]) -> list[str]:
    """The names the tests read that neither they, the imports nor the builtins bind."""
    bound, read = set(dir(builtins)), []
    for source in [imports, *tests]:
        for node in ast.walk(pyast.parse(source)):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                bound.update((a.asname or a.name).split('.')[0] for a in node.names)
            elif isinstance(node, ast.Name):
                if isinstance(node.ctx, ast.Load):
                    read.append(node.id)
                else:
                    bound.add(node.id)
    return sorted({name for name in read if name not in bound})


@dataclasses.dataclass(frozen=True)
class MBPP(_CodeTask):
    """Sanitized MBPP, test split (257 problems; task ids 11-510): code that passes asserts."""

    name: ClassVar[str] = 'mbpp'
    relpath: ClassVar[str] = 'mbpp/sanitized-mbpp.json'
    hub: ClassVar[tuple] = ('google-research-datasets/mbpp', 'sanitized', 'test')

    def _select(self, rows: list[dict]) -> list[dict]:
        return [row for row in rows if int(row['task_id']) in MBPP_TEST_IDS]

    def _item(self, row: dict) -> Item:
        entry = _mbpp_entry_point(row)
        tests = '\n'.join(row['test_list'])
        user = (
            f'{row["prompt"]}\nYour code should pass these tests:\n\n{tests}\n\n'
            f'The function should be named {entry}.'
        )
        return Item(
            task=self.name,
            id=str(row['task_id']),
            messages=self._messages(user),
            gold={
                'test_imports': list(row.get('test_imports') or []),
                'test_list': list(row['test_list']),
            },
            meta={'entry_point': entry, 'reference': row.get('code', '')},
        )

    def solution(self, item: Item, code: str) -> str:
        imports = '\n'.join(item.gold['test_imports'])  # As the old program had them.
        return f'{imports}\n{sanitize(code)}\n'

    def checks(self, item: Item) -> tuple[str, int]:
        imports, tests = '\n'.join(item.gold['test_imports']), item.gold['test_list']
        names = _free_names(imports, tests)
        return fill(_CHECKS, IMPORTS=imports, NAMES=names, TESTS=list(tests)), len(tests)
