"""Experiment plans: every lossy rule is paired with its matched baseline (or lossless SD)."""

import pytest

from spec_jax import rules
from spec_jax.eval import plan

GRID = (
    'lenience:l=0.5',
    'cos:lam=0.4',
    'minp_verify:rho=0.3',
    'overshoot_tail:l=0.5,rho=0.3',
    'speccascade:deferral=token_v3,alpha=0.7',
    'speccascade:deferral=token_v2,alpha=0.3',
    'eta_verify:eta=0.1',
    'typical:eps=0.2',
    'greedy',
)


@pytest.mark.parametrize('mode', ['chain', 'tree'])
def test_every_lossy_rule_gets_its_matched_baseline(mode):
    grid = GRID if mode == 'chain' else tuple(
        g for g in GRID if rules.make(g).tree_modes
    )  # fmt: skip
    methods = {m.name: m for m in plan.plan(grid, mode)}
    assert methods['ar'].mode == 'ar' and methods['lossless'].rule == 'lossless'
    for spec in grid:
        rule = rules.make(spec)
        lossy = methods[plan.rule_spec(rule)]
        assert rules.make(lossy.rule) == rule and not lossy.baseline  # Round trip.
        (base_name,) = lossy.pairs
        base, want = methods[base_name], rules.matched_baseline(rule)
        assert lossy.name in base.pairs
        if want.truncation == 'none':
            assert base_name == 'lossless' and not base.baseline
            continue
        assert base.baseline and base.mode == mode and base.truncation == want.truncation
        assert base.param == (None if want.param is None else pytest.approx(want.param))
        assert base.convention == plan.CONVENTIONS[mode]
        # The method runs as (its rule, baseline=True): the same truncation as the pair's.
        again = rules.matched_baseline(rules.make(base.rule))
        assert (again.truncation, again.param) == (want.truncation, pytest.approx(want.param))
    if mode == 'chain':  # min-p 0.3 is shared by three rules; lenience and cos need none.
        assert methods['baseline[min_p=0.3]'].pairs == (
            'minp_verify:rho=0.3', 'overshoot_tail:l=0.5,rho=0.3',
            'speccascade:deferral=token_v3,alpha=0.7',
        )  # fmt: skip
        assert set(methods['lossless'].pairs) == {'lenience:l=0.5', 'cos:lam=0.4'}
        names = [m.name for m in plan.plan(grid, mode)]
        assert len(names) == len(set(names)) == 2 + len(grid) + 5
    text = plan.describe(list(methods.values()))
    assert 'plain AR' in text and plan.CONVENTIONS[mode] in text


def test_bad_grids_are_refused():
    with pytest.raises(ValueError, match="mode 'beam' is not one of"):
        plan.plan(GRID, 'beam')
    with pytest.raises(ValueError, match='lossless SD is always in the plan'):
        plan.plan(('lossless',))
    with pytest.raises(ValueError, match="rule 'cos' has no tree form"):
        plan.plan(('cos:lam=0.4',), 'tree')
    with pytest.raises(ValueError, match='appears twice'):
        plan.plan(('lenience:l=0.5', 'lenience:l=0.50'))
    with pytest.raises(ValueError, match='unknown rule'):
        plan.plan(('magic',))
