"""The claims job (configs/experiments/smollm2_135m_claims.py:tiny): its whole path on the
tiny random models, one line per claim; the floors' position kinds and derived floors."""

import os
import re

import numpy as np
import pytest

from spec_jax import checkpoints
from spec_jax.eval import claims as eval_claims
from spec_jax.eval import floors, frontier
from spec_jax.eval.stats import verdicts
from spec_jax.jobs import claims, runtime

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, 'configs', 'experiments', 'smollm2_135m_claims.py')

STATUSES = ('shown', 'not shown', 'cannot be tested here')
VERDICT = r'(above|below) [01]\b|not distinguishable from|flatters it|understates it'


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
    assert 'DFlash chain = AR on 3/3, DDTree = AR on 3/3' in lines[0], lines[0]
    # C3 asked of DDTree against the DFlash drafter's chain, in the job's one family.
    assert f'{RULE} DDTree - DFlash chain TV per prompt' in lines[2], lines[2]
    assert 'C3 DDTree - DFlash chain TV per truncation rule (1)' in out['composition']
    assert lines[5].startswith('C6: cannot be tested here')
    for name in ('claims.md', 'claims.json', 'frontier.png'):
        assert os.path.exists(tmp_path / name), name
    text = (tmp_path / 'claims.md').read_text()
    assert '## The distortion frontier' in text and '## Floors at q = p' in text
    assert 'one Holm family for the job' in text
    # One family per job: the arm reports print tables and intervals, no verdict.
    for arm in ('chain', 'tree', 'dflash_chain', 'ddtree'):
        report = (tmp_path / arm / 'report' / 'report.md').read_text()
        assert "the verdicts are the claims job's" in report
        assert not re.search(VERDICT, report), re.search(VERDICT, report)
    # The frontier from the rule's own drafted positions: the overlap meter reached the rows.
    assert out['frontier']['lenience:l=0.5']['gap']['n'] == 3
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


def test_frontier_points_read_the_rules_own_drafted_positions():
    """x = TV(pi, p) summed over the drafted positions / their count; y = the rule's
    acceptance there minus the metered sum min(p, q) at the same positions (no second
    decoding); gap = x - y; a prompt without the overlap meter is left out."""
    stats = [dict(accepted=8, reached=10, tv_plain_sum=1.0, overlap_sum=6.0),
             dict(accepted=3, reached=5, tv_plain_sum=0.5, overlap_sum=2.5),
             dict(accepted=3, reached=5, tv_plain_sum=0.5)]  # fmt: skip
    res = [dict(task='speed_alpaca', item=str(i), seed=0, method='lenience:l=0.5', stats=st)
           for i, st in enumerate(stats)]  # fmt: skip
    pts = frontier.points(res, ['lenience:l=0.5'])['lenience:l=0.5']
    np.testing.assert_allclose(pts['x'], [0.1, 0.1])
    np.testing.assert_allclose(pts['y'], [0.2, 0.1])
    assert pts['gap']['mean'] == pytest.approx(-0.05) and pts['gap']['n'] == 2
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




# ---- the claims on constructed arms (12 prompts: above verdicts.MIN_ITEMS) ------------------

N = 12
RULE, MATCHED = 'minp_verify:rho=0.1', 'minp_sd:rho=0.1'
VERDICT_WORDS = ('above', 'below', 'distinguishable', 'flatters', 'understates')


def _results(method, tv, correct=None):
    return [dict(task='speed_alpaca', item=str(i), seed=0, method=method,
                 stats=dict(tv_sum=10 * tv(i), metered=10),
                 **({} if correct is None else dict(correct=correct(i))))
            for i in range(N)]  # fmt: skip


