"""The paper's headline numbers (docs/paper.md §5.1 and §5.2) as data, and the map from our
method and task names to its rows, so a report can put the paper's gaps beside ours.

Two setups, transcribed verbatim from the Fast-HSD legacy README "Results" (docs/paper.md §5;
the repository never reads it at run time):

  tree:  Llama-3.1-8B-Instruct + EAGLE-3 draft, T = 0.7, block size 7, a single run;
         BE = accepted draft tokens per target step (EAGLE's accept_length, no +1);
         DS = tokens/s.
  chain: Qwen2.5-72B-Instruct (GPTQ-Int8) + Qwen2.5-0.5B draft, T = 0.7, gamma = 10, mean and
         std over 3 seeds; BE = tokens per full-gamma block including the bonus token (at most
         11; the tail block is excluded); DS = gamma-normalised proposed tokens/s.

Tasks are the paper's columns MATH, MBPP+ (Pass@1), INCLUDE and BFCL (the parallel_multiple
category); accuracies are in percent. Matched pairs (docs/laws.md §5): a lossy truncation rule at
a parameter is compared with its truncation sampler + lossless SD at the same parameter
(SpecCascade rho <-> Min-p + SD rho, lossy eta <-> eta + SD eta); lenience and CoS, which
truncate nothing, with the lossless baseline.
"""

from __future__ import annotations

import re
from typing import Any

TASKS = ('MATH', 'MBPP+', 'INCLUDE', 'BFCL')

# Our task names -> the paper's columns.
TASK_COLUMNS = {
    'math': 'MATH',
    'mbppplus': 'MBPP+',
    'include': 'INCLUDE',
    'bfcl_parallel_multiple': 'BFCL',
}

# The paper's task sizes (docs/paper.md §2) and its grids (docs/paper.md §4): rule -> (parameter,
# values); min-p + SD and eta + SD at each value come from the plan's matched baselines.
TASK_SIZES = {'math': 500, 'mbppplus': 378, 'include': 220, 'bfcl_parallel_multiple': 200}
# Where those items come from (`spec_jax.eval.tasks.sources`): the paper's own items, source
# 'fast_hsd' (Fast-HSD's question files, bundled; MATH's rows 240-499 from the hub), for MATH,
# INCLUDE (its exact 220: 5 per language of 44) and BFCL; MBPP+'s file has no tests, and the
# paper's selection, v0.2.0 in task_id order, is what 'hub' (or '' with the full v0.2.0 file
# under a data root) gives.
TASK_SOURCES = {
    'math': 'fast_hsd',
    'mbppplus': 'hub',
    'include': 'fast_hsd',
    'bfcl_parallel_multiple': 'fast_hsd',
}
# Task options of the paper setups: none ('fast_hsd' is already the paper's selection; on
# another source INCLUDE's `per_language=5, sample_seed=42` draws a sample of its shape).
TASK_OPTIONS: dict[str, dict] = {}
GRIDS = {
    'lenience': ('l', (0.2, 0.4, 0.6, 0.8)),
    'cos': ('lam', (0.2, 0.4, 0.6, 0.8)),
    'minp_verify': ('rho', (0.1, 0.3, 0.5, 0.7, 0.9)),  # SpecCascade (Fast-HSD's rule)
    'eta_verify': ('eta', (0.05, 0.1, 0.15, 0.2, 0.25)),  # Medusa / Typical (lossy eta)
}


def grid(rule_names) -> tuple[str, ...]:
    """The `rules.make` specs of the paper's grid for these rules, in GRIDS order."""
    return tuple(
        f'{rule}:{name}={v}'
        for rule, (name, values) in GRIDS.items()
        if rule in rule_names
        for v in values
    )


