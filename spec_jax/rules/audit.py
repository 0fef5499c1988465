"""A law audit for anyone's verifier (docs/laws.md §9): the law a verify function emits, by
Monte Carlo, against the law it claims, on random and adversarial (p, q) laws.

  import spec_jax.rules as rules
  from spec_jax.rules import audit
  report = audit.audit(audit.chain(rules.make('lossless')), audit.standard_laws())
  print(report.format()); assert report.passed
  audit.audit(my_verify, laws, claim=audit.rule_claim(my_rule))   # a lossy rule's law

The contract audited (`Verify`): `verify(key, p_bav1, q_bav, x_ba, u_ba) -> (tokens_ba1,
num_accepted_b)`, `verify_chain`'s arrays (target rows p_0..p_A, the draft laws q_0..q_{A-1}
the drafts x were drawn from) plus the acceptance uniforms u [B, A] in [0, 1): drawing the
uniforms is the audit's, so that it can put them at their bounds (0 and 1 - 2^-24); a
verifier that accepts with probability a must accept iff u < a. `chain(rule)` meets it for
spec_jax's `verify_chain` (u -> 1 - u, its (0, 1] convention), `node(rule, draws)` for its
`verify_node` (one sibling; offset 0 only, its own uniforms) and `host(fn)` for a host
(numpy) function `fn(p, q, x, u, w) -> (tokens, n)`, w [B] a uniform in [0, 1) for its final
draw (inverse CDF), run through `jax.pure_callback`.

What is judged, per law and offset t (0..A; t < A the drafted positions, t = A the bonus):
the token at offset t over the rows that reached it (n >= t), against the claimed law there
(`Claim`: p itself by default; `rule_claim(rule)`: the rule's `round_law`).

- Laws with uniform u: TV(empirical, claim). Bound (Bretagnolle-Huber-Carol): for n draws
  of a law pi over V tokens, P(TV(pi_hat, pi) >= r) <= 2^V exp(-2 n r^2); the p-value of an
  observed TV d is min(1, 2^V exp(-2 n (d - 1e-4)_+^2)) (1e-4: float32 rounding of the
  claims), and an audit of m such comparisons flags those with p <= alpha / m (Bonferroni:
  a verifier that emits its claims passes with probability >= 1 - alpha). Power: a verifier
  whose law is off by TV >= r(n, alpha / m) + r(n, 0.1) there is flagged with probability
  >= 0.9 (`Row.detectable`, r(n, delta) = sqrt((V ln 2 + ln(1/delta)) / (2 n)) + 1e-4).
- Laws with u at a bound (u = 0 or 1 - 2^-24 in every row): the emitted law is not the
  claim there (u is not uniform), but every token a correct verifier emits lies in the
  claim's support (an accepted x has a(x) > 0, so pi(x) >= q(x) a(x) > 0; a replacement is
  drawn only where rejection has positive probability). Any token outside it is flagged
  (p-value 0, no false alarm); a verifier that emits outside it with probability e per row
  is flagged with probability 1 - (1 - e)^n (>= 0.9 for e >= 2.31 / n).
- The frontier (docs/laws.md §8.1) at each drafted offset: acceptance <= sum min(p, q) +
  TV(pi, p) for every verifier; `Row.gap` = frontier(p, q, pi_hat) - acceptance_hat, with
  radius r_tv + r_acc (Hoeffding for the acceptance, at the same alpha / m); a gap below
  -radius (more acceptance than any rule with that law can have) is flagged as well.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax import categorical
from spec_jax.rules import base, contract
from spec_jax.rules.audit_laws import U_MODES, U_TOP, Law, stack, standard_laws
from spec_jax.rules.chain import verify_chain
from spec_jax.rules.distortion import frontier_gap
from spec_jax.rules.tree import verify_node

Array = jax.Array
Verify = Callable[[Array, Array, Array, Array, Array], tuple[Array, Array]]
Claim = Callable[[Array, Array], Array]

FLOAT_SLACK = 1e-4  # float32 rounding of the claimed laws and of the samplers.
P_FLOOR = 1e-300  # The smallest p-value a TV test reports.
LOG_TINY = -1e4  # The raw logit given a token of probability 0 (`raw_inputs`).
__all__ = ['U_MODES', 'U_TOP', 'Law', 'standard_laws']  # Re-exported from audit_laws; and:
__all__ += ['Report', 'Row', 'audit', 'audit_all', 'chain', 'host', 'node', 'node_claim',
            'rule_claim', 'target_claim']  # fmt: skip


class Row(NamedTuple):
    """The audit of one law at one offset (see the module docstring for each test).

    Attributes:
      law, offset, u: the law's name, t in 0..A (A: the bonus), how u was drawn.
      n: rows that reached the offset.
      tv: TV(empirical law, claimed law) (measured; not judged where u is at a bound).
      bound: r(n, alpha / m), the TV a verifier emitting its claim stays under (prob >= 1 -
        alpha / m); nan where u is at a bound.
      p_value: the Bretagnolle-Huber-Carol p-value of tv (floored at 1e-300); at a bound:
        0 if a token fell outside the claim's support, else 1.
      detectable: the smallest TV (uniform u) or per-row outside-support probability (u at
        a bound) flagged with power >= 0.9 at this n.
      outside: tokens emitted outside the claimed law's support.
      acceptance: measured P(accept at t | reached t) (nan at the bonus offset).
      gap: frontier(p, q, pi_hat) - acceptance (nan at the bonus offset or a bound).
      gap_radius: its Monte Carlo radius at alpha / m.
      flagged: the law is broken here (p_value <= alpha / m, or gap < -gap_radius).
    """

    law: str
    offset: int
    u: str
    n: int
    tv: float
    bound: float
    p_value: float
    detectable: float
    outside: int
    acceptance: float
    gap: float
    gap_radius: float
    flagged: bool


class Report(NamedTuple):
    """An audit's rows, the family-wise alpha and the m comparisons it is split over."""

    name: str
    rows: tuple[Row, ...]
    alpha: float
    m: int

    @property
    def passed(self) -> bool:
        return not any(r.flagged for r in self.rows)

    @property
    def flagged(self) -> tuple[Row, ...]:
        return tuple(r for r in self.rows if r.flagged)

    def worst(self) -> Row:
        """The row with the smallest p-value (ties: a row with uniform u, then the largest
        measured TV)."""
        return min(
            self.rows,
            key=lambda r: (r.p_value, r.u != 'uniform', -(0.0 if math.isnan(r.tv) else r.tv)),
        )

    def format(self) -> str:
        """A table of the rows: measured TV, its bound, p-value, power, frontier gap."""
        head = (f'{self.name}: {"PASS" if self.passed else "FLAGGED"} (alpha {self.alpha:g} '
                f'over m = {self.m} TV tests, Bonferroni)')  # fmt: skip
        lines = [head, f'{"law":<12}{"t":>2}{"u":>8}{"n":>7}{"TV":>8}{"bound":>8}{"p":>10}'
                       f'{"det@0.9":>9}{"out":>6}{"acc":>7}{"gap":>8}{"+-":>7}  flag']  # fmt: skip
        for r in self.rows:
            lines.append(
                f'{r.law:<12}{r.offset:>2}{r.u:>8}{r.n:>7}{r.tv:>8.4f}{r.bound:>8.4f}'
                f'{r.p_value:>10.2e}{r.detectable:>9.4f}{r.outside:>6}{r.acceptance:>7.3f}'
                f'{r.gap:>8.4f}{r.gap_radius:>7.4f}  {"FLAG" if r.flagged else ""}'
            )
        return '\n'.join(lines)


