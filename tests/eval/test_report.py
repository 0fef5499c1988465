"""The evaluation report: markdown, CSV round trip, the paper's rows and gaps, the figures'
series (what each plotting function says it drew, and its colours in the PNG), theory curves."""

from __future__ import annotations

import csv
import math
import re

import pytest
from figures import check_series, has_color, read_png

from spec_jax.eval import compare, machine, metrics_csv, paper, plots, report
from spec_jax.rules import theory

PAPER_TASKS = ('math', 'include')
TASKS = (*PAPER_TASKS, 'gsm8k', 'speed_mtbench')
# (method, kind, rule, param_name, param, pairs)
METHODS = (
    ('ar', 'ar', 'lossless', None, None, []),
    ('lossless', 'lossless', 'lossless', None, None, ['lenience:l=0.2', 'cos:lam=0.4']),
    ('lenience:l=0.2', 'lossy', 'lenience', 'l', 0.2, ['lossless']),
    ('cos:lam=0.4', 'lossy', 'cos', 'lam', 0.4, ['lossless']),
    ('minp_verify:rho=0.1', 'lossy', 'minp_verify', 'rho', 0.1, ['baseline[min_p=0.1]']),
    ('minp_verify:rho=0.3', 'lossy', 'minp_verify', 'rho', 0.3, ['baseline[min_p=0.3]']),
    ('eta_verify:eta=0.1', 'lossy', 'eta_verify', 'eta', 0.1, ['baseline[eta=0.1]']),
    ('baseline[min_p=0.1]', 'baseline', 'min_p', 'min_p', 0.1, ['minp_verify:rho=0.1']),
    ('baseline[min_p=0.3]', 'baseline', 'min_p', 'min_p', 0.3, ['minp_verify:rho=0.3']),
    ('baseline[eta=0.1]', 'baseline', 'eta', 'eta', 0.1, ['eta_verify:eta=0.1']),
)


def make_rows() -> list[dict]:
    """A constructed run: every task x method, numbers that differ per row."""
    rows = []
    for t, task in enumerate(TASKS):
        scored = task != 'speed_mtbench'
        for m, (method, kind, rule, param_name, param, pairs) in enumerate(METHODS):
            ar = kind == 'ar'
            lossy = kind == 'lossy'
            score = 0.30 + 0.03 * m + 0.05 * t if scored else None
            be = 1.0 if ar else 2.0 + 0.2 * m + 0.1 * t
            rows.append(
                {
                    'task': task,
                    'scored': scored,
                    'method': method,
                    'kind': kind,
                    'rule': rule,
                    'param': param,
                    'param_name': param_name,
                    'pairs': list(pairs),
                    'n_items': 20 + t,
                    'n_samples': 2,
                    'score': score,
                    'score_lo': None if score is None else score - 0.1,
                    'score_hi': None if score is None else score + 0.08,
                    'block_efficiency': be,
                    'be_full_gamma': None if ar else be + 0.25,
                    'accept_length': None if ar else be - 1.0,
                    'acceptance_rate': None if ar else 0.4 + 0.02 * m,
                    'position_acceptance': None if ar else 0.5 + 0.02 * m,
                    'full_fraction': None if ar else 0.9,
                    'tokens': 1000 + 10 * m + t,
                    'decode_seconds': 2.5 + 0.1 * m,
                    'tokens_per_s': 400.0 + 7.0 * m,
                    'speedup': 1.0 if ar else 1.1 + 0.05 * m + 0.01 * t,
                    'ds': None if ar else 300.0 + 5.0 * m,
                    'tv': 0.01 * m + 0.002 * t if lossy else None,
                    'tv_plain': 0.012 * m + 0.002 * t if lossy else None,
                    'js': 0.004 * m + 0.001 * t if lossy else None,
                    'kl': (math.inf if rule == 'minp_verify' else 0.02 * m) if lossy else None,
                    'kl_inf_fraction': 0.0 if lossy else None,
                    'outside': 0.005 * m if lossy else None,
                    'overshoot_mean': 1.0 + 0.3 * m + 0.1 * t if lossy else None,
                    'overshoot_max': 3.0 + m if lossy else None,
                    'overshoot_inf_fraction': 0.0 if lossy else None,
                    'seeds_k': None,
                    'avg_at_k': None,
                    'pass_at_k': None,
                    'n_scorer_errors': 0 if scored else None,
                    'n_timeouts': 0 if scored else None,
                    'n_infra_errors': 0 if scored else None,
                    'failed_samples': [] if scored else None,
                }
            )
    return rows


