"""The claims job (configs/experiments/smollm2_135m_claims.py:tiny): its whole path on the
tiny random models, one line per claim; the floors' position kinds and derived floors."""

import os

import numpy as np
import pytest

from spec_jax.eval import floors, frontier
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
