"""HumanEval: complete a function from its signature and docstring.

A completion is accepted as a full function (run after the prompt, whose imports and helpers
it may use) or as a body continuing the prompt (indented if it was not). The candidate's
box runs the prompt and completion; the checker's box runs the dataset's prompt (the
helpers some tests call, e.g. `encode_cyclic`, come from there, never from the completion),
then `test` and `check(candidate)` with `candidate` the proxy of the entry point. One check:
`check` returned.
"""

from __future__ import annotations

import dataclasses
import textwrap
from typing import ClassVar

from spec_jax.eval.tasks.base import Item
from spec_jax.eval.tasks.code.boxes import fill
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


# The checks (the checker's box, see `boxes`): the dataset's prompt and test, the proxy.
_CHECKS = """
def checks():
    g = {'__name__': '__checker__'}
    exec(compile(@PROMPT@, 'prompt.py', 'exec'), g)
    exec(compile(@TEST@, 'test.py', 'exec'), g)
    candidate = g[@ENTRY@] = Proxy(@ENTRY@)
    g['check'](candidate)
    CHECKS[0] = 1

_run_checks(checks)
"""


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

    def solution(self, item: Item, code: str) -> str:
        g = item.gold
        return humaneval_solution(g['prompt'], code, g['entry_point'])

    def checks(self, item: Item) -> tuple[str, int]:
        g = item.gold
        return fill(_CHECKS, PROMPT=g['prompt'], TEST=g['test'], ENTRY=g['entry_point']), 1
