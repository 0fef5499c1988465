"""What every task provides: items with chat prompts, and a scorer of generated text.

A task reads its data through `spec_jax.data_files` (a data root from the config, else
$SPEC_JAX_DATA, else the samples bundled in the package), from a local file the user names
(JSONL, JSON or Parquet), or from the hub through `datasets` on a machine that reaches it.
Scoring is a pure function of (item, text): the runner calls it off the decoding thread.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol


@dataclasses.dataclass(frozen=True)
class Item:
    """One evaluation item.

    Attributes:
      task: the task's name.
      id: a stable id within the task (the source's id or row index, as a string).
      messages: the chat prompt (system message first where the task has one).
      gold: what the scorer compares against (an answer string, tests, calls, ...).
      meta: anything else the scorer or a report needs (subject, level, category, ...).
    """

    task: str
    id: str
    messages: tuple[dict, ...]
    gold: Any
    meta: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Score:
    """The verdict on one generated text.

    Attributes:
      correct: whether it counts as solved (pass@1 for code).
      extracted: the answer (or code) extracted from the text, None if nothing was found.
      detail: scorer-specific facts (e.g. which tests failed, a timeout), JSON-ready.
    """

    correct: bool
    extracted: str | None = None
    detail: dict = dataclasses.field(default_factory=dict)


class Task(Protocol):
    """A benchmark: `load` its items, `score` a generated text for one of them.

    Attributes:
      name: the task's name (its key in `spec_jax.eval.tasks.TASKS`).
      scored: whether `score` judges the text; False for the speed sets
        (`spec_jax.eval.tasks.speed`), which measure speed and acceptance only and which the
        runner does not score.
    """

    name: str
    scored: bool

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The task's items: `source` is '' (the data root: config, $SPEC_JAX_DATA or the
        bundled samples), a local file or directory, or 'hub' (through `datasets`); the
        first `limit` items (0 = all)."""

    def score(self, item: Item, text: str) -> Score:
        """Scores the model's text for `item`."""
