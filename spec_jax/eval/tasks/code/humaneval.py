"""HumanEval: complete a function from its signature and docstring.

A completion is accepted as a full function (run after the prompt, whose imports and helpers
it may use) or as a body continuing the prompt (indented if it was not); the program is the
prompt and completion, then the task's `test` and `check(entry_point)`.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import ClassVar

from spec_jax.eval.tasks.base import Item
from spec_jax.eval.tasks.code.extract import _compiles, _defines, _parses, sanitize
from spec_jax.eval.tasks.code.task import _CodeTask


def humaneval_solution(prompt: str, code: str, entry_point: str) -> str:
    """The program text of a HumanEval completion: the prompt then a full function (which
    replaces the prompt's stub), or the prompt continued by a body (indented by 4 spaces if
    its first line was not)."""
    if _defines(code, entry_point) and _parses(code):
        return f'{prompt}\n{sanitize(code)}\n'
    indented = textwrap.indent(textwrap.dedent(code), '    ')
    first = next((line for line in code.splitlines() if line.strip()), '')
    for body in (code, indented) if first[:1].isspace() else (indented, code):
        if _compiles(prompt + body):
            return f'{prompt}{body}\n'
    return f'{prompt}{code}\n'


@dataclasses.dataclass(frozen=True)
class HumanEval(_CodeTask):
    """HumanEval (164 problems): complete a function from its signature and docstring."""

    name: ClassVar[str] = 'humaneval'
    relpath: ClassVar[str] = 'humaneval/HumanEval.jsonl.gz'
    hub: ClassVar[tuple] = ('openai/openai_humaneval', None, 'test')

    def _item(self, row: dict) -> Item:
        prompt = row['prompt']
        user = (
            'Complete the following Python function. Reply with the whole function, '
            f'signature included.\n\n{prompt}'
        )
        return Item(
            task=self.name,
            id=str(row['task_id']),
            messages=self._messages(user),
            gold={'prompt': prompt, 'test': row['test'], 'entry_point': row['entry_point']},
            meta={'entry_point': row['entry_point'], 'reference': row['canonical_solution']},
        )

    def program(self, item: Item, code: str) -> str:
        g = item.gold
        solution = humaneval_solution(g['prompt'], code, g['entry_point'])
        return f'{solution}\n\n{g["test"]}\n\ncheck({g["entry_point"]})\n'
