"""The pool of sample uids: leasing one per run, finding and killing their processes."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Sequence

from .launcher import LAUNCHER, SAMPLE_ENV

UID_BASE = 2_000_000_000  # The sample uids (and gids) are UID_BASE + slot, slot < UID_SLOTS.
UID_SLOTS = 64


class _UidLease:
    """An unprivileged uid of the pool, held by one run: the lock is an abstract unix socket
    named after the uid (exclusive machine-wide, gone with the holder; no files)."""

    def __init__(self, base: int, sweep: bool):
        for slot in range(UID_SLOTS):
            uid = base + slot
            lock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                lock.bind(f'\0spec_jax_sandbox_uid_{uid}')
            except OSError:
                lock.close()
                continue
            if sweep and _processes_of(uid):  # Left over from a crashed caller.
                _kill_uid(uid)
                if _processes_of(uid):
                    lock.close()
                    continue
            self.uid, self._lock = uid, lock
            return
        raise RuntimeError(f'all {UID_SLOTS} sandbox uids from {base} are busy')

    def release(self) -> None:
        self._lock.close()


def _processes_of(uid: int) -> list[int]:
    """Live (non-zombie) processes whose real uid is `uid`."""
    return leftover_processes(range(uid, uid + 1))


def leftover_processes(uids: Sequence[int] | range | None = None) -> list[int]:
    """Pids of live (non-zombie) processes whose real uid lies in `uids` (default: the whole
    sandbox range, `UID_BASE` .. + `UID_SLOTS`)."""
    if uids is None:
        uids = range(UID_BASE, UID_BASE + UID_SLOTS)
    wanted = set(uids)
    found = []
    for name in os.listdir('/proc'):
        if not name.isdigit():
            continue
        try:
            with open(f'/proc/{name}/status') as f:
                text = f.read()
        except OSError:
            continue
        fields = dict(line.split(':', 1) for line in text.splitlines() if ':' in line)
        uid = int(fields.get('Uid', '-1').split()[0])
        if uid in wanted and not fields.get('State', '').strip().startswith(('Z', 'X')):
            found.append(int(name))
    return found


def _kill_uid(uid: int) -> None:
    """SIGKILL to every process of `uid`, sent as `uid` (kill(-1) is atomic against forks) by
    launcher.py run as a script: it starts as root, so the interpreter need not be the uid's."""
    for _ in range(3):
        subprocess.run(
            [sys.executable, '-I', '-S', LAUNCHER, '--kill-uid', str(uid)],
            env=dict(SAMPLE_ENV),
            cwd='/',
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
        if not _processes_of(uid):
            return
        time.sleep(0.05)
