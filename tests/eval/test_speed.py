"""SPEED-Bench-shaped speed fields (spec_jax/eval/speed.py) against hand-computed values, and
their table: the matched baseline and TV beside a lossy row, 'too few to judge' under n 2."""

import pytest
from scipy import stats

from spec_jax.eval import speed


def request(emitted, blocks, accepted_at, reached_at, tokens, call, seconds, prefill_s, **kw):
    return dict(emitted=emitted, blocks=blocks, accepted_at=accepted_at, reached_at=reached_at,
                tokens=tokens, call=call, seconds=seconds, prefill_s=prefill_s,
                metered=kw.get('metered', 0), tv_sum=kw.get('tv_sum'))  # fmt: skip


# Two calls: A (1.0 s, prefill 0.2) with two requests, B (2.0 s, prefill 0.4) with one.
REQUESTS = [
    request(6, 2, [2, 1], [2, 2], 5, 'A', 1.0, 0.2, metered=6, tv_sum=0.3),
    request(3, 3, [0, 0], [3, 0], 3, 'A', 1.0, 0.2),
    request(4, 2, [1, 1], [2, 1], 9, 'B', 2.0, 0.4),
]


def test_fields_by_hand():
    f = speed.fields(REQUESTS)
    t2, t1 = stats.t.ppf(0.975, 2), stats.t.ppf(0.975, 1)
    # Acceptance length pooled (13 tokens / 7 forwards); its interval from the requests' own
    # lengths 3, 1, 2 (sd 1).
    assert f['acceptance_length'] == pytest.approx(13 / 7)
    assert f['acceptance_length_half'] == pytest.approx(t2 / 3**0.5)
    assert f['acceptance_length_n'] == 3
    # P(accept at k | accepted before k): position 1 reached 7 times, 3 accepted; position 2
    # reached 3 times (the second request never got there), 2 accepted.
    assert f['position_acceptance_at'] == pytest.approx([3 / 7, 2 / 3])
    assert f['position_rounds'] == [7, 3] and f['position_requests'] == 3
    # TTFT: each call's prefill once (0.2, 0.4); TPOT: per request 0.8/4, 0.8/2, 1.6/8,
    # its interval over the calls' means (0.3, 0.2).
    assert (f['ttft_s'], f['ttft_n']) == (pytest.approx(0.3), 2)
    assert f['ttft_half'] == pytest.approx(t1 * 0.1)
    assert f['tpot_s'] == pytest.approx(0.8 / 3)
    assert f['tpot_half'] == pytest.approx(t1 * 0.05) and f['tpot_n'] == 2
    assert f['tpot_requests'] == 3
    # TV from the one metered request: 0.3 over 6 positions, too few for an interval.
    assert f['tv'] == pytest.approx(0.05) and f['tv_n'] == 1 and f['tv_half'] is None
    ar = speed.fields(REQUESTS, spec=False)
    assert ar['acceptance_length'] is None and ar['position_acceptance_at'] is None
    assert ar['tpot_s'] == pytest.approx(f['tpot_s'])


def test_table_puts_the_matched_baseline_and_tv_beside_a_lossy_rule():
    fields = speed.fields(REQUESTS)
    rows = [
        dict(task='speed', method='ar', kind='ar', pairs=[], **speed.fields(REQUESTS, False)),
        dict(task='speed', method='lenience', kind='lossy', pairs=['base'], **fields),
        dict(task='speed', method='base', kind='baseline', pairs=[],
             **dict(fields, acceptance_length=1.5, tpot_s=0.25, tv=None)),
    ]  # fmt: skip
    lines = speed.section(rows)
    assert lines[0] == "## Speed in the field's terms"
    table = [line for line in lines if line.startswith('|')]  # Header, rule, 3 rows.
    assert len(table) == 5 and {line.count('|') for line in table} == {len(speed.HEADER) + 1}
    body = {line.split(' | ')[0].strip('| `'): line.split(' | ') for line in lines
            if line.startswith('| `')}  # fmt: skip
    assert body['lenience'][-1] == 'base: 1.50 / 250.00 |'
    assert body['lenience'][-2] == '0.0500 (n 1: too few to judge)'
    assert body['base'][-2] == '0 (emits p_A)' and body['ar'][2] == '-'
    assert body['lenience'][3].startswith('0.43/0.67 (± <= ')
    assert body['lenience'][4] == f'300.0 ± {1e3 * stats.t.ppf(0.975, 1) * 0.1:.1f} (n 2)'
    # An older metrics.csv without the fields: no section.
    assert speed.section([dict(task='speed', method='ar', kind='ar')]) == []
    assert speed.text(0.3, None, 1) == '0.30 (n 1: too few to judge)'
