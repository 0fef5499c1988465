"""The claims job (configs/experiments/smollm2_135m_claims.py:tiny): its whole path on the
tiny random models, one line per claim; the floors' position kinds and derived floors."""

import os

import numpy as np
import pytest

from spec_jax.eval import claims as eval_claims
from spec_jax.eval import floors, frontier, verdicts
from spec_jax.jobs import claims, runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, 'configs', 'experiments', 'smollm2_135m_claims.py')

STATUSES = ('shown', 'not shown', 'cannot be tested here')


def test_tiny_job_prints_one_line_per_claim(tmp_path, capsys):
    out = claims.run(runtime.load_config(CONFIG, 'tiny'), str(tmp_path))
    printed = capsys.readouterr().out.splitlines()
    lines = [line for line in printed if line[:1] == 'C']
    assert any(line.startswith('frontier gap') and 'lenience:l=0.5' in line for line in printed)
    assert [line[:3] for line in lines] == [f'C{i}:' for i in range(1, 7)]
    for line in lines:
        assert line.split(': ')[1].startswith(STATUSES), line
    # 3 prompts: below the verdicts' minimum, so no claim is shown from them.
    assert not any(line.split(': ')[1] == 'shown' for line in lines)
    assert 'C1: not shown (too few items' in lines[0] and '3/3 prompts' in lines[0]
    assert lines[5].startswith('C6: cannot be tested here')
    for name in ('claims.md', 'claims.json', 'frontier.png'):
        assert os.path.exists(tmp_path / name), name
    text = (tmp_path / 'claims.md').read_text()
    assert '## The distortion frontier' in text and '## Floors at q = p' in text
    # At q = p the tree walk emits the argmax at every drafted position: its floor is
    # 1 - p_A(argmax) there, which the meter measures exactly where no limit cut a round.
    tree = next(f for f in out['floors'] if f['form'] == 'tree')
    assert tree['measured'] and len(tree['measured']) == len(tree['derived'])


def test_position_kinds():
    """The first token and bonus tokens are drawn from p; chain replacements are not."""
    chain = floors.position_kinds([3, 1, 0], num_draft=3, tree=False)
    assert chain.tolist() == [True, False, False, False, True, False, False, False]
    tree = floors.position_kinds([2, 0], num_draft=3, tree=True)
    assert tree.tolist() == [True, False, False, True, True]


def test_derived_floors_match_docs_laws():
    """docs/laws.md §3.2-3.3 at q = p: (1 - p(A))^2 at a chain draft, 1 - max p / p(A) at a
    tree node, 1 - p(A) where the law is p."""
    p = np.array([[0.5, 0.3, 0.15, 0.05]])  # rho 0.5: A = {0, 1}, p(A) = 0.8.
    for tree, drafted in ((False, 0.2**2), (True, 1 - 0.5 / 0.8)):
        got = floors.derived(np.repeat(p, 2, 0), 0.5, np.array([False, True]), tree)
        np.testing.assert_allclose(got, [drafted, 0.2], rtol=1e-6)


@pytest.mark.parametrize('arg', ['small', 'tiny,x'])
def test_bad_config_arg(arg):
    with pytest.raises(ValueError, match='unknown config arg'):
        runtime.load_config(CONFIG, arg)


def _stats(accepted, reached, tv_plain, drafted_metered):
    return dict(accepted=accepted, reached=reached, tv_plain_sum=tv_plain,
                metered_at_offset=[drafted_metered, 0, 0, 5])  # fmt: skip


def test_frontier_points_read_the_meter_per_prompt():
    """x = TV(pi, p) summed over drafted positions / their count; y = the rule's acceptance
    minus lossless SD's on the same prompt; gap = x - y."""
    res = []
    for item, (rule, plain) in enumerate([((8, 10, 1.0, 10), (5, 10)), ((6, 10, 0.5, 5), (4, 8))]):
        base = dict(task='speed_alpaca', item=str(item), seed=0)
        res.append(dict(base, method='lenience:l=0.5', stats=_stats(*rule)))
        res.append(dict(base, method='lossless', stats=_stats(*plain, 0.0, 1)))
    pts = frontier.points(res, ['lenience:l=0.5'], num_draft=3)['lenience:l=0.5']
    np.testing.assert_allclose(pts['x'], [0.1, 0.1])
    np.testing.assert_allclose(pts['y'], [0.3, 0.1])
    assert pts['gap']['mean'] == pytest.approx(-0.1) and pts['gap']['n'] == 2
    assert pts['exact']  # Lenience's bonus law is p: its bonus positions add no TV(pi, p).