@pytest.fixture(scope='module')
def curve():
    return theory.parameter_curve('minp_verify', 'rho', (0.1, 0.5, 0.9))


def test_parameter_curve(curve):
    assert curve['param'] == [0.1, 0.5, 0.9]
    assert len(curve['tv']) == 3
    assert all(math.isfinite(v) and 0.0 <= v <= 1.0 for v in curve['tv'])
    assert 0.0 < curve['quality'] < 1.0
    assert curve['label'] == f'theory, synthetic p, q (chain; draft quality {curve["quality"]:.2f})'


def test_write_report(tmp_path, curve):
    rows = make_rows()
    theory_curves = {'minp_verify': curve}
    paths = report.write_report(rows, str(tmp_path), title='Test run', theory=theory_curves)
    want = {'report', 'metrics_csv', 'paper_csv', 'score_vs_be', 'distortion'}
    want |= {f'pareto_{t}' for t in TASKS if t != 'speed_mtbench'}
    assert set(paths) == want
    for path in paths.values():
        with open(path, 'rb') as f:
            assert f.read(1)
    text = (tmp_path / 'report.md').read_text()
    assert text.startswith('# Test run')

    # Matched pairs: each lossy method on one line with its matched baseline.
    pairs = text[text.index('## Matched pairs') : text.index('## The paper beside ours')]
    for method, kind, *_, pair in METHODS:
        if kind == 'lossy':
            for task in TASKS:
                assert any(
                    line.startswith(f'| {task} | `{method}` | `{pair[0]}`')
                    for line in pairs.splitlines()
                ), (task, method)

    # The paper's comparison, labelled with its setup, and the caveat.
    label = paper.SETUPS['chain']['label']
    assert label == 'Qwen2.5-72B + 0.5B draft (chain, gamma 10, paper)' and label in text
    assert 'Compare the direction and size of the gaps, not absolute scores' in text
    for name in ('pareto_math.png', 'score_vs_be.png', 'distortion_vs_param.png'):
        assert f']({name})' in text
    assert plots.theory_label('minp_verify', curve) in text

    # metrics.csv parses back into the same rows (types, None, inf, pairs).
    assert metrics_csv.read_metrics_csv(paths['metrics_csv']) == rows
    with open(paths['metrics_csv'], newline='') as f:
        plain = list(csv.DictReader(f))
    fields = list(metrics_csv.FIELDS)
    assert len(plain) == len(rows) and list(plain[0])[: len(fields)] == fields

    # paper_comparison.csv: our gaps beside the paper's (docs/paper.md §5.2).
    with open(paths['paper_csv'], newline='') as f:
        comparison = {(r['task'], r['method']): r for r in csv.DictReader(f)}
    assert not any(task in ('gsm8k', 'speed_mtbench') for task, _ in comparison)
    row = comparison[('math', 'minp_verify:rho=0.3')]
    assert row['paper_method'] == 'Cascade (SpecCascade)' and row['paper_label'] == label
    assert row['paper_matched_method'] == 'Min-p + SD'
    assert float(row['paper_d_acc_pts']) == pytest.approx(75.47 - 76.67)
    ours = {r['method']: r for r in rows if r['task'] == 'math'}
    d = ours['minp_verify:rho=0.3']['score'] - ours['baseline[min_p=0.3]']['score']
    assert float(row['d_score_pts']) == pytest.approx(100 * d)
    row = comparison[('include', 'cos:lam=0.4')]
    assert float(row['paper_d_acc_pts']) == pytest.approx(53.79 - 68.18)
    assert comparison[('math', 'lossless')]['paper_method'] == 'SD Baseline'
    assert comparison[('math', 'lossless')]['paper_d_acc_pts'] == ''

    # The figures' series, as the report lists them.
    assert 'Series: ar (1), lossless (1), baselines (3), lenience (1), cos (1)' in text
    assert f'{plots.theory_label("minp_verify", curve)} (3)' in text


