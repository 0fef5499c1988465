"""Code benchmarks: HumanEval, MBPP (sanitized) and MBPP+ (EvalPlus), scored in the sandbox.

  extract.py    model text -> code: `extract_code` (fenced blocks, prose), `sanitize` (drops
                top-level demo code)
  passk.py      `pass_at_k` (the unbiased estimator), `aggregate` (averaged over items)
  task.py       what the tasks share: loading, the sandbox run, `CODE_SYSTEM_PROMPT`,
                `DEFAULT_TIMEOUT_S`
  humaneval.py  `HumanEval`, `humaneval_solution` (a full function or a body)
  mbpp.py       `MBPP` (the test split, `MBPP_TEST_IDS`)
  mbppplus.py   `MBPPPlus`: EvalPlus's inputs (`mbpp_plus_inputs`), the expected outputs
                (`mbpp_plus_expected`) and its comparison (`MBPP_SET_EQ`, `MBPP_NOT_NONE`)
  __init__.py   re-exports those names; `TASKS`

Each task is a frozen dataclass (`HumanEval`, `MBPP`, `MBPPPlus`; `TASKS` maps their names to
the classes) with fields `root`, the data root a config names with `data_root` ('' =
$SPEC_JAX_DATA, else the samples bundled in the package), and `timeout_s`, the wall-clock
limit on running one sample's tests (`spec_jax.eval.sandbox.run_python`; any thread).

Data. `load('')` reads the release's file under the data root (`humaneval/HumanEval.jsonl.gz`,
`mbpp/sanitized-mbpp.json`, `mbppplus/MbppPlus-v0.2.0.jsonl`; a missing one is a
`DataFileError` naming the file); `load(path)` reads a local .jsonl(.gz), .json or .parquet file
laid out like the release (or a directory holding it as under a data root); `load('hub')`
reads the hub copy through `datasets`. MBPP keeps the test split (task ids 11-510) of the
sanitized set; MBPP+ inputs are deserialised as EvalPlus does (tuples, sets, complex numbers
for the tasks whose JSON cannot carry them).

Prompts: a system message asking for the Python function alone (`CODE_SYSTEM_PROMPT`), then
HumanEval's prompt (signature and docstring) to complete, MBPP's description and tests, or
MBPP+'s description; MBPP and MBPP+ prompts end with "The function should be named X.".

Extraction (`extract_code`, see `extract`): the first fenced block if the text has one, else
the text itself; then `sanitize` drops a model's demo code. HumanEval accepts a full function
(run after the prompt, whose imports and helpers it may use) or a body continuing the prompt
(indented if it was not).

Scoring (one sandbox run per sample, `correct` = it passed):
- HumanEval: prompt + completion, then `test` and `check(entry_point)`.
- MBPP: `test_imports`, the code, then the `test_list` asserts.
- MBPP+: the candidate's outputs on the base and plus inputs against the reference's, compared
  as EvalPlus does (see `mbppplus`); `detail` reports `base_pass` and `plus_pass` (the MBPP+
  score, = `correct`) with counts.

`pass_at_k(n, c, k)` is the unbiased estimator 1 - C(n-c, k) / C(n, k); `aggregate` averages
it over items with several samples each.
"""

from __future__ import annotations

from spec_jax.eval.tasks.code.extract import extract_code, sanitize
from spec_jax.eval.tasks.code.humaneval import HumanEval, humaneval_solution
from spec_jax.eval.tasks.code.mbpp import MBPP, MBPP_TEST_IDS
from spec_jax.eval.tasks.code.mbppplus import (
    MBPP_NOT_NONE,
    MBPP_SET_EQ,
    MBPPPlus,
    mbpp_plus_expected,
    mbpp_plus_inputs,
)
from spec_jax.eval.tasks.code.passk import aggregate, pass_at_k
from spec_jax.eval.tasks.code.task import CODE_SYSTEM_PROMPT, DEFAULT_TIMEOUT_S

__all__ = [
    'CODE_SYSTEM_PROMPT',
    'DEFAULT_TIMEOUT_S',
    'MBPP',
    'MBPP_NOT_NONE',
    'MBPP_SET_EQ',
    'MBPP_TEST_IDS',
    'TASKS',
    'HumanEval',
    'MBPPPlus',
    'aggregate',
    'extract_code',
    'humaneval_solution',
    'mbpp_plus_expected',
    'mbpp_plus_inputs',
    'pass_at_k',
    'sanitize',
]

TASKS = {task.name: task for task in (HumanEval, MBPP, MBPPPlus)}