def _data(tree_gain=0.1, chain_floor=0.0, plain_correct=None, matched_correct=None,
          ddtree_gain=None):
    """A chain and a tree arm of one min-p rule on the same prompts (tree TV = chain TV +
    `tree_gain`, per-prompt noise), lossless SD metering 0, greedy equal, and the q = p
    floors with the chain's at `chain_floor` on every prompt. With `ddtree_gain`, the
    DFlash arms too: its chain's TV 0.2 above the head's chain, DDTree's `ddtree_gain` above
    its own chain's."""
    row = dict(method=RULE, kind='lossy', rule='minp_verify', pairs=[MATCHED], n_items=N,
               d_be=0.1, d_be_lo=0.0, d_be_hi=0.2, sd_d_be=0.3, sd_d_be_lo=0.2, sd_d_be_hi=0.4,
               flattery_be=0.2, flattery_be_lo=0.1, flattery_be_hi=0.3)  # fmt: skip
    chain_tv = lambda i: 0.05 + 0.002 * i  # noqa: E731
    tree_tv = lambda i: chain_tv(i) + tree_gain + 0.003 * (i % 3 - 1)  # noqa: E731
    chain = _results(RULE, chain_tv) + _results('lossless', lambda i: 0.0, plain_correct)
    if matched_correct is not None:
        chain += _results(MATCHED, lambda i: 0.0, matched_correct)
    tree = _results(RULE, tree_tv) + _results('lossless', lambda i: 0.0)
    floors = [dict(rule=RULE, form='chain', keys=list(range(N)), measured=[chain_floor] * N,
                   derived=[chain_floor] * N),
              dict(rule=RULE, form='tree', keys=list(range(N)),
                   measured=[0.15 + 0.01 * (i % 4) for i in range(N)],
                   derived=[0.15 + 0.01 * (i % 4) for i in range(N)])]  # fmt: skip
    arms = dict(chain=dict(rows=[row], results=chain, num_draft=3),
                tree=dict(rows=[row], results=tree, num_draft=4))
    tokens = dict(ar=[[1]] * N, chain=[[1]] * N, tree=[[1]] * N)
    if ddtree_gain is not None:
        df_tv = lambda i: chain_tv(i) + 0.2 + 0.001 * (i % 2)  # noqa: E731
        dd_tv = lambda i: df_tv(i) + ddtree_gain + 0.003 * (i % 3 - 1)  # noqa: E731
        arms['dflash_chain'] = dict(rows=[row], num_draft=3, results=_results(RULE, df_tv)
                                    + _results('lossless', lambda i: 0.0))  # fmt: skip
        arms['ddtree'] = dict(rows=[row], num_draft=4, results=_results(RULE, dd_tv)
                              + _results('lossless', lambda i: 0.0))  # fmt: skip
        tokens.update(dflash_chain=[[1]] * N, ddtree=[[1]] * N)
    return dict(arms=arms, floors=floors, tree_branch=2, greedy=dict(tokens=tokens, n=N))


@pytest.mark.parametrize('tree_gain, status', [(0.1, 'shown'), (0.0, 'not shown (1 of 2')])
def test_c3_paired_with_a_vanishing_chain_floor(tmp_path, tree_gain, status):
    """Strong amplification and a chain floor of exactly 0 at q = p read 'shown' (the floor's
    vanishing is no condition); the tree-chain differences at q = p and per rule are the
    family's only C3 tests. Without amplification only the q = p comparison is above 0."""
    data = _data(tree_gain)
    out = eval_claims.evaluate(data, str(tmp_path))
    c3 = out['claims']['C3']
    assert c3['status'].startswith(status), c3
    keys = [t.key for t in verdicts.judge([v[0] for v in data['_amplification'].values()]
                                          + [t for t, _ in data['_floors'].values()]).tests]
    assert keys == [('c3', 'tree - chain', RULE), ('c3', 'q = p tree - chain', RULE)]
    assert 'Holm p' in c3['text'] and 'q = p' in c3['text']
    assert 'C3 tree - chain TV per truncation rule (1)' in out['composition']
    assert 'C3 q = p tree - chain TV per floor rule (1)' in out['composition']


def test_by_construction_lines_stay_out_of_the_family(tmp_path):
    """C1's metered TV, C2, C3's floors and C4 are closed forms at the visited contexts:
    labelled so, no p-value, and the family holds only the paired C3 tests (C5 untestable:
    the arms are unscored)."""
    data = _data()
    out = eval_claims.evaluate(data, str(tmp_path))
    claims_ = out['claims']
    assert claims_['C1']['status'] == 'shown' and 'by construction' in claims_['C1']['text']
    assert claims_['C2']['status'] == 'shown by construction', claims_['C2']
    assert 'p ' not in claims_['C2']['text'].replace('p(A)', '').replace('p_A', '')
    assert out['family'].startswith('2 comparisons'), out['family']
    assert "by construction (closed forms at the visited contexts, cannot fail): C1's metered " \
           "TV, C2, C3's floors, C4" in out['composition']  # fmt: skip


@pytest.mark.parametrize('plain', [None, lambda i: i == 0])
def test_c5_cannot_be_tested_on_a_floor_target(tmp_path, plain):
    """Unscored arms, or plain SD at 1/12 correct: C5 'cannot be tested here', its BE and
    speed against plain SD printed as a decomposition without verdict words, no C5 test in
    the family."""
    data = _data(plain_correct=plain, matched_correct=plain and (lambda i: i < 2))
    out = eval_claims.evaluate(data, str(tmp_path))
    c5 = out['claims']['C5']
    assert c5['status'] == 'cannot be tested here', c5
    assert 'task quality' in c5['text'] and 'what the matched baseline adds +0.200' in c5['text']
    assert not any(word in c5['text'] for word in VERDICT_WORDS), c5['text']
    assert not data['_c5'] and 'C5' not in out['composition'].split('; not in it')[0]


