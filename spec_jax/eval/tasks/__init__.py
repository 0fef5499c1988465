"""Evaluation tasks: each family module has a `TASKS` dict from task names to classes
meeting `base.Task` (math, code, bfcl, include, speed).

The registry: `TASKS` merges the families' dicts (every name is unique across them), and
`make(name, root)` builds the task of a name with the data root `root`. Both import the
families on first use, not when the package is imported: `import spec_jax.eval.tasks.math`
(or the math-verify workers' `spec_jax.eval.tasks.timeouts`) does not load the other
families or the sandbox. `pyast.parse` is the scorers' `ast.parse` (one lock: scoring
runs on several threads).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from spec_jax.eval.tasks.base import Task

    TASKS: dict[str, type]

FAMILIES = ('math', 'code', 'bfcl', 'include', 'speed')


@functools.cache
def _registry() -> dict[str, type]:
    """Every family's `TASKS` in one dict, built once; a name two families share is an error."""
    tasks: dict[str, type] = {}
    for family in FAMILIES:
        module = importlib.import_module(f'{__name__}.{family}')
        for name, cls in module.TASKS.items():
            if name in tasks:
                raise RuntimeError(f'task {name!r} of {family} is also a task of another family')
            tasks[name] = cls
    return tasks


def __getattr__(name: str) -> Any:
    if name == 'TASKS':
        return _registry()
    raise AttributeError(f'module {__name__!r} has no attribute {name!r}')


def make(name: str, root: str = '', **options: Any) -> Task:
    """The task named `name` (a key of `TASKS`), reading its data under the data root `root`.

    Args:
      name: e.g. 'gsm8k', 'humaneval', 'bfcl_simple_python', 'include', 'speed_mt_bench'.
      root: the data root ('' = $SPEC_JAX_DATA, else the samples bundled in the package).
      **options: fields of the task's dataclass, e.g. `per_language=5` for 'include'.

    Raises:
      ValueError: an unknown name or option (the error lists the valid ones).
    """
    tasks = _registry()
    if name not in tasks:
        raise ValueError(f'unknown task {name!r}; valid: {sorted(tasks)}')
    cls = tasks[name]
    fields = sorted(f.name for f in dataclasses.fields(cls) if f.name != 'root')
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ValueError(f'task {name!r} has no option(s) {unknown}; its options: {fields}')
    return cls(root=root, **options)
