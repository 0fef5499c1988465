"""The pool of sample uids: leasing one per run, finding and killing their processes, removing
their files from the host's shared scratch places after a 'uid' run.

A lease takes the free uid released longest ago in this process (least recently used, so a
uid rests between runs), and a uid with any process left, a zombie included (it counts
against the uid's process limit until reaped), is busy.
"""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

from .launcher import LAUNCHER, SAMPLE_ENV

UID_BASE = 2_000_000_000  # The sample uids (and gids) are UID_BASE + slot, slot < UID_SLOTS.
UID_SLOTS = 64
# The host's places every uid may write (a 'uid' box has no private tmpfs): what the sample's
# uid owns there is removed after its run (`remove_files_of`).
SHARED_DIRS = ('/tmp', '/var/tmp', '/dev/shm')
MAX_ENTRIES = 100_000  # Entries `remove_files_of` looks at, at most (its cost per run).
_released: dict[int, float] = {}  # uid -> when this process last released it (monotonic).
_released_lock = threading.Lock()


class _UidLease:
    """An unprivileged uid of the pool, held by one run: the lock is an abstract unix socket
    named after the uid (exclusive machine-wide, gone with the holder; no files)."""

    def __init__(self, base: int, sweep: bool):
        with _released_lock:  # Never leased first, then the longest released.
            uids = sorted(range(base, base + UID_SLOTS), key=lambda u: _released.get(u, -1.0))
        for uid in uids:
            lock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                lock.bind(f'\0spec_jax_sandbox_uid_{uid}')
            except OSError:
                lock.close()
                continue
            if sweep and _processes_of(uid, zombies=True):  # Left by a crashed caller.
                _kill_uid(uid)
                if _processes_of(uid, zombies=True):  # Zombies too: busy until reaped.
                    lock.close()
                    continue
            self.uid, self._lock = uid, lock
            return
        raise RuntimeError(f'all {UID_SLOTS} sandbox uids from {base} are busy')

    def release(self) -> None:
        with _released_lock:
            _released[self.uid] = time.monotonic()
        self._lock.close()


def _processes_of(uid: int, zombies: bool = False) -> list[int]:
    """Processes whose real uid is `uid` (zombies too if `zombies`)."""
    return leftover_processes(range(uid, uid + 1), zombies)


def leftover_processes(uids: Sequence[int] | range | None = None, zombies: bool = False
                       ) -> list[int]:  # fmt: skip
    """Pids of processes whose real uid lies in `uids` (default: the whole sandbox range,
    `UID_BASE` .. + `UID_SLOTS`): live ones, and zombies too if `zombies`."""
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
        dead = fields.get('State', '').strip().startswith(('Z', 'X'))
        if uid in wanted and (zombies or not dead):
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


def remove_files_of(uid: int, tops: Sequence[str] = SHARED_DIRS) -> list[str]:
    """Removes what `uid` owns in `tops` (the host's shared scratch places) and below, in the
    directories others may enter, on the same filesystem, looking at `MAX_ENTRIES` entries
    at most; symlinks are removed, never followed. Returns the removed paths. Run after the
    uid's processes are gone (nothing then races the walk)."""
    removed, seen = [], 0
    for top in tops:
        try:
            device = os.lstat(top).st_dev
        except OSError:
            continue
        stack = [top]
        while stack and seen < MAX_ENTRIES:
            try:
                with os.scandir(stack.pop()) as entries:
                    found = list(entries)
            except OSError:
                continue
            for entry in found:
                seen += 1
                try:
                    st = entry.stat(follow_symlinks=False)
                except OSError:
                    continue
                if st.st_uid == uid:
                    if stat.S_ISDIR(st.st_mode):
                        shutil.rmtree(entry.path, ignore_errors=True)
                    else:
                        try:
                            os.unlink(entry.path)
                        except OSError:
                            continue
                    removed.append(entry.path)
                elif stat.S_ISDIR(st.st_mode) and st.st_mode & 0o001 and st.st_dev == device:
                    stack.append(entry.path)  # Others may enter: the uid may write below.
    return removed
