"""Code benchmarks: HumanEval, MBPP (sanitized) and MBPP+ (EvalPlus), scored in the sandbox.

  extract.py    model text -> code: `extract_code` (fenced blocks, prose), `sanitize` (drops
                top-level demo code)
  passk.py      `pass_at_k` (the unbiased estimator), `aggregate` (averaged over items)
  task.py       what the tasks share: loading, the two-box run, `CODE_SYSTEM_PROMPT`,
                `DEFAULT_TIMEOUT_S`
  boxes.py      `run_pair`: the candidate's code serves calls in one sandboxed box, the tests
                run in another (the checker) that never loads it; the `Verdict`
  wire.py       the plain-data encoding between the boxes (no pickle, no eval; bounded)
  legacy.py     the old one-process harness, kept only for tests that compare verdicts
  humaneval.py  `HumanEval`, `humaneval_solution` (a full function or a body)
  mbpp.py       `MBPP` (the test split, `MBPP_TEST_IDS`)
  mbppplus.py   `MBPPPlus`: EvalPlus's inputs (`mbpp_plus_inputs`), the expected outputs
                (`mbpp_plus_expected`) and its comparison (`MBPP_SET_EQ`, `MBPP_NOT_NONE`)
  __init__.py   re-exports those names; `TASKS`

Each task is a frozen dataclass (`HumanEval`, `MBPP`, `MBPPPlus`; `TASKS` maps their names to
the classes) with fields `root`, the data root a config names with `data_root` ('' =
$SPEC_JAX_DATA, else the samples bundled in the package), and `timeout_s`, the CPU time of a
sample's box (`spec_jax.eval.sandbox.run_python`'s `cpu_s`, with a blocked-time backstop;
any thread).

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

Extraction (`extract_code`, see `extract`; the text cut to `MAX_TEXT_CHARS` first, linear in
it): the first fenced block if the text has one, else the text itself; then `sanitize` drops
a model's demo code. HumanEval accepts a full function
(run after the prompt, whose imports and helpers it may use) or a body continuing the prompt
(indented if it was not).

Scoring (`boxes.run_pair`: two sandbox runs per sample; `correct` = every check ran and
held). The candidate's box runs its program and answers calls (function name, arguments ->
result or exception, as plain data, `wire`); the checker's box runs the dataset's tests with
the functions they call bound to proxies of the candidate's. The verdict is the checker's:
the sample's code never runs where the tests, the expected values or the verdict live.
- HumanEval: the candidate's box runs prompt + completion; the checker the dataset's prompt
  (its helpers), `test` and `check(proxy)`.
- MBPP: the candidate's box runs `test_imports` and the code; the checker the `test_list`
  asserts, one check each.
- MBPP+: the checker sends each base and plus input and compares the answer with the
  reference's output as EvalPlus does (see `mbppplus`); `detail` reports `base_pass` and
  `plus_pass` (the MBPP+ score, = `correct`) with counts.
`detail['status']` is 'ok', 'failed', 'timeout' or 'infra' (the sandbox or the reference
failed), with the checker's `reason`, the `checks` and `calls` it ran and each box's summary.

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
