"""The paper's six claims on the embedded default, one verdict line each (docs/claims.md).

    python launch/claims.py --config configs/experiments/smollm2_135m_claims.py
    python launch/claims.py --config configs/experiments/smollm2_135m_claims.py:tiny \
        --workdir /tmp/claims_tiny

A killed run restarted with the same command resumes its evaluations (docs/eval.md).
"""

import os

from absl import app, flags
from ml_collections import config_flags

from spec_jax.jobs import claims, runtime

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Claims config.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Results and claims.md (default runs/<name>).')
flags.mark_flags_as_required(['config'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    c = _CONFIG.value
    runtime.enable_compilation_cache(c.compilation_cache or None)
    claims.run(c, _WORKDIR.value or os.path.join('runs', c.name))


if __name__ == '__main__':
    app.run(main)
