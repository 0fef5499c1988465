"""Speculative cascades (Narasimhan et al., ICLR 2025), docs/laws.md §3.4."""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

from spec_jax import sampling
from spec_jax.rules import base, registry

DEFERRALS = ('chow', 'diff', 'opt', 'token_v1', 'token_v2', 'token_v3')


@registry.register
@dataclasses.dataclass(frozen=True)
class SpecCascade(base.YieldRule):
    """SpecCascade: lossless speculative sampling against a deferral mixture pi, docs/laws.md §3.4.

    Inputs: p and q as given. The original colab evaluates the deferral criteria on T = 1
    probabilities and the mixture on temperature-scaled ones; this rule reads both from the
    p and q it is given (pass T = 1 probabilities to reproduce the colab exactly at T = 1).

    Deferral rules ('use the drafter' criterion; alpha is the rule's lenience):
      chow      max q >= 1 - alpha                          pi = q if criterion else p
      diff      max q >= max p - alpha                      same switch
      opt       max q >= max p - alpha TV(q, p)             same switch, TV = sum (q - p)_+
      token_v1  A = {v : q(v) >= max p - alpha}             pi = q 1_A + (1 - q(A)) p
      token_v2  A = {v : p(v) >= max p - alpha}             same
      token_v3  A = {v : p(v) >= (1 - alpha) max p}         same (min-p with rho = 1 - alpha)

    - a(x) = min(1, pi(x)/q(x)); yield y = min(q, pi).
    - Replacement: norm((pi - q)_+), falling back to p.
    - Bonus: p.
    - Law: pi exactly (lossless against pi). For token_v3, pi equals the law of
      `minp_verify(rho = 1 - alpha)` while the acceptance is higher:
      q(A) + sum_{x not in A} min(q(x), (1 - q(A)) p(x)).
    """

    deferral: str = 'token_v3'
    alpha: float = 0.0

    name = 'speccascade'
    static_fields = ('deferral',)
    stats_need_q = True
    section = '§3.4'

    def __post_init__(self):
        if self.deferral not in DEFERRALS:
            raise ValueError(
                f'speccascade: deferral={self.deferral!r} is not one of {", ".join(DEFERRALS)}'
            )
        base.set_field(
            self,
            'alpha',
            base.check_range(
                'speccascade', 'alpha', self.alpha, 0.0, 1.0, lo_open=False, hi_open=False
            ),
        )

    def allowed(self, p, q):
        """The token-level set A [..., V] bool (token_v* deferrals only)."""
        a = self.alpha
        if self.deferral == 'token_v1':
            return q >= (p.max(-1) - a)[..., None]
        if self.deferral == 'token_v2':
            return p >= (p.max(-1) - a)[..., None]
        if self.deferral == 'token_v3':
            return sampling.min_p_mask(p, 1.0 - a)
        raise ValueError(f'speccascade: deferral {self.deferral!r} has no token set')

    def stats(self, p, q):
        a = self.alpha
        d = self.deferral
        if d in ('chow', 'diff', 'opt'):
            qmax = q.max(-1)
            if d == 'chow':
                use_draft = qmax >= 1.0 - a
            elif d == 'diff':
                use_draft = qmax >= p.max(-1) - a
            else:
                tv = jnp.maximum(q - p, 0.0).sum(-1)
                use_draft = qmax >= p.max(-1) - a * tv
            return {'use_draft': use_draft}
        if d == 'token_v1':
            threshold = p.max(-1) - a
            q_set = jnp.where(q >= threshold[..., None], q, 0.0).sum(-1)
            return {'threshold': threshold, 'q_set': q_set}
        threshold = p.max(-1) - a if d == 'token_v2' else sampling.min_p_threshold(p, 1.0 - a)
        q_set = jnp.where(p >= threshold[..., None], q, 0.0).sum(-1)
        return {'threshold': threshold, 'q_set': q_set}

    def target_from(self, px, qx, x, stats):
        """pi(x), the deferral mixture, from gathered scalars."""
        if self.deferral in ('chow', 'diff', 'opt'):
            return jnp.where(stats['use_draft'], qx, px)
        member = qx if self.deferral == 'token_v1' else px
        in_set = member >= stats['threshold']
        return jnp.where(in_set, qx, 0.0) + (1.0 - stats['q_set']) * px

    def yield_from(self, px, qx, x, stats):
        return jnp.minimum(qx, self.target_from(px, qx, x, stats))

    def mixture(self, p, q):
        """The deferral mixture pi [..., V]."""
        return self.target_vector(p, q)

    def induced(self, p, q):
        return self.mixture(p, q)