def test_figures_draw_their_series(tmp_path, curve):
    rows = make_rows()
    path = tmp_path / 'pareto.png'
    drawn = plots.pareto(rows, 'math', str(path))
    front = drawn[plots.FRONT_LABEL]
    assert front >= 1
    expected = {'ar': 1, 'lossless': 1, 'baselines': 3, 'lenience': 1, 'cos': 1,
                'minp_verify': 2, 'eta_verify': 1, plots.FRONT_LABEL: front}  # fmt: skip
    check_series(path, drawn, expected)
    assert drawn.colors['minp_verify'] == plots.FAMILY_COLORS['minp_verify']
    assert not has_color(read_png(path), plots.FAMILY_COLORS['speccascade'])  # Not drawn.
    assert plots.pareto(rows, 'speed_mtbench', str(tmp_path / 'empty.png')) == {}

    path = tmp_path / 'score_vs_be.png'
    drawn = plots.score_vs_be(rows, str(path))
    check_series(path, drawn, {'math': 10, 'include': 10, 'gsm8k': 10})
    assert len(set(drawn.colors.values())) == 3

    path = tmp_path / 'distortion.png'
    drawn = plots.distortion_vs_param(rows, str(path), theory={'minp_verify': curve})
    expected = {'lenience': 1, 'cos': 1, 'minp_verify': 2, 'eta_verify': 1}
    expected.update({plots.overshoot_label(rule): n for rule, n in list(expected.items())})
    expected.update({plots.js_label(rule): expected[rule] for rule in ('lenience', 'cos',
                     'minp_verify', 'eta_verify')})  # fmt: skip
    expected[plots.theory_label('minp_verify', curve)] = 3
    check_series(path, drawn, expected)
    # A panel per family, each on its own parameter's axis.
    assert drawn.panels == {'lenience': 'l', 'cos': 'lam', 'minp_verify': 'rho',
                            'eta_verify': 'eta'}  # fmt: skip
    assert plots.distortion_vs_param(rows, str(tmp_path / 'bare.png')).keys() == (
        expected.keys() - {plots.theory_label('minp_verify', curve)}
    )


def test_pareto_front():
    points = [(1.0, 0.5), (2.0, 0.4), (1.5, 0.3), (3.0, 0.1), (2.0, 0.45)]
    assert plots.pareto_front(points) == [(1.0, 0.5), (2.0, 0.45), (3.0, 0.1)]


def test_headline():
    rows = make_rows()
    lines = report.headline(rows).splitlines()
    assert len(lines) == len(rows) + 2
    assert lines[0].split()[:2] == ['task', 'method']
    math_minp = next(line for line in lines if ' minp_verify:rho=0.3 ' in line)
    assert math_minp.startswith('math ') and '[' in math_minp
    speed = next(line for line in lines if line.startswith('speed_mtbench') and 'lossless' in line)
    assert speed.split()[2] == '-'  # No score on a speed set.


def test_paper_rows():
    row = paper.paper_row('chain', 'math', 'cos:lam=0.4')
    assert (row['method'], row['param'], row['be'], row['acc'], row['acc_std']) == (
        'CoS', 0.4, 8.80, 60.40, 2.84,
    )  # fmt: skip
    assert paper.paper_row('tree', 'math', 'cos:lam=0.4') is None  # CoS: chain only.
    assert paper.paper_row('chain', 'gsm8k', 'lossless') is None  # Not a paper task.
    assert paper.paper_row('chain', 'math', 'lenience:l=0.5') is None  # Not in the grid.
    assert paper.paper_row('chain', 'math', 'ar') is None
    assert paper.paper_row('tree', 'mbppplus', 'lossless')['method'] == 'Baseline'
    bfcl = paper.paper_row('tree', 'bfcl_parallel_multiple', 'baseline[eta=0.25]')
    assert bfcl['ds'] == 63.85 and bfcl['note'] and bfcl['acc_std'] is None
    # docs/paper.md §5.3's contrasts.
    gap = paper.paper_gap('tree', 'math', 'eta_verify:eta=0.05')
    assert gap['matched']['method'] == 'η + SD' and gap['d_acc'] == pytest.approx(-9.2)
    assert gap['d_be'] == pytest.approx(4.82 - 3.85)
    assert paper.paper_gap('tree', 'include', 'minp_verify:rho=0.1')['d_acc'] == (
        pytest.approx(30.91 - 40.0)
    )
    assert paper.paper_gap('tree', 'math', 'lenience:l=0.2')['matched']['method'] == 'Baseline'
    assert paper.paper_gap('chain', 'math', 'eta_verify:eta=0.2')['d_acc'] == (
        pytest.approx(74.67 - 76.27)
    )
    assert paper.paper_gap('chain', 'math', 'baseline[min_p=0.5]') is None
    with pytest.raises(ValueError, match='setup'):
        paper.paper_row('graph', 'math', 'lossless')


