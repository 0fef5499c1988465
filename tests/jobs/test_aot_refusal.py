"""launch/aot.py refuses a plan over the chip's HBM in one line with the numbers (exit
status 1), not a ValueError traceback: a dry run, so nothing compiles and no libtpu."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_a_plan_over_the_hbm_is_refused_in_one_line():
    args = ['--config', 'configs/smollm2_135m.py:tiny', '--config.model=random:llama3_1_8b',
            '--config.dtype=float32', '--config.mesh.data=4', '--config.mesh.model=1',
            '--topology', 'v5e:2x2', '--prompt_len', '64', '--dry_run']  # fmt: skip
    run = subprocess.run([sys.executable, 'launch/aot.py', *args], cwd=ROOT,
                         capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 1, run.stderr
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run.stderr
    want = (
        r'refused: ar on v5e \(mesh data 4 x model 1\) \(estimate\) needs [\d.]+ GiB '
        r'per v5e chip, over its 16.00 GiB HBM: use .*'
    )  # Llama's fp32 weights: 30 GB.
    assert re.fullmatch(want, lines[0]), lines[0]
    assert 'HBM v5e' in run.stdout  # The estimate's table, printed before the refusal.