# ----------------------------------------------------------------------------------------
# Verifiers and claims.


def raw_inputs(p: Array, q: Array) -> contract.Raw:
    """Raw logits for the rules that read them: log p and log q (LOG_TINY where 0), so the
    T = 1 laws are the processed ones."""

    def logits(x):
        return jnp.where(x > 0, jnp.log(jnp.where(x > 0, x, 1.0)), LOG_TINY)

    return contract.Raw(logits(p), logits(q))


def chain(rule: base.Rule) -> Verify:
    """spec_jax's `verify_chain` with `rule` on the audit's contract (uniforms 1 - u, in its
    (0, 1] convention: accept iff 1 - u <= a, iff u >= 1 - a)."""

    def verify(key, p, q, x, u):
        raw = raw_inputs(p, q) if rule.needs_logits else None
        out = verify_chain(rule, key, p, q, x, raw=raw, uniforms=1.0 - u)
        return out.tokens, out.num_accepted

    return verify


def host(fn: Callable) -> Verify:
    """A host verifier on the audit's contract: `fn(p, q, x, u, w) -> (tokens, n)` with numpy
    arrays p [B, A+1, V], q [B, A, V] float32, x [B, A] int32, u [B, A] and w [B] uniforms in
    [0, 1) (w: for its final draw, by inverse CDF), returning tokens [B, A+1] and n [B]
    (int). It runs through `jax.pure_callback`, inside the audit's compiled program."""

    def verify(key, p, q, x, u):
        b, a1 = p.shape[:2]
        w = jax.random.uniform(key, (b,), jnp.float32)
        shapes = (jax.ShapeDtypeStruct((b, a1), jnp.int32), jax.ShapeDtypeStruct((b,), jnp.int32))

        def call(*args):
            tokens, n = fn(*(np.asarray(z) for z in args))
            return np.asarray(tokens, np.int32), np.asarray(n, np.int32)

        return jax.pure_callback(call, shapes, p, q, x, u, w)

    return verify


