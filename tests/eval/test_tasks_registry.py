"""The task registry (`spec_jax.eval.tasks.TASKS`, `make`): every family's names, one class
each, built with a data root; unknown names list the valid ones."""

import subprocess
import sys

import pytest

from spec_jax import data_files
from spec_jax.eval import tasks
from spec_jax.eval.tasks import bfcl, code, include, math, speed

FAMILIES = {'math': math, 'code': code, 'bfcl': bfcl, 'include': include, 'speed': speed}


def test_registry_merges_every_family():
    assert set(tasks.FAMILIES) == set(FAMILIES)
    merged = {}
    for module in FAMILIES.values():
        assert not set(module.TASKS) & set(merged)  # No name in two families.
        merged.update(module.TASKS)
    assert tasks.TASKS == merged
    assert tasks.TASKS is tasks.TASKS  # Built once.
    assert {f'speed_{s}' for s in data_files.SPEED_SETS} <= set(tasks.TASKS)
    assert {'gsm8k', 'humaneval', 'mbppplus', 'bfcl_simple_python', 'include'} <= set(tasks.TASKS)


@pytest.mark.parametrize('name', sorted(tasks.TASKS))
def test_make_every_name(name):
    task = tasks.make(name)
    assert type(task) is tasks.TASKS[name]
    assert task.name == name
    assert task.root == ''
    assert tasks.make(name, root='/some/root').root == '/some/root'
    assert task.scored is (not name.startswith('speed_'))
    assert callable(task.load) and callable(task.score)


def test_unknown_name_lists_the_valid_ones():
    with pytest.raises(ValueError) as e:
        tasks.make('gsm9k')
    message = str(e.value)
    assert "unknown task 'gsm9k'" in message
    assert str(sorted(tasks.TASKS)) in message
    with pytest.raises(AttributeError):
        tasks.NOT_A_NAME  # noqa: B018


def test_importing_one_family_loads_no_other():
    # The math-verify workers import spec_jax.eval.tasks.timeouts; the registry is lazy.
    script = (
        'import sys, spec_jax.eval.tasks.math; '
        "print(sorted(m for m in sys.modules if m.startswith('spec_jax.eval')))"
    )
    out = subprocess.run([sys.executable, '-c', script], capture_output=True, text=True, check=True)
    loaded = eval(out.stdout)
    assert 'spec_jax.eval.tasks.math' in loaded
    assert not {
        'spec_jax.eval.sandbox',
        'spec_jax.eval.tasks.code',
        'spec_jax.eval.tasks.bfcl',
        'spec_jax.eval.tasks.include',
        'spec_jax.eval.tasks.speed',
    } & set(loaded)
