"""What a score hides: the samples whose scoring failed (scorer errors, timeouts, the
infrastructure), and the over-seeds view of a score (avg@k and pass@k, AIME's metrics).

A failed scoring counts as a wrong answer in the score, as the paper's harness counts it;
these counts say how many of the wrong answers were not the model's (docs/eval.md,
"Metrics"). The kind of a failure is read from the result line's `detail`:

  infra         the machinery failed, not the answer: the sandbox's own status 'error' or
                'infra' (`spec_jax.eval.sandbox.result.RunResult`), or a scorer worker that
                could not start (`timeouts.WorkerStartError`, recorded by the runner);
  timeout       the judgement ran out of time: `detail['timeout']` (math-verify's worker,
                `tasks.math.judge`) or the sandbox's 'timeout' / 'cpu_timeout';
  scorer_error  the scorer raised (`detail['error']`: `runner._scored`'s repr of the
                exception, or math-verify's worker error).

A sandbox 'failed' / 'killed' run is the candidate's own failure (an assertion, a crash):
a wrong answer, not counted here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spec_jax.eval.tasks.code.passk import pass_at_k

FAILURE_KINDS = ('scorer_error', 'timeout', 'infra')
# The metrics-row field counting each kind.
FAILURE_FIELDS = {'scorer_error': 'n_scorer_errors', 'timeout': 'n_timeouts',
                  'infra': 'n_infra_errors'}  # fmt: skip
_INFRA_STATUSES = frozenset({'error', 'infra'})
_TIMEOUT_STATUSES = frozenset({'timeout', 'cpu_timeout'})


def failure_kind(detail: Mapping[str, Any] | None) -> str | None:
    """The kind (FAILURE_KINDS) of a sample whose scoring failed, None for a judged one."""
    if not detail:
        return None
    status = detail.get('status')
    error = str(detail.get('error') or '')
    if status in _INFRA_STATUSES or error.startswith('WorkerStartError'):
        return 'infra'
    if detail.get('timeout') or status in _TIMEOUT_STATUSES:
        return 'timeout'
    if error:
        return 'scorer_error'
    return None


def failures(group: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Counts of each failure kind over result lines (FAILURE_FIELDS) and `failed_samples`:
    'item@seed: kind' for each, sorted, so a report can list them."""
    out: dict[str, Any] = {field: 0 for field in FAILURE_FIELDS.values()}
    listed = []
    for r in group:
        kind = failure_kind(r.get('detail'))
        if kind is not None:
            out[FAILURE_FIELDS[kind]] += 1
            listed.append(f'{r["item"]}@{r.get("seed", 0)}: {kind}')
    out['failed_samples'] = sorted(listed)
    return out


def over_seeds(per_item: Mapping[str, Sequence[bool]]) -> dict[str, Any]:
    """avg@k and pass@k over each item's k samples (its seeds), k the fewest any item has.

    avg@k: the mean over items of the item's mean over its first k samples (the score when
    every item has k); pass@k: the mean over items of the unbiased pass@k estimate
    1 - C(n - c, k) / C(n, k) from all n samples (`tasks.code.passk.pass_at_k`). Both None
    (and `seeds_k` the count) when some item has a single sample.
    """
    k = min((len(v) for v in per_item.values()), default=0)
    if k < 2:
        return {'seeds_k': k or None, 'avg_at_k': None, 'pass_at_k': None}
    avg = [sum(map(bool, v[:k])) / k for v in per_item.values()]
    passed = [pass_at_k(len(v), sum(map(bool, v)), k) for v in per_item.values()]
    return {'seeds_k': k, 'avg_at_k': sum(avg) / len(avg), 'pass_at_k': sum(passed) / len(passed)}
