"""The metrics rows as CSV, read back with their types.

One row per task x method (`spec_jax.eval.metrics`): FIELDS first, then any other keys;
None is an empty cell, `pairs` is ';'-joined, floats are written exactly (repr), other
lists and dicts (the Δs' gain/lose/tie spreads) as JSON. `read_metrics_csv` restores bool,
int, float, None, the `pairs` list and the JSON cells.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Sequence
from typing import Any

FIELDS = (
    'task',
    'scored',
    'method',
    'kind',
    'rule',
    'param',
    'param_name',
    'pairs',
    'n_items',
    'n_samples',
    'score',
    'score_lo',
    'score_hi',
    'block_efficiency',
    'be_full_gamma',
    'accept_length',
    'acceptance_rate',
    'position_acceptance',
    'full_fraction',
    'tokens',
    'decode_seconds',
    'tokens_per_s',
    'speedup',
    'ds',
    'tv',
    'tv_plain',
    'js',
    'kl',
    'kl_inf_fraction',
    'outside',
    'overshoot_mean',
    'overshoot_max',
    'overshoot_inf_fraction',
    'seeds_k',
    'avg_at_k',
    'pass_at_k',
    'n_scorer_errors',
    'n_timeouts',
    'n_infra_errors',
    'failed_samples',
)
# The paired Δs of a lossy row against its matched baseline (`spec_jax.eval.stats.paired`).
PAIR_FIELDS = ('d_score', 'd_score_lo', 'd_score_hi', 'd_score_p', 'd_score_test', 'd_be',
               'd_be_lo', 'd_be_hi', 'd_tv', 'd_tv_lo', 'd_tv_hi', 'd_tv_plain', 'd_tv_plain_lo',
               'd_tv_plain_hi', 'speedup_vs_matched', 'speedup_vs_matched_lo',
               'speedup_vs_matched_hi', 'speedup_vs_matched_n_batches')  # fmt: skip
_STR_FIELDS = frozenset({'task', 'method', 'kind', 'rule', 'param_name', 'speedup_group',
                         'speedup_basis', 'd_score_test'})  # fmt: skip
_INT_FIELDS = frozenset({'n_items', 'n_samples', 'tokens', 'seeds_k', 'n_scorer_errors',
                         'n_timeouts', 'n_infra_errors'})  # fmt: skip
_PAIRS_SEP = ';'  # Method names hold ':', ',', '=' and brackets, never ';'.


def cell(value: Any, key: str = '') -> str:
    """One value as a CSV cell."""
    if value is None:
        return ''
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (list, tuple, dict)):  # Method names; other lists, dicts as JSON.
        return _PAIRS_SEP.join(str(v) for v in value) if key == 'pairs' else json.dumps(value)
    if isinstance(value, float):
        return repr(value)
    return str(value)


def _fieldnames(rows: Sequence[dict[str, Any]], fields: Sequence[str]) -> list[str]:
    extra = [k for r in rows for k in r if k not in fields]
    return list(fields) + list(dict.fromkeys(extra))


def write_metrics_csv(rows: Sequence[dict[str, Any]], path: str) -> str:
    """Writes the rows as CSV (FIELDS first, then any other keys): None is an empty cell,
    `pairs` is ';'-joined, floats are written exactly (repr). Returns `path`."""
    names = _fieldnames(rows, FIELDS)
    with open(path, 'w', newline='') as f:
        writer = csv.writer(f)
        writer.writerow(names)
        for r in rows:
            writer.writerow([cell(r.get(k), k) for k in names])
    return path


def _parse(key: str, text: str) -> Any:
    if key == 'pairs':
        return [p for p in text.split(_PAIRS_SEP) if p]
    if text == '':
        return None
    if key in _STR_FIELDS:
        return text
    if text.startswith(('[', '{')):
        return json.loads(text)
    if key == 'scored' or text in ('True', 'False'):
        return text == 'True'
    try:
        number = float(text)
    except ValueError:
        return text
    if key in _INT_FIELDS or (key not in FIELDS and re.fullmatch(r'-?\d+', text)):
        return int(number)
    return number


def read_metrics_csv(path: str) -> list[dict[str, Any]]:
    """Reads `write_metrics_csv`'s file back into rows with their types (bool, int, float,
    None, the `pairs` list, the JSON lists and dicts)."""
    with open(path, newline='') as f:
        return [{k: _parse(k, v) for k, v in r.items()} for r in csv.DictReader(f)]
