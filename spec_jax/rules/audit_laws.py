"""The laws `rules.audit` runs a verifier on (docs/laws.md §9): `Law` (p rows, q rows, how
the acceptance uniforms are drawn) and `standard_laws`, random and adversarial."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# The largest float32 below 1: the upper bound of u in [0, 1).
U_TOP = float(np.nextafter(np.float32(1.0), np.float32(0.0)))
U_MODES = {'uniform': None, 'zero': 0.0, 'top': U_TOP}


class Law(NamedTuple):
    """One audited (p, q) chain: p [A+1, V] target rows, q [A, V] draft laws, how u is drawn
    ('uniform' in [0, 1), 'zero', 'top' = 1 - 2^-24)."""

    name: str
    p: np.ndarray
    q: np.ndarray
    u: str = 'uniform'


def _norm(x: np.ndarray) -> np.ndarray:
    return (x / x.sum(-1, keepdims=True)).astype(np.float32)


def standard_laws(v: int = 7, a: int = 2, seed: int = 0) -> tuple[Law, ...]:
    """The default law set: every law has distinct rows at every offset (a verifier reading
    the wrong offset's row emits another law), V = v, A = a drafts.

    random (Dirichlet 1), zeros_p (p = 0 on tokens q drafts), zeros_q (q = 0 where p > 0),
    near_tie (q = p up to 1e-6 per entry: acceptance ~1, an empty residual), point_p (p
    one-hot), point_q (q one-hot on a token with 0 < p < 1), disjoint (supports apart),
    and u_zero / u_top: the zeros_p law with u at 0 and at 1 - 2^-24 in every row.
    """
    if v < 4 or a < 1:
        raise ValueError(f'standard_laws: v={v} (>= 4) and a={a} (>= 1)')
    rng = np.random.default_rng(seed)

    def dirichlet(rows, alpha=1.0):
        return rng.dirichlet(np.full(v, alpha), rows)

    half = v // 2
    laws = [Law('random', _norm(dirichlet(a + 1)), _norm(dirichlet(a)))]
    p, q = dirichlet(a + 1), dirichlet(a, 0.7)
    for i in range(a):  # p = 0 on two tokens q drafts often.
        hot = rng.permutation(v)[:2]
        p[i, hot] = 0.0
        q[i, hot] += 0.3
    zeros_p = (_norm(p), _norm(q))
    laws.append(Law('zeros_p', *zeros_p))
    p, q = dirichlet(a + 1), dirichlet(a)
    for i in range(a):
        q[i, rng.permutation(v)[:half]] = 0.0
    laws.append(Law('zeros_q', _norm(p), _norm(q)))
    p = _norm(dirichlet(a + 1))
    tie = p[:a] * (1.0 + 1e-6 * rng.choice([-1.0, 1.0], (a, v)))
    laws.append(Law('near_tie', p, _norm(tie)))
    onehot = np.eye(v, dtype=np.float32)[rng.integers(v, size=a + 1)]
    laws.append(Law('point_p', onehot, _norm(dirichlet(a))))
    p = _norm(dirichlet(a + 1) + 0.05)
    laws.append(Law('point_q', p, np.eye(v, dtype=np.float32)[rng.integers(v, size=a)]))
    p = np.concatenate([dirichlet(a + 1)[:, :half], np.zeros((a + 1, v - half))], 1)
    q = np.concatenate([np.zeros((a, half)), dirichlet(a)[:, half:]], 1)
    p[-1] = dirichlet(1)[0]  # The bonus row: full support.
    laws.append(Law('disjoint', _norm(p), _norm(q)))
    laws.append(Law('u_zero', *zeros_p, u='zero'))
    laws.append(Law('u_top', *zeros_p, u='top'))
    return tuple(laws)


def stack(laws: tuple[Law, ...]) -> tuple[np.ndarray, np.ndarray]:
    shapes = {(law.p.shape, law.q.shape) for law in laws}
    if len(shapes) != 1:
        raise ValueError(f'audit: the laws differ in shape {sorted(shapes)}; one A and V each')
    ((p_shape, q_shape),) = shapes
    if len(p_shape) != 2 or q_shape != (p_shape[0] - 1, p_shape[1]):
        raise ValueError(f'audit: p {p_shape}, q {q_shape}: want [A+1, V] and [A, V]')
    for law in laws:
        if law.u not in U_MODES:
            raise ValueError(f'audit: law {law.name!r} u={law.u!r}; valid: {sorted(U_MODES)}')
    p = np.stack([law.p for law in laws]).astype(np.float32)
    q = np.stack([law.q for law in laws]).astype(np.float32)
    return p, q
