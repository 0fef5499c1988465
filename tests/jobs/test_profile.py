"""The jobs' `profile_dir` option (spec_jax/jobs/profile.py): at ':tiny' the generate job
writes a trace of `profile_rounds` rounds of AR and of its chain after a warm-up, each
round a step of its own in the trace (the evaluate and bench jobs call the same
`profile_rounds`; their ':tiny' configs were traced by hand, not here: suite time)."""

import collections
import glob
import gzip
import json
import os

import pytest

from spec_jax import decoding
from spec_jax.jobs import generate, profile
from spec_jax.jobs.runtime import load_config
from spec_jax.testing import tiny

CONFIGS = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(__file__))), 'configs')


def _rounds_in_trace(where: str) -> collections.Counter:
    """Each '<engine> round' step's count in the Perfetto trace beside the XProf one."""
    assert glob.glob(os.path.join(where, '*.xplane.pb'))
    with gzip.open(os.path.join(where, 'perfetto_trace.json.gz')) as f:
        events = json.load(f)
    events = events['traceEvents'] if isinstance(events, dict) else events
    return collections.Counter(e['name'] for e in events if e.get('name', '').endswith(' round'))


def test_generate_writes_a_trace_of_the_rounds(tmp_path, capsys):
    c = load_config(os.path.join(CONFIGS, 'smollm2_135m_chain.py'), 'tiny')
    c.profile_dir, c.profile_rounds = str(tmp_path / 'profile'), 3
    generate.run(c)
    (where,) = glob.glob(str(tmp_path / 'profile' / 'plugins' / 'profile' / '*'))
    assert _rounds_in_trace(where) == {'ar round': 3, 'chain round': 3}
    assert f'profile: 3 rounds of ar, chain after a warm-up round, batch 3: {where}' in (
        capsys.readouterr().out
    )


def test_rounds_beyond_the_output_buffer_are_refused(tmp_path):
    ar = decoding.Engine(tiny.TARGET, tiny.DECODE)  # 20 new tokens in a bucket of 24.
    with pytest.raises(ValueError, match=r'profile_rounds=23: ar holds 1\.\.22 rounds'):
        profile.profile_rounds({'ar': ar}, None, tiny.PROMPTS, str(tmp_path), 23)
