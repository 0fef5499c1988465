"""The EAGLE speed sets: MT-bench, HumanEval, GSM8K, Alpaca, CNN/DailyMail and Natural
Questions prompts, for speed and acceptance only.

Each set is a frozen dataclass, a subclass of `SpeedSet` (`TASKS` maps 'speed_<set>' to the
class, the set named as `data_files.SPEED_SETS` names it: speed_mt_bench, speed_humaneval,
speed_gsm8k, speed_alpaca, speed_sum (CNN/DailyMail) and speed_qa (Natural Questions);
`SpeedSet.for_set(set_name, root)` builds one), with the field `root`, the data root a config
names with `data_root` ('' = $SPEC_JAX_DATA, else the samples bundled in the package, the
first 10 questions of each set).

Data. `load('')` reads `speed/<set>.jsonl` under the data root (`data_files.speed_files`; a
missing one is a `DataFileError` naming the file); `load(path)` reads a local .jsonl (or
.json, .parquet) file in EAGLE's `question.jsonl` schema (`question_id`, `category`,
`turns`), or a directory holding `speed/<set>.jsonl`, `<set>.jsonl` or `<set>/question.jsonl`
(EAGLE's `eagle/data/`). The sets are not loaded from the hub (they have no one hub copy):
`load('hub')` is a ValueError. An item's id is its row index in the file, its prompt is the
row's first turn alone as the one user message (MT-bench's second turns are left out, as
`data_files.speed_prompts` leaves them out), and it has no gold.

Scoring. There is nothing to score: the speed sets measure decoding speed and acceptance,
and the runner does not score them (`scored = False`). `score` returns an incorrect Score
with detail {'unscored': True} for any text.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, ClassVar

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.sources import task_rows


@dataclasses.dataclass(frozen=True)
class SpeedSet:
    """What the speed sets share; a subclass sets `set_name` (see the module docstring)."""

    root: str = ''

    scored: ClassVar[bool] = False
    set_name: ClassVar[str] = ''  # The set, as `data_files.SPEED_SETS` names it.
    name: ClassVar[str] = ''  # 'speed_<set_name>'.
    relpath: ClassVar[str] = ''  # The set's file under a data root.

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        set_name = cls.__dict__.get('set_name')
        if set_name:
            cls.name = f'speed_{set_name}'
            cls.relpath = data_files.speed_files([set_name])[0]

    @staticmethod
    def for_set(set_name: str, root: str = '') -> SpeedSet:
        """The task of one speed set, e.g. `SpeedSet.for_set('mt_bench')`."""
        if f'speed_{set_name}' not in TASKS:
            raise ValueError(
                f'unknown speed set {set_name!r}; valid: {list(data_files.SPEED_SETS)}'
            )
        return TASKS[f'speed_{set_name}'](root=root)

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the module docstring), the first `limit` (0 = all)."""
        rows = task_rows(self._source(source), self.relpath, self.root, self._hub_rows, limit)
        if limit:
            rows = rows[:limit]
        return [self._item(index, row) for index, row in enumerate(rows)]

    def score(self, item: Item, text: str) -> Score:
        """No verdict: the speed sets are not scored (the runner does not call this)."""
        return Score(False, None, {'unscored': True})

    def _item(self, index: int, row: dict) -> Item:
        return Item(
            task=self.name,
            id=str(index),
            messages=({'role': 'user', 'content': row['turns'][0]},),
            gold=None,
            meta={'set': self.set_name},
        )

    def _hub_rows(self) -> list[dict]:
        raise ValueError(
            f"{self.name}: the speed sets are not loaded from the hub; use source '' (the data "
            f'root, set with data_root or ${data_files.ENV_VAR}, holding {self.relpath}) or a '
            f"local file (e.g. EAGLE's eagle/data/{self.set_name}/question.jsonl)"
        )

    def _source(self, source: str) -> str:
        """`source`, or for a directory the set's file in it: `speed/<set>.jsonl` (a data
        root), `<set>.jsonl` or `<set>/question.jsonl` (EAGLE's `eagle/data/`)."""
        if source in ('', 'hub') or not os.path.isdir(source):
            return source
        names = (self.relpath, os.path.basename(self.relpath), f'{self.set_name}/question.jsonl')
        for name in names:
            if os.path.isfile(os.path.join(source, name)):
                return os.path.join(source, name)
        raise DataFileError(f'none of {list(names)} found under {source}')


@dataclasses.dataclass(frozen=True)
class SpeedMTBench(SpeedSet):
    """MT-bench (80 questions, two turns each; the first turn is the prompt)."""

    set_name: ClassVar[str] = 'mt_bench'


@dataclasses.dataclass(frozen=True)
class SpeedHumanEval(SpeedSet):
    """HumanEval (80 "Complete the code I provided." prompts)."""

    set_name: ClassVar[str] = 'humaneval'


@dataclasses.dataclass(frozen=True)
class SpeedGSM8K(SpeedSet):
    """GSM8K (80 grade-school math word problems)."""

    set_name: ClassVar[str] = 'gsm8k'


@dataclasses.dataclass(frozen=True)
class SpeedAlpaca(SpeedSet):
    """Alpaca (80 instructions)."""

    set_name: ClassVar[str] = 'alpaca'


@dataclasses.dataclass(frozen=True)
class SpeedSum(SpeedSet):
    """CNN/DailyMail summarization (79 "Summarize: <article>" prompts)."""

    set_name: ClassVar[str] = 'sum'


@dataclasses.dataclass(frozen=True)
class SpeedQA(SpeedSet):
    """Natural Questions (79 open-domain questions)."""

    set_name: ClassVar[str] = 'qa'


TASKS = {
    task.name: task
    for task in (SpeedMTBench, SpeedHumanEval, SpeedGSM8K, SpeedAlpaca, SpeedSum, SpeedQA)
}