def test_budget_rows_pick_the_budget_nearest_lenience():
    rows = [dict(method='lenience:l=0.5', rule='lenience', tv=0.05, tv_at_offset=[0.06, 0.0]),
            dict(method='cos:lam=0.4', rule='cos', tv=0.08),
            dict(method='tv_budget:eps=0.02,l=0.5', rule='tv_budget', tv=0.02),
            dict(method='tv_budget:eps=0.05,l=0.5', rule='tv_budget', tv=0.045)]  # fmt: skip
    out = frontier.budget_rows(rows)
    assert out['nearest'] == 'tv_budget:eps=0.05,l=0.5'
    assert len(out['table']) == 2 + 4 and '0.0600' in out['table'][2]
    assert frontier.budget_rows(rows[:2]) == {}


def test_budget_table_reads_delta_be_against_lossless_sd():
    rows = [dict(method='lenience:l=0.5', rule='lenience', tv=0.05, d_be=0.456, sd_d_be=0.123),
            dict(method='tv_budget:eps=0.05,l=0.5', rule='tv_budget', tv=0.045)]  # fmt: skip
    table = frontier.budget_rows(rows)['table']
    assert 'ΔBE vs lossless SD' in table[0]
    assert '+0.123' in table[2] and '+0.456' not in table[2]


def test_fmt_ci_and_bonus_law():
    m = frontier.mean_interval([1.0, 2.0, 3.0])
    assert frontier.fmt_ci(m, '.2f') == '2.00 [-0.48, 4.48]'
    assert frontier.fmt_ci(frontier.mean_interval([]), '.2f') == '-'
    assert frontier.bonus_is_target('minp_verify:rho=0.1')
    assert not frontier.bonus_is_target('greedy')  # Its bonus is the argmax, not p.


def test_floor_rules_must_be_min_p():
    claims.check_floor_rules(('minp_verify:rho=0.1', 'minp_verify:rho=0.3'))
    with pytest.raises(ValueError, match="'eta_verify:eta=0.05' is not a minp_verify rule"):
        claims.check_floor_rules(('minp_verify:rho=0.1', 'eta_verify:eta=0.05'))


def _c5_row(method):
    # 12 items (24 item-seed pairs); the interval excludes 0 just: p a little under 0.05.
    return dict(method=method, kind='lossy', rule=method.split(':')[0], flattery_be=0.05,
                flattery_be_lo=0.001, flattery_be_hi=0.099, pair_n=24, pair_n_items=12)  # fmt: skip


def test_c5_is_judged_in_the_holm_family(tmp_path):
    """Two C5 tests each at p just under 0.05: above 0 alone, not under Holm over both
    (and the other claims' tests); n is the items, not the item-seed pairs."""
    rows = [_c5_row('minp_verify:rho=0.1'), _c5_row('eta_verify:eta=0.05')]
    arm = dict(rows=rows, results=[], num_draft=3)
    data = dict(arms=dict(chain=arm, tree=dict(arm, rows=[])), floors=[], tree_branch=2,
                greedy=dict(tokens=dict(ar=[], chain=[], tree=[]), n=0))  # fmt: skip
    out = eval_claims.evaluate(data, str(tmp_path))
    c5 = out['claims']['C5']
    assert c5['status'] == 'not shown' and 'above' not in c5['text'], c5
    assert c5['text'].count('not distinguishable from 0; n 12 items') == 2, c5
    alone = verdicts.judge([data['_c5'][0][1]])
    assert alone.verdicts[('c5', 'minp_verify:rho=0.1')] == 'above 0'
