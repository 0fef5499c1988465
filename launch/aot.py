"""Compile a config's decode loops for a TPU topology on this machine (no TPU, no weights):

    python launch/aot.py --config configs/smollm2_135m_chain.py:tiny --topology v5e:2x2
    python launch/aot.py --config configs/experiments/qwen25_72b_chain.py:v5p \
        --topology v5p:2x2x2 --block_efficiency 3.5 --workdir /tmp/aot
    python launch/aot.py --config configs/experiments/llama31_8b_eagle3.py:h100 \
        --device h100 --dry_run

Prints per chip the memory estimate, memory_analysis(), the compile time, the loop body's
collectives and the round's roofline (spec_jax/jobs/aot.py). Needs libtpu for the compile
(`pip install 'jax[tpu]==<the installed jax>'`); --dry_run only estimates. A plan over the
chip's HBM is refused in one line with the numbers (exit status 1; --force compiles it).
"""

import sys

from absl import app, flags
from ml_collections import config_flags

from spec_jax.costs import memory
from spec_jax.jobs import aot

_CONFIG = config_flags.DEFINE_config_file('config', None, 'A decode config.', lock_config=True)
_TOPOLOGY = flags.DEFINE_string('topology', 'v5e:2x2', 'TPU topology: v5e:2x2, v5p:2x2x1, ...')
_DEVICE = flags.DEFINE_string('device', '', "Estimate for this chip instead ('h100', 'v5e').")
_MODES = flags.DEFINE_list('modes', [], "'ar' and/or the config's mode (default both).")
_BLOCK = flags.DEFINE_float('block_efficiency', 3.0, 'Tokens per SD round, for the speedup.')
_DRY_RUN = flags.DEFINE_bool('dry_run', False, 'The memory estimate only; nothing compiles.')
_FORCE = flags.DEFINE_bool('force', False, 'Compile a plan the estimate puts over the HBM.')
_PROMPT_LEN = flags.DEFINE_integer('prompt_len', 0, 'Prompt bucket to compile (0: the longest).')
_ROUNDS = flags.DEFINE_bool('rounds', True, 'Also compile one round per mode (the roofline).')
_WORKDIR = flags.DEFINE_string('workdir', None, 'Where to write aot.json (optional).')
flags.mark_flags_as_required(['config'])


def main(argv):
    if len(argv) > 1:
        raise app.UsageError(f'unexpected arguments: {argv[1:]}')
    try:
        aot.run(
            _CONFIG.value,
            _WORKDIR.value,
            topology=_TOPOLOGY.value,
            device=_DEVICE.value,
            modes=tuple(_MODES.value),
            block_efficiency=_BLOCK.value,
            dry_run=_DRY_RUN.value,
            force=_FORCE.value,
            prompt_len=_PROMPT_LEN.value,
            rounds=_ROUNDS.value,
        )
    except memory.OverHBM as e:  # One line with the numbers, not a traceback.
        sys.exit(f'refused: {e}')


if __name__ == '__main__':
    app.run(main)