def node(rule: base.Rule, draws: str = 'iid') -> Verify:
    """spec_jax's `verify_node` on the audit's contract: the node of target p_0 with one
    sibling, the draft x_0 ~ q_0. It emits one token (offset 0; n = 0, so the other offsets
    are not reached). `verify_node` draws its own uniforms: on the u-at-bound laws it runs
    at uniform u (the support check still holds).

    Args:
      rule: a rule with the tree mode.
      draws: 'iid' or 'distinct' (sampled siblings: q_0 passed), or 'deterministic' (q not
        passed: EAGLE's siblings, whose law does not read how they were chosen).
    """
    sampled = draws != 'deterministic'

    def verify(key, p, q, x, u):
        del u
        out = verify_node(rule, key, p[:, 0], x[:, :1], q[:, 0] if sampled else None,
                          draws=draws if sampled else 'iid')  # fmt: skip
        tokens = jnp.zeros(p.shape[:2], jnp.int32).at[:, 0].set(out.token)
        return tokens, jnp.zeros(p.shape[:1], jnp.int32)

    return verify


def node_claim(rule: base.Rule, draws: str = 'iid') -> Claim:
    """The law `node(rule, draws)` claims at offset 0 (p at the offsets it does not reach):
    p for sampled siblings (lossless tree modes); for deterministic siblings the mixture
    sum_x q_0(x) rule.induced_tree_node(p_0, [x]) over the drafted sibling."""

    def claim(p, q):
        if draws != 'deterministic':
            return p
        v = p.shape[-1]
        sib = jnp.broadcast_to(jnp.arange(v)[:, None, None], (v, p.shape[0], 1))
        laws = jax.vmap(lambda s: rule.induced_tree_node(p[:, 0], s))(sib)  # [V, L, V]
        mixed = jnp.einsum('lx,xlv->lv', q[:, 0], laws)
        return p.at[:, 0].set(mixed)

    return claim


def rule_claim(rule: base.Rule) -> Claim:
    """The law `rule` claims at each offset: `rule.round_law` [L, A+1, V] (its `induced` at
    the drafted offsets, the bonus at the last; the raw logits of `raw_inputs`). A claim must
    not depend on the drafts x (true of every registered rule at A < fly's window)."""

    def claim(p, q):
        x = jnp.zeros(q.shape[:2], jnp.int32)
        raw = raw_inputs(p, q) if rule.needs_logits else None
        return rule.round_law(p, q, x, raw)

    return claim