SETUPS: dict[str, dict[str, str]] = {
    'tree': {
        'label': 'Llama-3.1-8B-Instruct + EAGLE-3 (tree, paper)',
        'section': 'docs/paper.md §5.1',
        'runs': 'single run',
        'be_definition': 'accepted draft tokens per target step (EAGLE accept_length, no +1)',
        'ds_definition': 'new tokens / wall time (tokens/s)',
    },
    'chain': {
        'label': 'Qwen2.5-72B + 0.5B draft (chain, gamma 10, paper)',
        'section': 'docs/paper.md §5.2',
        'runs': 'mean ± std over 3 seeds',
        'be_definition': 'tokens per full-gamma block incl. the bonus token (max 11)',
        'ds_definition': 'gamma-normalised proposed tokens/s (gamma * full blocks / decode s)',
    },
}

# The paper's lossless row in each setup.
BASELINE = {'tree': 'Baseline', 'chain': 'SD Baseline'}

# (our rule or 'baseline', our parameter name) -> the paper's method, per setup.
METHODS: dict[str, dict[tuple[str, str | None], str]] = {
    'tree': {
        ('lossless', None): 'Baseline',
        ('lenience', 'l'): 'Lenience',
        ('minp_verify', 'rho'): 'SpecCascade',
        ('baseline', 'min_p'): 'Min-p + SD',
        ('baseline', 'eta'): 'η + SD',
        ('eta_verify', 'eta'): 'Typical (lossy η)',
    },
    'chain': {
        ('lossless', None): 'SD Baseline',
        ('lenience', 'l'): 'Lenience',
        ('cos', 'lam'): 'CoS',
        ('minp_verify', 'rho'): 'Cascade (SpecCascade)',
        ('baseline', 'min_p'): 'Min-p + SD',
        ('baseline', 'eta'): 'η + SD',
        ('eta_verify', 'eta'): 'Medusa (lossy η)',
    },
}

# A paper method -> its matched baseline method (same parameter; None: the lossless row).
MATCHED: dict[str, str | None] = {
    'SpecCascade': 'Min-p + SD',
    'Cascade (SpecCascade)': 'Min-p + SD',
    'Typical (lossy η)': 'η + SD',
    'Medusa (lossy η)': 'η + SD',
    'Lenience': None,
    'CoS': None,
}

# Cells the source marks as suspect: (setup, method, param, task) -> note.
NOTES = {
    ('tree', 'η + SD', 0.25, 'BFCL'): (
        'DS 63.85 looks like an outlier or typo in the source; reproduced as given'
    ),
}

