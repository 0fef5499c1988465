"""One cgroup per run: the sample's total memory, process count and CPU time, whatever it forks.

`Cgroup.create(name, memory_bytes, pids)` makes the run's group (cgroup v2 where the unified
hierarchy has the memory, pids and cpu controllers; else v1, one directory in each of the
memory, pids, cpuacct and cpu hierarchies, as on machines that mount them at
/sys/fs/cgroup/{memory,pids,cpuacct,cpu}, co-mounted or not); the launcher joins it (writes 0
to each `procs` file) before it creates the namespaces, so every process of the run is in it.
The group is also the run's one CPU share (the cpu controller, v1 and v2): its tasks leave the
kernel's autogroups (which act in the root cpu group only), so a sample that makes many
sessions (`setsid`) is still one share against every other box and session. The caller reads
the CPU time (`cpu_ns`: cpuacct.usage in v1, usage_usec of cpu.stat in v2), the run-queue
delay of its most delayed live task (`largest_run_delay_ns`, from /proc/<tid>/schedstat),
whether the OOM killer fired
(`oom_killed`), and `remove()`s it after the run: SIGKILL to whatever is still in it, then
rmdir. `available()` says which version this machine offers (None: no cgroups, e.g. not root).
"""

from __future__ import annotations

import os
import signal
import time

ROOT = '/sys/fs/cgroup'
PREFIX = 'spec_jax_sbx_'  # The run groups' names (in each hierarchy's root).
_V1 = ('memory', 'pids', 'cpuacct', 'cpu')  # Indices used below: 0 memory, 1 pids, 2 cpuacct.


def _v1_parents() -> list[str]:
    """The v1 hierarchies' roots in `_V1` order, a co-mounted one (cpu,cpuacct) once."""
    parents, seen = [], set()
    for c in _V1:
        real = os.path.realpath(f'{ROOT}/{c}')
        if real not in seen:
            seen.add(real)
            parents.append(f'{ROOT}/{c}')
    return parents


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _write(path: str, value: str) -> None:
    with open(path, 'w') as f:
        f.write(value)


def available() -> str | None:
    """'v2', 'v1' or None: the cgroup version with writable memory, pids, CPU accounting and
    the cpu controller (the run's CPU share)."""
    if os.geteuid() != 0:
        return None
    try:
        controllers = _read(f'{ROOT}/cgroup.controllers').split()
        if {'memory', 'pids', 'cpu'} <= set(controllers):
            return 'v2'
    except OSError:
        pass
    if all(os.access(f'{ROOT}/{c}/cgroup.procs', os.W_OK) for c in _V1):
        return 'v1'
    return None


