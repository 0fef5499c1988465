"""Reading a task's rows from the places a task reads: a local file or directory the user
names, and the hub through `datasets` (the data root goes through `spec_jax.data_files`).

A task's source is one of (`SOURCES`):

  ''          the data root: the release's file under the config's `data_root`, else
              $SPEC_JAX_DATA, else the samples bundled in the package;
  'hub'       the hub copy, through `datasets` (or `huggingface_hub`);
  'fast_hsd'  the paper's own items (`FAST_HSD`): Fast-HSD's question files, bundled in the
              package and read back into the task's row schema by `tasks.fast_hsd`; only the
              tasks of `FAST_HSD_TASKS` have them (MBPP+'s file has no tests: `NO_FAST_HSD`);
  a path      a local .jsonl/.json/.parquet file, or a directory holding the release's file.
"""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable

from spec_jax import data_files
from spec_jax.data_files import DataFileError

SUFFIXES = ('.jsonl', '.json', '.parquet', '.jsonl.gz', '.json.gz')
FAST_HSD = 'fast_hsd'
SOURCES = "'' (the data root), 'hub', 'fast_hsd' (the paper's items) or a local file or directory"
# The tasks with a 'fast_hsd' source (the paper's items; see `tasks.fast_hsd`).
FAST_HSD_TASKS = ('gsm8k', 'math', 'include', 'bfcl_parallel_multiple')
# Top folder of a task's release -> why it has no 'fast_hsd' source and what to use instead.
NO_FAST_HSD = {
    'mbppplus': "MBPP+'s Fast-HSD question file holds prompts and reference code but no tests, "
    'so it cannot be scored; the paper\'s selection is all 378 tasks of v0.2.0 in task_id '
    "order, which source '' gives with the full mbppplus/MbppPlus-v0.2.0.jsonl under the data "
    "root (data_root or $SPEC_JAX_DATA; the bundled sample holds 10) and 'hub' gives from "
    "'evalplus/mbppplus'",
}


def read_rows(path: str) -> list[dict]:
    """The rows of a local .jsonl(.gz), .json(.gz) (a list, {'data'|'rows': list}, or JSON
    lines under a .json name, as BFCL ships them) or .parquet file."""
    if path.endswith('.parquet'):
        import pyarrow.parquet as pq  # Optional: only for Parquet sources (`datasets` has it).

        return pq.read_table(path).to_pylist()
    opener = gzip.open if path.endswith('.gz') else open
    with opener(path, 'rt', encoding='utf-8') as f:
        text = f.read()
    if path.endswith(('.json', '.json.gz')):
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # JSON lines under a .json name.
        if isinstance(data, dict) and 'id' not in data:  # A one-row JSON-lines file has an id.
            data = data.get('data', data.get('rows'))
        if isinstance(data, list):
            return data
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def local_file(source: str, relpath: str, suffixes: tuple[str, ...] = SUFFIXES) -> str:
    """The file a local `source` names: the file itself, or `relpath` (or its basename)
    under a directory.

    Raises:
      DataFileError: nothing there, or a file of another kind.
    """
    if os.path.isdir(source):
        for candidate in (relpath, os.path.basename(relpath)):
            path = os.path.join(source, candidate)
            if os.path.isfile(path):
                return path
        raise DataFileError(
            f'neither {relpath!r} nor {os.path.basename(relpath)!r} found under {source}'
        )
    if not os.path.isfile(source):
        raise DataFileError(f"data file {source!r} not found (a task's source is {SOURCES})")
    if not source.endswith(suffixes):
        raise DataFileError(f'{source!r}: expected a file ending in one of {list(suffixes)}')
    return source


def hub_error(what: str, e: Exception, instead: str) -> DataFileError:
    """The error for a hub load that failed: what was loaded, why, and what to use instead."""
    offline = os.environ.get('HF_HUB_OFFLINE', '')
    return DataFileError(
        f'could not load {what} from the hub: {type(e).__name__}: {e}. Offline '
        f'(HF_HUB_OFFLINE={offline!r}) or without a cached copy, use {instead}'
    )


def load_hub(hub_id: str, config: str | None, split: str) -> list[dict]:
    """The rows of a hub dataset through `datasets`, or a DataFileError saying what to do."""
    try:
        import datasets  # Imported on use: loading it costs seconds, and only 'hub' needs it.

        return list(datasets.load_dataset(hub_id, config, split=split))
    except Exception as e:  # Network, hub or file errors: name what was being loaded.
        instead = (
            "source '' (the data root, set with data_root or "
            f'${data_files.ENV_VAR}) or a local file.'
        )
        raise hub_error(f'{hub_id!r} (config {config!r}, split {split!r})', e, instead) from e


def no_fast_hsd(relpath: str) -> DataFileError:
    """The error for source 'fast_hsd' on a task without the paper's items (`relpath`: its
    release's file), saying why and what to use."""
    top = relpath.split('/')[0]
    why = NO_FAST_HSD.get(top, 'the paper has no items of this task')
    return DataFileError(
        f"source 'fast_hsd' is not available for {relpath!r}: {why}. Tasks with the paper's "
        f'items: {list(FAST_HSD_TASKS)}; a source is {SOURCES}'
    )


def task_rows(
    source: str,
    relpath: str,
    root: str,
    hub_rows: Callable[[], list[dict]],
    limit: int = 0,
    fast_hsd_rows: Callable[[int], list[dict]] | None = None,
) -> list[dict]:
    """A task's rows from `source`: '' (the data root: `relpath` under `root`, else
    $SPEC_JAX_DATA, else the bundled samples), 'hub' (`hub_rows()`), 'fast_hsd'
    (`fast_hsd_rows(limit)`, the paper's items; an error where it is None) or a local file or
    directory; checks `limit` (the caller cuts, after any selection of its own)."""
    if limit < 0:
        raise ValueError(f'limit must be >= 0, got {limit}')
    if source == FAST_HSD:
        if fast_hsd_rows is None:
            raise no_fast_hsd(relpath)
        return fast_hsd_rows(limit)
    if source == '':
        return read_rows(data_files.locate(relpath, root, 'data_root'))
    if source == 'hub':
        return hub_rows()
    return read_rows(local_file(source, relpath))
