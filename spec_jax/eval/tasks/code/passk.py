"""pass@k: `pass_at_k(n, c, k)` is the unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al.,
2021); `aggregate` averages it over items with several samples each."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from spec_jax.eval.tasks.base import Score


def pass_at_k(n: int, c: int, k: int) -> float:
    """The unbiased pass@k estimate from `n` samples of which `c` are correct:
    1 - C(n-c, k) / C(n, k) (Chen et al., 2021)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f'need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}')
    if n - c < k:
        return 1.0
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def aggregate(
    samples: Mapping[str, Sequence[Score | bool]], ks: Sequence[int] = (1,), key: str = ''
) -> dict:
    """pass@k averaged over items, from several scored samples per item.

    Args:
      samples: item id -> the Scores (or bools) of its samples.
      ks: the k of pass@k; a k above some item's sample count is left out.
      key: a `Score.detail` field to count instead of `correct` (e.g. 'base_pass').

    Returns:
      {'items', 'samples', 'pass@k' for each k kept, 'per_item': {id: [n, c]}}.
    """

    def ok(s: Score | bool) -> bool:
        if isinstance(s, Score):
            return bool(s.detail.get(key)) if key else s.correct
        return bool(s)

    counts = {item: (len(v), sum(ok(s) for s in v)) for item, v in samples.items()}
    out: dict[str, Any] = {'items': len(counts), 'samples': sum(n for n, _ in counts.values())}
    smallest = min((n for n, _ in counts.values()), default=0)
    for k in ks:
        if counts and k <= smallest:
            values = [pass_at_k(n, c, k) for n, c in counts.values()]
            out[f'pass@{k}'] = sum(values) / len(values)
    out['per_item'] = {item: [n, c] for item, (n, c) in counts.items()}
    return out
