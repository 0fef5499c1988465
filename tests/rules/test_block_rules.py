"""Block-level rules (block verification, FLy): every draw of a small block enumerated in numpy.

The chains here are prefix-dependent: the target row after x_1..x_i and the draft row x_{i+1}
is drawn from are tables indexed by the prefix (`Chain`), so a verifier that reads a wrong
row, or keeps the wrong length, has a different law. The enumerations (`block_outcomes`,
`fly_outcomes`) are written from the rules' definitions (issue 32; docs/laws.md §7.4-§7.5),
not from the rules' code: over every draft x in V^A and, given x, the exact probability of
each kept length (block verification: P(tau = k) = h_k prod_{j > k} (1 - h_j) for independent
uniforms; FLy: the 2^A native accept patterns), they give the law of the emitted token
sequence (the kept drafts, then the final token).

Bound (as tests/rules/test_laws.py): for n rows and K outcome categories, the
Bretagnolle-Huber-Carol inequality gives P(TV(empirical, law) >= r) <= delta for
r = sqrt((K ln 2 + ln(1/delta)) / (2n)), delta = 1e-8. With K = 39 emitted sequences
(V = 3, A = 2: lengths 1 to 3) and n = 120,011 rows, r = 0.0121; with K = 120 (A = 3) and
n = 200,003, r = 0.0154. Power: a verifier whose emitted law is >= 2r away in TV fails with
probability >= 1 - 1e-8 (its empirical law is within r of its own law); the tests assert
that the mistakes they guard against (keeping the first failure's leading run instead of the
largest passing tau; FLy without the window) are that far away on these chains.
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import spec_jax.rules as rules

from . import _cases

DELTA = 1e-8


def radius(n: int, k: int) -> float:
    return math.sqrt((k * math.log(2.0) + math.log(1.0 / DELTA)) / (2.0 * n)) + 1e-4


class Chain(NamedTuple):
    """Prefix-indexed laws: p[prefix] the target after the prefix (len 0..A), q[prefix] the
    draft's law of the next draft (len 0..A-1), z[prefix] the target's raw logits."""

    p: dict
    q: dict
    z: dict
    v: int
    a: int


def make_chain(seed: int, v: int, a: int, temperature: float = 1.0) -> Chain:
    rng = np.random.default_rng(seed)
    p, q, z = {}, {}, {}
    for length in range(a + 1):
        for prefix in itertools.product(range(v), repeat=length):
            logits = rng.normal(0.0, 1.2, v)
            z[prefix] = logits
            e = np.exp((logits - logits.max()) / temperature)
            p[prefix] = e / e.sum()
            if length < a:
                q[prefix] = rng.dirichlet(np.full(v, 0.8))
    return Chain(p, q, z, v, a)


def residual(f: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    f = np.maximum(f, 0.0)
    return f / f.sum() if f.sum() > 1e-9 else fallback


def block_outcomes(chain: Chain, x: tuple) -> dict:
    """Block verification given the drafts x: {emitted sequence: probability} (the issue's
    definition: P_i, r_i, h_i, tau = the largest i with u_i <= h_i)."""
    a = chain.a
    big_p = [1.0]
    for i in range(a):
        ratio = chain.p[x[:i]][x[i]] / chain.q[x[:i]][x[i]]
        big_p.append(min(1.0, big_p[-1] * ratio))
    h = []
    for i in range(1, a + 1):
        if i < a:
            r = np.maximum(big_p[i] * chain.p[x[:i]] - chain.q[x[:i]], 0.0).sum()
            h.append(r / (r + 1.0 - big_p[i]) if r + 1.0 - big_p[i] > 0 else 1.0)
        else:
            h.append(big_p[a])
    out = {}
    for tau in range(a + 1):
        prob = (h[tau - 1] if tau else 1.0) * np.prod([1.0 - hj for hj in h[tau:]])
        if tau < a:
            law = residual(big_p[tau] * chain.p[x[:tau]] - chain.q[x[:tau]], chain.p[x[:tau]])
        else:
            law = chain.p[x]
        for y in range(chain.v):
            key = x[:tau] + (y,)
            out[key] = out.get(key, 0.0) + prob * law[y]
    return out


def token_level_length(chain: Chain, x: tuple) -> float:
    """E[n | x] of token-level speculative sampling."""
    expected, reach = 0.0, 1.0
    for i in range(chain.a):
        reach *= min(1.0, chain.p[x[:i]][x[i]] / chain.q[x[:i]][x[i]])
        expected += reach
    return expected


def block_length(chain: Chain, x: tuple) -> float:
    """E[tau | x] of block verification (from `block_outcomes`' kept lengths)."""
    return sum(prob * (len(seq) - 1) for seq, prob in block_outcomes(chain, x).items())


def topk_entropy(z: np.ndarray, k: int) -> float:
    logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    top = np.sort(logp)[::-1][:k]
    return float(-(np.exp(top) * top).sum())


def fly_outcomes(chain: Chain, x: tuple, theta: float, window: int, k: int = 3) -> dict:
    """FLy given the drafts x: {emitted sequence: probability}. Native accept at i with
    a_i = min(1, p/q); a native rejection at 0-indexed i is accepted when the top-k T = 1
    entropy is >= theta, i + W < A, the next W - 1 drafts are natively accepted, p(x_i) > 0;
    the leading run is kept; replacement norm((p - q)_+), bonus p."""
    a = chain.a
    acc_p = [min(1.0, chain.p[x[:i]][x[i]] / chain.q[x[:i]][x[i]]) for i in range(a)]
    out = {}
    for pattern in itertools.product((False, True), repeat=a):
        prob = np.prod([acc_p[i] if ok else 1.0 - acc_p[i] for i, ok in enumerate(pattern)])
        if prob == 0.0:
            continue
        kept = []
        for i in range(a):
            fly = (not pattern[i] and topk_entropy(chain.z[x[:i]], k) >= theta
                   and i + window < a and all(pattern[i + 1:i + window])
                   and chain.p[x[:i]][x[i]] > 0)  # fmt: skip
            kept.append(pattern[i] or fly)
        n = next((i for i, ok in enumerate(kept) if not ok), a)
        pre = x[:n]
        law = chain.p[pre] if n == a else residual(chain.p[pre] - chain.q[pre], chain.p[pre])
        for y in range(chain.v):
            out[pre + (y,)] = out.get(pre + (y,), 0.0) + prob * law[y]
    return out


def emitted_law(chain: Chain, outcomes) -> dict:
    """{sequence: probability} over every draft x ~ q of the per-draft outcomes."""
    law = {}
    for x in itertools.product(range(chain.v), repeat=chain.a):
        qx = np.prod([chain.q[x[:i]][x[i]] for i in range(chain.a)])
        for seq, prob in outcomes(x).items():
            law[seq] = law.get(seq, 0.0) + qx * prob
    return law


def table(laws: dict, length: int, v: int) -> np.ndarray:
    """The laws of the prefixes of one length as an array [v] * length + [v]."""
    out = np.zeros((v,) * length + (v,))
    for prefix in itertools.product(range(v), repeat=length):
        out[prefix] = laws[prefix]
    return out


def draw_rows(chain: Chain, n: int, seed: int):
    """n rows: drafts x ~ q along the chain, with the target rows p [n, A+1, V], draft rows
    q [n, A, V] and target logits [n, A+1, V] of their prefixes."""
    rng = np.random.default_rng(seed)
    a, v = chain.a, chain.v
    x = np.zeros((n, a), np.int64)
    rows = {'p': [], 'q': [], 'z': []}
    for i in range(a + 1):
        index = tuple(x[:, j] for j in range(i))
        for name in ('p', 'z') + (('q',) if i < a else ()):
            rows[name].append(np.broadcast_to(table(getattr(chain, name), i, v)[index], (n, v)))
        if i < a:
            cdf = np.cumsum(rows['q'][i], -1)
            x[:, i] = np.minimum((rng.random((n, 1)) > cdf).sum(-1), v - 1)
    p, q, z = (np.stack(rows[k], 1).astype(np.float32) for k in ('p', 'q', 'z'))
    return x, p, q, z


def sequences(tokens: np.ndarray, n_acc: np.ndarray) -> list:
    return [tuple(int(t) for t in row[: k + 1]) for row, k in zip(tokens, n_acc)]


def tv_dict(a: dict, b: dict) -> float:
    keys = set(a) | set(b)
    return 0.5 * sum(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in keys)


def empirical(seqs: list) -> dict:
    out = {}
    for s in seqs:
        out[s] = out.get(s, 0.0) + 1.0 / len(seqs)
    return out


def run(rule, key, x, p, q, z):
    raw = rules.Raw(jnp.asarray(z), jnp.zeros(q.shape, jnp.float32))
    out = rules.verify_chain(rule, key, jnp.asarray(p), jnp.asarray(q), jnp.asarray(x, jnp.int32),
                             raw=raw)  # fmt: skip
    return np.asarray(out.tokens), np.asarray(out.num_accepted)


def test_block_verification_is_lossless_and_keeps_at_least_token_level_length():
    """Enumerated over every draft and kept length (V 3, A 2 and 3): the emitted sequence,
    completed by the target, has the target's joint law exactly; the expected kept length
    (over the drafts) exceeds token-level speculative sampling's, though not draft by draft."""
    for seed, a in ((0, 2), (1, 3), (2, 3)):
        chain = make_chain(seed, 3, a)
        law = emitted_law(chain, lambda x, c=chain: block_outcomes(c, x))
        assert sum(law.values()) == pytest.approx(1.0, abs=1e-12)
        completed = {}
        for seq, prob in law.items():
            for rest in itertools.product(range(3), repeat=a + 1 - len(seq)):
                full, pr = seq + rest, prob
                for i in range(len(seq), a + 1):
                    pr *= chain.p[full[:i]][full[i]]
                completed[full] = completed.get(full, 0.0) + pr
        for full in itertools.product(range(3), repeat=a + 1):
            target = np.prod([chain.p[full[:i]][full[i]] for i in range(a + 1)])
            assert completed[full] == pytest.approx(target, abs=1e-12), (seed, full)
        drafts = list(itertools.product(range(3), repeat=a))
        weight = [np.prod([chain.q[x[:i]][x[i]] for i in range(a)]) for x in drafts]
        gains = [block_length(chain, x) - token_level_length(chain, x) for x in drafts]
        gain = float(np.dot(weight, gains))  # E over x ~ q; a single draft may keep fewer.
        assert gain > 0.01, (seed, gain)
        assert min(gains) < 0  # Per draft it is not a pointwise bound (Sun et al.: in mean).


def test_block_verification_emits_its_enumerated_law():
    """verify_chain's emitted sequences (n = 120,011 rows, V 3, A 2) against the enumeration,
    and the power against keeping the first failure's leading run (token-level SD's law of
    the emitted sequence), which is > 2r away on this chain."""
    chain = make_chain(10, 3, 2)  # Block and token-level laws 0.18 apart in TV.
    n = 120_011
    x, p, q, z = draw_rows(chain, n, seed=5)
    law = emitted_law(chain, lambda d: block_outcomes(chain, d))
    r = radius(n, len(law))
    tokens, kept = run(rules.make('block_verify'), _cases.key(7), x, p, q, z)
    got = empirical(sequences(tokens, kept))
    assert tv_dict(got, law) < r, (tv_dict(got, law), r)
    tok_tokens, tok_kept = run(rules.make('lossless'), _cases.key(7), x, p, q, z)
    token_law = empirical(sequences(tok_tokens, tok_kept))
    assert tv_dict(token_law, law) > 2 * r  # The guarded mistake is visible...
    assert tv_dict(got, token_law) > r  # ...and the verifier is not it.
    assert kept.mean() >= tok_kept.mean()  # Same drafts: block keeps at least as many.


def test_block_verification_with_one_draft_is_speculative_sampling():
    chain = make_chain(4, 5, 1)
    x, p, q, z = draw_rows(chain, 4_001, seed=1)
    key = _cases.key(3)
    got = run(rules.make('block_verify'), key, x, p, q, z)
    want = run(rules.make('lossless'), key, x, p, q, z)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@pytest.mark.parametrize('theta,window', [(0.3, 2), (0.0, 2)])
def test_fly_emits_its_enumerated_law(theta, window):
    """FLy (V 3, A 3, W 2) over n = 200,003 rows against the enumeration; the window is
    visible: its law is > 2r from lossless SD's (the target's) on this chain."""
    chain = make_chain(6, 3, 3, temperature=0.8)
    n = 200_003
    x, p, q, z = draw_rows(chain, n, seed=9)
    law = emitted_law(chain, lambda d: fly_outcomes(chain, d, theta, window))
    r = radius(n, len(law))
    plain = emitted_law(chain, lambda d: fly_outcomes(chain, d, math.inf, window))
    assert tv_dict(law, plain) > 2 * r, tv_dict(law, plain)
    tokens, kept = run(rules.make('fly', theta=theta, window=window), _cases.key(11), x, p, q, z)
    got = empirical(sequences(tokens, kept))
    assert tv_dict(got, law) < r, (tv_dict(got, law), r)


def test_fly_without_its_window_is_lossless_sd_token_for_token():
    """theta = inf keeps exactly lossless SD's tokens on the same keys; its plug-in law is then
    p, and with the window on it moves."""
    chain = make_chain(8, 4, 3)
    x, p, q, z = draw_rows(chain, 3_001, seed=2)
    key = _cases.key(5)
    want = run(rules.make('lossless'), key, x, p, q, z)
    got = run(rules.make('fly:theta=inf'), key, x, p, q, z)
    np.testing.assert_array_equal(got[0], want[0])
    assert rules.make('fly:theta=inf').lossless and not rules.make('fly').lossless
    raw = rules.Raw(jnp.asarray(z), jnp.zeros(q.shape, jnp.float32))
    args = jnp.asarray(p), jnp.asarray(q), jnp.asarray(x), raw
    pi = round_law(rules.make('fly:theta=inf'), *args)
    np.testing.assert_allclose(np.asarray(pi), p, atol=1e-6)
    law = round_law(rules.make('fly:theta=0.0,window=1'), *args)
    np.testing.assert_allclose(np.asarray(law).sum(-1), 1.0, atol=1e-5)
    assert not np.allclose(np.asarray(law), p, atol=1e-3)  # The window moves the plug-in law.


@jax.jit
def round_law(rule, p, q, x, raw):
    return rule.round_law(p, q, x, raw)
