"""Train a draft: `python launch/train_draft.py --config <config> --workdir <dir>`.

    python launch/train_draft.py --config configs/smollm2_135m_draft.py --workdir runs/draft
    python launch/train_draft.py --config configs/smollm2_135m_eagle3.py --workdir runs/e3
    python launch/train_draft.py --config configs/smollm2_135m_draft.py:tiny --workdir /tmp/t

Every stage resumes from the workdir: rerun the same command after a crash.
"""

from absl import app, flags
from ml_collections import config_flags

from spec_jax.jobs import runtime, train_draft

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Data, checkpoints, metrics and summary.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    runtime.enable_compilation_cache()
    train_draft.run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
    app.run(main)
