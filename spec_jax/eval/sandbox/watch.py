"""The caller's watch over a running box: waiting for its launcher, stopping it at its limits.

`_watch` polls the run's cgroup (every 5-100 ms) while the launcher runs: its CPU time against
`cpu_s`, its OOM kills, the caller's cancel event, and the wall-clock backstop, which counts
the wall time less the run-queue delay (time runnable but not run) of the box's most delayed
task: a blocked sample is a 'timeout' at `wall_s`, a sample the machine's load keeps waiting
for a CPU is judged by its CPU time, up to `STARVED_FACTOR` times `wall_s` (`latest_end_s`),
then 'starved'. `_kill_init` stops a namespace box through its init.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time

from .result import _read_lines

# Starved: the box's most delayed task waited for a CPU (runnable, not run) over this share of
# the elapsed time, and the box received CPU time under `STARVED_CPU_SHARE` of it.
STARVED_SHARE = 0.5
STARVED_CPU_SHARE = 0.5
# A sample runnable but not run (its run-queue delay) has its backstop moved by that delay, up
# to this many times `wall_s`; then it is 'starved' (retried once, then 'infra').
STARVED_FACTOR = 4
# The namespace init's own alarm lies this far past the caller's latest end (`latest_end_s`):
# only a caller that stopped watching meets it.
ALARM_MARGIN_S = 10.0


def latest_end_s(wall_s: float) -> float:
    """The latest time (from the run's start) at which `_watch` stops a run with `wall_s`."""
    return STARVED_FACTOR * wall_s


def _wait(proc: subprocess.Popen, timeout_s: float, pidfd: int | None) -> bool:
    """Waits up to `timeout_s` for `proc` to exit without reaping it (so its pgid stays
    reserved); True if it exited."""
    if pidfd is not None:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(max(0, int(timeout_s * 1000))))
    deadline = time.monotonic() + timeout_s
    while True:
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            return True
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.005)


def _watch(proc, group, cpu_s: float, wall_s: float, start: float, cancel) -> str | None:
    """Waits for the launcher; None if it exited, else why the run must be stopped:
    'cpu_timeout' (the cgroup's CPU time passed `cpu_s`), 'memory' (its OOM killer fired),
    'timeout' (the wall backstop, the sample blocked), 'starved' (runnable but not run until
    `STARVED_FACTOR` times the backstop) or 'cancelled' (`cancel` was set).

    The backstop counts the wall time less the run-queue delay of the box's most delayed task
    (`Cgroup.largest_run_delay_ns`, kept as a running maximum: a task that exits does not take
    its delay back): a loaded machine delays a runnable sample's verdict, it does not make it
    a timeout. A sample cannot forge that delay: its tasks keep each other waiting only while
    one of them runs, so what they add is at most the box's own CPU time (`cpu_s`), not the
    sum over its tasks; and 'starved' also needs the box to have received under
    `STARVED_CPU_SHARE` of the elapsed time."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        pidfd = None
    try:
        interval, delay, cpu_ns = 0.005, 0.0, 0
        while True:
            left = wall_s - (time.monotonic() - start)
            polled = group is not None or cancel is not None
            step = (min(interval, left) if left > 0 else interval) if polled else left
            if _wait(proc, max(0.0, step), pidfd):
                return None
            interval = min(2 * interval, 0.1)
            if cancel is not None and cancel.is_set():
                return 'cancelled'
            if group is not None:
                if group.oom_killed():  # Over budget: done, not thrashing.
                    return 'memory'
                cpu_ns = group.cpu_ns()
                if cpu_ns > cpu_s * 1e9:
                    return 'cpu_timeout'
                delay = max(delay, group.largest_run_delay_ns() / 1e9)
            elapsed = time.monotonic() - start
            if elapsed >= wall_s:
                if elapsed - delay < wall_s and elapsed < latest_end_s(wall_s):
                    continue  # Waiting for a CPU, not blocked: the backstop moves.
                cpu = cpu_ns / 1e9 if group is not None else elapsed
                starved = delay > STARVED_SHARE * elapsed and cpu < STARVED_CPU_SHARE * elapsed
                return 'starved' if starved else 'timeout'
    finally:
        if pidfd is not None:
            os.close(pidfd)


def _kill_init(status_fd: int, proc: subprocess.Popen) -> None:
    """Kills the namespace's init and waits for the launcher, which returns once the kernel
    has killed and reaped every process of the namespace."""
    init = None
    for line in _read_lines(status_fd, 1 << 20):
        try:
            init = json.loads(line).get('init', init)
        except ValueError:
            pass
    if init is None:
        return
    try:
        os.kill(init, signal.SIGKILL)  # Unreaped child of the live launcher: the pid is its.
    except ProcessLookupError:
        return
    _wait(proc, 10.0, None)
