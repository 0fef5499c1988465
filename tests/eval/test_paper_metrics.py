"""The paper's metrics (docs/paper.md §3) against hand-computed values on constructed logs:
chain BE over full blocks and DS on a 3-round log with one round cut by a stop token and
one by the token limit; the per-position acceptance; avg@k / pass@k over seeds; scorer
failures counted by kind."""

from __future__ import annotations

import math

import jax.numpy as jnp
import pytest

from spec_jax import rules
from spec_jax.decoding.state import uncut_draft
from spec_jax.decoding.stats import Stats, summarize
from spec_jax.eval import metrics, outcomes, plan, runner

GAMMA, STOP = 3, 2


def chain_result(num_accepted: list[int]) -> rules.ChainResult:
    """A round of GAMMA drafts per row with `num_accepted` accepted (tokens irrelevant)."""
    n_b = jnp.asarray(num_accepted, jnp.int32)
    pos = jnp.arange(GAMMA)[None, :]
    return rules.ChainResult(
        num_accepted=n_b,
        tokens=jnp.zeros((len(num_accepted), GAMMA + 1), jnp.int32),
        accepted=pos < n_b[:, None],
        num_emitted=n_b + 1,
        accept_probs=jnp.zeros((len(num_accepted), GAMMA), jnp.float32),
        reached=pos <= jnp.minimum(n_b, GAMMA - 1)[:, None],
        final_token=jnp.zeros(len(num_accepted), jnp.int32),
    )


# Two rows, three rounds: (drafts per row, room per row, accepted per row). Row 0's second
# round drafts the stop token (not a full block, whatever it accepted); row 1's third round
# has room for 3 tokens only (< GAMMA + 1: the limit cuts the draft).
ROUNDS = (
    ([[5, 6, 7], [5, 6, 7]], [50, 50], [2, 3]),
    ([[8, STOP, 9], [4, 4, 4]], [47, 46], [1, 0]),
    ([[4, 4, 4], [9, 9, 9]], [45, 3], [3, 1]),
)
SECONDS = (0.5, 0.25)  # Each row's share of its batch's decode time.
TOKENS = (9, 8)


@pytest.fixture(scope='module')
def per_row():
    st = Stats.zeros(2, GAMMA, 8)
    live = jnp.ones(2, bool)
    for drafts, room, accepted in ROUNDS:
        full = uncut_draft(jnp.asarray(drafts), (STOP,), jnp.asarray(room), GAMMA)
        st = st.update(chain_result(accepted), live, full_b=full)
    return summarize(st)['per_row']


def result_lines(per_row, method='lossless'):
    """The runner's result lines of the two rows (its stats fields, `runner.PER_ROW_STATS`)."""
    return [
        dict(method=method, task='gsm8k', item=str(b), seed=0, correct=True,
             num_tokens=TOKENS[b], seconds=SECONDS[b],
             stats={k: per_row[k][b] for k in runner.PER_ROW_STATS if k in per_row})
        for b in range(2)
    ]  # fmt: skip


def test_full_blocks_leave_out_cut_drafts(per_row):
    assert per_row['full_blocks'] == [2, 2]  # Row 0: rounds 1 and 3; row 1: rounds 1 and 2.
    assert per_row['full_accepted'] == [2 + 3, 3 + 0]
    assert per_row['full_drafted'] == [2 * GAMMA, 2 * GAMMA]
    assert per_row['blocks'] == [3, 3] and per_row['drafted'] == [9, 9]


def test_full_block_be_and_ds(per_row):
    methods = plan.plan([], 'chain')
    (row,) = [r for r in metrics.aggregate(result_lines(per_row), methods)]
    # Full blocks: row 0 accepted 2 and 3, row 1 accepted 3 and 0 -> (3 + 4 + 4 + 1) / 4.
    assert row['be_full_gamma'] == pytest.approx((3 + 4 + 4 + 1) / 4)
    # Every round: emitted (3 + 2 + 4) + (4 + 1 + 2) over 6 rounds -- not the paper's BE.
    assert row['block_efficiency'] == pytest.approx(16 / 6)
    assert row['full_fraction'] == pytest.approx(4 / 6)
    # DS: gamma x full blocks / decode seconds = 3 x 4 / 0.75.
    assert row['ds'] == pytest.approx(GAMMA * 4 / 0.75)
    assert row['tokens_per_s'] == pytest.approx(17 / 0.75)
    # Per-position acceptance: accepted 10 over reached (3 + 2 + 3) + (3 + 1 + 2) = 14,
    # beside accepted / drafted = 10 / 18.
    assert row['position_acceptance'] == pytest.approx(10 / 14)
    assert row['acceptance_rate'] == pytest.approx(10 / 18)


