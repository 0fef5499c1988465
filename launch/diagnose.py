"""Diagnose verification rules. Theory mode: distortion against draft quality, PNG + CSV.

python launch/diagnose.py --config=configs/diagnose.py --workdir=runs/diagnose
python launch/diagnose.py --config=configs/diagnose.py:tiny --workdir=/tmp/diag
"""

import os

import jax
from absl import app, flags, logging
from ml_collections import config_flags

from spec_jax.rules import theory

_DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'diagnose.py')
_CONFIG = config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'Diagnose config file.', lock_config=True
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def main(argv):
    del argv
    logging.info('jax %s, devices %s', jax.__version__, jax.devices())
    out = theory.run_diagnose(_CONFIG.value, _WORKDIR.value)
    for name, claim in out['claims'].items():
        logging.info('claim %s holds=%s', name, claim['holds'])
    logging.info('wrote %s', out['paths'])


if __name__ == '__main__':
    app.run(main)
