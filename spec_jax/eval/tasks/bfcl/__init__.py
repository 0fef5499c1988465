"""BFCL v4 (Berkeley Function Calling Leaderboard): the AST categories, scored offline.

  parse.py      model text -> calls: `parse_calls` (Python via `ast`; Java and JavaScript
                with a bracket-aware scanner), `CallParseError`
  convert.py    BFCL's Java/JavaScript type converters: `java_convert`, `js_convert`
  check.py      the AST checker: `check_calls`, `check_call`, `Verdict`, `normalize_string`,
                `is_empty`, `language_of`
  prompt.py     the prompt: `SYSTEM_PROMPT`, `prompt_functions`, `messages`
  reference.py  reference responses: `reference_calls`, `render_calls`, `reference_response`
  __init__.py   the tasks (`BFCL`, one subclass per category, `TASKS`), loading, `judge`

Tasks. One frozen dataclass per category (`TASKS` maps 'bfcl_<category>' to the class;
`BFCL.for_category(category, root)` builds one), each with the field `root`, the data root a
config names with `data_root` ('' = $SPEC_JAX_DATA, else the samples bundled in the
package). Categories: simple_python, simple_java, simple_javascript, multiple, parallel,
parallel_multiple, live_simple, live_multiple, live_parallel, live_parallel_multiple and
irrelevance (correct iff the text holds no call).

Data. `load('')` reads `bfcl/BFCL_v4_<category>.json` and its
`bfcl/possible_answer/BFCL_v4_<category>.json` (JSON lines; irrelevance has no answer file)
under the data root; `load(path)` reads a local questions file (its answers in
`possible_answer/<same name>` beside it) or a directory holding `bfcl/BFCL_v4_<category>.json`
or `BFCL_v4_<category>.json` (e.g. `bfcl_eval/data/` of the bfcl-eval wheel); `load('hub')`
downloads `BFCL_v3_<category>.json` and its possible answer from the hub repository
`gorilla-llm/Berkeley-Function-Calling-Leaderboard` with `huggingface_hub` (the files mix
value types that `datasets` cannot put in one Arrow column; v3 names simple_python 'simple',
simple_java 'java' and simple_javascript 'javascript'); `load('fast_hsd')` (parallel_multiple
only) reads the paper's 200 (`tasks.fast_hsd`: Fast-HSD's question file, bundled, its
functions and question parsed back out of its prompt, its reference as the possible answer).
An item's prompt is `messages` (see `prompt`): ours, also for the paper's items.

Scoring (`judge`, the tasks' `score`): the text's calls are decoded (`parse_calls`, see
`parse`; known differences from upstream there) and checked against the possible answer
(`check_calls`, see `check`); in irrelevance, a text that does not decode, or decodes to no
call, is correct. `Score.detail` holds the checker's error type and messages and the decoded
calls.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from typing import Any, ClassVar

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks import fast_hsd
from spec_jax.eval.tasks.base import Item, Score
from spec_jax.eval.tasks.bfcl.check import (
    Verdict,
    check_call,
    check_calls,
    is_empty,
    language_of,
    normalize_string,
)
from spec_jax.eval.tasks.bfcl.convert import java_convert, js_convert
from spec_jax.eval.tasks.bfcl.parse import CallParseError, parse_calls
from spec_jax.eval.tasks.bfcl.prompt import SYSTEM_PROMPT, messages, prompt_functions
from spec_jax.eval.tasks.bfcl.reference import reference_calls, reference_response, render_calls
from spec_jax.eval.tasks.sources import FAST_HSD, SOURCES, read_rows

__all__ = [
    'BFCL',
    'CATEGORIES',
    'HUB_ID',
    'SYSTEM_PROMPT',
    'TASKS',
    'BFCLIrrelevance',
    'BFCLLiveMultiple',
    'BFCLLiveParallel',
    'BFCLLiveParallelMultiple',
    'BFCLLiveSimple',
    'BFCLMultiple',
    'BFCLParallel',
    'BFCLParallelMultiple',
    'BFCLSimpleJava',
    'BFCLSimpleJavaScript',
    'BFCLSimplePython',
    'CallParseError',
    'Verdict',
    'check_call',
    'check_calls',
    'is_empty',
    'java_convert',
    'js_convert',
    'judge',
    'language_of',
    'messages',
    'normalize_string',
    'parse_calls',
    'prompt_functions',
    'reference_calls',
    'reference_response',
    'render_calls',
]


CATEGORIES = (
    'simple_python',
    'simple_java',
    'simple_javascript',
    'multiple',
    'parallel',
    'parallel_multiple',
    'live_simple',
    'live_multiple',
    'live_parallel',
    'live_parallel_multiple',
    'irrelevance',
)
HUB_ID = 'gorilla-llm/Berkeley-Function-Calling-Leaderboard'
_V3_NAMES = {'simple_python': 'simple', 'simple_java': 'java', 'simple_javascript': 'javascript'}


def _jsonable(x: Any) -> Any:
    if isinstance(x, dict):
        return {k if isinstance(k, str) else repr(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if x is None or isinstance(x, (str, bool, int)):
        return x
    if isinstance(x, float) and math.isfinite(x):
        return x
    return repr(x)


def judge(item: Item, text: str) -> Score:
    """Scores a model's text for a BFCL item (any thread; pure)."""
    category, language = item.meta['category'], item.meta['language']
    try:
        calls = parse_calls(text, language)
    except CallParseError as e:
        if category == 'irrelevance':
            return Score(True, None, {'error_type': '', 'errors': [], 'decoded': False})
        return Score(False, None, {'error_type': 'ast_decoder:decoder_failed', 'errors': [str(e)]})
    decoded = _jsonable(calls)
    extracted = json.dumps(decoded, ensure_ascii=False)
    if category == 'irrelevance':
        empty = is_empty(calls)
        detail = {'error_type': '', 'errors': [], 'decoded': True, 'calls': decoded}
        if not empty:
            detail['error_type'] = 'irrelevance_error:decoder_success'
            detail['errors'] = ['a function was called where none applies']
        return Score(empty, extracted, detail)
    verdict = check_calls(item.gold['functions'], calls, item.gold['ground_truth'], category)
    detail = {'error_type': verdict.error_type, 'errors': list(verdict.errors), 'calls': decoded}
    return Score(verdict.valid, extracted, detail)


