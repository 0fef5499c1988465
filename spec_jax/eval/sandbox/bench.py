"""The box's per-sample overhead: start-up to verdict of a trivial sample (`pass`).

    python -m spec_jax.eval.sandbox.bench [--runs 30] [--against REV]

prints the median, mean and minimum seconds of `run_python('pass')`; with `--against REV` (a
git revision of this repository, e.g. 6a9afb9, the box before issue 30) it also runs that
revision's sandbox package, extracted with `git show` into a temporary directory, interleaved
run by run with today's (so both see the same load), and prints the ratio. A benchmark, not a
test: docs/sandbox.md has the figures.
"""

from __future__ import annotations

import argparse
import importlib
import os
import statistics
import subprocess
import sys
import tempfile
import time

from spec_jax.eval import sandbox

_FILES = ('__init__', 'harness', 'launcher', 'result', 'uids', 'rootfs', 'seccomp', 'cgroups')


def _old_package(rev: str, into: str):
    """The sandbox package at git revision `rev`, importable as `old_sandbox`."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    pkg = os.path.join(into, 'old_sandbox')
    os.mkdir(pkg)
    for name in _FILES:
        shown = subprocess.run(
            ['git', 'show', f'{rev}:spec_jax/eval/sandbox/{name}.py'],
            cwd=repo, capture_output=True, text=True, check=False,
        )  # fmt: skip
        if shown.returncode == 0:
            with open(os.path.join(pkg, f'{name}.py'), 'w') as f:
                f.write(shown.stdout)
    sys.path.insert(0, into)
    return importlib.import_module('old_sandbox')


def _time(module, **kwargs) -> float:
    start = time.monotonic()
    result = module.run_python('pass', **kwargs)
    if not result.passed:
        raise RuntimeError(f'a trivial sample did not pass: {result}')
    return time.monotonic() - start


def _line(name: str, times: list[float]) -> str:
    return (
        f'{name}: median {statistics.median(times):.3f} s, mean {statistics.mean(times):.3f} s, '
        f'min {min(times):.3f} s over {len(times)} runs'
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--runs', type=int, default=30)
    parser.add_argument('--against', default=None, help='a git revision to compare with')
    args = parser.parse_args(argv)
    print(f'isolation {sandbox.isolation_level()}, missing layers {sandbox.missing_layers()}')
    with tempfile.TemporaryDirectory() as tmp:
        old = _old_package(args.against, tmp) if args.against else None
        if old is not None:
            old.isolation_level()
        for _ in range(3):  # Warm-up: the probe, the private root's plan, the page cache.
            _time(sandbox)
            if old is not None:
                _time(old)
        new_times, old_times = [], []
        for _ in range(args.runs):
            new_times.append(_time(sandbox))
            if old is not None:
                old_times.append(_time(old))
    print(_line('now', new_times))
    if old is not None:
        print(_line(args.against, old_times))
        ratio = statistics.median(new_times) / statistics.median(old_times)
        print(f'ratio of medians: {ratio:.2f}')
    print(f'load average: {os.getloadavg()}')


if __name__ == '__main__':
    main()
