"""Evaluate rules against matched baselines on tasks, then write the report.

    python launch/evaluate.py --config configs/experiments/smollm2_135m.py
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py --dry_run
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py:tiny \
        --workdir /tmp/eval_tiny

A killed run restarted with the same command finishes what is missing (docs/eval.md).

On several hosts (a TPU pod slice, GPU nodes: launch/tpu/, launch/gpu/) every host runs
the same command with a shared --workdir; each process takes its share of the samples and
process 0 merges the results and writes the report (spec_jax/distributed.py):

    python launch/evaluate.py --config ... --workdir /shared/run --coordinator auto
    python launch/evaluate.py --config ... --workdir /shared/run \
        --coordinator 10.0.0.2:8476 --num_processes 2 --process_id 1
"""

import os

from absl import app, flags
from ml_collections import config_flags

from spec_jax import distributed
from spec_jax.eval import sandbox
from spec_jax.jobs import evaluate, runtime

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Results and report (default runs/<name>).')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the plan and sample counts; run nothing.')
_COORDINATOR = flags.DEFINE_string(
    'coordinator', '', "Several processes: process 0's host:port, or 'auto' (TPU pods, "
    f'SLURM); default ${distributed.ENV_COORDINATOR}, else one process.'
)  # fmt: skip
_NUM_PROCESSES = flags.DEFINE_integer(
    'num_processes', 0, f'With --coordinator host:port (default ${distributed.ENV_NUM_PROCESSES}).'
)
_PROCESS_ID = flags.DEFINE_integer(
    'process_id', -1, f'With --coordinator host:port (default ${distributed.ENV_PROCESS_ID}).'
)
_WEAK_SANDBOX = flags.DEFINE_bool(
    'weak_sandbox', False, 'Score code samples even where the sandbox lacks a layer '
    f'(namespaces, cgroups, seccomp; docs/sandbox.md); default ${sandbox.WEAK_ENV}.'
)  # fmt: skip
flags.mark_flags_as_required(['config'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    c = _CONFIG.value
    if _DRY_RUN.value:
        print(evaluate.dry_run(c))
        return
    if _WEAK_SANDBOX.value:
        sandbox.ALLOW_WEAK = True  # The user's opt-in to the weaker box (docs/sandbox.md).
    distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    runtime.enable_compilation_cache(c.compilation_cache or None)
    evaluate.run(c, _WORKDIR.value or os.path.join('runs', c.name))


if __name__ == '__main__':
    app.run(main)
