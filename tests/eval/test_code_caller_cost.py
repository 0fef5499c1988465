"""The caller's work per sample is bounded (issue 40): extraction runs in the trusted scorer,
holding the GIL, on hostile text. Adversarial completions scored through the public API
(`HumanEval().score`, default data root and timeouts) each take under 1 s of the caller's CPU
time (`time.process_time` of the scoring process, every thread of it: the boxes are other
processes). Before: `' \\n'` x 16,000 before the body took 7 s (quadratic: x 500,000 would
take hours), 1 MB of code then 60 prose lines 31 s; a candidate that writes 16 MiB of `R 0`
report lines to its result channel (issue 46) 7.6-10.6 s and 266 MiB (every line decoded,
though the candidate box's reports are never used). Measured in a subprocess, so that a
regression fails at its timeout instead of stalling the suite."""

import json
import subprocess
import sys
import textwrap

import pytest
from test_sandbox import CI, FULL, REPO

pytestmark = pytest.mark.skipif(
    not FULL and not CI, reason='needs root, namespaces, cgroups and libseccomp'
)
BOUND_S = 1.0  # Caller CPU seconds per sample (a plain sample takes about 0.05 s).

_CALLER = r"""
import json, time
from spec_jax.eval.tasks import code
task = code.HumanEval()
item = task.load(limit=1)[0]
body = ('def has_close_elements(numbers, threshold):\n'
        '    return any(abs(a - b) < threshold for i, a in enumerate(numbers)\n'
        '               for b in numbers[i + 1:])\n')
helpers = ''.join(f'def helper_{i}(x):\n    return x + {i}\n\n' for i in range(24000))
prose = ''.join(f'This line {i} explains the solution above in plain words.\n' for i in range(60))
flood = ('import os\n'
         'for fd in range(3, 256):\n'
         '    try:\n'
         '        if "spec_jax_sbx_res" in os.readlink(f"/proc/self/fd/{fd}"):\n'
         '            os.write(fd, b"R 0\\n" * ((16 << 20) // 4 - 1024))\n'
         '    except OSError:\n'
         '        pass\n')
texts = {
    'blank lines x 500,000': ' \n' * 500_000 + body,
    'blank lines x 14,000': ' \n' * 14_000 + body,
    '1 MB of code then prose': body + helpers + prose,
    '16 MiB of report lines': flood + body,
}
task.score(item, body)  # One-time costs (the isolation probe, the private root's plan).
out = {}
for name, text in texts.items():
    start = time.process_time()
    score = task.score(item, text)
    out[name] = [time.process_time() - start, len(text), score.correct, score.detail['status']]
print(json.dumps(out))
"""


def test_adversarial_completions_cost_the_caller_under_a_second():
    proc = subprocess.run([sys.executable, '-c', textwrap.dedent(_CALLER)], capture_output=True,
                          text=True, timeout=180, cwd=REPO)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    print(out)
    assert all(seconds < BOUND_S for seconds, *_ in out.values()), out
    # The blank lines within the size cap still find the body; the code before the prose,
    # cut at the cap, is trimmed to what parses and still defines the function.
    assert out['blank lines x 14,000'][2] and out['1 MB of code then prose'][2], out
    assert out['16 MiB of report lines'][2:] == [True, 'ok'], out  # The flood ran, then passed.
