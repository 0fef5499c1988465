"""Closed-form distortion curves on synthetic (p, q): the theory `launch/diagnose.py`
plots (spec_jax/jobs/diagnose.py writes the files) and the evaluation report sets beside
its measurements (`parameter_curve`).

For a family of random targets p and drafts q_t = softmax((1 - t) z_q + t z_p) that move
towards p as t goes 0 -> 1, every rule's induced law pi (chain: `rule.induced`; tree node:
`rule.induced_tree_node` with the draft's top-C tokens as ordered siblings) is compared with
its matched baseline p_A (docs/laws.md §5). Draft quality is 1 - TV(p, q_t). `run_theory`
computes the curves and checks the paper's claims numerically (`check_claims`):

  lossless_exact          lossless (and greedy) distortion is 0 in chain and tree mode;
  chain_truncation_floor  chain min-p/eta distortion does not vanish as q -> p: at q = p it
                          equals (1 - p(A))^2, the leaked tail mass (the paper writes
                          1 - p(A), assuming pi -> p; the exact limit is the square);
  tree_truncation_greedy  tree min-p/eta tends to onehot(argmax p) (near-greedy) and its
                          distortion tends to 1 - p_A(argmax) > 0;
  lenience_ceiling        lenience keeps pi <= p/l everywhere (chain and tree);
  cos_no_ceiling          CoS's pi/p is unbounded (large on tail tokens).

Pure jax and numpy, like the rest of `spec_jax.rules`.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.rules import base, distortion, registry
from spec_jax.rules.baselines import matched_baseline


def synthetic_family(
    seed: int, vocab: int, num_pairs: int, num_points: int, logit_scale: float
) -> dict[str, np.ndarray]:
    """Random targets p [P, V] and drafts q [T, P, V] moving towards p (q at t = 1 is p).

    Logits are N(0, logit_scale^2); q_t = softmax((1 - t) z_q + t z_p), t = linspace(0, 1).
    """
    rng = np.random.default_rng(seed)
    z_p = rng.normal(size=(num_pairs, vocab)) * logit_scale
    z_q = rng.normal(size=(num_pairs, vocab)) * logit_scale
    t = np.linspace(0.0, 1.0, num_points)
    p = jax.nn.softmax(jnp.asarray(z_p, jnp.float32), -1)
    z_t = (1.0 - t)[:, None, None] * z_q[None] + t[:, None, None] * z_p[None]
    q = jax.nn.softmax(jnp.asarray(z_t, jnp.float32), -1)
    q = q.at[-1].set(p)  # Exactly p at t = 1.
    return {'t': t, 'p': np.asarray(p), 'q': np.asarray(q)}


def _metrics(pi, p, law):
    """Per-pair metrics [..]: TV/KL to the baseline law, TV to p, max pi/p, TV to argmax."""
    greedy = base.onehot_argmax(p)
    return {
        'tv_baseline': distortion.tv(pi, law),
        'kl_baseline': distortion.kl(pi, law),
        'tv_target': distortion.tv(pi, p),
        'overshoot_p': distortion.overshoot_ratio(pi, p),
        'tv_greedy': distortion.tv(pi, greedy),
        'one_minus_pa': 1.0 - jnp.where(law > 0, p, 0.0).sum(-1),
        'one_minus_pa_top': 1.0 - (law * greedy).sum(-1),
    }


def curves(
    rule: base.Rule, family: dict[str, np.ndarray], mode: str, num_siblings: int
) -> dict[str, np.ndarray]:
    """Distortion curves of one rule in 'chain' or 'tree' mode: each metric [T, P]."""
    baseline = matched_baseline(rule)

    @jax.jit
    def run(p, q):
        law = baseline.law(p)
        if mode == 'chain':
            pi = jax.vmap(lambda qt: rule.induced(p, qt))(q)
            rate = jax.vmap(lambda qt: rule.acceptance_rate(p, qt))(q)
        else:
            sibs = jax.lax.top_k(q, num_siblings)[1]  # [T, P, C], descending draft order.
            pi = jax.vmap(lambda s: rule.induced_tree_node(p, s))(sibs)
            rate = jnp.zeros(q.shape[:-1])
        out = _metrics(pi, p[None], law[None])
        out['acceptance'] = rate
        out['quality'] = 1.0 - distortion.tv(p[None], q)
        return out

    return {k: np.asarray(v) for k, v in run(family['p'], family['q']).items()}


def run_theory(config: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Computes every rule's curves and checks the claims; returns (csv rows, claims)."""
    fam = synthetic_family(
        config.seed, config.vocab, config.num_pairs, config.num_points, config.logit_scale
    )
    rows, results = [], {}
    for spec in config.rules:
        rule = registry.make(spec)
        modes = ['chain'] + (['tree'] if 'deterministic' in rule.tree_modes else [])
        for mode in modes:
            res = curves(rule, fam, mode, config.num_siblings)
            results[(spec, mode)] = (rule, res)
            for i, t in enumerate(fam['t']):
                rows.append(
                    {
                        'mode': mode,
                        'rule': spec,
                        't': float(t),
                        'quality': float(res['quality'][i].mean()),
                        'tv_baseline': float(res['tv_baseline'][i].mean()),
                        'kl_baseline': float(res['kl_baseline'][i].mean()),
                        'tv_target': float(res['tv_target'][i].mean()),
                        'tv_greedy': float(res['tv_greedy'][i].mean()),
                        'overshoot_p_max': float(res['overshoot_p'][i].max()),
                        'acceptance': float(res['acceptance'][i].mean()),
                    }
                )
    return rows, check_claims(results)


