"""The engines' rules experiment (configs/experiments/smollm2_135m_engines.py, issue 32 item 5):
its plans pair every engine rule with its matched baseline and with lossless SD, the Δs
against lossless SD and the flattery are paired and add up, and the tiny run goes end to
end with the report's section "Rules the engines ship"."""

from __future__ import annotations

import os

import pytest

from spec_jax import rules
from spec_jax.eval import engine_rules, findings, metrics, plan, runner, timing
from spec_jax.jobs import evaluate, runtime

ROOT = os.path.join(os.path.dirname(__file__), '..', '..')
CONFIG = os.path.join(ROOT, 'configs', 'experiments', 'smollm2_135m_engines.py')
SET_RULES = ('relaxed', 'mars', 'minp_verify')  # Matched with a truncated target (§5).


def config(arg: str = ''):
    return runtime.load_config(CONFIG, arg)


@pytest.mark.parametrize('arg', ['', 'tree', 'greedy', 'tiny', 'tree,tiny'])
def test_every_engine_rule_is_paired_with_its_baseline_and_lossless_sd(arg):
    """Every engine rule (with a tree form, in tree mode; the greedy ones at T 0) is in the
    plan at two settings (the lossless ones once), beside the paper's rules; each lossy
    method names its matched baseline, which is in the plan and truncates with the rule's
    own set (relaxed, MARS, min-p) or is lossless SD; AR and lossless SD are always there."""
    c = config(arg)
    methods = runner.methods_of(c)
    by_name = {m.name: m for m in methods}
    assert {'ar', 'lossless'} <= set(by_name) and by_name['ar'].mode == 'ar'
    lossy = [m for m in methods if m.name not in ('ar', 'lossless') and not m.baseline]
    kinds = {}
    for m in lossy:
        kinds.setdefault(rules.make(m.rule).name, []).append(m)
    mode = c.mode
    assert c.temperature == (0.0 if 'greedy' in arg else 0.7)
    if 'tiny' in arg:  # A few of the full grid's rules (one compile per rule kind).
        full = config(arg.replace('tiny', '').strip(','))
        assert set(c.grid) < set(full.grid) and (c.mode, c.temperature) == (
            full.mode, full.temperature)  # fmt: skip
    elif arg == 'greedy':
        assert set(kinds) == {'relaxed', 'mars', 'fuzzy'}
    else:
        expected = {n for n in (*engine_rules.ENGINE_RULES, *engine_rules.ABLATIONS)
                    if mode == 'chain' or rules.make(n).tree_modes}  # fmt: skip
        assert expected <= set(kinds), expected - set(kinds)
        paper = {'lenience', 'minp_verify'} | ({'cos'} if mode == 'chain' else set())
        assert paper <= set(kinds)
    for name, ms in kinds.items() if 'tiny' not in arg else ():
        lossless_rule = name in ('onehot_q', 'block_verify')
        assert len(ms) == (1 if lossless_rule or name in engine_rules.ABLATIONS
                           or family_is_paper(name) else 2), (name, ms)  # fmt: skip
    plain = by_name['lossless'].pairs
    for m in lossy:
        rule = rules.make(m.rule)
        matched = by_name[m.pairs[0]]
        if rule.name in SET_RULES:
            want = rules.matched_baseline(rule)
            assert matched.baseline and m.name in matched.pairs, m.name
            assert (matched.truncation, matched.param) == (want.truncation, want.param)
            again = rules.matched_baseline(rules.make(matched.rule))  # The rule it runs.
            assert again.truncation == want.truncation and again.param == want.param
            if rule.name in ('relaxed', 'mars'):  # Read from the target's logits.
                assert matched.convention == plan.CONVENTIONS['tree']
            assert m.name not in plain
        else:
            assert m.pairs == ('lossless',) and m.name in plain, m.name
    # Every lossy method meets lossless SD too: the plan always holds it.
    assert by_name['lossless'].rule == 'lossless' and not by_name['lossless'].baseline


def family_is_paper(name: str) -> bool:
    return engine_rules.family(name) == 'paper'


def test_relaxed_rules_with_one_delta_and_two_ks_get_two_baselines():
    """The set is the top K within delta: a shared baseline would be the wrong law for one
    of them (plan.SET_FIELDS); the bonus mode does not change the set, so it shares."""
    methods = plan.plan(['relaxed:delta=0.6,top_k=10', 'relaxed:delta=0.6,top_k=3',
                         'relaxed:preset=max'])  # fmt: skip
    baselines = {m.name: m.pairs for m in methods if m.baseline}
    assert set(baselines) == {'baseline[relaxed=0.6,top_k=10]', 'baseline[relaxed=0.6,top_k=3]'}
    assert len(baselines['baseline[relaxed=0.6,top_k=10]']) == 2


