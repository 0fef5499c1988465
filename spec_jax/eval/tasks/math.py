"""Math benchmarks: GSM8K, MATH-500, MATH, AIME 2024 and AIME 2025.

Each task is a frozen dataclass (`GSM8K`, `MATH500`, `MATH`, `AIME24`, `AIME25`; `TASKS` maps
their names to the classes) with two fields: `root`, the data root a config names with
`data_root` ('' = $SPEC_JAX_DATA, else the samples bundled in the package), and `timeout_s`,
the wall-clock limit on scoring one text.

Data. `load('')` reads the release's file under the data root (`gsm8k/test.jsonl`,
`math500/test.jsonl`, `math/test.jsonl`, `aime24/test.jsonl`, `aime25/test.jsonl`; a missing
one is a `DataFileError` naming the file, the `data_root` field and the hub id);
`load(path)` reads a local .jsonl, .json or .parquet file laid out like the release (or a
directory holding `<task>/test.jsonl` or `test.jsonl`); `load('hub')` reads the hub copy
through `datasets`; `load('fast_hsd')` reads the paper's own items (`tasks.fast_hsd`): for
GSM8K all 1,319 test questions, for MATH the paper's MATH, the first 500 rows of
competition_math's *train* split (ids 'train/<row>'; 240 bundled, rows 240.. of a larger
limit from the hub `qwedsacf/competition_math`, offline a `DataFileError`); the other math
tasks have none. The gold answers: GSM8K, the text after '####' with thousands commas
removed; MATH-500, `answer`; MATH, the last brace-balanced \\boxed{} of `solution`; AIME, the
answer as an integer (aime24's answers are zero-padded strings). The aime25 release has three
problems (rows 18, 19, 27) whose `\\f` and `\\t` JSON escapes were decoded into a form feed
and a tab (`\\frac` -> form feed + 'rac'); `load` puts the backslashes back.

Prompts: a system message asking for a step-by-step solution with the final answer in
\\boxed{} (`MATH_SYSTEM_PROMPT`, or `GSM8K_SYSTEM_PROMPT`), then the problem as the user turn.

Scoring: `math_judge` (math-verify, the strict score, each text in a killable worker under
`timeout_s`).
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from spec_jax.eval.tasks import fast_hsd
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.math_answers import extract_answer, last_boxed
from spec_jax.eval.tasks.math_judge import DEFAULT_TIMEOUT_S, judge
from spec_jax.eval.tasks.sources import load_hub, task_rows

# Re-exported: the extraction lives in math_answers, the judging in math_judge.
__all__ = ['extract_answer', 'judge', 'last_boxed']

MATH_SYSTEM_PROMPT = (
    'You are a helpful math assistant. Solve the problem step by step, explaining your '
    'reasoning, and put your final answer within \\boxed{}.'
)
GSM8K_SYSTEM_PROMPT = (
    'You are a helpful math assistant. Solve the word problem step by step, showing your '
    'calculations, and put the final numerical answer within \\boxed{}.'
)

# --------------------------------------------------------------------------- data


@dataclasses.dataclass(frozen=True)
class _MathTask:
    """What the math tasks share; a subclass sets the ClassVars and `_gold`/`_problem`."""

    root: str = ''
    timeout_s: float = DEFAULT_TIMEOUT_S

    scored: ClassVar[bool] = True
    name: ClassVar[str]
    relpath: ClassVar[str]  # The release's file under a data root.
    hub: ClassVar[tuple[str, str | None, str]]  # (id, config, split) for `datasets`.
    kind: ClassVar[str] = 'latex'  # How `math_judge.judge` reads gold and answer.
    system_prompt: ClassVar[str] = MATH_SYSTEM_PROMPT
    problem_field: ClassVar[str] = 'problem'

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the module docstring), the first `limit` (0 = all)."""
        rows = task_rows(
            source, self.relpath, self.root, self._hub_rows, limit, fast_hsd.loader(self.name)
        )
        if limit:
            rows = rows[:limit]
        return [self._item(i, row) for i, row in enumerate(rows)]

    def score(self, item: Item, text: str) -> Score:
        """Scores the model's text for `item` (math-verify, under `timeout_s`; any thread)."""
        return judge(self.kind, item.gold, text, self.timeout_s)

    def _hub_rows(self) -> list[dict]:
        return load_hub(*self.hub)

    def _item(self, index: int, row: dict) -> Item:
        problem = self._problem(row)
        return Item(
            task=self.name,
            id=self._id(index, row),
            messages=(
                {'role': 'system', 'content': self.system_prompt},
                {'role': 'user', 'content': problem},
            ),
            gold=self._gold(row),
            meta=self._meta(row),
        )

    def _problem(self, row: dict) -> str:
        return row[self.problem_field]

    def _id(self, index: int, row: dict) -> str:
        for key in ('unique_id', 'id', 'idx'):
            if row.get(key) is not None:
                return str(row[key])
        return str(index)

    def _gold(self, row: dict) -> str:
        return str(row['answer']).strip()

    def _meta(self, row: dict) -> dict:
        return {}