def test_gaps_by_method_on_tasks_the_paper_did_not_run(tmp_path):
    """A run on other tasks (the README's: GSM8K, HumanEval, BFCL simple) still gets the
    paper's gaps for its methods: CoS 0.4 on MATH, 60.40 - 76.47 (docs/paper.md §5.2)."""
    rows = [r for r in make_rows() if r['task'] in ('gsm8k', 'speed_mtbench')]
    gaps = {g['method']: g for g in compare.method_gaps(rows, 'chain')}
    assert gaps['cos:lam=0.4']['paper']['MATH'] == pytest.approx(60.40 - 76.47)
    assert set(gaps['cos:lam=0.4']['ours']) == {'gsm8k'}  # Speed sets have no score.
    assert 'baseline[min_p=0.1]' not in gaps and 'ar' not in gaps
    report.write_report(rows, str(tmp_path))
    with open(tmp_path / 'report.md') as f:
        md = f.read()
    assert '### Gaps by method' in md and 'paper Δ MATH' in md and '-16.1' in md
    # With paired fields, our gap shows its interval and the items it pairs.
    paired_rows = [dict(r, pair_n=7, pair_n_items=7, d_score=-0.333, d_score_lo=-0.8,
                        d_score_hi=0.1) if r['kind'] == 'lossy' else r for r in rows]  # fmt: skip
    (cos,) = [g for g in compare.method_gaps(paired_rows, 'chain') if g['method'] == 'cos:lam=0.4']
    assert cos['ours_text']['gsm8k'] == '-33.3 [-80.0, +10.0] (n 7)'
    section = '\n'.join(compare.method_gaps_section([cos], 'chain'))
    assert '| `cos:lam=0.4` | -33.3 [-80.0, +10.0] (n 7) |' in section


def test_what_a_referee_asks_for():
    """One batch draws no interval and says so; several seeds show their spread; the
    headline's n comes from every row; the header warns when the load exceeded the cores and
    lists the settings one line each; each figure states what its bars are."""
    one = dict(task='mbpp', speedup=1.31, speedup_lo=None, speedup_hi=None, speedup_n_batches=1)
    assert report.speedup_text(one) == '1.31 (1 batch: no interval)'
    five = dict(one, speedup_lo=1.1, speedup_hi=1.5, speedup_n_batches=5)
    assert report.speedup_text(five) == '1.31 [1.10, 1.50] (5)'
    decode = dict(five, decode_speedup=1.6, decode_speedup_lo=1.4, decode_speedup_hi=1.8,
                  decode_speedup_n_batches=5)  # fmt: skip
    assert report.speedup_text(decode, 'decode_speedup') == '1.60 [1.40, 1.80] (5)'
    assert report.seed_text(dict(score_seed_std=0.031, n_seeds=3)) == ' ± 3.1 sd over 3 seeds'
    assert report.seed_text(dict(score_seed_std=None, n_seeds=1)) == ''
    rows = make_rows()
    rows[3] = dict(rows[3], n_items=6)  # A partial run: one method on fewer items.
    lines = report._headline_section(rows, 'chain')
    assert '6-20 items (methods differ: a partial run), 2 samples per method' in '\n'.join(lines)
    info = machine.header('fp', (9.4, 3.0, 2.0), (1.0, 1.0, 1.0), settings={'gamma': '3'})
    info['usable_cores'] = 2
    head = machine.header_lines(info)
    assert head[0].startswith('- WARNING: load average 9.40 exceeds the 2 usable cores')
    assert '- gamma: 3' in head
    quiet = machine.header_lines(dict(info, load_start=(0.5, 0.5, 0.5)))
    assert not any('WARNING' in line for line in quiet)
    assert set(plots.BARS) == {'pareto', 'score_vs_be', 'distortion', 'tradeoff'}
    assert 'min to max over tasks' in plots.BARS['distortion']
    # CoS's overshoot: means within a factor 50, the tasks' range over 20 decades: log.
    means, lows, highs = [1e22, 3e22], [1.4, 2.0], [2e22, 6e22]
    assert not plots.spans_decades(means) and plots.spans_decades([*means, *lows, *highs])


