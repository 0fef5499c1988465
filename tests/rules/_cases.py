"""Shared (p, q) cases and Monte Carlo helpers for the rules tests."""

from __future__ import annotations

import numpy as np

V = 6

RULE_SPECS = (
    'lossless',
    'greedy',
    'lenience:l=0.5',
    'lenience:l=0.2',
    'cos:lam=0.4',
    'overshoot_only:l=0.5',
    'overshoot_tail:l=0.5,rho=0.3',
    'uniform_interp:w=0.3',
    'minp_verify:rho=0.3',
    'eta_verify:eta=0.2',
    'typical:eps=0.2',
    'typical:eps=0.2,mode=sample',
    'speccascade:deferral=chow,alpha=0.5',
    'speccascade:deferral=diff,alpha=0.2',
    'speccascade:deferral=opt,alpha=0.5',
    'speccascade:deferral=token_v1,alpha=0.3',
    'speccascade:deferral=token_v2,alpha=0.2',
    'speccascade:deferral=token_v3,alpha=0.6',
    # The serving engines' per-position rules and the overshoot ablations (their upstream
    # enumerations: tests/rules/test_engine_rules.py); the logit and block rules meet
    # verify_chain through `raw` / `accept_block` (test_logit_rules, test_block_rules).
    'static_ensemble:w=0.7',
    'logit_ensemble:w_d=0.3',
    'sglang:t_s=0.5,t_a=0.5',
    'onehot_q',
    'lenience_flat:l=0.4',
    'interp_ceiling:w=0.5',
    # On the distortion frontier with a per-position TV cap (tests/rules/test_budget.py).
    'tv_budget:eps=0.1,l=0.5',
    # Cactus (block-level: its residual reads the rejected draft; tests/rules/test_cactus.py)
    # and vllm-ascend's entropy verify (lenience with an entropy-read l).
    'cactus:delta=0.5',
    'entropy_verify',
)

TREE_SPECS = (
    'lossless',
    'greedy',
    'lenience:l=0.5',
    'minp_verify:rho=0.3',
    'eta_verify:eta=0.2',
)


def cases(v: int = V) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Named (p, q) pairs: random, peaked, flat, disjoint supports, equal, one-hot p."""
    rng = np.random.default_rng(1234)
    rand_p, rand_q = rng.dirichlet(np.ones(v)), rng.dirichlet(np.ones(v))
    peaked = np.full(v, 0.02)
    peaked[2] = 1.0 - 0.02 * (v - 1)
    flat = np.full(v, 1.0 / v)
    half = v // 2
    disjoint_p = np.r_[rng.dirichlet(np.ones(half)), np.zeros(v - half)]
    disjoint_q = np.r_[np.zeros(half), rng.dirichlet(np.ones(v - half))]
    onehot = np.eye(v)[1]
    out = {
        'random': (rand_p, rand_q),
        'peaked_p_flat_q': (peaked, flat),
        'flat_p_peaked_q': (flat, rng.dirichlet(np.full(v, 0.3))),
        'disjoint': (disjoint_p, disjoint_q),
        'equal': (rand_p, rand_p),
        'onehot_p': (onehot, rand_q),
    }
    return {k: (a.astype(np.float32), b.astype(np.float32)) for k, (a, b) in out.items()}


def tv_bound(pi: np.ndarray, n: int) -> float:
    """4x the bound E[TV(empirical, pi)] <= 1/2 sum_v sqrt(pi(v)(1 - pi(v)) / n), plus slack.

    For n = 1e5 draws and V = 6 the expected TV is at most ~0.004; four times that keeps a
    fixed-seed test far from flaky while still catching law errors of ~0.02. The 2e-4 slack
    covers float32 rounding in the closed forms.
    """
    pi = np.clip(np.asarray(pi, np.float64), 0.0, 1.0)
    return 4.0 * 0.5 * float(np.sum(np.sqrt(pi * (1.0 - pi) / n))) + 2e-4


def empirical(tokens: np.ndarray, v: int) -> np.ndarray:
    """Histogram of tokens [n] over v values, normalised."""
    return np.bincount(np.asarray(tokens).reshape(-1), minlength=v)[:v] / tokens.size


def key(seed: int):
    """A PRNG key for tests. 'rbg' keys compile ~3x faster than threefry on XLA:CPU."""
    import jax

    return jax.random.key(seed, impl='rbg')


def stacked(v: int = V):
    """All cases stacked: (names, p [K, V], q [K, V])."""
    named = cases(v)
    p = np.stack([pq[0] for pq in named.values()])
    q = np.stack([pq[1] for pq in named.values()])
    return tuple(named), p, q