@dataclasses.dataclass(frozen=True)
class GSM8K(_MathTask):
    """GSM8K test (1,319 grade-school word problems); gold = the number after '####'."""

    name: ClassVar[str] = 'gsm8k'
    relpath: ClassVar[str] = 'gsm8k/test.jsonl'
    hub: ClassVar[tuple] = ('openai/gsm8k', 'main', 'test')
    kind: ClassVar[str] = 'number'
    system_prompt: ClassVar[str] = GSM8K_SYSTEM_PROMPT
    problem_field: ClassVar[str] = 'question'

    def _gold(self, row: dict) -> str:
        return row['answer'].split('####')[-1].strip().replace(',', '')


@dataclasses.dataclass(frozen=True)
class MATH500(_MathTask):
    """MATH-500 (the PRM800K test split of MATH); gold = `answer`."""

    name: ClassVar[str] = 'math500'
    relpath: ClassVar[str] = 'math500/test.jsonl'
    hub: ClassVar[tuple] = ('HuggingFaceH4/MATH-500', None, 'test')

    def _meta(self, row: dict) -> dict:
        return {'subject': row.get('subject'), 'level': row.get('level')}


MATH_SUBJECTS = (
    'algebra',
    'counting_and_probability',
    'geometry',
    'intermediate_algebra',
    'number_theory',
    'prealgebra',
    'precalculus',
)


@dataclasses.dataclass(frozen=True)
class MATH(_MathTask):
    """The MATH test set (5,000 problems); gold = the last \\boxed{} of `solution`.

    The hub copy (one config per subject) has no row ids: its ids are '<subject>/<row>'.
    """

    name: ClassVar[str] = 'math'
    relpath: ClassVar[str] = 'math/test.jsonl'
    hub: ClassVar[tuple] = ('EleutherAI/hendrycks_math', None, 'test')

    def _hub_rows(self) -> list[dict]:
        rows = []
        for subject in MATH_SUBJECTS:
            part = load_hub(self.hub[0], subject, self.hub[2])
            rows += [{**row, 'id': f'{subject}/{i}'} for i, row in enumerate(part)]
        return rows

    def _gold(self, row: dict) -> str:
        gold = last_boxed(row['solution'])
        if gold is None:
            raise ValueError(
                f'MATH row {row.get("idx", row.get("id"))}: no \\boxed{{}} in solution'
            )
        return gold

    def _meta(self, row: dict) -> dict:
        return {'subject': row.get('type'), 'level': row.get('level')}


@dataclasses.dataclass(frozen=True)
class AIME24(_MathTask):
    """AIME 2024 (I and II, 30 problems); gold = the integer answer ('025' -> '25')."""

    name: ClassVar[str] = 'aime24'
    relpath: ClassVar[str] = 'aime24/test.jsonl'
    hub: ClassVar[tuple] = ('HuggingFaceH4/aime_2024', None, 'train')
    kind: ClassVar[str] = 'integer'

    def _gold(self, row: dict) -> str:
        return str(int(str(row['answer']).strip()))

    def _meta(self, row: dict) -> dict:
        return {'url': row['url']} if row.get('url') else {}


def repair_escapes(problem: str) -> str:
    """Undoes JSON-escape damage: a form feed back to '\\f', a tab back to '\\t'."""
    return problem.replace('\x0c', '\\f').replace('\x09', '\\t')


@dataclasses.dataclass(frozen=True)
class AIME25(AIME24):
    """AIME 2025 (I and II, 30 problems); problems with escape damage are repaired."""

    name: ClassVar[str] = 'aime25'
    relpath: ClassVar[str] = 'aime25/test.jsonl'
    hub: ClassVar[tuple] = ('math-ai/aime25', None, 'test')

    def _problem(self, row: dict) -> str:
        return repair_escapes(row['problem'])


TASKS = {task.name: task for task in (GSM8K, MATH500, MATH, AIME24, AIME25)}