class Cgroup:
    """The cgroup of one run (see the module docstring)."""

    def __init__(self, version: str, dirs: list[str]):
        self.version, self.dirs = version, dirs

    @classmethod
    def create(cls, name: str, memory_bytes: int, pids: int) -> Cgroup:
        version = available()
        if version is None:
            raise OSError('no writable cgroup hierarchy with memory, pids, cpuacct and cpu')
        if version == 'v2':
            _write(f'{ROOT}/cgroup.subtree_control', '+memory +pids +cpu')
            group = cls(version, [f'{ROOT}/{PREFIX}{name}'])
            os.mkdir(group.dirs[0])
            try:
                _write(f'{group.dirs[0]}/memory.max', str(memory_bytes))
                _write(f'{group.dirs[0]}/memory.swap.max', '0')
                _write(f'{group.dirs[0]}/pids.max', str(pids))
            except OSError:
                group.remove()
                raise
            return group
        group = cls(version, [])
        try:
            for parent in _v1_parents():
                path = f'{parent}/{PREFIX}{name}'
                os.mkdir(path)
                group.dirs.append(path)
            mem = group.dirs[0]
            _write(f'{mem}/memory.limit_in_bytes', str(memory_bytes))
            # No swap for the group: swappiness 0 makes its limit reclaim OOM rather than
            # swap (the only guard where the kernel has no swap accounting, memsw), and
            # memsw caps memory plus swap where it has.
            _write(f'{mem}/memory.swappiness', '0')
            if os.path.exists(f'{mem}/memory.memsw.limit_in_bytes'):
                _write(f'{mem}/memory.memsw.limit_in_bytes', str(memory_bytes))
            _write(f'{group.dirs[1]}/pids.max', str(pids))
        except OSError:
            group.remove()
            raise
        return group

    def procs_files(self) -> list[str]:
        """The files the launcher writes 0 to, to join the group."""
        return [f'{d}/cgroup.procs' for d in self.dirs]

    def cpu_ns(self) -> int:
        """CPU time used by every process that has been in the group (nanoseconds)."""
        try:
            if self.version == 'v2':
                for line in _read(f'{self.dirs[0]}/cpu.stat').splitlines():
                    if line.startswith('usage_usec '):
                        return int(line.split()[1]) * 1000
                return 0
            return int(_read(f'{self.dirs[2]}/cpuacct.usage'))
        except (OSError, ValueError):
            return 0

    def tasks(self) -> list[int]:
        """Thread ids now in the group."""
        name = 'cgroup.threads' if self.version == 'v2' else 'tasks'
        try:
            return [int(t) for t in _read(f'{self.dirs[-1]}/{name}').split()]
        except (OSError, ValueError):
            return []

    def largest_run_delay_ns(self) -> int:
        """The largest run-queue delay (time runnable but not running) of one live task: what
        the machine's load did to the box, which the box's own tasks cannot multiply (their
        sum grows with their number while they wait on each other)."""
        largest = 0
        for tid in self.tasks():
            try:
                largest = max(largest, int(_read(f'/proc/{tid}/schedstat').split()[1]))
            except (OSError, ValueError, IndexError):
                pass
        return largest

    def oom_killed(self) -> bool:
        """True if the OOM killer killed a process of the group (its memory limit)."""
        try:
            if self.version == 'v2':
                text = _read(f'{self.dirs[0]}/memory.events')
            else:
                text = _read(f'{self.dirs[0]}/memory.oom_control')
        except OSError:
            return False
        fields = dict(line.split() for line in text.splitlines() if len(line.split()) == 2)
        return int(fields.get('oom_kill', 0)) > 0

    def _procs(self) -> list[int]:
        pids = set()
        for path in self.procs_files():
            try:
                pids.update(int(p) for p in _read(path).split())
            except (OSError, ValueError):
                pass
        return sorted(pids)

    def remove(self, timeout_s: float = 10.0) -> None:
        """SIGKILL to every process left in the group, then remove its directories."""
        deadline = time.monotonic() + timeout_s
        while True:
            pids = self._procs()
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            left = []
            for d in self.dirs:
                try:
                    os.rmdir(d)
                except FileNotFoundError:
                    pass
                except OSError:
                    left.append(d)
            self.dirs = [d for d in self.dirs if d in left]
            if not left:
                return
            if time.monotonic() > deadline:
                raise OSError(f'cgroups {left} still busy after {timeout_s} s')
            time.sleep(0.01)


def sweep_stale() -> list[str]:
    """Removes run groups whose caller (the pid in their name) is gone; returns them."""
    removed = []
    by_version = {'v2': [ROOT], 'v1': _v1_parents()}
    for version, parents in by_version.items():
        for parent in parents:
            try:
                names = [n for n in os.listdir(parent) if n.startswith(PREFIX)]
            except OSError:
                continue
            for name in names:
                pid = name[len(PREFIX) :].split('_')[0]
                if pid.isdigit() and not os.path.exists(f'/proc/{pid}'):
                    try:
                        Cgroup(version, [f'{parent}/{name}']).remove(timeout_s=1.0)
                        removed.append(f'{parent}/{name}')
                    except OSError:
                        pass
    return removed


def leftover_groups() -> list[str]:
    """Run groups that exist now (in every hierarchy this module uses)."""
    found = []
    for parent in [ROOT] + _v1_parents():
        try:
            found += [f'{parent}/{n}' for n in os.listdir(parent) if n.startswith(PREFIX)]
        except OSError:
            pass
    return sorted(found)