def check_claims(results: dict) -> dict[str, Any]:
    """Checks the paper's claims on computed curves; each entry has 'holds' and numbers."""
    claims: dict[str, Any] = {}

    def add(name, holds, **numbers):
        entry = claims.setdefault(name, {'holds': True, 'cases': []})
        entry['holds'] = bool(entry['holds'] and holds)
        entry['cases'].append({'holds': bool(holds), **numbers})

    for (spec, mode), (rule, res) in results.items():
        tv_end = res['tv_baseline'][-1]  # At q = p.
        if rule.lossless:
            worst = float(res['tv_baseline'].max())
            add('lossless_exact', worst < 1e-5, rule=spec, mode=mode, max_tv=worst)
        truncation = rule.name in ('minp_verify', 'eta_verify') or (
            rule.name == 'speccascade' and getattr(rule, 'deferral', '') == 'token_v3'
        )
        if truncation and mode == 'chain':
            floor = float(np.mean(res['one_minus_pa'][-1] ** 2))
            got = float(tv_end.mean())
            add(
                'chain_truncation_floor',
                abs(got - floor) < 1e-4 and got > 0,
                rule=spec,
                tv_at_q_eq_p=got,
                predicted_sq=floor,
                paper_1_minus_pA=float(res['one_minus_pa'][-1].mean()),
            )
        if truncation and mode == 'tree':
            greedy_gap = float(res['tv_greedy'][-1].mean())
            got = float(tv_end.mean())
            predicted = float(res['one_minus_pa_top'][-1].mean())
            add(
                'tree_truncation_greedy',
                greedy_gap < 1e-3 and got > 0.01 and abs(got - predicted) < 1e-3,
                rule=spec,
                tv_to_greedy_at_q_eq_p=greedy_gap,
                tv_at_q_eq_p=got,
                predicted=predicted,
            )
        if rule.name == 'lenience':
            worst = float(res['overshoot_p'].max())
            add(
                'lenience_ceiling',
                worst <= 1.0 / rule.l + 1e-4,
                rule=spec,
                mode=mode,
                max_ratio=worst,
                ceiling=1.0 / rule.l,
            )
        if rule.name == 'cos' and mode == 'chain':
            worst = float(res['overshoot_p'].max())
            bound = 1.0 / max(1.0 - rule.lam, 1e-6)
            add(
                'cos_no_ceiling',
                worst > 10.0 * bound,
                rule=spec,
                max_ratio=worst,
                comparison_1_over_1_minus_lam=bound,
            )
    return claims


