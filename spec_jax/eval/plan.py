"""An experiment's methods: the grid of rules, each lossy rule paired with its matched
baseline, plus plain lossless speculative decoding and plain AR.

A lossy truncation rule must be compared with "the target, the same truncation sampler and
lossless verification", whose output law is exactly the truncated target p_A: against plain
lossless SD, accuracy changes caused by the truncation itself would be credited to the
verifier (docs/engine.md, matched baselines). `plan` builds that list for any grid, so no
experiment can leave a pairing out, and says which convention each baseline follows:

  chain: the truncation applied to the target at every verified position and to the draft
         (the draft samples from its own truncation); lossless verification;
  tree:  the truncation applied to the target only (the draft tree is deterministic);
         lossless tree verification.

Rules whose matched baseline truncates nothing (lenience, CoS, the overshoot ablations, the
SpecCascade deferrals whose sets depend on q) pair with plain lossless SD itself.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from spec_jax import rules
from spec_jax.rules.baselines import LOGIT_TRUNCATIONS

CONVENTIONS = {'chain': 'target and draft truncated', 'tree': 'target truncated'}
# Static fields of a rule that shape its baseline's set beside the truncation's parameter:
# relaxed acceptance's set is the top K within delta, so rules with one delta and two Ks
# need two baselines (its bonus mode and span do not change the set, docs/laws.md §5).
SET_FIELDS = {'relaxed': ('top_k',)}


@dataclasses.dataclass(frozen=True)
class Method:
    """One decoding method of an experiment.

    Attributes:
      name: a unique, readable name ('ar', 'lossless', 'lenience:l=0.5',
        'baseline[min_p=0.3]').
      mode: the engine mode: 'ar', or the experiment's speculative mode ('chain', 'tree').
      rule: the rule spec `rules.make` reads ('lossless' for AR and lossless SD).
      baseline: run the rule's matched baseline (truncation + lossless verification).
      truncation: the baseline's truncation ('none' unless `baseline`), and its parameter.
      param: the truncation's parameter (None when it has none).
      pairs: for a baseline, the names of the lossy methods it is matched to; for a lossy
        method, the name of its baseline.
      convention: how the baseline truncates (CONVENTIONS), '' unless `baseline`.
    """

    name: str
    mode: str
    rule: str
    baseline: bool = False
    truncation: str = 'none'
    param: float | None = None
    pairs: tuple[str, ...] = ()
    convention: str = ''


def rule_spec(rule: rules.Rule) -> str:
    """The `rules.make` spec string of a concrete rule ('lenience:l=0.5')."""
    fields = [f'{f.name}={getattr(rule, f.name)!r}'.replace("'", '') for f in
              dataclasses.fields(rule)]  # fmt: skip
    return rule.name + (':' + ','.join(fields) if fields else '')


def plan(grid: Sequence[str], mode: str = 'chain') -> list[Method]:
    """The methods of an experiment over `grid` (rule specs, e.g. 'minp_verify:rho=0.3').

    Returns AR, lossless SD, every rule of the grid, and one matched baseline per distinct
    truncation (several rules may share one: min-p verification at rho and SpecCascade
    token_v3 at 1 - rho both truncate to min-p(rho)), in that order, with the pairing
    recorded on both sides.

    Raises:
      ValueError: an unknown mode, an unknown or invalid rule, a lossless rule in the grid,
        or a rule without a tree form in tree mode.
    """
    if mode not in CONVENTIONS:
        raise ValueError(f'mode {mode!r} is not one of {sorted(CONVENTIONS)}')
    methods = {
        'ar': Method('ar', 'ar', 'lossless'),
        'lossless': Method('lossless', mode, 'lossless'),
    }
    lossy, baselines = [], {}
    for spec in grid:
        rule = rules.make(spec)
        if rule.name == 'lossless':
            raise ValueError(f'{spec!r}: lossless SD is always in the plan; grid rules are lossy')
        if mode == 'tree' and not rule.tree_modes:
            raise ValueError(f'{spec!r}: rule {rule.name!r} has no tree form (tree mode)')
        name = rule_spec(rule)
        if name in methods:
            raise ValueError(f'{spec!r} appears twice in the grid')
        matched = rules.matched_baseline(rule)
        shape = tuple((f, getattr(rule, f)) for f in SET_FIELDS.get(matched.truncation, ()))
        key = (matched.truncation, None if matched.param is None else float(matched.param),
               shape)  # fmt: skip
        if key == ('none', None, ()):
            base_name = 'lossless'
        else:
            param = '' if key[1] is None else f'={key[1]:g}'
            base_name = f'baseline[{key[0]}{param}' + ''.join(f',{f}={v}' for f, v in shape) + ']'
            baselines.setdefault(base_name, (spec, key, []))[2].append(name)
        methods[name] = Method(name, mode, name, pairs=(base_name,))
        lossy.append(name)
    out = list(methods.values())
    for base_name, (spec, (truncation, param, _), paired) in baselines.items():
        out.append(
            Method(base_name, mode, rule_spec(rules.make(spec)), True, truncation, param,
                   tuple(paired), convention(truncation, mode))  # fmt: skip
        )
    plain_pairs = tuple(n for n in lossy if methods[n].pairs == ('lossless',))
    out[1] = dataclasses.replace(out[1], pairs=plain_pairs)
    return out


def convention(truncation: str, mode: str) -> str:
    """How a baseline truncates (CONVENTIONS[mode]), except the sets read from the target's
    raw logits (relaxed acceptance, MARS), which truncate the target only in both modes: the
    draft has no such logits (docs/laws.md §5)."""
    return CONVENTIONS['tree'] if truncation in LOGIT_TRUNCATIONS else CONVENTIONS[mode]


def describe(methods: Sequence[Method]) -> str:
    """A plan as lines a person reads before a run (`--dry_run`)."""
    lines = []
    for m in methods:
        what = 'plain AR' if m.mode == 'ar' else f'{m.mode}, rule {m.rule}'
        if m.baseline:
            param = '' if m.param is None else f' {m.param:g}'
            what = (f'{m.mode}, lossless verification of the {m.truncation}{param} truncation '
                    f'({m.convention}); matched to {", ".join(m.pairs)}')  # fmt: skip
        elif m.name == 'lossless':
            what += f'; the matched baseline of {", ".join(m.pairs) or "no grid rule"}'
        elif m.pairs:
            what += f'; matched baseline: {m.pairs[0]}'
        lines.append(f'{m.name:32s} {what}')
    return '\n'.join(lines)
