"""The diagnose job, theory mode: every rule's distortion against draft quality on
synthetic (p, q) (spec_jax/rules/theory.py), written as a CSV, a PNG (chain and tree
panels) and a JSON of the paper's claims checked numerically.

    python launch/diagnose.py --config configs/diagnose.py --workdir runs/diagnose
"""

from __future__ import annotations

import csv
import json
import math
import os
from typing import Any

import matplotlib
import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from spec_jax.rules import theory


def write_outputs(rows: list[dict[str, Any]], claims: dict[str, Any], workdir: str) -> dict:
    """Writes diagnose_theory.csv, diagnose_theory.png and diagnose_claims.json."""
    os.makedirs(workdir, exist_ok=True)
    paths = {
        'csv': os.path.join(workdir, 'diagnose_theory.csv'),
        'png': os.path.join(workdir, 'diagnose_theory.png'),
        'claims': os.path.join(workdir, 'diagnose_claims.json'),
    }
    with open(paths['csv'], 'w', newline='') as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    with open(paths['claims'], 'w') as f:
        json.dump(claims, f, indent=2, default=lambda x: None if math.isnan(x) else x)

    specs = list(dict.fromkeys(r['rule'] for r in rows))
    colors = matplotlib.colormaps['tab20'](np.linspace(0, 1, max(len(specs), 2)))
    styles = ('-', '--', '-.', ':')
    fig = Figure(figsize=(15, 5))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, sharey=True)
    for ax, mode in zip(axes, ('chain', 'tree'), strict=True):
        for k, spec in enumerate(specs):
            sel = [r for r in rows if r['mode'] == mode and r['rule'] == spec]
            if not sel:
                continue
            ax.plot(
                [r['quality'] for r in sel],
                [r['tv_baseline'] for r in sel],
                marker='o',
                markersize=3,
                color=colors[k],
                linestyle=styles[k % len(styles)],
                label=spec,
            )
        ax.set_title(f'{mode} verification (TV to the matched baseline)')
        ax.set_xlabel('draft quality 1 - TV(p, q)')
        ax.grid(alpha=0.3)
    axes[0].set_ylabel('TV(pi, matched baseline p_A)')
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc='center right')
    fig.tight_layout(rect=(0, 0, 0.8, 1))
    fig.savefig(paths['png'], dpi=110)
    return paths


def run(config: Any, workdir: str) -> dict[str, Any]:
    """Runs the diagnose job (launch/diagnose.py).

    Args:
      config: ml_collections ConfigDict from configs/diagnose.py (mode 'theory').
      workdir: output directory.

    Returns:
      {'rows': csv rows, 'claims': claims dict, 'paths': written files}.
    """
    if config.mode != 'theory':
        raise ValueError(f"diagnose: mode={config.mode!r}; only 'theory' is implemented")
    rows, claims = theory.run_theory(config)
    paths = write_outputs(rows, claims, workdir)
    return {'rows': rows, 'claims': claims, 'paths': paths}