def parameter_curve(
    rule_name: str,
    param_name: str,
    values,
    *,
    mode: str = 'chain',
    num_siblings: int = 1,
    quality_t: float = 0.5,
    seed: int = 0,
    vocab: int = 257,
    num_pairs: int = 64,
    logit_scale: float = 2.0,
) -> dict[str, Any]:
    """Theory distortion of one rule family vs its parameter, at one draft quality.

    On `synthetic_family(seed, vocab, num_pairs, ., logit_scale)` at draft interpolation
    t = `quality_t` (q_t = softmax((1 - t) z_q + t z_p)), each value v builds
    `make(f'{rule_name}:{param_name}={v}')` and takes the `mode` `curves` TV against its
    matched baseline, averaged over the pairs: chain, the rule's induced law
    (docs/laws.md §3.2, §4.1); tree, its node law with the draft's top `num_siblings`
    tokens as the ordered deterministic siblings (EAGLE's top-k; §3.3, §4.2). The report's
    distortion figure draws it dashed beside the measured TV
    (`spec_jax.eval.plots.distortion_vs_param`), labelled synthetic: random (p, q) pairs,
    not the run's own distributions, so its level says nothing about the run's.

    Args:
      rule_name: a registry name ('minp_verify', 'lenience', ...).
      param_name: the swept parameter ('rho', 'l', ...).
      values: the parameter values.
      mode: 'chain' or 'tree' (the rule must have a deterministic tree form).
      num_siblings: tree mode's siblings per node (the run's branch), >= 1.
      quality_t: the interpolation t in [0, 1] (1: q = p).
      seed, vocab, num_pairs, logit_scale: the synthetic family's arguments.

    Returns:
      {'param': [v...], 'param_name', 'tv': [mean TV...], 'quality': mean 1 - TV(p, q_t), 'mode',
       'label': 'theory, synthetic p, q (chain; draft quality 0.xx)'}.

    Raises:
      ValueError: quality_t outside [0, 1], a bad mode or num_siblings, a rule without a
        tree form in tree mode, or an invalid rule or parameter (from `make`).
    """
    if not 0.0 <= quality_t <= 1.0:
        raise ValueError(f'quality_t={quality_t!r} must be in [0, 1]')
    if mode not in ('chain', 'tree'):
        raise ValueError(f"mode={mode!r} must be 'chain' or 'tree'")
    if not 1 <= num_siblings <= vocab:
        raise ValueError(f'num_siblings={num_siblings!r} must be in [1, vocab={vocab}]')
    values = [float(v) for v in values]
    ends = synthetic_family(seed, vocab, num_pairs, 2, logit_scale)  # t = 0 and t = 1.
    # log softmax(z) = z - logsumexp(z) per row: a row shift, which the softmax ignores, so the
    # family's member at any t is a softmax of the same mix of the end points' logs.
    log_p = jnp.log(jnp.maximum(jnp.asarray(ends['p']), jnp.finfo(jnp.float32).tiny))
    log_q = jnp.log(jnp.maximum(jnp.asarray(ends['q'][0]), jnp.finfo(jnp.float32).tiny))
    q_t = jax.nn.softmax((1.0 - quality_t) * log_q + quality_t * log_p, -1)
    family = {'t': np.asarray([quality_t]), 'p': ends['p'], 'q': np.asarray(q_t)[None]}
    tvs, quality = [], float('nan')
    for v in values:
        rule = registry.make(f'{rule_name}:{param_name}={v}')
        if mode == 'tree' and 'deterministic' not in rule.tree_modes:
            raise ValueError(f'{rule_name} has no deterministic tree form (tree_modes '
                             f'{rule.tree_modes}); tree mode takes one that has')  # fmt: skip
        res = curves(rule, family, mode, num_siblings)
        tvs.append(float(res['tv_baseline'][0].mean()))
        quality = float(res['quality'][0].mean())
    what = 'chain' if mode == 'chain' else f'tree node, top-{num_siblings} siblings'
    return {
        'param': values,
        'param_name': param_name,
        'tv': tvs,
        'quality': quality,
        'mode': mode,
        'label': f'theory, synthetic p, q ({what}; draft quality {quality:.2f})',
    }
