"""Train a DFlash drafter: `python launch/train_dflash.py --config <config> --workdir <dir>`.

    python launch/train_dflash.py --config configs/smollm2_135m_dflash.py --workdir runs/df
    python launch/train_dflash.py --config configs/smollm2_135m_dflash.py:tiny --workdir /tmp/d

The data stages resume from the workdir; training restarts.
"""

from absl import app, flags
from ml_collections import config_flags

from spec_jax.jobs import runtime, train_dflash

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Data, checkpoints, metrics and summary.')
flags.mark_flags_as_required(['config', 'workdir'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    runtime.enable_compilation_cache()
    train_dflash.run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
    app.run(main)
