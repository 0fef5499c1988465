"""The findings a run prints: each claim says only what its numbers show (a gap is real only
when its interval excludes zero, a trend only when every step goes one way), and the claims
the run cannot test are named with the number that decides it."""

from spec_jax.eval import findings


def lossy(rule, name, value, **fields):
    row = dict(task='speed', kind='lossy', rule=rule, param=value, param_name=name,
               method=f'{rule}:{name}={value}', pairs=['lossless'], scored=False,
               pair_n=20)  # fmt: skip
    return dict(row, **fields)


def test_trends_need_every_step():
    assert findings._trend([0.1, 0.2, 0.4]) == 'rises'
    assert findings._trend([0.4, 0.2, 0.1]) == 'falls'
    assert findings._trend([0.1, 0.3, 0.2]) == 'is not monotone'
    assert findings._trend([0.058, 0.0581, 0.058]) == 'stays flat'  # Within 1% of the scale.
    assert findings._trend([0.1, None]) == 'cannot be judged'


def test_a_gap_is_real_only_when_its_interval_excludes_zero():
    rows = [
        dict(task='speed', kind='lossless', method='lossless', scored=False, block_efficiency=1.4,
             speedup=1.1, speedup_lo=1.02, speedup_hi=1.19, speedup_n_batches=6),  # fmt: skip
        lossy('cos', 'lam', 0.2, d_be=0.02, d_be_lo=-0.01, d_be_hi=0.05, tv=0.01),
        lossy('cos', 'lam', 0.4, d_be=0.05, d_be_lo=0.01, d_be_hi=0.09, tv=0.03),
        lossy('cos', 'lam', 0.6, d_be=0.09, d_be_lo=0.04, d_be_hi=0.14, tv=0.06,
              overshoot_max=40.0),
        lossy('lenience', 'l', 0.5, d_be=0.1, tv=0.02, overshoot_max=2.5),
        lossy('lenience', 'l', 0.8, d_be=0.05, tv=0.01, overshoot_max=1.5),  # Over 1/0.8.
        lossy('minp_verify', 'rho', 0.3, pair_n=0, tv=0.2, outside=0.1),  # Partial run.
    ]
    lines = findings.findings(rows)
    text = '\n'.join(lines)
    assert 'speedup 1.10 [1.02, 1.19]x over AR (6 batches) (above 1)' in text
    assert 'cos lam 0.2: BE +0.020 [-0.010, +0.050] (not distinguishable from 0) for TV' in text
    assert 'cos lam 0.4: BE +0.050 [+0.010, +0.090] (above 0) for TV 0.030' in text
    assert 'cos over lam = 0.2, 0.4, 0.6: TV rises (0.010, 0.030, 0.060), ΔBE rises' in text
    assert 'lenience l 0.5: BE +0.050' not in text and '(no interval' in text
    assert '1.5 (ceiling 1.25): NOT under its ceiling 1/l' in text
    assert 'minp_verify rho 0.3: no samples shared with lossless (a partial run): TV 0.200' in text


def test_claims_out_of_reach_are_named_with_their_numbers():
    ar = dict(task='mbpp', kind='ar', method='ar', scored=True, score=0.1, score_lo=0.028,
              score_hi=0.302, n_samples=20)  # fmt: skip
    wide = findings.untestable([ar], 'chain')
    assert any('±13.7 points' in line and 'near floor' in line for line in wide)
    assert any('tree verification' in line for line in wide)
    narrow = dict(ar, score=0.5, score_lo=0.495, score_hi=0.505)
    assert not any('task-score gaps' in line for line in findings.untestable([narrow], 'tree'))
    assert not any('tree verification' in line for line in findings.untestable([narrow], 'tree'))
    assert any('no scored task' in line for line in findings.untestable([], 'chain'))