def test_uncut_draft():
    drafts = jnp.asarray([[1, 1], [1, STOP], [1, 1], [1, 1]])
    room = jnp.asarray([3, 3, 2, 100])
    assert uncut_draft(drafts, (STOP,), room, 2).tolist() == [True, False, False, True]
    assert uncut_draft(drafts, (), room, 2).tolist() == [True, True, False, True]


def test_older_result_lines_have_no_ds():
    """Result lines written before the full-block counters: DS and the per-position
    acceptance are unknown (None), not computed from missing counters."""
    stats = dict(blocks=2, drafted=4, accepted=2, emitted=4, full_blocks=2, full_accepted=2)
    lines = [dict(method='lossless', task='t', item='0', seed=0, correct=True, num_tokens=4,
                  seconds=1.0, stats=stats)]  # fmt: skip
    (row,) = metrics.aggregate(lines, plan.plan([], 'chain')[1:])
    assert row['ds'] is None and row['position_acceptance'] is None and row['js'] is None


def test_avg_and_pass_at_k_over_seeds():
    # Three items, three seeds each: 3, 1 and 0 correct.
    per_item = {'a': [True, True, True], 'b': [False, True, False], 'c': [False] * 3}
    out = outcomes.over_seeds(per_item)
    assert out['seeds_k'] == 3
    assert out['avg_at_k'] == pytest.approx((1 + 1 / 3 + 0) / 3)
    # pass@3 from 3 samples: 1 iff any is correct.
    assert out['pass_at_k'] == pytest.approx(2 / 3)
    # Four samples of 'b' (one correct), k = 3: pass@3 = 1 - C(3, 3) / C(4, 3) = 3/4.
    out = outcomes.over_seeds({'a': [True] * 3, 'b': [False, True, False, False]})
    assert out['pass_at_k'] == pytest.approx((1 + (1 - math.comb(3, 3) / math.comb(4, 3))) / 2)
    assert out['avg_at_k'] == pytest.approx((1 + 1 / 3) / 2)  # 'b''s first three seeds.
    assert outcomes.over_seeds({'a': [True], 'b': [True, False]})['pass_at_k'] is None


def test_scorer_failures_counted_by_kind():
    details = [
        {'error': "ValueError('bad gold')"},  # runner._scored: the scorer raised.
        {'method': 'boxed', 'timeout': True, 'timeout_s': 10.0},  # math-verify's deadline.
        {'status': 'timeout', 'returncode': -9, 'seconds': 10.0},  # The sandbox's deadline.
        {'status': 'error', 'error': 'no isolation available'},  # The sandbox itself.
        {'error': "WorkerStartError('fork failed')"},  # The scorer's worker never started.
        {'status': 'failed', 'returncode': 1},  # The candidate's own failure: a wrong answer.
        {'error_type': 'type_error', 'errors': ['x']},  # BFCL's checker: a wrong answer.
        {},
    ]
    lines = [dict(method='lossless', task='t', item=str(i), seed=0, correct=False, num_tokens=1,
                  seconds=1.0, stats={}, detail=d) for i, d in enumerate(details)]  # fmt: skip
    (row,) = metrics.aggregate(lines, plan.plan([], 'chain')[1:])
    assert (row['n_scorer_errors'], row['n_timeouts'], row['n_infra_errors']) == (1, 2, 2)
    assert row['failed_samples'] == ['0@0: scorer_error', '1@0: timeout', '2@0: timeout',
                                     '3@0: infra', '4@0: infra']  # fmt: skip
    assert row['score'] == 0.0  # Failures count as wrong answers.
