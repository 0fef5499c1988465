"""Reading a task's rows from the places a task reads: a local file or directory the user
names, and the hub through `datasets` (the data root goes through `spec_jax.data_files`)."""

from __future__ import annotations

import gzip
import json
import os
from collections.abc import Callable

from spec_jax import data_files
from spec_jax.data_files import DataFileError

SUFFIXES = ('.jsonl', '.json', '.parquet', '.jsonl.gz', '.json.gz')


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
        raise DataFileError(
            f"data file {source!r} not found (a task's source is '' for the data root, "
            "'hub', or a local .jsonl/.json/.parquet file or directory)"
        )
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


def task_rows(
    source: str, relpath: str, root: str, hub_rows: Callable[[], list[dict]], limit: int = 0
) -> list[dict]:
    """A task's rows from `source`: '' (the data root: `relpath` under `root`, else
    $SPEC_JAX_DATA, else the bundled samples), 'hub' (`hub_rows()`), or a local file or
    directory; checks `limit` (the caller cuts, after any selection of its own)."""
    if limit < 0:
        raise ValueError(f'limit must be >= 0, got {limit}')
    if source == '':
        return read_rows(data_files.locate(relpath, root, 'data_root'))
    if source == 'hub':
        return hub_rows()
    return read_rows(local_file(source, relpath))