def _answers_beside(path: str) -> str:
    return os.path.join(os.path.dirname(path), 'possible_answer', os.path.basename(path))


@dataclasses.dataclass(frozen=True)
class BFCL:
    """What the BFCL category tasks share; a subclass sets `category` (see the module
    docstring)."""

    root: str = ''

    scored: ClassVar[bool] = True
    category: ClassVar[str] = ''
    name: ClassVar[str] = ''
    relpath: ClassVar[str] = ''  # The questions file under a data root.
    answer_relpath: ClassVar[str] = ''  # Its possible answers ('' for irrelevance).
    hub: ClassVar[tuple[str, str, str]] = ('', '', '')  # (repo, questions, answers) files.

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        category = cls.__dict__.get('category')
        if category:
            answers = category != 'irrelevance'
            v3 = f'BFCL_v3_{_V3_NAMES.get(category, category)}.json'
            cls.name = f'bfcl_{category}'
            cls.relpath = f'bfcl/BFCL_v4_{category}.json'
            cls.answer_relpath = f'bfcl/possible_answer/BFCL_v4_{category}.json' if answers else ''
            cls.hub = (HUB_ID, v3, f'possible_answer/{v3}' if answers else '')

    @staticmethod
    def for_category(category: str, root: str = '') -> BFCL:
        """The task of one category, e.g. `BFCL.for_category('parallel')`."""
        if f'bfcl_{category}' not in TASKS:
            raise ValueError(f'unknown BFCL category {category!r}; valid: {list(CATEGORIES)}')
        return TASKS[f'bfcl_{category}'](root=root)

    @property
    def language(self) -> str:
        return language_of(self.category)

    def load(self, source: str = '', limit: int = 0) -> list[Item]:
        """The items (see the module docstring), the first `limit` (0 = all)."""
        if limit < 0:
            raise ValueError(f'limit must be >= 0, got {limit}')
        if source == '':
            rows = data_files.read_jsonl(self.relpath, self.root, 'data_root')
            answers = (
                data_files.read_jsonl(self.answer_relpath, self.root, 'data_root')
                if self.answer_relpath
                else None
            )
        elif source == 'hub':
            rows, answers = self._hub_rows()
        elif source == FAST_HSD:
            rows, answers = fast_hsd.bfcl_rows(self.category)
        else:
            path = self._local_file(source)
            answers = None
            if self.answer_relpath:
                answer_path = _answers_beside(path)
                if not os.path.isfile(answer_path):
                    raise DataFileError(
                        f'the possible answers of {path} are missing: expected {answer_path}'
                    )
                answers = read_rows(answer_path)
            rows = read_rows(path)
        if limit:
            rows = rows[:limit]
        by_id = {a['id']: a['ground_truth'] for a in answers} if answers is not None else None
        items = []
        for row in rows:
            if by_id is not None and row['id'] not in by_id:
                raise DataFileError(f'BFCL {self.category}: no possible answer for {row["id"]!r}')
            items.append(self._item(row, by_id[row['id']] if by_id is not None else None))
        return items

    def score(self, item: Item, text: str) -> Score:
        """Decodes the calls of `text` and checks them (see the module docstring)."""
        return judge(item, text)

    def _item(self, row: dict, ground_truth: list | None) -> Item:
        return Item(
            task=self.name,
            id=str(row['id']),
            messages=messages(row, self.language),
            gold={'functions': row['function'], 'ground_truth': ground_truth},
            meta={'category': self.category, 'language': self.language},
        )

    def _local_file(self, source: str) -> str:
        base = os.path.basename(self.relpath)
        if os.path.isdir(source):
            for candidate in (self.relpath, base):
                for path in (candidate, candidate + 'l'):  # .json, or .jsonl
                    if os.path.isfile(os.path.join(source, path)):
                        return os.path.join(source, path)
            raise DataFileError(f'neither {self.relpath!r} nor {base!r} found under {source}')
        if not os.path.isfile(source):
            raise DataFileError(
                f"data file {source!r} not found (a task's source is {SOURCES}; a local "
                f'file is {base} or a directory holding it)'
            )
        return source

    def _hub_rows(self) -> tuple[list[dict], list[dict] | None]:
        repo, questions, answers = self.hub
        try:
            from huggingface_hub import hf_hub_download

            rows = read_rows(hf_hub_download(repo, questions, repo_type='dataset'))
            gold = None
            if answers:
                gold = read_rows(hf_hub_download(repo, answers, repo_type='dataset'))
        except Exception as e:
            offline = os.environ.get('HF_HUB_OFFLINE', '')
            raise DataFileError(
                f'could not download {questions!r} from the hub dataset {repo!r}: '
                f'{type(e).__name__}: {e}. Offline (HF_HUB_OFFLINE={offline!r}) or without a '
                "cached copy, use source '' (the data root, set with data_root or "
                f'${data_files.ENV_VAR}) or a local BFCL_v4_{self.category}.json.'
            ) from e
        return rows, gold