# fmt: off
# docs/paper.md §5.1: (method, param, MATH, MBPP+, INCLUDE, BFCL), each task (BE, DS, Acc %).
_TREE = (
    ('Baseline', None,
     (3.76, 140.21, 73.2), (4.7, 167.83, 59.3), (0.67, 45.72, 35.5), (2.57, 85.27, 86.0)),
    ('Lenience', 0.2,
     (4.49, 161.29, 71.2), (5.17, 181.95, 61.11), (0.86, 50.61, 30.91), (2.63, 87.31, 83.5)),
    ('Lenience', 0.4,
     (4.34, 157.03, 76.2), (5.02, 177.13, 59.79), (0.8, 48.93, 32.73), (2.61, 86.14, 85.5)),
    ('Lenience', 0.6,
     (4.19, 152.85, 76.0), (4.96, 175.43, 59.52), (0.73, 47.03, 34.55), (2.59, 85.77, 86.0)),
    ('Lenience', 0.8,
     (4.07, 149.39, 75.2), (4.92, 174.25, 59.79), (0.72, 46.73, 33.64), (2.59, 85.56, 84.0)),
    ('SpecCascade', 0.1,
     (4.47, 159.83, 73.0), (5.16, 180.81, 59.79), (0.92, 51.76, 30.91), (2.62, 85.82, 84.5)),
    ('SpecCascade', 0.3,
     (4.28, 154.42, 77.4), (5.03, 176.79, 61.38), (0.79, 48.26, 31.82), (2.59, 85.18, 84.5)),
    ('SpecCascade', 0.5,
     (4.18, 151.56, 77.6), (4.99, 175.66, 60.85), (0.76, 47.43, 31.82), (2.58, 85.03, 86.5)),
    ('SpecCascade', 0.7,
     (4.12, 149.71, 76.2), (4.93, 173.7, 61.38), (0.73, 46.74, 36.82), (2.58, 84.99, 85.5)),
    ('SpecCascade', 0.9,
     (4.06, 148.2, 76.6), (4.89, 172.6, 60.32), (0.72, 46.45, 35.0), (2.58, 85.0, 86.0)),
    ('Min-p + SD', 0.1,
     (3.89, 140.72, 75.2), (4.84, 166.79, 61.9), (0.54, 45.34, 40.0), (2.58, 84.45, 86.0)),
    ('Min-p + SD', 0.3,
     (3.96, 142.85, 77.6), (4.89, 168.29, 60.32), (0.55, 45.65, 36.82), (2.58, 84.13, 86.0)),
    ('Min-p + SD', 0.5,
     (3.98, 143.42, 77.4), (4.91, 168.98, 60.85), (0.56, 45.91, 35.91), (2.58, 84.09, 86.5)),
    ('Min-p + SD', 0.7,
     (4.0, 143.88, 77.4), (4.92, 169.23, 62.43), (0.56, 45.96, 35.91), (2.59, 84.21, 87.5)),
    ('Min-p + SD', 0.9,
     (4.05, 145.24, 76.8), (4.93, 169.58, 63.49), (0.57, 46.13, 36.36), (2.59, 84.42, 87.0)),
    ('η + SD', 0.05,
     (3.85, 137.92, 75.2), (4.84, 164.79, 59.79), (0.55, 45.42, 35.0), (2.58, 83.63, 87.5)),
    ('η + SD', 0.1,
     (3.9, 139.33, 77.0), (4.86, 165.32, 61.11), (0.54, 45.06, 41.82), (2.59, 83.92, 86.0)),
    ('η + SD', 0.15,
     (3.93, 140.21, 77.2), (4.88, 165.95, 61.9), (0.54, 45.13, 35.0), (2.59, 83.91, 86.5)),
    ('η + SD', 0.2,
     (3.96, 140.97, 76.0), (4.89, 166.23, 64.29), (0.54, 45.14, 34.09), (2.57, 83.54, 85.0)),
    ('η + SD', 0.25,
     (3.99, 141.83, 75.2), (4.88, 165.77, 63.76), (0.57, 45.92, 37.73), (2.58, 63.85, 86.5)),
    ('Typical (lossy η)', 0.05,
     (4.82, 168.77, 66.0), (5.29, 182.86, 55.29), (1.24, 59.8, 29.55), (2.66, 86.11, 78.0)),
    ('Typical (lossy η)', 0.1,
     (4.66, 164.19, 68.2), (5.21, 180.54, 56.08), (1.15, 57.2, 29.55), (2.65, 85.85, 79.5)),
    ('Typical (lossy η)', 0.15,
     (4.58, 161.86, 72.2), (5.16, 178.87, 57.41), (1.05, 54.76, 25.91), (2.64, 85.65, 83.0)),
    ('Typical (lossy η)', 0.2,
     (4.54, 160.65, 69.8), (5.16, 178.94, 58.47), (0.98, 52.73, 27.73), (2.63, 85.4, 83.5)),
    ('Typical (lossy η)', 0.25,
     (4.46, 158.17, 73.0), (5.17, 179.31, 57.14), (1.0, 53.21, 26.82), (2.62, 85.05, 83.0)),
)

