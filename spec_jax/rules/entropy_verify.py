"""vllm-ascend's "entropy verify" (its rejection sampler's `enable_entropy_verify`), docs/laws.md
§4.8: lenience whose ceiling l is read per row from the target's entropy."""

from __future__ import annotations

import dataclasses
import math

import jax.numpy as jnp

from spec_jax.rules import base, registry


@registry.register
@dataclasses.dataclass(frozen=True)
class EntropyVerify(base.YieldRule):
    """vllm-ascend's entropy verify (`rejection_sampler_config`: posterior_threshold 0.95,
    posterior_alpha 0.4, its defaults), docs/laws.md §4.8.

    Inputs: processed p and q. The kernel accepts iff p(x)/q(x) >= t u, u ~ U[0, 1), with
    t = min(posterior_threshold, exp(-posterior_alpha H(p))), H(p) = -sum p log(p + 1e-10)
    (of its `ori_target_probs` when given; here of the processed p), and on a rejection
    emits vLLM's recovered token, a sample of norm((p - q)_+). Despite the Medusa names of
    its parameters it is not typical acceptance (no set, no argmax replacement): it is
    lenience with a per-row l = t.

    - a(x) = min(1, p(x) / (t q(x))) (yield y = min(q, p/t)).
    - Replacement: norm((p - y)_+) = norm((p - q)_+) (y = q where q < p, y >= p elsewhere).
    - Bonus: p.
    - Law: pi = y + (1 - sum y) norm((p - q)_+); on the distortion frontier (§8.1) like
      lenience. posterior_threshold 1 with alpha 0 (t = 1) is lossless SD.
    - Matched baseline: plain lossless SD (§5). Tree: none here.
    """

    posterior_threshold: float = 0.95
    posterior_alpha: float = 0.4

    name = 'entropy_verify'
    section = '§4.8'

    def __post_init__(self):
        thr = base.check_range('entropy_verify', 'posterior_threshold', self.posterior_threshold,
                               0.0, 1.0, lo_open=True, hi_open=False)  # fmt: skip
        alpha = base.check_range('entropy_verify', 'posterior_alpha', self.posterior_alpha, 0.0,
                                 math.inf, lo_open=False, hi_open=True)  # fmt: skip
        base.set_field(self, 'posterior_threshold', thr)
        base.set_field(self, 'posterior_alpha', alpha)

    @property
    def lossless(self) -> bool:
        """t = 1 for every p: posterior_threshold 1 and alpha 0 (host-side)."""
        return base.host_equal(self.name, 'lossless', 'posterior_threshold',
                               self.posterior_threshold, 1.0) and base.host_equal(
            self.name, 'lossless', 'posterior_alpha', self.posterior_alpha, 0.0)  # fmt: skip

    def stats(self, p, q):
        """t [...] per row, at least the smallest normal float32 (exp(-alpha H) underflows)."""
        h = -jnp.sum(p * jnp.log(p + 1e-10), -1)
        t = jnp.minimum(self.posterior_threshold, jnp.exp(-self.posterior_alpha * h))
        return jnp.maximum(t, base.TINY)

    def yield_from(self, px, qx, x, stats):
        return jnp.minimum(qx, px / stats)
