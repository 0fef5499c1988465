"""The rules the serving engines ship (issue 32), judged twice: against their matched baseline
and against plain lossless SD, the comparison their authors publish.

A lossy rule with an allowed set (relaxed acceptance's top-K-within-delta, MARS's gated top
2, min-p verification) is matched with that set imposed on the target and verified
losslessly (docs/laws.md §5); measured against plain lossless SD instead, the block
efficiency and speed the truncation itself buys are credited to the verifier. Rules without
a set are matched with lossless SD itself, and for them the two comparisons are one.

`vs_plain_sd` gives a lossy metrics row (`spec_jax.eval.metrics`) its paired Δs against the
'lossless' method on the (item, seed) keys both ran (`spec_jax.eval.stats.paired.matched_deltas`,
so a partial run compares the same samples), and the *flattery*: Δ vs lossless SD minus Δ
vs matched (BE: a difference; speedup: a ratio), with the interval of the matched
baseline's own paired Δ over lossless SD, which equals it on a complete run (the same keys
and batches on all three). `section` is the report's "Rules the engines ship", present when
a run holds an engine rule; `finding_lines` are its sentences, which the findings print.

TV is metered twice at every emitted position (`rules.meter`): against the matched
baseline's law p_A (`tv`, 'TV vs matched') and against the processed target p itself
(`tv_plain`, 'TV vs lossless SD': what plain SD emits). They differ only for a rule matched
with a truncated target, whose TV vs lossless SD includes the truncation's own.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from spec_jax import rules
from spec_jax.eval import tables
from spec_jax.eval.stats import paired, verdicts

PLAIN = 'lossless'  # The plan's plain lossless SD method (`spec_jax.eval.plan`).
# The engines' rules (docs/rules.md) and the single-factor overshoot ablations (§4.7).
ENGINE_RULES = ('static_ensemble', 'logit_ensemble', 'sglang', 'onehot_q', 'relaxed', 'mars',
                'fuzzy', 'block_verify', 'fly')  # fmt: skip
ABLATIONS = ('lenience_flat', 'interp_ceiling')
_DELTAS = ('pair_n', 'd_score', 'd_score_lo', 'd_score_hi', 'd_be', 'd_be_lo', 'd_be_hi',
           'd_tv_plain', 'd_tv_plain_lo', 'd_tv_plain_hi')  # fmt: skip
_SPEED = ('speedup_vs_matched', 'speedup_vs_matched_lo', 'speedup_vs_matched_hi',
          'speedup_vs_matched_n_batches')  # fmt: skip
# The fields `vs_plain_sd` gives every row (None where they do not apply).
FIELDS = (*(f'sd_{k}' for k in _DELTAS), 'sd_speedup', 'sd_speedup_lo', 'sd_speedup_hi',
          'sd_speedup_n_batches', 'flattery_score', 'flattery_score_lo', 'flattery_score_hi',
          'flattery_be', 'flattery_be_lo', 'flattery_be_hi', 'flattery_speedup',
          'flattery_speedup_lo', 'flattery_speedup_hi')  # fmt: skip

Rows = Callable[[str], Sequence[dict]]


def _sd(d: dict) -> dict:
    """matched_deltas' fields renamed as the Δs against plain lossless SD."""
    out = {f'sd_{k}': d.get(k) for k in _DELTAS}
    out.update({k.replace('speedup_vs_matched', 'sd_speedup'): d.get(k) for k in _SPEED})
    return out


def vs_plain_sd(row: dict, rows_of: Rows, timed_of: Rows) -> dict:
    """FIELDS of one metrics row: for a lossy row, its Δs against plain lossless SD and the
    flattery; None elsewhere, or where the run has no lossless SD.

    Args:
      row: a metrics row with its matched Δs (`paired.matched_deltas`) already in it.
      rows_of: a method's per-sample results of the row's task.
      timed_of: a method's results of the row's timing group (the speedup's batches).
    """
    out = dict.fromkeys(FIELDS)
    matched = tables.matched_name(row)
    if matched is None:
        return out
    if matched == PLAIN:  # One comparison: the same numbers, flattery 0 exactly.
        out.update(_sd(row))
        out.update(flattery_be=0.0, flattery_speedup=1.0,
                   flattery_score=0.0 if tables.num(row.get('d_score')) else None)  # fmt: skip
        return out
    plain = rows_of(PLAIN)
    if not plain:
        return out
    vs = paired.matched_deltas(rows_of(row['method']), plain,
                               (timed_of(row['method']), timed_of(PLAIN)))  # fmt: skip
    out.update(_sd(vs))
    base = paired.matched_deltas(rows_of(matched), plain, (timed_of(matched), timed_of(PLAIN)))
    for name in ('score', 'be'):
        ours, theirs = vs.get(f'd_{name}'), row.get(f'd_{name}')
        out[f'flattery_{name}'] = tables.diff(ours, theirs)
        out[f'flattery_{name}_lo'], out[f'flattery_{name}_hi'] = (
            base.get(f'd_{name}_lo'), base.get(f'd_{name}_hi'))  # fmt: skip
    ours, theirs = vs.get('speedup_vs_matched'), row.get('speedup_vs_matched')
    if tables.num(ours) and tables.num(theirs) and theirs > 0:
        out['flattery_speedup'] = ours / theirs
        out['flattery_speedup_lo'] = base.get('speedup_vs_matched_lo')
        out['flattery_speedup_hi'] = base.get('speedup_vs_matched_hi')
    return out