# docs/paper.md §5.2: (method, param, MATH, MBPP+, INCLUDE, BFCL), each task
# (BE, DS, Acc %, BE std, DS std, Acc std).
_CHAIN = (
    ('SD Baseline', None,
     (7.98, 4.67, 76.47, 0.02, 0.02, 1.53), (5.47, 4.06, 75.84, 0.06, 0.03, 0.4),
     (3.4, 4.63, 68.18, 0.03, 0.01, 0.0), (8.73, 6.86, 88.17, 0.01, 0.0, 0.58)),
    ('Min-p + SD', 0.1,
     (7.94, 4.65, 76.27, 0.02, 0.02, 1.53), (5.42, 3.89, 75.57, 0.08, 0.14, 0.4),
     (3.34, 4.63, 68.79, 0.04, 0.01, 0.69), (8.73, 6.97, 88.17, 0.01, 0.18, 0.58)),
    ('Min-p + SD', 0.3,
     (7.99, 4.64, 76.67, 0.05, 0.01, 0.83), (5.56, 3.9, 76.19, 0.03, 0.14, 0.46),
     (3.42, 4.62, 68.18, 0.04, 0.01, 2.08), (8.85, 6.94, 88.33, 0.01, 0.21, 1.04)),
    ('Min-p + SD', 0.5,
     (8.03, 4.64, 76.07, 0.02, 0.01, 1.17), (5.45, 3.89, 75.57, 0.07, 0.14, 0.31),
     (3.44, 4.61, 68.48, 0.02, 0.02, 1.46), (8.88, 6.97, 87.67, 0.02, 0.19, 0.29)),
    ('Min-p + SD', 0.7,
     (8.08, 4.64, 76.27, 0.04, 0.01, 0.42), (5.59, 3.88, 76.01, 0.02, 0.13, 0.31),
     (3.47, 4.63, 66.52, 0.05, 0.01, 1.14), (8.89, 6.96, 87.67, 0.02, 0.19, 0.29)),
    ('Min-p + SD', 0.9,
     (8.08, 4.65, 77.27, 0.1, 0.01, 1.27), (5.62, 3.88, 76.01, 0.04, 0.14, 0.15),
     (3.47, 4.62, 66.97, 0.04, 0.01, 1.31), (8.89, 6.97, 88.0, 0.01, 0.18, 0.0)),
    ('Cascade (SpecCascade)', 0.1,
     (8.46, 4.53, 76.87, 0.06, 0.22, 0.46), (5.64, 3.89, 76.46, 0.03, 0.14, 0.26),
     (3.57, 4.63, 64.85, 0.04, 0.01, 1.14), (8.87, 6.83, 89.0, 0.04, 0.05, 0.5)),
    ('Cascade (SpecCascade)', 0.3,
     (8.36, 4.65, 75.47, 0.04, 0.01, 0.7), (5.59, 3.89, 75.4, 0.04, 0.14, 0.26),
     (3.5, 4.6, 66.67, 0.03, 0.01, 3.44), (8.89, 6.81, 88.67, 0.01, 0.02, 0.29)),
    ('Cascade (SpecCascade)', 0.5,
     (8.12, 4.66, 74.87, 0.05, 0.01, 0.42), (5.51, 3.9, 74.87, 0.03, 0.12, 0.7),
     (3.4, 4.61, 68.33, 0.08, 0.02, 3.03), (8.85, 6.88, 88.0, 0.03, 0.03, 0.0)),
    ('Cascade (SpecCascade)', 0.7,
     (8.01, 4.66, 75.47, 0.06, 0.01, 0.7), (5.48, 3.9, 76.46, 0.01, 0.14, 0.53),
     (3.3, 4.6, 68.33, 0.04, 0.01, 1.05), (8.84, 6.82, 87.67, 0.03, 0.03, 0.29)),
    ('Cascade (SpecCascade)', 0.9,
     (7.84, 4.66, 75.47, 0.07, 0.01, 1.4), (5.41, 3.89, 76.19, 0.01, 0.14, 0.26),
     (3.25, 4.62, 65.91, 0.03, 0.01, 0.45), (8.84, 5.28, 88.17, 0.03, 0.04, 0.58)),
    ('η + SD', 0.05,
     (7.92, 4.63, 76.67, 0.04, 0.01, 1.85), (5.42, 3.89, 75.57, 0.08, 0.14, 0.4),
     (3.34, 4.61, 67.73, 0.05, 0.02, 1.82), (8.73, 6.95, 88.17, 0.01, 0.18, 0.58)),
    ('η + SD', 0.1,
     (7.94, 4.64, 76.47, 0.03, 0.01, 1.03), (5.49, 3.88, 76.54, 0.06, 0.15, 0.61),
     (3.31, 4.62, 68.79, 0.02, 0.02, 0.26), (8.74, 6.82, 88.17, 0.01, 0.02, 0.58)),
    ('η + SD', 0.15,
     (7.96, 4.64, 75.87, 0.03, 0.02, 2.21), (5.44, 3.89, 76.01, 0.02, 0.15, 0.31),
     (3.39, 4.6, 67.27, 0.05, 0.03, 0.45), (8.77, 6.79, 88.17, 0.01, 0.05, 0.58)),
    ('η + SD', 0.2,
     (8.11, 4.51, 76.27, 0.29, 0.21, 0.7), (5.57, 3.88, 76.01, 0.05, 0.12, 0.15),
     (3.42, 4.61, 68.33, 0.05, 0.01, 1.84), (8.8, 6.8, 88.17, 0.07, 0.02, 0.58)),
    ('η + SD', 0.25,
     (8.03, 4.5, 75.4, 0.06, 0.21, 1.6), (5.57, 3.87, 75.13, 0.04, 0.14, 0.26),
     (3.41, 4.63, 68.79, 0.02, 0.03, 1.6), (8.88, 6.72, 88.17, 0.05, 0.07, 0.58)),
    ('Medusa (lossy η)', 0.05,
     (8.49, 4.67, 76.6, 0.01, 1.93, 2.08), (5.64, 3.89, 76.46, 0.03, 0.14, 1.06),
     (3.58, 4.62, 66.52, 0.03, 0.01, 1.31), (8.87, 6.84, 89.0, 0.04, 0.02, 0.5)),
    ('Medusa (lossy η)', 0.1,
     (8.47, 4.66, 75.2, 0.05, 0.0, 1.11), (5.64, 3.89, 76.46, 0.03, 0.13, 1.06),
     (3.63, 4.61, 66.52, 0.03, 0.01, 1.05), (8.87, 6.85, 89.0, 0.04, 0.01, 0.5)),
    ('Medusa (lossy η)', 0.15,
     (8.21, 4.65, 75.73, 0.24, 0.03, 2.12), (5.66, 3.88, 75.66, 0.03, 0.14, 0.53),
     (3.59, 4.62, 66.06, 0.01, 0.02, 1.31), (8.87, 6.85, 89.0, 0.04, 0.03, 0.5)),
    ('Medusa (lossy η)', 0.2,
     (8.39, 4.65, 74.67, 0.01, 0.0, 1.55), (5.63, 3.9, 75.4, 0.05, 0.14, 0.26),
     (3.54, 4.6, 68.79, 0.03, 0.01, 0.69), (8.87, 6.84, 89.0, 0.04, 0.02, 0.5)),
    ('Medusa (lossy η)', 0.25,
     (8.3, 4.67, 75.53, 0.05, 0.01, 0.31), (5.55, 3.9, 75.04, 0.08, 0.14, 0.15),
     (3.46, 4.63, 66.06, 0.01, 0.01, 0.26), (8.89, 6.78, 88.67, 0.01, 0.04, 0.29)),
    ('Lenience', 0.2,
     (8.49, 4.68, 74.47, 0.02, 0.05, 0.58), (5.65, 4.06, 75.13, 0.03, 0.02, 0.26),
     (3.59, 4.52, 67.42, 0.04, 0.04, 1.39), (8.87, 6.9, 88.67, 0.01, 0.02, 0.29)),
    ('Lenience', 0.4,
     (8.37, 4.66, 75.6, 0.08, 0.12, 2.65), (5.61, 4.06, 75.49, 0.02, 0.02, 0.67),
     (3.55, 4.53, 67.88, 0.06, 0.09, 1.31), (8.85, 6.87, 88.0, 0.04, 0.01, 0.5)),
    ('Lenience', 0.6,
     (8.26, 4.66, 78.0, 0.05, 0.14, 1.73), (5.52, 4.06, 75.57, 0.07, 0.03, 0.4),
     (3.48, 4.5, 68.64, 0.02, 0.18, 1.82), (8.83, 6.84, 88.17, 0.02, 0.02, 0.29)),
    ('Lenience', 0.8,
     (8.22, 4.65, 76.47, 0.07, 0.23, 1.15), (5.52, 4.06, 75.75, 0.04, 0.02, 0.4),
     (3.38, 4.49, 68.33, 0.03, 0.11, 0.26), (8.81, 6.87, 87.67, 0.05, 0.02, 0.29)),
    ('CoS', 0.2,
     (8.33, 4.68, 71.53, 0.0, 0.01, 2.12), (6.05, 4.1, 71.43, 0.13, 0.01, 1.06),
     (3.89, 4.61, 64.55, 0.04, 0.02, 1.98), (8.76, 6.79, 70.67, 0.13, 0.04, 3.4)),
    ('CoS', 0.4,
     (8.8, 4.67, 60.4, 0.04, 0.0, 2.84), (7.14, 4.13, 61.2, 0.09, 0.01, 3.29),
     (4.69, 4.58, 53.79, 0.07, 0.03, 2.1), (8.84, 6.69, 58.0, 0.15, 0.03, 4.5)),
    ('CoS', 0.6,
     (9.42, 4.67, 54.8, 0.01, 0.01, 0.72), (7.86, 4.2, 59.44, 0.02, 0.02, 0.85),
     (5.99, 4.53, 48.03, 0.03, 0.01, 1.89), (9.29, 6.69, 43.83, 0.16, 0.03, 3.79)),
    ('CoS', 0.8,
     (10.14, 4.65, 46.0, 0.11, 0.01, 2.12), (9.26, 4.26, 54.06, 0.04, 0.0, 0.31),
     (8.02, 4.49, 37.12, 0.05, 0.01, 2.05), (10.26, 6.75, 43.67, 0.07, 0.01, 1.89)),
)
# fmt: on

