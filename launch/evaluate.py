"""Evaluate rules against matched baselines on tasks, then write the report.

    python launch/evaluate.py --config configs/experiments/smollm2_135m.py
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py --dry_run
    python launch/evaluate.py --config configs/experiments/smollm2_135m.py:tiny \
        --workdir /tmp/eval_tiny

A killed run restarted with the same command finishes what is missing (docs/eval.md).
"""

import os

from absl import app, flags
from ml_collections import config_flags

from spec_jax.jobs import common, evaluate

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Experiment config.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Results and report (default runs/<name>).')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'Print the plan and sample counts; run nothing.')
flags.mark_flags_as_required(['config'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    c = _CONFIG.value
    if _DRY_RUN.value:
        print(evaluate.dry_run(c))
        return
    common.enable_compilation_cache(c.compilation_cache or None)
    evaluate.run(c, _WORKDIR.value or os.path.join('runs', c.name))


if __name__ == '__main__':
    app.run(main)
