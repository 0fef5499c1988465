"""Benchmark: `python launch/bench.py --config configs/bench.py`."""

from absl import app, flags
from ml_collections import config_flags

from spec_jax.jobs import bench, runtime

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where to write bench.json (optional).')
flags.mark_flags_as_required(['config'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    c = _CONFIG.value
    runtime.enable_compilation_cache(c.get('compilation_cache') or None)  # 'off': none.
    bench.run(c, _WORKDIR.value)


if __name__ == '__main__':
    app.run(main)