@dataclasses.dataclass(frozen=True)
class BFCLSimplePython(BFCL):
    """simple_python: one call of the one Python function given (400 items)."""

    category: ClassVar[str] = 'simple_python'


@dataclasses.dataclass(frozen=True)
class BFCLSimpleJava(BFCL):
    """simple_java: one call of a Java method, values as Java source (100 items)."""

    category: ClassVar[str] = 'simple_java'


@dataclasses.dataclass(frozen=True)
class BFCLSimpleJavaScript(BFCL):
    """simple_javascript: one call of a JavaScript function, values as JS source (50)."""

    category: ClassVar[str] = 'simple_javascript'


@dataclasses.dataclass(frozen=True)
class BFCLMultiple(BFCL):
    """multiple: one call of the right function among several (200 items)."""

    category: ClassVar[str] = 'multiple'


@dataclasses.dataclass(frozen=True)
class BFCLParallel(BFCL):
    """parallel: several calls of one function, in any order (200 items)."""

    category: ClassVar[str] = 'parallel'


@dataclasses.dataclass(frozen=True)
class BFCLParallelMultiple(BFCL):
    """parallel_multiple: several calls of several functions, in any order (200 items)."""

    category: ClassVar[str] = 'parallel_multiple'


@dataclasses.dataclass(frozen=True)
class BFCLLiveSimple(BFCL):
    """live_simple: user-contributed, one call of one function (258 items)."""

    category: ClassVar[str] = 'live_simple'


@dataclasses.dataclass(frozen=True)
class BFCLLiveMultiple(BFCL):
    """live_multiple: user-contributed, one call of the right function (1,053 items)."""

    category: ClassVar[str] = 'live_multiple'


@dataclasses.dataclass(frozen=True)
class BFCLLiveParallel(BFCL):
    """live_parallel: user-contributed, several calls of one function (16 items)."""

    category: ClassVar[str] = 'live_parallel'


@dataclasses.dataclass(frozen=True)
class BFCLLiveParallelMultiple(BFCL):
    """live_parallel_multiple: user-contributed, several calls of several functions (24)."""

    category: ClassVar[str] = 'live_parallel_multiple'


@dataclasses.dataclass(frozen=True)
class BFCLIrrelevance(BFCL):
    """irrelevance: no function applies; correct iff the text holds no call (240 items)."""

    category: ClassVar[str] = 'irrelevance'


TASKS = {
    task.name: task
    for task in (
        BFCLSimplePython,
        BFCLSimpleJava,
        BFCLSimpleJavaScript,
        BFCLMultiple,
        BFCLParallel,
        BFCLParallelMultiple,
        BFCLLiveSimple,
        BFCLLiveMultiple,
        BFCLLiveParallel,
        BFCLLiveParallelMultiple,
        BFCLIrrelevance,
    )
}
