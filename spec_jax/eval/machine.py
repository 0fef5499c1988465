"""What a reader needs to judge a run's numbers: the machine, the versions, the config's
fingerprint and the load beside the run (the report's header, docs/eval.md).

    header = machine.header(fingerprint, load_start=machine.load_average())
    report.write_report(rows, out_dir, header=header)   # its lines: machine.header_lines
"""

from __future__ import annotations

import os
import platform

import jax

import spec_jax

CPUINFO = '/proc/cpuinfo'


def cpu_model(path: str = CPUINFO) -> str:
    """The CPU's model name from /proc/cpuinfo (Linux), else what `platform` knows."""
    try:
        with open(path) as f:
            for line in f:
                key, _, value = line.partition(':')
                if key.strip() in ('model name', 'Model', 'Hardware') and value.strip():
                    return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or 'unknown'


def load_average() -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    try:
        return tuple(round(x, 2) for x in os.getloadavg())
    except OSError:
        return None


def header(
    fingerprint: str | None,
    load_start: tuple[float, float, float] | None = None,
    load_end: tuple[float, float, float] | None = None,
    **extra,
) -> dict:
    """The header of a report: 'cpu', 'cores' (usable by this process and in the machine),
    'devices' (jax's), 'jax' and 'spec_jax' versions, 'python', 'fingerprint' (the
    config's, `records.fingerprint`: the one resume checks), 'load_start' / 'load_end'
    (`load_average`; the end is read now unless given), and any `extra` items (e.g. AR's
    tokens/s on the first and last batch)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None
    return dict(
        cpu=cpu_model(),
        cores=f'{usable} usable of {os.cpu_count()}' if usable else str(os.cpu_count()),
        devices=', '.join(str(d) for d in jax.devices()),
        jax=jax.__version__,
        spec_jax=spec_jax.__version__,
        python=platform.python_version(),
        fingerprint=fingerprint,
        load_start=load_start,
        load_end=load_end if load_end is not None else load_average(),
        **extra,
    )


def _load_text(load) -> str:
    return '-' if load is None else ' / '.join(f'{x:.2f}' for x in load) + ' (1 / 5 / 15 min)'


def header_lines(info: dict) -> list[str]:
    """The header as markdown lines (a bullet per item)."""
    labels = dict(cpu='CPU', cores='cores', devices='JAX devices', jax='jax', spec_jax='spec_jax',
                  python='python', fingerprint='config fingerprint')  # fmt: skip
    lines = [f'- {labels[k]}: {info[k] if info.get(k) is not None else "-"}' for k in labels
             if k in info]  # fmt: skip
    lines += [f'- load average at start: {_load_text(info.get("load_start"))}',
              f'- load average at end: {_load_text(info.get("load_end"))}']  # fmt: skip
    for key, value in info.items():
        if key not in labels and key not in ('load_start', 'load_end'):
            shown = f'{value:.1f}' if isinstance(value, float) else str(value)
            lines.append(f'- {key.replace("_", " ")}: {shown}')
    return lines + ['']