def test_tree_run_shows_every_divergence(tmp_path):
    """A tree run, where a good draft makes pi a point mass: KL is infinite at most metered
    positions (everywhere for eta here), so the markdown shows each finite mean with its
    infinite share, and the bounded JS beside it; scoring failures and avg@k / pass@k over
    seeds appear beside the scores; the dashed curve is the tree node law, labelled
    synthetic."""
    rows = [dict(r) for r in make_rows() if r['rule'] != 'cos' and r['task'] == 'math']
    divergences = {  # method -> (kl, kl_inf_fraction, js, overshoot_inf_fraction)
        'minp_verify:rho=0.1': (0.0523, 0.81, 0.2345, 0.0),
        'minp_verify:rho=0.3': (0.0411, 0.62, 0.1876, 0.0),
        'eta_verify:eta=0.1': (None, 1.0, 0.3012, 0.035),
        'lenience:l=0.2': (0.0107, 0.0, 0.0089, 0.0),
    }
    for r in rows:
        if r['method'] in divergences:
            r['kl'], r['kl_inf_fraction'], r['js'], r['overshoot_inf_fraction'] = (
                divergences[r['method']]
            )
    lossless = next(r for r in rows if r['method'] == 'lossless')
    lossless.update(seeds_k=3, avg_at_k=0.4, pass_at_k=0.65, n_timeouts=2, n_infra_errors=1,
                    failed_samples=['7@0: timeout', '7@2: timeout', '9@1: infra'])  # fmt: skip
    curve = theory.parameter_curve('minp_verify', 'rho', (0.1, 0.3), mode='tree',
                                   num_siblings=2, vocab=33, num_pairs=8)  # fmt: skip
    report.write_report(rows, str(tmp_path), mode='tree', theory={'minp_verify': curve})
    text = (tmp_path / 'report.md').read_text()
    headline = text[text.index('## Headline') : text.index('## Over seeds')]
    pairs = text[text.index('## Matched pairs') : text.index('## The paper beside ours')]
    assert '| KL (inf %) |' in headline and '| JS |' in headline and '| JS |' in pairs

    def line(section, method):  # The table row of `method` (headline or pairs), its cells.
        rows = [[c.strip() for c in x.strip('|').split('|')] for x in section.splitlines()
                if x.startswith('| ')]  # fmt: skip
        (found,) = [cells for cells in rows if f'`{method}`' in cells[:2]]
        return found

    for section in (headline, pairs):
        cells = line(section, 'minp_verify:rho=0.1')
        assert '0.0523 (inf 81.0%)' in cells and '0.2345' in cells
        cells = line(section, 'eta_verify:eta=0.1')
        assert 'inf (inf 100%)' in cells and '0.3012' in cells
        assert any(c.endswith('(inf 3.5%)') for c in cells)  # The overshoot's share.
        cells = line(section, 'lenience:l=0.2')
        assert '0.0107' in cells and not any('inf' in c for c in cells)
    cells = line(headline, 'lossless')
    assert '0 / 2 / 1' in cells  # Scorer errors / timeouts / infrastructure errors.
    seeds = text[text.index('## Over seeds') : text.index('## Scoring failures')]
    assert '| math | `lossless` | 3 | 40.0 | 65.0 |' in seeds
    failures = text[text.index('## Scoring failures') : text.index('## Matched pairs')]
    assert '7@0: timeout, 7@2: timeout, 9@1: infra' in failures
    label = plots.theory_label('minp_verify', curve)
    assert 'tree node, top-2 siblings' in label and 'synthetic' in label and label in text
    assert 'not on this run\'s distributions' in text


def test_the_strict_score_stands_beside_the_score(tmp_path):
    """A math task's hedge-free score (metrics' strict_score) is shown beside its score; a
    task without one shows the score alone."""
    rows = make_rows()
    for r in rows:
        if r['task'] == 'math' and r['scored']:
            r['strict_score'] = r['score'] - 0.05
    md = open(report.write_report(rows, str(tmp_path))['report']).read()
    math_part = md[md.index('### math'):md.index('### ', md.index('### math') + 1)]
    first = next(r for r in rows if r['task'] == 'math')
    assert f'(strict {100 * first["strict_score"]:.1f})' in math_part
    gsm = md[md.index('### gsm8k'):md.index('### ', md.index('### gsm8k') + 1)]
    assert re.search(r'\(strict \d', math_part) and not re.search(r'\(strict \d', gsm)
