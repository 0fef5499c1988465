"""Generate text: `python launch/generate.py --config configs/smollm2_135m.py`."""

from absl import app, flags
from ml_collections import config_flags

from spec_jax.jobs import generate, runtime

_CONFIG = config_flags.DEFINE_config_file('config', None, 'Config file.', lock_config=True)
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where to write generations.jsonl (resumable).')
flags.mark_flags_as_required(['config'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    runtime.enable_compilation_cache()
    generate.run(_CONFIG.value, _WORKDIR.value)


if __name__ == '__main__':
    app.run(main)
