"""An evaluation's results on disk: one JSONL line per (method, task, item, seed), and the
config that produced them (docs/eval.md, runs that lose nothing).

    <workdir>/run.json       the config, its fingerprint, the plan; earlier fingerprints
                             when a changed config was allowed to mix (`mix`)
    <workdir>/results.jsonl  one line per finished sample, appended as it finishes

A line is written whole, then flushed and fsynced, so a run killed at any instant leaves
complete lines and at most one torn last line, which the next open drops. A restarted run
skips the keys already there, so it ends with exactly one line per sample.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections.abc import Iterable
from typing import Any

# Config fields that do not change results: a run may resume with other values of these.
RUNTIME_FIELDS = ('mix', 'score_workers', 'progress', 'compilation_cache', 'mesh')


def fingerprint(config: dict) -> str:
    """A short hash of the result-affecting part of a config (a plain dict)."""
    kept = {k: v for k, v in config.items() if k not in RUNTIME_FIELDS}
    blob = json.dumps(kept, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def row_key(row: dict) -> tuple:
    """What identifies a sample: (method, task, item id, seed)."""
    return (row['method'], row['task'], row['item'], row['seed'])


class ConfigMismatchError(ValueError):
    """The workdir holds results of a different config."""


def _plain(config: dict) -> dict:
    """The config as run.json holds it (tuples become lists)."""
    return json.loads(json.dumps(config, default=str))


def _changed(old: dict, new: dict, prefix: str = '') -> list[str]:
    out = []
    for key in sorted(set(old) | set(new)):
        if key in RUNTIME_FIELDS and not prefix:
            continue
        a, b = old.get(key), new.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _changed(a, b, f'{prefix}{key}.')
        elif a != b:
            out.append(f'{prefix}{key}: {a!r} -> {b!r}')
    return out


class ResultStore:
    """The results of one workdir: what is done, and appending what finishes (thread-safe).

    Opening a workdir whose run.json holds another config's fingerprint raises
    `ConfigMismatchError` naming the changed fields, unless `mix` is set (or this config
    wrote here before): run.json's history keeps the other fingerprints, and every line
    carries its own.
    """

    def __init__(self, workdir: str, config: dict, plan: list[dict], mix: bool = False):
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.fingerprint = fingerprint(config)
        self.path = os.path.join(workdir, 'results.jsonl')
        self._lock = threading.Lock()
        self._open_run(config, plan, mix)
        self.rows = list(self._read())
        self.done = {row_key(r) for r in self.rows}

    @classmethod
    def read_only(cls, workdir: str) -> ResultStore:
        """The results of `workdir` as they are, for reading (no run.json check or write)."""
        store = cls.__new__(cls)
        store.workdir, store.fingerprint = workdir, None
        store.path = os.path.join(workdir, 'results.jsonl')
        store._lock = threading.Lock()
        store.rows = list(store._read(repair=False))
        store.done = {row_key(r) for r in store.rows}
        return store

    def _open_run(self, config: dict, plan: list[dict], mix: bool) -> None:
        run_path = os.path.join(self.workdir, 'run.json')
        run = dict(config=config, fingerprint=self.fingerprint, plan=plan, history=[])
        if os.path.exists(run_path):
            with open(run_path) as f:
                old = json.load(f)
            # Every config that wrote here: the last one and those it mixed with.
            seen = old.get('history', []) + [old['fingerprint']]
            if self.fingerprint not in seen and not mix:
                changes = _changed(old['config'], _plain(config))
                raise ConfigMismatchError(
                    f'{self.workdir} holds results of another config (fingerprint '
                    f'{old["fingerprint"]}, this one {self.fingerprint}); changed: '
                    f'{"; ".join(changes) or "(fields only)"}. Use a new --workdir, or '
                    'set --config.mix=True to add these results to the old ones.'
                )
            run['history'] = [f for f in dict.fromkeys(seen) if f != self.fingerprint]
        tmp = run_path + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(run, f, indent=1, default=str)
        os.replace(tmp, run_path)

    def _read(self, repair: bool = True) -> Iterable[dict]:
        if not os.path.exists(self.path):
            return []
        with open(self.path, 'rb') as f:
            data = f.read()
        if data and not data.endswith(b'\n'):  # A torn last line from a killed run.
            data = data[: data.rfind(b'\n') + 1]
            if repair:  # Cut in place: the whole lines are never rewritten.
                with open(self.path, 'r+b') as f:
                    f.truncate(len(data))
                    os.fsync(f.fileno())
        rows, seen = [], set()
        for line in data.decode().splitlines():
            if line.strip():
                row = json.loads(line)
                if row_key(row) not in seen:  # The first result of a sample wins.
                    seen.add(row_key(row))
                    rows.append(row)
        return rows

    def is_done(self, key: tuple) -> bool:
        return key in self.done

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Writes finished samples (each a dict with the `row_key` fields)."""
        with self._lock:
            new = {}
            for r in rows:
                if row_key(r) not in self.done:
                    new.setdefault(row_key(r), dict(r, config=self.fingerprint))
            if not new:
                return
            rows = list(new.values())
            text = ''.join(json.dumps(r) + '\n' for r in rows)
            with open(self.path, 'a') as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            self.rows += rows
            self.done |= {row_key(r) for r in rows}
