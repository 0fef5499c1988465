"""An evaluation's results on disk: one JSONL line per (method, task, item, seed), and the
config that produced them (docs/eval.md, runs that lose nothing).

    <workdir>/run.json       the config, its fingerprint, the plan; earlier fingerprints
                             when a changed config was allowed to mix (`mix`)
    <workdir>/results.jsonl  one line per finished sample, appended as it finishes
    <workdir>/results.p<i>.jsonl  the same, of process i of a run on several processes,
                             until process 0 merges them into results.jsonl (`merge`)

A line is written whole, then flushed and fsynced, so a run killed at any instant leaves
complete lines and at most one torn last line, which the next open of that file's writer
drops. A store reads every results file of the workdir and keeps each sample's first line,
so a restarted run (on any number of processes) skips what any process finished and ends
with exactly one line per sample.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

from spec_jax.eval import timing

# Config fields that do not change results: a run may resume with other values of these.
RUNTIME_FIELDS = ('mix', 'score_workers', 'progress', 'compilation_cache', 'mesh', 'profile_dir',
                  'profile_rounds')
RESULTS = 'results.jsonl'
# Where and when this process runs: every batch record carries it (runner), so a run
# resumed by another invocation or on another host says so (`provenance`).
PROVENANCE = dict(invocation=uuid.uuid4().hex[:12], host=socket.gethostname(),
                  started=round(time.time(), 3))  # fmt: skip


def process_results(index: int) -> str:
    """The results file process `index` of a several-process run appends to."""
    return f'results.p{index}.jsonl'


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
    carries its own. With several processes (`process=(index, count)`) every process
    checks run.json, process 0 alone writes it, and each appends to its own file.
    """

    def __init__(
        self,
        workdir: str,
        config: dict,
        plan: list[dict],
        mix: bool = False,
        process: tuple[int, int] = (0, 1),
    ):
        index, count = process
        os.makedirs(workdir, exist_ok=True)
        self.workdir = workdir
        self.fingerprint = fingerprint(config)
        self.path = os.path.join(workdir, RESULTS if count == 1 else process_results(index))
        self._lock = threading.Lock()
        self._open_run(config, plan, mix, write=index == 0)
        self.rows = self._read_all()
        self.done = {row_key(r) for r in self.rows}

    @classmethod
    def read_only(cls, workdir: str) -> ResultStore:
        """The results of `workdir` as they are, for reading (no run.json check or write)."""
        store = cls.__new__(cls)
        store.workdir, store.fingerprint = workdir, None
        store.path = None  # Nothing is repaired or appended.
        store._lock = threading.Lock()
        store.rows = store._read_all()
        store.done = {row_key(r) for r in store.rows}
        return store

    def files(self) -> list[str]:
        """The workdir's results files: results.jsonl, then each process's in index order."""
        main = os.path.join(self.workdir, RESULTS)
        parts = glob.glob(os.path.join(self.workdir, 'results.p*.jsonl'))
        index = {p: int(m.group(1)) for p in parts if (m := re.search(r'\.p(\d+)\.jsonl$', p))}
        return ([main] if os.path.exists(main) else []) + sorted(index, key=index.get)

    def merge(self) -> None:
        """Every results file into results.jsonl, the per-process files then removed (process
        0, once every process has finished). The merged file is written whole and swapped
        in before any per-process file goes, so a merge killed at any point loses nothing,
        and reads keep a sample's first line, so it duplicates nothing."""
        main = os.path.join(self.workdir, RESULTS)
        parts = [f for f in self.files() if f != main]
        if not parts:
            return
        with self._lock:
            rows = self._read_all()
            tmp = main + '.tmp'
            with open(tmp, 'w') as f:
                f.write(''.join(json.dumps(r) + '\n' for r in rows))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, main)
            for part in parts:
                os.remove(part)
            self.path, self.rows = main, rows
            self.done = {row_key(r) for r in rows}

    def _open_run(self, config: dict, plan: list[dict], mix: bool, write: bool) -> None:
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
        if not write:
            return
        tmp = run_path + '.tmp'
        with open(tmp, 'w') as f:
            json.dump(run, f, indent=1, default=str)
        os.replace(tmp, run_path)

    def _read_all(self) -> list[dict]:
        """The rows of every results file, each sample's first line (this store's own file
        repaired: no other process appends to it)."""
        rows, seen = [], set()
        for path in self.files():
            for row in _read(path, repair=path == self.path):
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


def _read(path: str, repair: bool) -> list[dict]:
    """The whole lines of one results file; a torn last line (a killed writer) is dropped,
    and with `repair` cut from the file in place (the whole lines are never rewritten)."""
    if not os.path.exists(path):
        return []
    with open(path, 'rb') as f:
        data = f.read()
    if data and not data.endswith(b'\n'):
        data = data[: data.rfind(b'\n') + 1]
        if repair:
            with open(path, 'r+b') as f:
                f.truncate(len(data))
                os.fsync(f.fileno())
    return [json.loads(line) for line in data.decode().splitlines() if line.strip()]


def provenance(rows: Sequence[dict]) -> dict:
    """Where a run's rows were decoded: 'invocations' and 'hosts' (sorted, from the batch
    records; rows written before they were recorded count as 'unknown'), 'started' (each
    invocation's start time), and 'mixed_pairs' / 'speed_pairs': of the (batch, method)
    pairs a speedup is made of (each method's batch against AR's on it), how many set
    seconds of two invocations against each other; 'within_one' says none does."""
    invocations, hosts, started, by_batch = set(), set(), {}, {}
    for r in rows:
        b = r.get('batch') or {}
        inv = b.get('invocation', 'unknown')
        invocations.add(inv)
        hosts.add(b.get('host', 'unknown'))
        if 'started' in b:
            started[inv] = b['started']
        if r.get('batch_id') is not None:
            by_batch.setdefault(r['batch_id'], {})[r['method']] = inv
    pairs = [(inv, methods['ar']) for methods in by_batch.values() if 'ar' in methods
             for m, inv in methods.items() if m != 'ar' and not timing.is_monitor(m)]  # fmt: skip
    mixed = sum(a != b for a, b in pairs)
    return dict(invocations=sorted(invocations), hosts=sorted(hosts), started=started,
                speed_pairs=len(pairs), mixed_pairs=mixed, within_one=mixed == 0)  # fmt: skip


def provenance_text(info: dict) -> str:
    """One line for a report's header: invocations, hosts, and whether speed pairs mix
    invocations."""
    n, hosts = len(info['invocations']), ', '.join(info['hosts'])
    text = f'{n} invocation{"s" if n != 1 else ""} on {hosts}'
    if info['within_one']:
        return text + '; every speed pair within one invocation'
    return (text + f'; MIXED: {info["mixed_pairs"]} of {info["speed_pairs"]} speed pairs set '
            'a method against AR timed by another invocation')