_RAW = {'tree': _TREE, 'chain': _CHAIN}


def _key(param: float | None) -> float | None:
    """A parameter as a lookup key (the grids have at most two decimals)."""
    return None if param is None else round(float(param), 6)


# setup -> {(paper method, param key): per-task cells in TASKS order}.
_TABLES = {
    setup: {(method, _key(param)): tuple(cells) for method, param, *cells in raw}
    for setup, raw in _RAW.items()
}

_BASELINE_NAME = re.compile(r'^baseline\[(\w+)=([^\]]+)\]$')
_RULE_NAME = re.compile(r'^(\w+):(\w+)=([^,=]+)$')


def parse_method(method: str) -> tuple[str, str | None, float | None] | None:
    """Our method name -> (rule or 'baseline', parameter name, value), None if not of a form
    the paper ran ('lossless', 'rule:name=value', 'baseline[truncation=value]')."""
    if method == 'lossless':
        return ('lossless', None, None)
    for pattern in (_BASELINE_NAME, _RULE_NAME):
        m = pattern.match(method)
        if m is None:
            continue
        groups = m.groups()
        rule, name, value = ('baseline', *groups) if pattern is _BASELINE_NAME else groups
        try:
            return (rule, name, float(value))
        except ValueError:
            return None
    return None