def _rows(methods, be_of, seconds_of, items=10, per_batch=2, tv_plain_of=None):
    """Per-sample results: item i of batch i // per_batch, BE be_of[method] + a per-item
    wobble, seconds from seconds_of (a per-batch factor too, as a drifting machine), TV
    against the plain target tv_plain_of[method] a position (default 0)."""
    out = []
    for m in methods:
        for i in range(items):
            blocks = 10 + i % 3
            emitted = round(blocks * (be_of[m.name] + 0.03 * ((i * 7) % 5 - 2)))
            out.append(dict(
                method=m.name, task='speed_qa', item=str(i), seed=0, num_tokens=emitted,
                batch_id=f'b{i // per_batch}', correct=None,
                seconds=seconds_of[m.name] * emitted * (1 + 0.1 * (i // per_batch)),
                stats=dict(emitted=emitted, blocks=blocks, metered=emitted,
                           tv_sum=0.0 if m.baseline or m.mode == 'ar' else 0.05 * emitted,
                           tv_plain_sum=(tv_plain_of or {}).get(m.name, 0.0) * emitted),
            ))  # fmt: skip
    return out


def test_the_flattery_is_the_baselines_own_gain_over_lossless_sd():
    """A truncation rule against lossless SD is credited with its baseline's gain: Δ vs
    lossless SD - Δ vs matched = the matched baseline's paired Δ over lossless SD (BE), and
    the speed ratio likewise; a rule matched with lossless SD itself is flattered by 0."""
    methods = plan.plan(['minp_verify:rho=0.3', 'lenience:l=0.5'])
    be = {'ar': 1.0, 'lossless': 1.3, 'minp_verify:rho=0.3': 1.6, 'baseline[min_p=0.3]': 1.5,
          'lenience:l=0.5': 1.45}  # fmt: skip
    secs = {'ar': 1.0, 'lossless': 0.8, 'minp_verify:rho=0.3': 0.7, 'baseline[min_p=0.3]': 0.75,
            'lenience:l=0.5': 0.72}  # fmt: skip
    tv_plain = {'minp_verify:rho=0.3': 0.04, 'baseline[min_p=0.3]': 0.03, 'lenience:l=0.5': 0.05}
    results = _rows(methods, be, secs, tv_plain_of=tv_plain)
    rows = {r['method']: r for r in metrics.aggregate(results, methods)}
    minp, lenience = rows['minp_verify:rho=0.3'], rows['lenience:l=0.5']
    # TV against plain SD's law: against the baseline a difference of two truncation
    # distortions, against lossless SD (whose law is p) the rule's own.
    assert minp['tv_plain'] == pytest.approx(0.04) and minp['d_tv_plain'] == pytest.approx(0.01)
    assert minp['sd_d_tv_plain'] == pytest.approx(0.04)
    assert engine_rules._tv_vs_plain(minp).startswith('0.0400 [')
    assert minp['pairs'] == ['baseline[min_p=0.3]'] and minp['sd_pair_n'] == 10
    assert minp['sd_d_be'] == pytest.approx(minp['flattery_be'] + minp['d_be'])
    assert minp['flattery_be'] > 0.1 and minp['flattery_be_lo'] > 0  # The baseline's gain.
    assert minp['sd_speedup'] == pytest.approx(minp['flattery_speedup']
                                               * minp['speedup_vs_matched'])  # fmt: skip
    assert minp['flattery_speedup_lo'] > 1 and minp['sd_speedup_n_batches'] == 5
    assert lenience['flattery_be'] == 0.0 and lenience['flattery_speedup'] == 1.0
    assert lenience['sd_d_be'] == lenience['d_be'] and lenience['sd_speedup_lo'] is not None
    assert rows['ar']['flattery_be'] is None and rows['baseline[min_p=0.3]']['sd_d_be'] is None
    group = minp['task']
    lines = engine_rules.finding_lines(group, list(rows.values()),
                                       findings.family(list(rows.values())))  # fmt: skip
    assert any(line.startswith(f'{group}: minp_verify:rho=0.3: against lossless SD BE +')
               and '(flatters it; Holm p' in line for line in lines), lines  # fmt: skip
    assert any('1 rules are matched with lossless SD itself' in line for line in lines)
    assert engine_rules.section(list(rows.values())) == []  # No engine rule: no section.


def test_the_tiny_run_writes_the_section(tmp_path):
    """The ':tiny' config end to end (random tiny models, every method of the plan): one
    result per sample (AR's drift-monitor rows apart), and the report's "Rules the engines
    ship" with a row per lossy method and the flattery of the set-matched rules."""
    c = config('tiny')
    c.progress = False
    out = evaluate.run(c, str(tmp_path))
    methods = runner.methods_of(c)
    store, _, _ = runner.run(c, str(tmp_path))  # Resumed: everything is there.
    samples = [r for r in store.rows if not timing.is_monitor(r['method'])]
    assert len(samples) == 4 * len(methods)
    assert {r['method'] for r in store.rows} - {m.name for m in methods} == {
        *timing.START_MONITORS, *timing.END_MONITORS}
    with open(out['paths']['report']) as f:
        md = f.read()
    part = md[md.index('## Rules the engines ship'):]
    part = part[: part.index('\n## ')] if '\n## ' in part else part
    lossy = [m.name for m in methods if m.name not in ('ar', 'lossless') and not m.baseline]
    for name in lossy:
        assert f'| speed | `{name}` |' in part, name
    assert '| `mars:theta=0.9` | engine | no | `baseline[mars=0.9]` | 4 |' in part
    assert '| `onehot_q` | engine | yes | `lossless` | 4 |' in part
    assert 'not metered' not in part  # TV vs lossless SD of the set-matched MARS too.
    assert '- speed: mars:theta=0.9: against lossless SD BE' in part
    assert '- speed: mars:theta=0.9: against lossless SD BE' in out['findings']
    assert 'speed: 1 rules are matched with lossless SD itself' in out['findings']