def target_claim(p: Array, q: Array) -> Array:
    """The lossless claim: the target row p_t at every offset t."""
    del q
    return p


# ----------------------------------------------------------------------------------------
# The Monte Carlo and its statistics.


def _simulate(verifiers, claims, num_l: int, a: int, v: int, n: int):
    """The Monte Carlo of every verifier on n rows per law (the laws' rows interleaved, so a
    verifier reading another row's law is caught) and the claims, one program: (key, p [L,
    A+1, V], q [L, A, V], u modes [L]) -> Counts of [K, L, ...] for the K verifiers."""

    def run(key, p_l, q_l, u_mode_l):
        b = num_l * n
        law = jnp.arange(b) % num_l
        p, q = p_l[law], q_l[law]
        k_x, k_u, k_v = jax.random.split(key, 3)
        x = categorical.sample(k_x, q)  # [B, A]: the drafts, from q.
        u = jax.random.uniform(k_u, (b, a), jnp.float32)
        mode = u_mode_l[law][:, None]
        u = jnp.where(mode == 1, 0.0, jnp.where(mode == 2, U_TOP, u))
        x_hot = jax.nn.one_hot(x, v, dtype=jnp.int32)
        out = []
        for i, (verify, claim) in enumerate(zip(verifiers, claims, strict=True)):
            tokens, num = verify(jax.random.fold_in(k_v, i), p, q, x, u)
            reached = jnp.arange(a + 1)[None, :] <= num[:, None]  # [B, A+1]
            hot = jax.nn.one_hot(tokens, v, dtype=jnp.int32) * reached[..., None]
            acc = (jnp.arange(a)[None, :] < num[:, None]).astype(jnp.int32)
            out.append(Counts(
                jax.ops.segment_sum(hot, law, num_l),
                jax.ops.segment_sum(acc, law, num_l),
                jax.ops.segment_sum(x_hot * reached[:, :a, None], law, num_l),
                (claim or target_claim)(p_l, q_l).astype(jnp.float32),
            ))  # fmt: skip
        return jax.tree_util.tree_map(lambda *xs: jnp.stack(xs), *out)

    return run


class Counts(NamedTuple):
    """A Monte Carlo's counts per law: tokens [L, A+1, V] at each offset over the rows that
    reached it, accepts [L, A] (rows with n > t), drafts [L, A, V] (x_t over the rows that
    reached t), and the claimed laws [L, A+1, V]."""

    tokens: Array
    accepts: Array
    drafts: Array
    claim: Array


def radius(n: int, v: int, delta: float) -> float:
    """r(n, delta) = sqrt((V ln 2 + ln(1/delta)) / (2n)) + FLOAT_SLACK: P(TV(pi_hat, pi) >=
    r) <= delta for n draws of pi over V tokens (Bretagnolle-Huber-Carol)."""
    if n <= 0:
        return math.inf
    return math.sqrt((v * math.log(2.0) + math.log(1.0 / delta)) / (2.0 * n)) + FLOAT_SLACK


def p_value(d: float, n: int, v: int) -> float:
    """min(1, 2^V exp(-2 n (d - FLOAT_SLACK)_+^2)): the BHC p-value of an observed TV d,
    floored at P_FLOOR = 1e-300 (below it the bound underflows; a TV p-value is never 0)."""
    if n <= 0:
        return 1.0
    e = max(d - FLOAT_SLACK, 0.0)
    log_p = v * math.log(2.0) - 2.0 * n * e * e
    return float(min(1.0, math.exp(max(log_p, math.log(P_FLOOR)))))


def _rate_radius(n: int, delta: float) -> float:
    """Hoeffding: P(|acceptance_hat - acceptance| >= r) <= delta."""
    return math.inf if n <= 0 else math.sqrt(math.log(2.0 / delta) / (2.0 * n)) + FLOAT_SLACK