def paper_method(setup: str, method: str) -> tuple[str, float | None] | None:
    """The paper's (method, param) for our method name in `setup`, None if it has no row.

    Examples (chain): 'lossless' -> ('SD Baseline', None); 'cos:lam=0.4' -> ('CoS', 0.4);
    'baseline[min_p=0.3]' -> ('Min-p + SD', 0.3). Whether the paper ran that parameter is
    `lookup`'s question.
    """
    if setup not in METHODS:
        raise ValueError(f'setup {setup!r} is not one of {sorted(METHODS)}')
    parsed = parse_method(method)
    if parsed is None:
        return None
    rule, name, value = parsed
    paper = METHODS[setup].get((rule, name))
    return None if paper is None else (paper, value)


def lookup(setup: str, method: str, param: float | None, column: str) -> dict[str, Any] | None:
    """One cell of the paper's table by the paper's names (method, param, column in TASKS).

    Returns:
      None when the paper has no such row, else {'setup', 'label', 'section', 'runs', 'task',
      'method', 'param', 'be', 'ds', 'acc' (%), 'score' (acc / 100, our scale), 'be_std',
      'ds_std', 'acc_std' (None for the single-run tree setup), 'be_definition',
      'ds_definition', 'note'}.
    """
    if column not in TASKS:
        raise ValueError(f'paper column {column!r} is not one of {TASKS}')
    if setup not in _TABLES:
        raise ValueError(f'setup {setup!r} is not one of {sorted(_TABLES)}')
    cells = _TABLES[setup].get((method, _key(param)))
    if cells is None:
        return None
    cell = cells[TASKS.index(column)]
    be, ds, acc = cell[:3]
    stds = cell[3:] if len(cell) == 6 else (None, None, None)
    info = SETUPS[setup]
    return {
        'setup': setup,
        'label': info['label'],
        'section': info['section'],
        'runs': info['runs'],
        'task': column,
        'method': method,
        'param': None if param is None else float(param),
        'be': be,
        'ds': ds,
        'acc': acc,
        'score': acc / 100.0,
        'be_std': stds[0],
        'ds_std': stds[1],
        'acc_std': stds[2],
        'be_definition': info['be_definition'],
        'ds_definition': info['ds_definition'],
        'note': NOTES.get((setup, method, _key(param), column), ''),
    }


