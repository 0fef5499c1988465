"""The paper's own items: Fast-HSD's question files, read back into our tasks' row schemas.

The question files the paper's EAGLE-3 runs read (`EAGLE/eagle/data/<bench>/question.jsonl`
of ZhouYuxuanYX/Fast-HSD) are bundled verbatim under `spec_jax/assets/data/fast_hsd/`
(`BUNDLED`; spec_jax/assets/data/README.md gives each file's source, licence, count and
status). A task's source 'fast_hsd' (`sources.FAST_HSD`) reads them: the paper's exact
selection, converted to the rows the task reads from its own release, so the task's own
prompt and scorer apply (the prompts are ours, the items are the paper's):

  gsm8k                   all 1,319 test questions in file order: {'question', 'answer'}.
  math                    the first 500 rows of the competition_math *train* split in hub
                          order (`MATH_SIZE`; all Algebra): {'id': 'train/<row>', 'problem',
                          'solution', 'type', 'level'}. Rows 0-239 are bundled; a limit above
                          240 (0 = the paper's 500) reads rows 240.. from the hub
                          (`MATH_HUB`, after checking the hub's first 240 against the bundled
                          ones); offline that is a DataFileError saying so.
  include                 the paper's 220 (5 per language, 44 languages), parsed back from the
                          prompt: INCLUDE's hub schema (question, option_a..option_d, answer
                          0-3, language, subject = the file's category).
  bfcl_parallel_multiple  all 200 parallel_multiple problems: BFCL's question rows (id,
                          question, function parsed from the prompt's JSON) and possible
                          answers (the file's reference).

MBPP+'s file holds prompts and reference code but no tests, so it cannot be scored; its
selection, all 378 tasks of v0.2.0 in task_id order, is what the mbppplus task loads from
the full v0.2.0 file or the hub (`sources.NO_FAST_HSD`). The parsers are strict: a prompt
that does not parse to exactly what the file was built from is a DataFileError.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable

from spec_jax import data_files
from spec_jax.data_files import DataFileError
from spec_jax.eval.tasks.sources import load_hub

BUNDLED = os.path.join(data_files.BUNDLED, 'fast_hsd')

# Bench -> (its file under BUNDLED, its rows).
FILES = {
    'gsm8k': ('gsm8k/question.jsonl', 1319),
    'competition_math': ('competition_math/question.first240.jsonl', 240),
    'include': ('include/question.transcribed.jsonl', 220),
    'bfcl': ('bfcl/question.jsonl', 200),
    'mbppplus': ('mbppplus/question.jsonl', 378),
}

MATH_SIZE = 500  # The paper's MATH: `ds.select(range(500))` of the train split.
MATH_HUB = ('qwedsacf/competition_math', None, 'train')

_INCLUDE_HEAD = 'Question:\n'
_INCLUDE_OPTIONS = '\nOptions:\n'
_INCLUDE_TAIL = "\nAnswer: Let's think step by step."
_BFCL_FUNCTIONS = 'Here is a list of functions in JSON format that you can invoke:\n'
_BFCL_QUESTION = '\n\nQuestion: '


def questions(bench: str) -> list[dict]:
    """The records of a bundled question file (`FILES`), checked for its row count."""
    if bench not in FILES:
        raise ValueError(f'unknown Fast-HSD bench {bench!r}; valid: {sorted(FILES)}')
    relpath, count = FILES[bench]
    path = os.path.join(BUNDLED, relpath)
    if not os.path.isfile(path):
        raise DataFileError(f'the bundled Fast-HSD file {path} is missing (a broken install?)')
    with open(path, encoding='utf-8') as f:
        rows = [json.loads(line) for line in f if line.strip()]
    if len(rows) != count:
        raise DataFileError(f'{path}: {len(rows)} rows, expected {count}')
    return rows


def gsm8k_rows(limit: int = 0) -> list[dict]:
    """GSM8K's rows ({'question', 'answer'}, the test release's schema), the first `limit`."""
    rows = [{'question': r['turns'][0], 'answer': r['reference'][0]} for r in questions('gsm8k')]
    return rows[:limit] if limit else rows


def _math_row(index: int, row: dict) -> dict:
    return {
        'id': f'train/{index}',
        'problem': row['problem'],
        'solution': row['solution'],
        'type': row.get('type'),
        'level': row.get('level'),
    }


def math_rows(limit: int = 0, hub_rows: Callable[[], list[dict]] | None = None) -> list[dict]:
    """The first `limit` rows (0 = the paper's `MATH_SIZE`) of the competition_math train
    split: the bundled 240, then rows 240.. of `hub_rows()` (default: `MATH_HUB` through
    `datasets`) in hub order (see the module docstring).

    Raises:
      DataFileError: more than 240 rows asked for and the hub not reachable, or a hub copy
        whose first 240 rows are not the bundled ones.
    """
    limit = limit or MATH_SIZE
    bundled = []
    for k, q in enumerate(questions('competition_math')):
        row = {'problem': q['turns'][0], 'solution': q['reference'][0], 'type': q['category']}
        bundled.append(_math_row(k, row))
    if limit <= len(bundled):
        return bundled[:limit]
    try:
        hub = hub_rows() if hub_rows is not None else load_hub(*MATH_HUB)
    except DataFileError as e:
        raise DataFileError(
            f"MATH source 'fast_hsd' with limit {limit}: the paper's rows {len(bundled)}.."
            f'{limit - 1} come from the hub ({MATH_HUB[0]!r}, split {MATH_HUB[2]!r}), which '
            f'could not be read; offline, use a limit of at most {len(bundled)} (the bundled '
            f'rows). {e}'
        ) from e
    for k, row in enumerate(bundled):
        if k >= len(hub) or hub[k].get('problem') != row['problem']:
            raise DataFileError(
                f"the hub copy of {MATH_HUB[0]!r} differs from the paper's row {k} (bundled): "
                "its order changed, so its rows are not the paper's"
            )
    return bundled + [_math_row(k, hub[k]) for k in range(len(bundled), min(limit, len(hub)))]


def parse_include(prompt: str) -> tuple[str, list[str]]:
    """(question, [option A, B, C, D]) of a Fast-HSD INCLUDE prompt ("Question:\\n...
    \\nOptions:\\nA. ...\\nD. ...\\nAnswer: Let's think step by step.")."""
    if not (prompt.startswith(_INCLUDE_HEAD) and prompt.endswith(_INCLUDE_TAIL)):
        raise DataFileError(f'not a Fast-HSD INCLUDE prompt: {prompt[:60]!r}...')
    body = prompt[len(_INCLUDE_HEAD) : -len(_INCLUDE_TAIL)]
    if body.count(_INCLUDE_OPTIONS) != 1:
        raise DataFileError(f'INCLUDE prompt without one options block: {prompt[:60]!r}...')
    question, options = body.split(_INCLUDE_OPTIONS)
    lines = options.split('\n')
    if len(lines) != 4 or any(not ln.startswith(f'{c}. ') for ln, c in zip(lines, 'ABCD')):
        raise DataFileError(f'INCLUDE prompt without exactly 4 options A-D: {options[:80]!r}')
    return question, [ln[3:] for ln in lines]


def include_rows() -> list[dict]:
    """The paper's 220 INCLUDE questions in the hub's schema, in the file's order, each with
    an 'id' 'fast_hsd/<question_id>'."""
    rows = []
    for r in questions('include'):
        question, options = parse_include(r['turns'][0])
        letter = r['reference'][0]
        if letter not in ('A', 'B', 'C', 'D'):
            raise DataFileError(f'INCLUDE question {r["question_id"]}: gold {letter!r} not A-D')
        rows.append({
            'id': f'fast_hsd/{r["question_id"]}',
            'language': r['language'],
            'subject': r['category'],
            'question': question,
            **{f'option_{c}': option for c, option in zip('abcd', options)},
            'answer': 'ABCD'.index(letter),
        })  # fmt: skip
    return rows


def parse_bfcl(prompt: str) -> tuple[list[dict], str]:
    """(functions, question) of a Fast-HSD BFCL prompt: the instructions, the functions as
    JSON (indent 2, ASCII-escaped: re-serialising them must give the prompt's text back), then
    "Question: ..."."""
    start = prompt.find(_BFCL_FUNCTIONS)
    if start < 0:
        raise DataFileError(f'not a Fast-HSD BFCL prompt (no functions list): {prompt[:60]!r}')
    start += len(_BFCL_FUNCTIONS)
    try:
        functions, end = json.JSONDecoder().raw_decode(prompt, start)
    except json.JSONDecodeError as e:
        raise DataFileError(f'BFCL prompt: the functions are not JSON: {e}') from e
    if json.dumps(functions, indent=2) != prompt[start:end] or not isinstance(functions, list):
        raise DataFileError('BFCL prompt: the functions do not re-serialise to the prompt text')
    if not prompt.startswith(_BFCL_QUESTION, end):
        raise DataFileError(f'BFCL prompt: no question after the functions: {prompt[end:][:60]!r}')
    return functions, prompt[end + len(_BFCL_QUESTION) :]


def bfcl_rows(category: str) -> tuple[list[dict], list[dict]]:
    """(question rows, possible answers) of the paper's BFCL problems in BFCL's schema; only
    `parallel_multiple` has a Fast-HSD file."""
    if category != 'parallel_multiple':
        raise DataFileError(
            f"BFCL {category}: the paper has no items of this category (source 'fast_hsd' is "
            'for bfcl_parallel_multiple only)'
        )
    rows, answers = [], []
    for r in questions('bfcl'):
        if r['category'] != category:
            raise DataFileError(f'Fast-HSD BFCL row {r["question_id"]}: {r["category"]!r}')
        functions, question = parse_bfcl(r['turns'][0])
        rows.append({'id': r['bfcl_id'], 'question': [[{'role': 'user', 'content': question}]],
                     'function': functions})  # fmt: skip
        answers.append({'id': r['bfcl_id'], 'ground_truth': r['reference']})
    return rows, answers


# Tasks read through `sources.task_rows` -> their reader of `limit` rows.
_LOADERS: dict[str, Callable[[int], list[dict]]] = {'gsm8k': gsm8k_rows, 'math': math_rows}


def loader(task: str) -> Callable[[int], list[dict]] | None:
    """The reader of `task`'s Fast-HSD rows for `sources.task_rows` (None: it has none)."""
    return _LOADERS.get(task)


def needs_hub(task: str, limit: int) -> bool:
    """Whether source 'fast_hsd' of `task` at `limit` reads the hub (MATH beyond 240 rows)."""
    return task == 'math' and (limit or MATH_SIZE) > FILES['competition_math'][1]
