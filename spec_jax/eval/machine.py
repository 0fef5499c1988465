"""What a reader needs to judge a run's numbers: the machine, the versions, the commit, the
config's fingerprint, every setting that moves a number, and the load beside the run (the
report's header, docs/eval.md), with a warning when the load exceeded the cores.

    header = machine.header(fingerprint, load_start=machine.load_average(),
                            settings=machine.settings(config))
    report.write_report(rows, out_dir, header=header)   # its lines: machine.header_lines
"""

from __future__ import annotations

import os
import platform
import subprocess

import jax
import ml_collections

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


def commit(path: str | None = None) -> str:
    """The git commit spec_jax runs from ('<hash>', plus ' with uncommitted changes' when
    tracked files differ from it); 'unknown (not a git checkout)' where git cannot say (an
    installed package: spec_jax's version is a fixed string and does not move)."""
    where = path or os.path.dirname(os.path.abspath(spec_jax.__file__))

    def git(*args: str) -> str:
        return subprocess.run(['git', '-C', where, *args], capture_output=True, text=True,
                              timeout=20, check=True).stdout.strip()  # fmt: skip

    try:
        head = git('rev-parse', 'HEAD')
        dirty = git('status', '--porcelain', '--untracked-files=no')
    except (OSError, subprocess.SubprocessError):
        return 'unknown (not a git checkout)'
    return head + (' with uncommitted changes' if dirty else '')


def _tasks_text(tasks: ml_collections.ConfigDict) -> list[tuple[str, str]]:
    out = []
    for name in sorted(tasks):
        t = tasks[name]
        limit = f'first {t.limit} items' if t.limit else 'all items'
        options = dict(t.get('options') or {})
        extra = ''.join(f', {k} {v}' for k, v in sorted(options.items()))
        out.append((f'task {name}', f'{limit}, at most {t.max_new_tokens} new tokens, source '
                                    f'{t.source or "the data root"}{extra}'))  # fmt: skip
    return out


def settings(c: ml_collections.ConfigDict) -> dict[str, str]:
    """name -> value of every setting of an evaluation config that moves a number: the
    target and draft, gamma, temperature, the tree shape (tree mode), token limits, batch
    size, seeds, the grid, each task's items, limit and source, the data root, and the
    commit."""
    out = dict(model=f'{c.model} ({c.dtype}{", weights " + c.weights if c.weights else ""})',
               mode=c.mode, drafter=f'{c.drafter} {c.draft or "-"}'
               + (f' behind prompt lookup (n-grams {c.lookup}..{c.ngram})' if c.lookup else ''),
               gamma=f'{c.num_draft} drafted tokens a chain round')  # fmt: skip
    if c.mode == 'tree':
        t = c.tree
        out['tree shape'] = (f'static {t.static}' if t.static else
                             f'{t.nodes} nodes, depth {t.depth}, branch {t.branch}') + (
                             f', sampled {t.sampled}' if t.sampled else '')  # fmt: skip
    out.update({
        'temperature': f'{c.temperature:g}',
        'grid': ', '.join(c.grid),
        'seeds': ', '.join(str(s) for s in c.seeds),
        'batch size': str(c.batch_size),
        'token limits': f'{c.max_new_tokens} new tokens (buffer), prompts up to '
                        f'{c.max_prompt_len} in buckets of {c.prompt_bucket}',
        **dict(_tasks_text(c.tasks)),
        'data root': c.data_root or os.environ.get('SPEC_JAX_DATA') or 'the bundled samples',
        'commit': commit(),
    })  # fmt: skip
    return out


def header(
    fingerprint: str | None,
    load_start: tuple[float, float, float] | None = None,
    load_end: tuple[float, float, float] | None = None,
    **extra,
) -> dict:
    """The header of a report: 'cpu', 'cores' (usable by this process and in the machine;
    'usable_cores' the number),
    'devices' (jax's), 'jax' and 'spec_jax' versions, 'python', 'fingerprint' (the
    config's, `records.fingerprint`: the one resume checks), 'load_start' / 'load_end'
    (`load_average`; the end is read now unless given), and any `extra` items (e.g. AR's
    tokens/s on the first and last batch)."""
    usable = len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else None
    return dict(
        cpu=cpu_model(),
        cores=f'{usable} usable of {os.cpu_count()}' if usable else str(os.cpu_count()),
        usable_cores=usable or os.cpu_count(),
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


def load_warning(info: dict) -> str | None:
    """A warning when a load average at the start or end exceeded the usable cores (other
    work shared the CPUs: timings slower and noisier than the machine's), else None."""
    cores = info.get('usable_cores')
    if cores is None and str(info.get('cores', '')).split(' ')[0].isdigit():
        cores = int(str(info['cores']).split(' ')[0])
    loads = [x for key in ('load_start', 'load_end') for x in (info.get(key) or ())]
    if not cores or not loads or max(loads) <= cores:
        return None
    return (f'WARNING: load average {max(loads):.2f} exceeds the {cores} usable cores: other '
            'work shared the CPUs, so the timings are slower and noisier than this '
            "machine's")  # fmt: skip


def header_lines(info: dict) -> list[str]:
    """The header as markdown lines (a bullet per item; the config's `settings`, one
    `- name: value` line each; the load warning first when there is one, then any item
    whose text starts with 'WARNING')."""
    labels = dict(cpu='CPU', cores='cores', devices='JAX devices', jax='jax', spec_jax='spec_jax',
                  python='python', fingerprint='config fingerprint')  # fmt: skip
    warning = load_warning(info)
    lines = [f'- {warning}'] if warning else []
    # Other warnings (the drift monitor's, `spec_jax.eval.monitor`) next, then the items.
    warned = [k for k, v in info.items() if isinstance(v, str) and v.startswith('WARNING')]
    lines += [f'- {info[k]}' for k in warned]
    lines += [f'- {labels[k]}: {info[k] if info.get(k) is not None else "-"}' for k in labels
              if k in info]  # fmt: skip
    lines += [f'- load average at start: {_load_text(info.get("load_start"))}',
              f'- load average at end: {_load_text(info.get("load_end"))}']  # fmt: skip
    lines += [f'- {name}: {value}' for name, value in (info.get('settings') or {}).items()]
    for key, value in info.items():
        if key not in labels and key not in warned and key not in (
                'load_start', 'load_end', 'settings', 'usable_cores'):  # fmt: skip
            shown = f'{value:.1f}' if isinstance(value, float) else str(value)
            lines.append(f'- {key.replace("_", " ")}: {shown}')
    return lines + ['']
