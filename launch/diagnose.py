"""Diagnose verification rules. Theory mode: distortion against draft quality, PNG + CSV.

python launch/diagnose.py --config=configs/diagnose.py --workdir=runs/diagnose
python launch/diagnose.py --config=configs/diagnose.py:tiny --workdir=/tmp/diag
"""

import os

from absl import app, flags, logging
from ml_collections import config_flags

from spec_jax.jobs import diagnose, runtime

_DEFAULT_CONFIG = os.path.join(os.path.dirname(__file__), '..', 'configs', 'diagnose.py')
_CONFIG = config_flags.DEFINE_config_file(
    'config', _DEFAULT_CONFIG, 'Diagnose config file.', lock_config=True
)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Output directory.', required=True)


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    runtime.log_devices()
    out = diagnose.run(_CONFIG.value, _WORKDIR.value)
    for name, claim in out['claims'].items():
        logging.info('claim %s holds=%s', name, claim['holds'])
    logging.info('wrote %s', out['paths'])


if __name__ == '__main__':
    app.run(main)