def audit_all(
    verifiers: Mapping[str, tuple[Verify, Claim | None]],
    laws: tuple[Law, ...] | None = None,
    *,
    n: int = 20_011,
    alpha: float = 0.01,
    seed: int = 0,
) -> dict[str, Report]:
    """Audits several verifiers on the same laws in one compiled program.

    Args:
      verifiers: name -> (verify on the `Verify` contract, its claim: a `Claim` (p [L, A+1,
        V], q [L, A, V]) -> [L, A+1, V], or None for the target p at every offset).
      laws: the (p, q) laws (`standard_laws()` when None), all of one A and V.
      n: rows per law (each law's rows interleaved with the others').
      alpha: the family-wise false-alarm probability of each verifier's audit.
      seed: the Monte Carlo's seed.

    Returns:
      name -> Report.

    Raises:
      ValueError: laws of different shapes, an unknown u mode, alpha outside (0, 1), n < 1.
    """
    laws = standard_laws() if laws is None else tuple(laws)
    if not 0.0 < alpha < 1.0 or n < 1:
        raise ValueError(f'audit: alpha={alpha} must be in (0, 1) and n={n} >= 1')
    p, q = stack(laws)
    modes = np.asarray([list(U_MODES).index(law.u) for law in laws], np.int32)
    names = list(verifiers)
    run = jax.jit(_simulate([verifiers[k][0] for k in names], [verifiers[k][1] for k in names],
                            len(laws), q.shape[1], p.shape[2], n))  # fmt: skip
    counts = jax.device_get(run(jax.random.key(seed), p, q, modes))
    return {name: _report(name, laws, p, jax.tree_util.tree_map(lambda c, k=k: c[k], counts), alpha)
            for k, name in enumerate(names)}  # fmt: skip


def audit(
    verify: Verify,
    laws: tuple[Law, ...] | None = None,
    *,
    claim: Claim | None = None,
    name: str = 'verifier',
    n: int = 20_011,
    alpha: float = 0.01,
    seed: int = 0,
) -> Report:
    """Audits one verifier against its claim (None: the target p; `rule_claim(rule)` for a
    rule's law); see `audit_all` and the module docstring for the tests."""
    return audit_all({name: (verify, claim)}, laws, n=n, alpha=alpha, seed=seed)[name]


def _report(name: str, laws, p: np.ndarray, counts: Counts, alpha: float) -> Report:
    """The rows of one verifier from its Counts (see the module docstring for each test)."""
    a1, v = p.shape[1:]
    pi = np.asarray(counts.claim, np.float64)
    uniform = [law.u == 'uniform' for law in laws]
    m = max(1, sum(int(counts.tokens[li, t].sum() > 0) for li in range(len(laws))
                   if uniform[li] for t in range(a1)))  # fmt: skip
    level = alpha / m
    rows = []
    for li, law in enumerate(laws):
        for t in range(a1):
            c = counts.tokens[li, t].astype(np.float64)
            nt = int(c.sum())
            hat = c / max(nt, 1)
            outside = int(c[pi[li, t] <= 0].sum())
            tv = float(0.5 * np.abs(hat - pi[li, t]).sum()) if nt else math.nan
            acc = gap = gap_r = math.nan
            if t < a1 - 1 and nt:
                acc = float(counts.accepts[li, t]) / nt
            if uniform[li]:
                bound = radius(nt, v, level)
                pv = p_value(tv, nt, v) if nt else 1.0
                det = bound + radius(nt, v, 0.1)
                if t < a1 - 1 and nt:  # q_hat: the drafts' law over the rows that reached t.
                    q_hat = counts.drafts[li, t] / nt
                    gap = float(frontier_gap(p[li, t], q_hat, hat, acc))
                    gap_r = 2.0 * bound + _rate_radius(nt, level)
                flag = pv <= level or (not math.isnan(gap) and gap < -gap_r)
            else:
                bound, pv = math.nan, 0.0 if outside else 1.0
                det = 1.0 - 0.1 ** (1.0 / nt) if nt else math.inf
                flag = outside > 0
            rows.append(Row(law.name, t, law.u, nt, tv, bound, pv, det, outside, acc, gap,
                            gap_r, bool(flag)))  # fmt: skip
    return Report(name, tuple(rows), alpha, m)
