"""What the code tasks share: fields `root` and `timeout_s`, loading, the two-box run
(`boxes.run_pair`: the candidate's code serves calls, the task's checks run apart), the
prompt (`CODE_SYSTEM_PROMPT`, then the task's user turn)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.code import boxes
from spec_jax.eval.tasks.code.extract import extract_code
from spec_jax.eval.tasks.sources import load_hub, task_rows

CODE_SYSTEM_PROMPT = (
    'You are a code generation model that writes correct, self-contained Python. Answer with '
    'the Python function definition alone, with the imports it needs: no explanation, no '
    'usage examples and no markdown formatting.'
)

DEFAULT_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class _CodeTask:
    """What the code tasks share; a subclass sets the ClassVars, `_item`, `solution` and
    `checks` (MBPP+ its own `score`)."""

    root: str = ''
    timeout_s: float = DEFAULT_TIMEOUT_S

    scored: ClassVar[bool] = True
    name: ClassVar[str]
    relpath: ClassVar[str]  # The release's file under a data root.
    hub: ClassVar[tuple[str, str | None, str]]  # (id, config, split) for `datasets`.

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the package docstring), the first `limit` (0 = all)."""
        rows = task_rows(source, self.relpath, self.root, lambda: load_hub(*self.hub), limit)
        rows = self._select(rows)
        if limit:
            rows = rows[:limit]
        return [self._item(row) for row in rows]

    def score(self, item: Item, text: str) -> Score:
        """Runs the code of `text` in a candidate box and `item`'s tests in a checker box
        (`boxes.run_pair`; any thread): correct iff every check ran and held."""
        code = extract_code(text, item.meta.get('entry_point'))
        if not code.strip():
            return Score(False, None, {'status': 'no code'})
        checks, count = self.checks(item)
        verdict = boxes.run_pair(self.solution(item, code), checks, count, self.timeout_s)
        return Score(verdict.passed, code, verdict.detail)

    def solution(self, item: Item, code: str) -> str:
        """The program the candidate's box runs before it serves calls."""
        raise NotImplementedError

    def checks(self, item: Item) -> tuple[str, int]:
        """(the checker's source, see `boxes.checker_source`; the number of checks it must
        run) for `item`."""
        raise NotImplementedError

    def _select(self, rows: list[dict]) -> list[dict]:
        return rows

    def _item(self, row: dict) -> Item:
        raise NotImplementedError

    def _messages(self, user: str) -> tuple[dict, ...]:
        return (
            {'role': 'system', 'content': CODE_SYSTEM_PROMPT},
            {'role': 'user', 'content': user},
        )
