"""Tree (multi-draft) verification at one node and over a whole static tree.

Representation (docs/eagle3.md §4): parent pointers, the `Tree` type and the children table
(`children_from_parents`) live in `tree_pointers` (re-exported here).

Inputs of the verifier: node tokens [B, M] (entry 0 unused), the processed target
probabilities at every node [B, M, V] (row i is the target's law of the token after the
path to node i), and, for sampled siblings, the draft law at every node [B, M, V] (row i is
the law the children of node i were drawn from) and how they were drawn (`draws`).

Walk: from the root, at each depth run the node rule over the node's children (a
`lax.scan` over siblings, all rows at once); descend into the accepted child or stop. The
depth loop is a `lax.fori_loop` of max_depth + 1 steps; finished rows are masked. Outputs
have static shapes: the accepted path [B, D+1] padded with its last node (never -1), its
length, and the final token (residual sample, or the bonus at a leaf).

Three sibling modes (`rule.tree_modes`; docs/engine.md "Tree rounds"):
  deterministic  EAGLE (docs/laws.md §2.2, §3.3, §4.2): rule.tree_gate(P(c_j)) accepts;
                 a rejection zeroes c_j and renormalises; duplicates and -1 are skipped;
                 if the residual mass falls to <= 1e-9 the scan stops and the token comes
                 from the full p (EAGLE's guard).
  iid            SpecInfer (§2.3), lossless rule only: siblings drawn i.i.d. from q;
                 accept with min(1, P(c_j)/q(c_j)); on rejection P <- norm((P - q)_+).
  distinct       Recursive rejection sampling without replacement (Jeon et al. 2024),
                 lossless rule only: siblings drawn from q without replacement (Gumbel
                 top-k), so c_j ~ q_j = q with c_1..c_{j-1} removed and renormalised; accept
                 with min(1, P(c_j)/q_j(c_j)); on rejection P <- norm((P - q_j)_+). Each
                 step is one speculative step of the residual target with a draft from
                 q_j, hence lossless; unlike i.i.d. draws no sibling is wasted on a repeat.
                 A sibling with q_j(c_j) = 0 (q's support used up) is skipped.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from spec_jax import categorical
from spec_jax.rules import base
from spec_jax.rules.chain import nonfinite_rows, uniform_open_closed
from spec_jax.rules.tree_pointers import Tree, children_from_parents

__all__ = ['NodeResult', 'Tree', 'TreeResult', 'children_from_parents', 'verify_node',
           'verify_tree']  # fmt: skip


class NodeResult(NamedTuple):
    """Outcome of verification at one node.

    Attributes:
      choice: [B] int32 index of the accepted sibling, -1 if none.
      final_dist: [B, V] law of the token emitted when no sibling is accepted (the residual,
        or the full p after EAGLE's guard).
      token: [B] int32 the emitted token: the accepted sibling, else a sample of final_dist.
      nonfinite: [B] bool, the target (or draft) row held a NaN or inf: the token is no
        law's draw.
    """

    choice: jax.Array
    final_dist: jax.Array
    token: jax.Array
    nonfinite: jax.Array | None = None


class TreeResult(NamedTuple):
    """Outcome of `verify_tree` (fixed shapes; D = max depth).

    Attributes:
      num_accepted: [B] int32 accepted draft nodes on the path (root excluded).
      path: [B, D+1] int32 node indices from the root; entries past num_accepted repeat the
        last accepted node (safe for gathers, never -1).
      tokens: [B, D+1] int32 the accepted node tokens, then the final token, then pad_id.
      final_token: [B] int32 the residual sample or bonus token.
      num_emitted: [B] int32 num_accepted + 1.
      last_node: [B] int32 the last accepted node (path[:, num_accepted]).
      nonfinite: [B] bool, a target (or draft) row the walk read held a NaN or inf (every
        rule rejects there; the final token is no law's draw): counted by the engine.
    """

    num_accepted: jax.Array
    path: jax.Array
    tokens: jax.Array
    final_token: jax.Array
    num_emitted: jax.Array
    last_node: jax.Array
    nonfinite: jax.Array | None = None


DRAWS = ('iid', 'distinct')


def _mode(rule: base.Rule, sampled: bool, draws: str) -> str:
    """The sibling mode of a verification, checked against the rule's tree modes."""
    if draws not in DRAWS:
        raise ValueError(f'draws={draws!r}: sampled siblings are drawn one of {DRAWS}')
    mode = draws if sampled else 'deterministic'
    if mode not in rule.tree_modes:
        raise ValueError(
            f'rule {rule.name!r} does not support {mode} tree verification; its tree modes: '
            f'{rule.tree_modes or "none"}'
        )
    return mode


def _scan_node(rule, p_bv, sibs_bc, u_bc, q_bv=None, distinct=False, logits_bv=None):
    """The sibling scan at one node; returns (choice [B], final_dist [B, V]). `logits_bv`
    [B, V]: the node's raw target logits, for rules that set `needs_logits`."""
    b, num_c = sibs_bc.shape
    sampled = q_bv is not None
    p_bv = rule.tree_target(p_bv, sibs_bc, q_bv)  # p itself for every rule but tv_budget.
    if sampled:
        valid = sibs_bc >= 0
    else:
        valid = jnp.stack([base.sibling_valid(sibs_bc, j) for j in range(num_c)], axis=1)
    c_safe = jnp.clip(sibs_bc, 0, p_bv.shape[-1] - 1)
    xs = (sibs_bc.T, c_safe.T, valid.T, u_bc.T, jnp.arange(num_c, dtype=jnp.int32))
    choice0 = jnp.full((b,), -1, jnp.int32)

    if sampled:

        def body(carry, x):
            big_p, q, choice = carry
            _, c, ok, u, j = x
            pc, qc = base.gather(big_p, c), base.gather(q, c)
            g = jnp.where(
                qc > 0,
                jnp.clip(pc / jnp.where(qc > 0, qc, 1.0), 0.0, 1.0),
                (pc > 0).astype(pc.dtype),  # An i.i.d. draw where q = 0 (measure zero).
            )
            active = ok & (choice < 0)
            if distinct:  # q_j(c) = 0 only once q's support is used up: skipped.
                active = active & (qc > 0)
            acc = active & (u <= g)
            rej = active & ~acc
            nxt = base.normalize_or(jnp.maximum(big_p - q, 0.0), big_p)
            big_p = jnp.where(rej[:, None], nxt, big_p)
            if distinct:  # The next sibling is drawn from q without c.
                drop = jnp.where(rej, c, q.shape[-1])[:, None]  # Out of range -> kept.
                q_out = q.at[jnp.arange(b)[:, None], drop].set(0.0, mode='drop')
                q = base.normalize_or(q_out, q_out)
            return (big_p, q, jnp.where(acc, j, choice)), None

        (big_p, _, choice), _ = jax.lax.scan(body, (p_bv, q_bv, choice0), xs)
        return choice, rule.tree_final(big_p)

    state0 = base.node_state(p_bv)
    pc_all = jnp.take_along_axis(p_bv, c_safe, axis=-1).T  # [C, B]
    # Per-node statistics: of the raw logits (rules that read them), or of the full p (the
    # chain forms' gates on the original p); None for the gates on the residual state.
    node = rule.tree_node_stats(p_bv) if logits_bv is None else rule.tree_node_raw(logits_bv)

    def body(carry, x):
        state, choice, guard = carry
        (_, c, ok, u, j), pc = x
        active = ok & (choice < 0) & ~guard
        if node is None:
            g = rule.tree_gate(pc, c, state)
        else:
            g = rule.tree_gate_raw(pc, c, state, node)
        acc = active & (u <= g)
        rej = active & ~acc
        state = base.node_reject(state, pc, rej)
        guard = guard | (rej & (state.mass <= base.ZERO_MASS))
        return (state, jnp.where(acc, j, choice), guard), rej

    carry0 = (state0, choice0, jnp.zeros((b,), bool))
    (_, choice, guard), rejected = jax.lax.scan(body, carry0, (xs, pc_all))
    drop = jnp.where(rejected.T, c_safe, p_bv.shape[-1])  # Out of range -> dropped.
    zeroed = p_bv.at[jnp.arange(b)[:, None], drop].set(0.0, mode='drop')
    residual = base.normalize_or(zeroed, p_bv)
    if node is None:
        final_law = rule.tree_final(residual)
    else:
        final_law = rule.tree_final_raw(residual, p_bv, node)
    final = jnp.where(guard[:, None], rule.bonus(p_bv), final_law)
    return choice, final


@functools.partial(jax.jit, static_argnames=('draws',))
def verify_node(
    rule: base.Rule,
    key: jax.Array,
    target_probs_bv: jax.Array,
    siblings_bc: jax.Array,
    draft_probs_bv: jax.Array | None = None,
    draws: str = 'iid',
    target_logits_bv: jax.Array | None = None,
) -> NodeResult:
    """Verifies the ordered siblings of one node.

    Args:
      rule: a tree-capable rule (a pytree; its float parameters may be traced).
      key: PRNG key.
      target_probs_bv: [B, V] processed target at the node.
      siblings_bc: [B, C] int sibling tokens in draft order; -1 is padding.
      draft_probs_bv: [B, V] the law the siblings were sampled from; None for
        deterministic siblings (EAGLE).
      draws: how sampled siblings were drawn from q: 'iid' (SpecInfer) or 'distinct'
        (without replacement, in draw order).
      target_logits_bv: [B, V] the node's raw target logits, for rules that set
        `needs_logits` (MARS).

    Returns:
      NodeResult.
    """
    mode = _mode(rule, draft_probs_bv is not None, draws)
    target_probs_bv, draft_probs_bv, target_logits_bv = (
        categorical.upcast(x) for x in (target_probs_bv, draft_probs_bv, target_logits_bv))
    key_u, key_s = jax.random.split(key)
    sibs = siblings_bc.astype(jnp.int32)
    u = uniform_open_closed(key_u, sibs.shape)
    _check_logits(rule, target_logits_bv)
    choice, final = _scan_node(
        rule, target_probs_bv, sibs, u, draft_probs_bv, distinct=mode == 'distinct',
        logits_bv=target_logits_bv,
    )  # fmt: skip
    picked = jnp.take_along_axis(sibs, jnp.maximum(choice, 0)[:, None], axis=1)[:, 0]
    token = jnp.where(choice >= 0, picked, categorical.sample(key_s, final))
    bad = nonfinite_rows(target_probs_bv, draft_probs_bv)
    return NodeResult(choice=choice, final_dist=final, token=token, nonfinite=bad)


def verify_tree(
    rule: base.Rule,
    key: jax.Array,
    tree: Tree | jax.Array,
    node_tokens_bm: jax.Array,
    target_probs_bmv: jax.Array | None,
    draft_probs_bmv: jax.Array | None = None,
    *,
    draws: str = 'iid',
    max_depth: int | None = None,
    max_children: int | None = None,
    pad_id: int = 0,
    target_logits_bmv: jax.Array | None = None,
    children: jax.Array | None = None,
    target_law=None,
) -> TreeResult:
    """Verifies a whole draft tree and returns the accepted path and the final token.

    Args:
      rule: a tree-capable rule (a pytree argument of the jitted walk: its float parameters
        are traced, its class and static fields select the trace).
      key: one PRNG key, or B keys (one per row, as `verify_chain` takes them): row b then
        draws its uniforms and its final token from key b only.
      tree: a static `Tree`, or traced parent pointers [M] or [B, M] (then give
        `max_depth` and `max_children`, defaults M - 1).
      node_tokens_bm: [B, M] int token of each node (entry 0, the root, is unused).
      target_probs_bmv: [B, M, V] processed target at every node; None with `target_law`.
      draft_probs_bmv: [B, M, V] for sampled siblings: row i is the law the children of
        node i were drawn from; None for deterministic siblings (EAGLE).
      draws: how sampled siblings were drawn from q: 'iid' (SpecInfer) or 'distinct'
        (without replacement, in sibling order).
      max_depth: static depth bound for traced parents.
      max_children: static sibling bound for traced parents.
      pad_id: token written after the emitted ones.
      target_logits_bmv: [B, M, V] the raw target logits at every node, for rules that set
        `needs_logits` (MARS reads its margin gate from them); None for the others.
      children: traced parents only: their children table [B, M, C] when the caller has
        built it (`children_from_parents(parents, max_children)`; the tree round reads it
        too), so it is built once.
      target_law: instead of `target_probs_bmv`, a pytree callable from raw logits [B, V]
        to the processed target law [B, V] (the engine's sampler and baseline truncation),
        applied to `target_logits_bmv` at the node the walk stands on only: max_depth + 1
        rows of the M, not all M (a 60-node tree of depth 6: 7 of 60).

    Returns:
      TreeResult.
    """
    m = node_tokens_bm.shape[-1]
    target_probs_bmv, draft_probs_bmv, target_logits_bmv = (
        categorical.upcast(x) for x in (target_probs_bmv, draft_probs_bmv, target_logits_bmv))
    if isinstance(tree, Tree):
        if tree.num_nodes != m:
            raise ValueError(f'verify_tree: tree has {tree.num_nodes} nodes, tokens have {m}')
        children = jnp.asarray(tree.children, jnp.int32)  # int64 under jax_enable_x64.
        depth = tree.max_depth
    else:
        parents = jnp.asarray(tree, jnp.int32)
        depth = m - 1 if max_depth is None else int(max_depth)
        width = max(1, m - 1) if max_children is None else int(max_children)
        if children is None:
            children = children_from_parents(parents, width)
        elif children.shape[-2:] != (m, width):
            raise ValueError(
                f'verify_tree: children table of shape {children.shape}, want [..., {m}, {width}]'
            )
    _check_logits(rule, target_logits_bmv)
    if (target_law is None) == (target_probs_bmv is None):
        raise ValueError('verify_tree: pass target_probs_bmv, or target_law and the logits')
    if target_law is not None:  # The laws of the rows the walk reads, from their logits.
        if target_logits_bmv is None:
            raise ValueError('verify_tree: target_law reads target_logits_bmv; pass them')
        return _verify_tree(
            rule, key, children, node_tokens_bm, None, draft_probs_bmv, draws, depth, pad_id,
            target_logits_bmv, target_law,
        )  # fmt: skip
    if target_logits_bmv is None:  # The call (and program) of the rules that read no logits.
        return _verify_tree(
            rule, key, children, node_tokens_bm, target_probs_bmv, draft_probs_bmv, draws, depth,
            pad_id,
        )  # fmt: skip
    return _verify_tree(
        rule, key, children, node_tokens_bm, target_probs_bmv, draft_probs_bmv, draws, depth,
        pad_id, target_logits_bmv,
    )  # fmt: skip


def _check_logits(rule, logits) -> None:
    if getattr(rule, 'needs_logits', False) and logits is None:
        raise ValueError(
            f'rule {rule.name!r} reads the raw logits in its tree form; pass the target logits'
        )


@functools.partial(jax.jit, static_argnames=('draws', 'max_depth', 'pad_id'))
def _verify_tree(
    rule, key, children, node_tokens_bm, target_probs_bmv, draft_probs_bmv, draws, max_depth,
    pad_id, target_logits_bmv=None, target_law=None,
):  # fmt: skip
    sampled = draft_probs_bmv is not None
    distinct = _mode(rule, sampled, draws) == 'distinct'
    b, m = node_tokens_bm.shape
    if target_law is None:
        law_bv = jax.ShapeDtypeStruct((b, target_probs_bmv.shape[-1]), target_probs_bmv.dtype)
    else:
        law_bv = jax.eval_shape(target_law, target_logits_bmv[:, 0])
    v = law_bv.shape[-1]
    rows = jnp.arange(b)
    tokens_bm = node_tokens_bm.astype(jnp.int32)
    children = children.astype(jnp.int32)
    num_c = children.shape[-1]
    steps = (max_depth + 1, num_c)
    if categorical.is_key_batch(key):
        if key.shape[0] != b:
            raise ValueError(f'verify_tree: {key.shape[0]} keys for a batch of {b} rows')
        key_walk, key_final = categorical.map_rows(lambda k: tuple(jax.random.split(k)), key)
        u_dbc = categorical.map_rows(lambda k: uniform_open_closed(k, steps), key_walk)
        u_dbc = u_dbc.transpose(1, 0, 2)
    else:
        key_walk, key_final = jax.random.split(key)
        u_dbc = uniform_open_closed(key_walk, (steps[0], b, num_c))

    def body(d, carry):
        cur, done, n_acc, path, final_dist, bad = carry
        kids = children[cur] if children.ndim == 2 else children[rows, cur]  # [B, C]
        exists = kids >= 0
        kids_safe = jnp.clip(kids, 0, m - 1)
        sibs = jnp.where(exists, jnp.take_along_axis(tokens_bm, kids_safe, axis=1), -1)
        z = None if target_logits_bmv is None else target_logits_bmv[rows, cur]  # [B, V]
        p = target_probs_bmv[rows, cur] if target_law is None else target_law(z)  # [B, V]
        q = draft_probs_bmv[rows, cur] if sampled else None
        bad = bad | (~done & nonfinite_rows(p, q))
        if not getattr(rule, 'needs_logits', False):
            choice, node_final = _scan_node(rule, p, sibs, u_dbc[d], q, distinct)
        else:
            choice, node_final = _scan_node(rule, p, sibs, u_dbc[d], q, distinct, logits_bv=z)
        has_kids = exists.any(-1)
        acc = ~done & (choice >= 0)
        stop = ~done & ~acc
        dist_now = jnp.where(has_kids[:, None], node_final, rule.bonus(p))
        final_dist = jnp.where(stop[:, None], dist_now, final_dist)
        nxt = jnp.take_along_axis(kids_safe, jnp.maximum(choice, 0)[:, None], axis=1)[:, 0]
        cur = jnp.where(acc, nxt, cur)
        path = path.at[:, d + 1].set(cur, mode='drop')
        return cur, done | stop, n_acc + acc, path, final_dist, bad

    carry0 = (
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b,), bool),
        jnp.zeros((b,), jnp.int32),
        jnp.zeros((b, max_depth + 1), jnp.int32),
        jnp.zeros((b, v), law_bv.dtype),
        jnp.zeros((b,), bool),
    )
    cur, _, n_acc, path, final_dist, bad = jax.lax.fori_loop(0, max_depth + 1, body, carry0)
    if categorical.is_key_batch(key):
        final = categorical.sample_rows(key_final, final_dist)
    else:
        final = categorical.sample(key_final, final_dist)
    path_tokens = jnp.take_along_axis(tokens_bm, path[:, 1:], axis=1)  # [B, D]
    pos = jnp.arange(max_depth + 1)[None, :]
    padded = jnp.concatenate([path_tokens, jnp.full((b, 1), pad_id, jnp.int32)], axis=1)
    tokens = jnp.where(
        pos < n_acc[:, None], padded, jnp.where(pos == n_acc[:, None], final[:, None], pad_id)
    )
    return TreeResult(
        num_accepted=n_acc,
        path=path,
        tokens=tokens.astype(jnp.int32),
        final_token=final,
        num_emitted=n_acc + 1,
        last_node=cur,
        nonfinite=bad,
    )