def paper_row(setup: str, task: str, method: str) -> dict[str, Any] | None:
    """The paper's row for our `task` and `method` names in `setup` ('chain' | 'tree').

    Returns:
      the `lookup` dict, or None when the task is not one of the paper's (TASK_COLUMNS), the
      method has no paper counterpart in this setup (e.g. CoS in the tree setup), or the paper
      did not run that parameter.
    """
    column = TASK_COLUMNS.get(task)
    mapped = paper_method(setup, method)
    if column is None or mapped is None:
        return None
    return lookup(setup, mapped[0], mapped[1], column)


def matched_method(setup: str, method: str, param: float | None) -> tuple[str, float | None]:
    """The paper's matched baseline of its (method, param): SpecCascade rho <-> Min-p + SD rho,
    lossy eta <-> eta + SD eta, lenience / CoS <-> the lossless row.

    Raises:
      ValueError: `method` is a baseline (it has no matched baseline) or unknown.
    """
    if method not in MATCHED:
        raise ValueError(f'{method!r} is not a lossy paper method; those are {sorted(MATCHED)}')
    base = MATCHED[method]
    return (BASELINE[setup], None) if base is None else (base, param)


def paper_gap(setup: str, task: str, method: str) -> dict[str, Any] | None:
    """The paper's gap for our lossy `method` on `task`: its row minus its matched baseline's.

    Returns:
      None unless both rows exist, else {'method': row, 'matched': matched row, 'd_acc'
      (percentage points), 'd_score' (d_acc / 100), 'd_be', 'd_ds'}.
    """
    row = paper_row(setup, task, method)
    if row is None or row['method'] not in MATCHED:
        return None
    base, param = matched_method(setup, row['method'], row['param'])
    matched = lookup(setup, base, param, row['task'])
    if matched is None:
        return None
    d_acc = row['acc'] - matched['acc']
    return {
        'method': row,
        'matched': matched,
        'd_acc': d_acc,
        'd_score': d_acc / 100.0,
        'd_be': row['be'] - matched['be'],
        'd_ds': row['ds'] - matched['ds'],
    }