def family(rule: str) -> str:
    """'engine', 'ablation' or 'paper' (every other lossy rule) of a rule name."""
    return 'engine' if rule in ENGINE_RULES else 'ablation' if rule in ABLATIONS else 'paper'


def has_engine_rules(rows: Sequence[dict]) -> bool:
    return any(r.get('kind') == 'lossy' and r.get('rule') in ENGINE_RULES for r in rows)


def _lossless_rule(method: str) -> bool | None:
    try:
        return bool(rules.make(method).lossless)
    except (ValueError, TypeError):
        return None


def flattery_tests(group: str, row: dict) -> list[verdicts.Test]:
    """The flattery of a lossy row matched with something other than lossless SD, as Tests
    of the run's family (`spec_jax.eval.findings.tests`): its BE (a difference, judged
    against 0 over the row's items) and its speed (a ratio, against 1 over its batches or
    design units), each from the matched baseline's own interval over lossless SD. Keys
    (group, method, 'flattery_be' / 'flattery_speedup'); none for other rows."""
    matched = tables.matched_name(row)
    if matched in (None, PLAIN) or not tables.num(row.get('sd_d_be')):
        return []
    m = row['method']
    out = [verdicts.t_test((group, m, 'flattery_be'), row.get('flattery_be'),
                           row.get('flattery_be_lo'), row.get('flattery_be_hi'),
                           row.get('pair_n_items') or row.get('pair_n'))]  # fmt: skip
    if tables.num(row.get('flattery_speedup')):
        n = row.get('speedup_vs_matched_n_units') or row.get('speedup_vs_matched_n_batches')
        out.append(verdicts.t_test((group, m, 'flattery_speedup'), row['flattery_speedup'],
                                   row.get('flattery_speedup_lo'),
                                   row.get('flattery_speedup_hi'), n, ref=1.0, log=True,
                                   min_n=verdicts.MIN_BATCHES, unit='batches'))  # fmt: skip
    return out


# The family's verdict words as the flattery's.
_WORDS = {'above': 'flatters it', 'below': 'understates it', 'not': 'not distinguishable'}


def _verdict(fam: verdicts.Family | None, key: tuple) -> str:
    """' (flatters it; Holm p 0.01)', ' (understates it; ...)', ' (not distinguishable;
    Holm p 0.4)' or ' (too few items to judge)' from the run's family; '' without a family
    (numbers only: the verdicts are the findings')."""
    if fam is None or key not in fam.verdicts:
        return ''
    said = fam.verdicts[key]
    words = _WORDS.get(said.split(' ')[0], said)
    adj = fam.adjusted.get(key)
    return f' ({words}; Holm p {adj:.3g})' if adj is not None else f' ({words})'


def _tv_vs_plain(row: dict) -> str:
    """TV against plain lossless SD's law (the processed target), with its interval: the
    rule's metered `tv_plain` paired with lossless SD's (0); 'not metered' on results that
    predate it."""
    if tables.num(row.get('sd_d_tv_plain')):
        return tables.interval(row, 'sd_d_tv_plain', '.4f')
    if tables.matched_name(row) == PLAIN:
        return tables.interval(row, 'd_tv', '.4f')
    return 'not metered'


