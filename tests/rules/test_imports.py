"""spec_jax.rules and spec_jax.sampling import without flax (jax only)."""

import subprocess
import sys


def test_rules_and_sampling_do_not_import_flax():
    code = (
        'import sys; import spec_jax.rules, spec_jax.sampling; '
        "bad = [m for m in ('flax', 'optax', 'orbax', 'matplotlib') if m in sys.modules]; "
        'assert not bad, bad'
    )
    subprocess.run([sys.executable, '-c', code], check=True)
