"""MBPP (sanitized), test split: code that passes the task's asserts.

The prompt is the description and the tests, ending "The function should be named X." (the
function the tests call); the program is `test_imports`, the sanitized code, then the
`test_list` asserts.
"""

from __future__ import annotations

import dataclasses
import re
from typing import ClassVar

from spec_jax.eval.tasks.base import Item
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

    def program(self, item: Item, code: str) -> str:
        imports = '\n'.join(item.gold['test_imports'])
        tests = '\n'.join(item.gold['test_list'])
        return f'{imports}\n{sanitize(code)}\n\n{tests}\n'