def test_c5_judged_on_scores_above_floor(tmp_path):
    """Plain SD at 4/12, the matched baseline at 12/12 on the same items: McNemar 8 wins, 0
    losses (exact p 2**-7), in the family: the plain-SD comparison adds 67 points, shown."""
    data = _data(plain_correct=lambda i: i < 4, matched_correct=lambda i: True)
    out = eval_claims.evaluate(data, str(tmp_path))
    c5 = out['claims']['C5']
    assert c5['status'] == 'shown', c5
    assert data['_c5'][0][1].p == pytest.approx(2.0**-7)
    assert '+66.7' in c5['text'] and 'Holm p' in c5['text']
    assert 'C5 score(matched) - score(plain SD) per truncation rule (1)' in out['composition']


@pytest.mark.parametrize('ddtree_gain', [0.1, 0.0])
def test_c3_asks_ddtree_against_the_same_drafters_chain(tmp_path, ddtree_gain):
    """DDTree's TV minus the DFlash chain's per prompt (not the head's chain's, 0.2 below:
    paired so, no gain would read above 0) is one test of the job's Holm family beside the
    EAGLE-3 tree's and q = p's, its line with p and Holm p; DDTree's q = p is the floors'
    tree, so that test is not counted twice (3 tests). Without DDTree amplification C3 is
    not shown and says which comparison failed."""
    data = _data(ddtree_gain=ddtree_gain)
    out = eval_claims.evaluate(data, str(tmp_path))
    c3 = out['claims']['C3']
    key = ('c3', 'DDTree - DFlash chain', RULE)
    assert list(data['_amplification']) == [('tree', RULE), ('ddtree', RULE)]
    test = data['_amplification'][('ddtree', RULE)][0]
    assert test.key == key and test.n == N
    assert test.estimate == pytest.approx(ddtree_gain + np.mean([0.003 * (i % 3 - 1)
                                                                 for i in range(N)]))  # fmt: skip
    assert out['family'].startswith('3 comparisons'), out['family']
    assert 'C3 DDTree - DFlash chain TV per truncation rule (1)' in out['composition']
    holm = verdicts.judge([v[0] for v in data['_amplification'].values()]
                          + [t for t, _ in data['_floors'].values()]).adjusted[key]  # fmt: skip
    start = c3['text'].index(f'{RULE} DDTree - DFlash chain TV')
    part = c3['text'][start : c3['text'].index('described)', start)]
    assert f'Holm p {holm:.3g}' in part and 'means DFlash chain 0.26' in part, part
    assert eval_claims.DDTREE_AT_Q_EQUALS_P in c3['text']
    if ddtree_gain:
        assert c3['status'] == 'shown', c3['status']
        assert part.startswith(f'{RULE} DDTree - DFlash chain TV per prompt +0.1000 '), part
    else:
        assert c3['status'] == ('not shown (2 of 3 comparisons above 0: EAGLE-3 tree 1 of 1, '
                                'DDTree 0 of 1, q = p 1 of 1)'), c3['status']  # fmt: skip
        assert 'not distinguishable from 0' in part, part


def test_c1_reads_the_dflash_decodings(tmp_path):
    """Greedy DDTree differing from AR on one prompt fails C1 and says where."""
    data = _data(ddtree_gain=0.1)
    data['greedy']['tokens']['ddtree'] = [[2]] + [[1]] * (N - 1)
    c1 = eval_claims.evaluate(data, str(tmp_path))['claims']['C1']
    assert c1['status'] == 'not shown', c1
    assert f'DFlash chain = AR on {N}/{N}, DDTree = AR on {N - 1}/{N}' in c1['text']
    assert 'DFlash chain 0.0e+00, DDTree 0.0e+00' in c1['text']


def test_arms_are_checked():
    c = runtime.load_config(CONFIG, 'tiny')
    claims.check_arms(c)
    with c.unlocked():
        c.dflash_draft = ''
    with pytest.raises(ValueError, match="drafts with the DFlash drafter: set dflash_draft"):
        claims.check_arms(c)
    with c.unlocked():
        c.arms.bogus = ('minp_verify:rho=0.1',)
    with pytest.raises(ValueError, match="arms.bogus: not an arm of the claims job"):
        claims.check_arms(c)


def test_full_config_names_a_missing_dflash_drafter(tmp_path, monkeypatch):
    monkeypatch.setattr(checkpoints, 'DFLASH_DRAFTER', str(tmp_path / 'absent'))
    with pytest.raises(FileNotFoundError, match='absent, a missing directory: train and export'):
        runtime.load_config(CONFIG, '')