def finding_lines(
    group: str, rows: Sequence[dict], fam: verdicts.Family | None = None
) -> list[str]:  # fmt: skip
    """Per lossy rule matched with something other than lossless SD, a sentence: its ΔBE
    and speedup against lossless SD and against its matched baseline, and how much the
    plain-SD comparison flatters it (with the matched baseline's own Δ interval) and, with
    the run's family `fam` (whose Holm adjustment covers `flattery_tests`), its verdict
    and Holm p; one sentence for the rules whose matched baseline is lossless SD."""
    lines, plain = [], []
    for r in rows:
        matched = tables.matched_name(r)
        if matched is None or not tables.num(r.get('sd_d_be')):
            continue
        if matched == PLAIN:
            plain.append(str(r['method']))
            continue
        m = r['method']
        be = _verdict(fam, (group, m, 'flattery_be'))
        speed = _verdict(fam, (group, m, 'flattery_speedup'))
        lines.append(
            f'{group}: {r["method"]}: against lossless SD BE '
            f'{tables.interval(r, "sd_d_be", "+.3f")}, speedup '
            f'{tables.interval(r, "sd_speedup", ".2f")}x; against {matched} BE '
            f'{tables.interval(r, "d_be", "+.3f")}, speedup '
            f'{tables.interval(r, "speedup_vs_matched", ".2f")}x: the plain-SD comparison '
            f'adds {tables.interval(r, "flattery_be", "+.3f")} BE{be} and x'
            f'{tables.interval(r, "flattery_speedup", ".2f")} speed{speed}'
        )
    if plain:
        lines.append(f'{group}: {len(plain)} rules are matched with lossless SD itself (no '
                     'allowed set, docs/laws.md §5): for them the plain-SD comparison is the '
                     'matched one')  # fmt: skip
    return lines


def section(rows: Sequence[dict]) -> list[str]:
    """'## Rules the engines ship': per task group, every lossy rule (the engines', the
    ablations and the paper's beside them) against its matched baseline and against plain
    lossless SD, then `finding_lines`; nothing when no engine rule ran."""
    if not has_engine_rules(rows):
        return []
    lines = [
        '## Rules the engines ship',
        '',
        'Each lossy rule against its matched baseline (its allowed set imposed on the target '
        'and verified losslessly, or lossless SD where it has none; docs/laws.md §5) and '
        'against plain lossless SD, the comparison engines publish. Δ = rule minus '
        'reference on the (item, seed) samples both ran, 95% t-intervals over items; '
        "speedups are tokens/s over the reference's per shared batch (geometric mean, "
        't-interval from 5 batches on). Flattery = Δ vs lossless SD minus Δ vs matched (BE), '
        "or their ratio (speed), with the interval of the matched baseline's own Δ over "
        'lossless SD (the same number on a complete run); its verdicts are in the findings '
        '(one Holm family), not here. TV vs matched is against the '
        "baseline's law p_A, TV vs lossless SD against the processed target p itself (both "
        'metered at every emitted position). '
        'Lossless: the rule at this setting emits the target law.',
        '',
    ]
    header = ('group', 'rule', 'family', 'lossless', 'matched', 'n', 'TV vs matched',
              'TV vs lossless SD', 'ΔBE vs matched', 'ΔBE vs lossless SD',
              'speedup vs matched', 'speedup vs lossless SD', 'speedup vs AR',
              'flattery ΔBE', 'flattery speed')  # fmt: skip
    scored = any(tables.num(r.get('d_score')) for r in rows)
    if scored:
        header += ('Δscore vs matched', 'Δscore vs lossless SD')
    body, out = [], []
    for group in tables.tasks(rows):
        sel = [r for r in rows if r['task'] == group and tables.matched_name(r) is not None]
        for r in sel:
            lossless = _lossless_rule(str(r['method']))
            cells = [
                group, f'`{r["method"]}`', family(str(r.get('rule'))),
                {True: 'yes', False: 'no', None: '?'}[lossless], f'`{tables.matched_name(r)}`',
                str(r.get('pair_n')), tables.interval(r, 'd_tv', '.4f'), _tv_vs_plain(r),
                tables.interval(r, 'd_be', '+.3f'), tables.interval(r, 'sd_d_be', '+.3f'),
                tables.interval(r, 'speedup_vs_matched', '.2f'),
                tables.interval(r, 'sd_speedup', '.2f'), tables.interval(r, 'speedup', '.2f'),
                tables.interval(r, 'flattery_be', '+.3f'),
                tables.interval(r, 'flattery_speedup', '.2f'),
            ]  # fmt: skip
            if scored:
                cells += [tables.interval(r, 'd_score', '+.1f', 100.0),
                          tables.interval(r, 'sd_d_score', '+.1f', 100.0)]  # fmt: skip
            body.append(cells)
        out += [f'- {line}' for line in finding_lines(group, sel)]
    return lines + tables.table(header, body) + [''] + out + ([''] if out else [])
