"""The rule contract and the shared 'yield' shape.

A rule is a small frozen dataclass registered (by `registry.register`) as a JAX pytree: its
float parameters are the pytree's leaves, and the kind/mode fields named in `static_fields`
(e.g. `Typical.mode`, `SpecCascade.deferral`) are static aux data. A rule is therefore an
ordinary argument of a jitted function: a sweep over a parameter's value compiles once, while
changing a static field compiles a new trace. Parameters are validated in `__post_init__` when
a user builds a rule (`registry.make`, the constructor); pytree unflattening skips that
validation, since during tree operations the leaves may be tracers or placeholders. A rule
whose parameters are Python floats is hashable and compares by value. Probabilities are
always the *processed* distributions (docs/laws.md §1): p is the target's next-token law after
temperature (and whatever warper the run uses), q the draft's law after the same processing.

The contract (all methods vectorised over leading axes; V is the vocabulary):

  accept_prob(p, q, x) -> [...]        a(x): probability of accepting drafted token x
  replacement(p, q)   -> [..., V]      law of the token emitted on rejection
  bonus(p)            -> [..., V]      law of the token emitted after a fully accepted block
  induced(p, q)       -> [..., V]      closed-form per-position law pi(x) (chain mode)
  induced_tree_node(p, siblings) -> [..., V]   law at a tree node with deterministic,
                                       ordered siblings (tree-capable rules only)
  name, lossless, tree_modes           registry name; exactness flag (host-side); supported
                                       tree modes
  static_fields                        the string/enum fields (pytree aux data); the other
                                       fields are float parameters (pytree leaves)

For speed, the chain verifier does not call `accept_prob` on full vectors: it gathers the
scalars p(x), q(x) and calls `accept_from(px, qx, x, stats)`, where `stats(p, q)` holds the
few per-row reductions a rule needs (max p, entropy, q(A), ...). `accept_prob` and
`accept_all` are defined from the same two methods, so there is one formula per rule.

The yield shape (docs/laws.md §4.5). Many rules are 'yield rules': a yield y(x) <= q(x) is
accepted with probability y(x)/q(x), and a rejection emits a sample of norm((t - y)_+) where
t is the law the rule is exact for (t = p for all but SpecCascade, where t = its mixture pi).
Their law is then, in closed form,

  pi(x) = y(x) + (1 - sum_v y(v)) * norm((t - y)_+)(x).

`YieldRule` implements this once; a yield rule only defines `yield_from`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.rules.contract import Block, Raw

Array = jax.Array

# The smallest normal float32: a divisor parameter (lenience's l, tv_budget's l) below it is
# flushed to 0 on accelerators and XLA:CPU, and p / l is then 0/0 = NaN where p = 0.
TINY = float(np.finfo(np.float32).tiny)

# Normalisers at or below this are treated as zero (the residual falls back to p). The same
# value is EAGLE's numerical guard for the tree residual (docs/laws.md §3.3).
ZERO_MASS = 1e-9


def check_range(
    rule: str, name: str, value: Any, lo: float, hi: float, *, lo_open: bool, hi_open: bool
) -> float:
    """Validates a rule parameter; returns it as a float or raises a clear ValueError.

    A traced value (a rule built inside a jitted function from traced numbers) cannot be
    checked and is returned unchanged.
    """
    if isinstance(value, jax.core.Tracer):
        return value
    interval = f'{"(" if lo_open else "["}{lo:g}, {hi:g}{")" if hi_open else "]"}'
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ValueError(f'{rule}: {name}={value!r} is not a number in {interval}') from None
    ok = (v > lo if lo_open else v >= lo) and (v < hi if hi_open else v <= hi)
    if not ok or math.isnan(v):
        raise ValueError(f'{rule}: {name}={value!r} is outside the valid range {interval}')
    return v


def check_divisor(rule: str, name: str, value: Any, hi: float = 1.0) -> float:
    """A parameter the rule divides by (p / l): in [TINY, hi], TINY the smallest normal
    float32 (a subnormal l is flushed to 0 and p / l is NaN where p = 0). ValueError naming
    the value otherwise; a traced value is returned unchecked."""
    try:
        return check_range(rule, name, value, TINY, hi, lo_open=False, hi_open=False)
    except ValueError as err:
        raise ValueError(f'{err}: {TINY:g} is the smallest normal float32 (below it {name} '
                         f'is flushed to 0 and p / {name} is 0/0 where p = 0)') from None


def set_field(obj, name: str, value: Any) -> None:
    """Sets a field on a frozen dataclass (used in __post_init__ to store validated floats)."""
    object.__setattr__(obj, name, value)


def host_equal(rule: str, prop: str, name: str, value: Any, target: float) -> bool:
    """`value == target` as a Python bool, for host-side properties such as `lossless`;
    a TypeError if `value` is traced (such properties describe concrete rules, host only)."""
    if isinstance(value, jax.core.Tracer):
        raise TypeError(
            f'{rule}.{prop} is a host-side property: parameter {name} is traced here; read it '
            'outside jit on a rule with concrete parameters'
        )
    try:
        return bool(value == target)
    except (TypeError, ValueError):  # Placeholders or arrays of several values.
        return False


# ---- vector helpers shared by rules ---------------------------------------------------


def gather(v: Array, x: Array) -> Array:
    """v[..., x[...]]: gathers one entry per row of v [..., V] at x [...] -> [...]."""
    idx = jnp.clip(x, 0, v.shape[-1] - 1).astype(jnp.int32)
    return jnp.take_along_axis(v, idx[..., None], axis=-1)[..., 0]


def normalize_or(f: Array, fallback: Array) -> Array:
    """norm(f) over the last axis; rows whose mass is <= ZERO_MASS return `fallback`."""
    mass = f.sum(-1, keepdims=True)
    return jnp.where(mass > ZERO_MASS, f / jnp.maximum(mass, ZERO_MASS), fallback)


def onehot_argmax(p: Array) -> Array:
    """One-hot of argmax p over the last axis, [..., V]."""
    return jax.nn.one_hot(jnp.argmax(p, -1), p.shape[-1], dtype=p.dtype)


def expand_stats(stats: Any) -> Any:
    """Appends a vocabulary axis to per-row statistics so they broadcast against [..., V]."""
    return jax.tree_util.tree_map(lambda s: jnp.asarray(s)[..., None], stats)


def vocab_index(p: Array) -> Array:
    """Token ids 0..V-1 broadcastable against p [..., V]."""
    return jnp.arange(p.shape[-1], dtype=jnp.int32)


class NodeState(NamedTuple):
    """Per-row state of the sibling scan at one tree node (deterministic siblings).

    The residual is P = P_raw / mass where P_raw is p with the rejected siblings zeroed.
    Because siblings are distinct, P_raw(c) = p(c) for every sibling not yet visited, so the
    scan only needs scalars.

    Attributes:
      mass: [...] remaining raw mass sum(P_raw).
      plogp: [...] sum_v P_raw(v) log P_raw(v) (for entropies recomputed on the residual).
      pmax: [...] max p over the original row (never removed by the rules that read it).
      top: [...] int32 argmax of p.
    """

    mass: Array
    plogp: Array
    pmax: Array
    top: Array


def node_state(p: Array) -> NodeState:
    """The initial NodeState of a target row p [..., V]."""
    safe = jnp.where(p > 0, p, 1.0)
    plogp = jnp.sum(jnp.where(p > 0, p * jnp.log(safe), 0.0), -1)
    return NodeState(p.sum(-1), plogp, p.max(-1), jnp.argmax(p, -1).astype(jnp.int32))


def node_reject(state: NodeState, pc: Array, reject: Array) -> NodeState:
    """Removes a rejected sibling with raw probability pc [...] where `reject` [...] holds."""
    pc = jnp.where(reject, pc, 0.0)
    plogp_c = jnp.where(pc > 0, pc * jnp.log(jnp.where(pc > 0, pc, 1.0)), 0.0)
    return state._replace(mass=state.mass - pc, plogp=state.plogp - plogp_c)


def residual_entropy(state: NodeState) -> Array:
    """H(P) of the residual P = P_raw / mass: log(mass) - plogp / mass, [...]."""
    m = jnp.maximum(state.mass, 1e-30)
    return jnp.log(m) - state.plogp / m


# ---- the rule interface -----------------------------------------------------------------


class Rule:
    """Base class of all verification rules.

    Subclasses are frozen dataclasses registered with `register`, which makes them pytrees:
    float parameters are leaves, the fields in `static_fields` are static aux data. Rule
    methods must treat parameters as (possibly traced) arrays: jnp ops only, no Python
    branching on a parameter's value, no `float(self.x)` or `math.*` on it.

    Class attributes:
      name: registry name.
      static_fields: names of the string/enum-like fields (pytree aux data, hashable); every
        other dataclass field is a float parameter (a pytree leaf).
      lossless: True when the emitted law equals the rule's reference law exactly for every
        (p, q): p itself, or onehot(argmax p) for `greedy`. A host-side property: rules whose
        exactness depends on a parameter (lenience l = 1, cos lam = 0) compute it from the
        concrete value (a Python bool) and raise TypeError if read on a traced rule.
      tree_modes: the tree verification modes supported: 'deterministic' (EAGLE-style
        ordered siblings, rejection zeroes the sibling), 'iid' (SpecInfer's siblings drawn
        i.i.d. from q) and/or 'distinct' (drawn from q without replacement).
      section: the docs/laws.md section that defines the rule.
      stats_need_q: whether `stats(p, q)` reads q. When it does not, `verify_chain` computes
        the statistics on the whole target [B, A+1, V] with q=None and drops the last row,
        which avoids copying a [B, A, V] slice of the target.
    """

    name: ClassVar[str] = ''
    static_fields: ClassVar[tuple[str, ...]] = ()
    lossless: ClassVar[bool] = False
    stats_need_q: ClassVar[bool] = False
    tree_modes: ClassVar[tuple[str, ...]] = ()
    section: ClassVar[str] = ''
    # The block-level contract (docs/rules.md, "Logits and block decisions"): a rule that sets
    # `needs_logits` is given the raw logits (`Raw`) beside the processed laws; a rule that
    # sets `block_level` decides the whole block in `accept_block` instead of the leading run
    # of per-position accepts. Both default to False, so the other rules' programs are the
    # ones they always were.
    needs_logits: ClassVar[bool] = False
    block_level: ClassVar[bool] = False

    # --- chain mode: the scalar path used by verify_chain ---------------------------------

    def stats(self, p: Array, q: Array | None) -> Any:
        """Per-row statistics [...] needed by `accept_from` (default: none); q may be None
        when `stats_need_q` is False."""
        del p, q
        return ()

    def accept_from(self, px: Array, qx: Array, x: Array, stats: Any) -> Array:
        """a(x) from the gathered scalars p(x), q(x) [...], the token x and `stats`."""
        raise NotImplementedError

    # --- chain mode: the contract ----------------------------------------------------------

    def accept_prob(self, p: Array, q: Array, x: Array) -> Array:
        """Acceptance probability a(x) of drafted tokens x [...] given p, q [..., V] -> [...]."""
        return self.accept_from(gather(p, x), gather(q, x), x, self.stats(p, q))

    def accept_all(self, p: Array, q: Array) -> Array:
        """a(v) for every token v: [..., V]."""
        stats = expand_stats(self.stats(p, q))
        return self.accept_from(p, q, vocab_index(p), stats)

    def replacement(self, p: Array, q: Array) -> Array:
        """Law of the token emitted when the draft is rejected, [..., V]."""
        raise NotImplementedError

    def bonus(self, p: Array) -> Array:
        """Law of the bonus token after a fully accepted block (the plain target p)."""
        return p

    def induced(self, p: Array, q: Array) -> Array:
        """Closed-form per-position law pi [..., V] (defaults to `induced_generic`)."""
        return self.induced_generic(p, q)

    def induced_generic(self, p: Array, q: Array) -> Array:
        """pi = q a + (1 - sum_v q(v) a(v)) replacement: the law of any chain rule."""
        qa = q * self.accept_all(p, q)
        return qa + (1.0 - qa.sum(-1, keepdims=True)) * self.replacement(p, q)

    def acceptance_rate(self, p: Array, q: Array) -> Array:
        """beta = E_{x~q}[a(x)], [...]."""
        return jnp.sum(q * self.accept_all(p, q), -1)

    # --- chain mode: the block-level contract ---------------------------------------------

    def accept_block(self, u: Array, p: Array, q: Array, x: Array, raw: Raw | None) -> Block:
        """The block decision of a `block_level` rule (docs/rules.md, "Logits and blocks").

        Args:
          u: [B, A] uniforms in (0, 1], one per drafted position (`verify_chain` draws them).
          p: [B, A+1, V] processed target at every position (the last one: the bonus row).
          q: [B, A, V] processed draft laws the drafts were drawn from.
          x: [B, A] int32 drafted tokens.
          raw: the raw inputs (`Raw`) when the rule sets `needs_logits`, else None.

        Returns:
          Block: how many drafts are kept, the law of the token emitted after them, and a
          per-position acceptance probability for the statistics.
        """
        raise NotImplementedError(f'rule {self.name!r} is not block-level')

    def round_law(self, p: Array, q: Array, x: Array, raw: Raw | None) -> Array:
        """The law [B, T, V] of the token each offset of a round emits given that it is reached
        (T = A + 1; the meter's input), for p [B, T, V], q [B, A, V], the drafts x [B, A]:
        the induced law at the A drafted offsets, the bonus law at the last. Rules whose law
        reads logits or the whole block override it."""
        del x, raw
        pi = self.bonus(p[:, -1:])
        if q.shape[1]:
            pi = jnp.concatenate([self.induced(p[:, :-1], q), pi], axis=1)
        return pi

    # --- tree mode -------------------------------------------------------------------------

    def tree_target(self, p: Array, siblings: Array, q: Array | None = None) -> Array:
        """The law [..., V] a node's walk verifies against, given its target p [..., V], its
        siblings [..., C] and, for sampled siblings, the draft law q (default: p itself; the
        budgeted rule moves mass onto the siblings, docs/laws.md §8.2)."""
        del siblings, q
        return p

    def tree_gate(self, pc: Array, c: Array, state: NodeState) -> Array:
        """g: probability of accepting sibling c with raw target probability pc [...].

        The residual at this point is P = P_raw / state.mass (rejected siblings zeroed).
        """
        raise ValueError(f'rule {self.name!r} has no tree form (tree modes: none)')

    def tree_final(self, residual: Array) -> Array:
        """Law of the token emitted when every sibling is rejected (default: the residual)."""
        return residual

    # Tree mode for rules that set `needs_logits`: the walk hands them the node's raw logits
    # once (`tree_node_raw`), then the *_raw forms replace tree_gate / tree_final.

    def tree_node_raw(self, logits: Array) -> Any:
        """Per-node statistics [B, ...] from the node's raw target logits [B, V]."""
        raise ValueError(f'rule {self.name!r} reads no logits in its tree form')

    def tree_node_stats(self, p: Array) -> Any:
        """Per-node statistics [...] of the node's full processed target p [..., V], for the
        tree forms whose gate reads the original p, not the residual (the chain forms of the
        truncation rules, docs/laws.md §3.3): when not None the walk and the node law use
        the *_raw forms with them as `node`. None (the default): `tree_gate` / `tree_final`."""
        del p
        return None

    def tree_gate_raw(self, pc: Array, c: Array, state: NodeState, node: Any) -> Array:
        """`tree_gate` with the node's statistics from `tree_node_raw`."""
        del node
        return self.tree_gate(pc, c, state)

    def tree_final_raw(self, residual: Array, p: Array, node: Any) -> Array:
        """`tree_final` with the node's target p [B, V] and statistics."""
        del p, node
        return self.tree_final(residual)

    def induced_tree_node_raw(self, p: Array, siblings: Array, logits: Array) -> Array:
        """`induced_tree_node` for a rule that reads the node's raw logits [..., V]."""
        del logits
        return self.induced_tree_node(p, siblings)

    def induced_tree_node(self, p: Array, siblings: Array) -> Array:
        """Law of the token emitted at a tree node, deterministic ordered siblings.

        P(emit c_j) = g_j prod_{i<j} (1 - g_i), and with probability prod_i (1 - g_i) a sample
        of the final residual (p with the siblings zeroed, renormalised). Duplicate siblings
        and padding (-1) are skipped; when the residual mass after a rejection is <= 1e-9 the
        scan stops and the token comes from the full p (EAGLE's guard).

        Args:
          p: [..., V] processed target at the node.
          siblings: [..., C] int sibling tokens in draft order; -1 is padding.

        Returns:
          [..., V] the law pi of the emitted token.
        """
        if 'deterministic' not in self.tree_modes:
            raise ValueError(f'rule {self.name!r} has no deterministic-sibling tree form')
        num_c = siblings.shape[-1]
        node = self.tree_node_stats(p)
        state = node_state(p)
        reach = jnp.ones(p.shape[:-1], p.dtype)
        law = jnp.zeros_like(p)
        zeroed = jnp.zeros(p.shape, bool)
        vocab = vocab_index(p)
        for j in range(num_c):
            c = siblings[..., j]
            valid = sibling_valid(siblings, j)
            pc = gather(p, c)
            if node is None:
                g = jnp.where(valid, self.tree_gate(pc, c, state), 0.0)
            else:
                g = jnp.where(valid, self.tree_gate_raw(pc, c, state, node), 0.0)
            law = law + (reach * g)[..., None] * (vocab == c[..., None])
            rejected = valid
            state = node_reject(state, pc, rejected)
            zeroed = zeroed | (rejected[..., None] & (vocab == c[..., None]))
            reach_next = reach * (1.0 - g)
            guard = valid & (state.mass <= ZERO_MASS)
            law = law + jnp.where(guard, reach_next, 0.0)[..., None] * self.bonus(p)
            reach = jnp.where(guard, 0.0, reach_next)
        residual = normalize_or(jnp.where(zeroed, 0.0, p), p)
        if node is not None:
            return law + reach[..., None] * self.tree_final_raw(residual, p, node)
        return law + reach[..., None] * self.tree_final(residual)

    def __repr__(self):
        params = ', '.join(f'{f.name}={getattr(self, f.name)!r}' for f in dataclasses.fields(self))
        return f'{self.name}({params})'


def sibling_valid(siblings: Array, j: int) -> Array:
    """Sibling j [...] is valid: not padding (-1) and not a duplicate of an earlier sibling."""
    c = siblings[..., j]
    valid = c >= 0
    if j > 0:
        valid = valid & ~jnp.any(siblings[..., :j] == c[..., None], axis=-1)
    return valid


class YieldRule(Rule):
    """A rule of the yield shape: accept x with y(x)/q(x), reject to norm((t - y)_+).

    Subclasses define `yield_from(px, qx, x, stats)` (and `stats`); t is p unless `target_from`
    is overridden. a(x) = y(x)/q(x) (if q(x) = 0, which the draft cannot produce, a(x) =
    1[t(x) > 0]), the replacement is norm((t - y)_+) falling back to p, and the closed-form
    law is pi = y + (1 - sum y) norm((t - y)_+).
    """

    def yield_from(self, px: Array, qx: Array, x: Array, stats: Any) -> Array:
        raise NotImplementedError

    def target_from(self, px: Array, qx: Array, x: Array, stats: Any) -> Array:
        """The law t the residual is taken against, evaluated at x (default p(x))."""
        del qx, x, stats
        return px

    def accept_from(self, px, qx, x, stats):
        y = self.yield_from(px, qx, x, stats)
        tx = self.target_from(px, qx, x, stats)
        return jnp.where(
            qx > 0, jnp.clip(y / jnp.where(qx > 0, qx, 1.0), 0.0, 1.0), (tx > 0).astype(px.dtype)
        )

    def yield_vector(self, p: Array, q: Array) -> Array:
        """y(v) for every token v, [..., V]."""
        return self.yield_from(p, q, vocab_index(p), expand_stats(self.stats(p, q)))

    def target_vector(self, p: Array, q: Array) -> Array:
        """t(v) for every token v, [..., V]."""
        return self.target_from(p, q, vocab_index(p), expand_stats(self.stats(p, q)))

    def replacement(self, p, q):
        y = self.yield_vector(p, q)
        return normalize_or(jnp.maximum(self.target_vector(p, q) - y, 0.0), p)

    def induced(self, p, q):
        y = self.yield_vector(p, q)
        res = normalize_or(jnp.maximum(self.target_vector(p, q) - y, 0.0), p)
        return y + (1.0 - y.sum(-1, keepdims=True)) * res
