"""What the math task tests share: the bundled items and a plausible boxed response."""

import functools

from spec_jax.eval.tasks.math import TASKS

NAMES = sorted(TASKS)


def boxed(answer: str) -> str:
    return f'We work through it step by step. So the answer is \\boxed{{{answer}}}.'


@functools.cache
def items(name: str) -> tuple:
    return tuple(TASKS[name]().load())


def by_gold(name: str, gold: str):
    return next(item for item in items(name) if item.gold == gold)


def is_int(s: str) -> bool:
    try:
        int(s)
        return True
    except ValueError:
        return False
