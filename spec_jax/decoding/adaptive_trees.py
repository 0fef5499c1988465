"""Tree tiers of verification sized online (decoding/adaptive.py): their expected tokens.

A tree's expected tokens need the acceptance of each rank, not only the top one:
`DecodeState.ranks` [2, A, C] counts, over the batch's live rows and every tree round
(any tier), the rounds whose walk stood at drafted depth d on a node with a k-th child and
those that accepted that child (`rank_counts`, from the round's `TreeResult.path`). Per
batch, not per row: a row's tree rounds are few and spread over C ranks. The estimate
p_dk = P(the target's token at depth d is the head's k-th candidate | its parent was
accepted) is shrunk toward the depth above, shifted by the prior's profile (depth 1 toward
p (1 - p)^k, p the prior's first rate), `weight`
rounds each (`rank_acceptance`). A node's chance of being on the accepted path is the
product of its ranks' p along its path; a tier's tokens are, per live row, 1 plus the sum
over its nodes no deeper than the row's room - 1 (`tree_tokens`; a dynamic tree keeps the
M - 1 best of its pool, tree_budget's premise that draft scores track acceptance). Counts
come from earlier rounds only, so lossless stays lossless. A smaller tier never examines
depths or ranks the larger ones hold; they borrow the depth above.
"""

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.decoding import adaptive_prior
from spec_jax.decoding.trees import TreeShape


def rank_counts(path_bt, num_accepted_b, kids_bmc, live_b, depth: int, width: int):
    """One tree round's counts [2, depth, width] (summed over the live rows): [1, d, k] the
    rounds whose walk stood at drafted depth d (0-based: the root's children are depth 0)
    on a node with a (k + 1)-th child, [0, d, k] those of them that accepted that child
    (`TreeResult.path`, `num_accepted`; children [B, M, C] in draft order, -1 padded)."""
    d = path_bt.shape[1] - 1
    kids_btc = jnp.take_along_axis(kids_bmc, path_bt[:, :, None], axis=1)[:, :d]
    stood_bd = (jnp.arange(d)[None, :] <= num_accepted_b[:, None]) & live_b[:, None]
    seen_bdc = stood_bd[..., None] & (kids_btc >= 0)
    took_bd = (jnp.arange(d)[None, :] < num_accepted_b[:, None]) & live_b[:, None]
    acc_bdc = took_bd[..., None] & (kids_btc == path_bt[:, 1:, None])
    counts = jnp.stack([acc_bdc.sum(0), seen_bdc.sum(0)]).astype(jnp.float32)
    c = kids_bmc.shape[2]
    return jnp.pad(counts, ((0, 0), (0, depth - d), (0, width - c)))


def rank_acceptance(counts_2dc, prior, weight) -> jax.Array:
    """P(the target's token at drafted depth d is the head's k-th candidate | its parent
    was accepted) [D, C], the batch's counts shrunk toward the depth above shifted by the
    prior's profile in log-odds, every rank alike (`adaptive_prior.anchor`; depth 1 toward
    the geometric p (1 - p)^k, p the prior's first rate), `weight` rounds each; each depth's
    total at most 1."""
    acc_dc, seen_dc = counts_2dc[0], counts_2dc[1]
    prior_p = jnp.atleast_1d(jnp.asarray(prior, jnp.float32))
    above = prior_p[0] * (1.0 - prior_p[0]) ** jnp.arange(acc_dc.shape[1], dtype=jnp.float32)
    rows = []
    for d in range(acc_dc.shape[0]):
        hold = above if d == 0 else adaptive_prior.anchor(above, prior_p, d)
        above = (acc_dc[d] + weight * hold) / (seen_dc[d] + weight)
        above = above / jnp.maximum(above.sum(), 1.0)
        rows.append(above)
    return jnp.stack(rows)


def tree_reach(shape: TreeShape, p_dc: jax.Array, pools=None) -> tuple[jax.Array, np.ndarray]:
    """(each drafted node's probability of being on the accepted path, its depth), [M - 1]
    each: the product of its ranks' probabilities along its path. A dynamic tree keeps the
    M - 1 most likely of its pool (tree_budget's premise: draft scores track acceptance);
    `pools` (a dict) shares one sorted pool among the tiers of one (levels, branch)."""
    if shape.static:
        tree = shape.tree
        depth_m, parents = np.asarray(tree.depth), np.asarray(shape.parents)
        rank_m = np.zeros(shape.nodes, np.int32)
        for i in range(1, shape.nodes):
            rank_m[i] = int(np.sum(parents[1:i] == parents[i]))
        factor_m = p_dc[np.maximum(depth_m - 1, 0), rank_m].at[0].set(1.0)
        anc_mm = np.asarray(tree_ancestors(parents))
        reach_m = jnp.prod(jnp.where(anc_mm, factor_m[None, :], 1.0), axis=1)
        return reach_m[1:], depth_m[1:]
    key = (shape.levels_drafted, shape.branch)
    pools = {} if pools is None else pools
    if key not in pools:
        pools[key] = _pool(*key, p_dc)
    kept, depth = pools[key]
    return kept[: shape.nodes - 1], depth[: shape.nodes - 1]


def _pool(levels: int, b: int, p_dc: jax.Array) -> tuple[jax.Array, jax.Array]:
    """A dynamic tree's candidate pool, best first, and each candidate's depth."""
    scores, depths = [], []
    front = jnp.zeros((b,)).at[0].set(1.0)
    for d in range(levels):
        level = (front[:, None] * p_dc[d, :b][None, :]).reshape(-1)
        scores.append(level)
        depths.append(np.full(level.shape, d + 1))
        front = jax.lax.top_k(level, b)[0]
    flat = jnp.concatenate(scores)
    kept, at = jax.lax.top_k(flat, flat.shape[0])
    return kept, jnp.asarray(np.concatenate(depths))[at]


def tree_ancestors(parents) -> np.ndarray:
    """[M, M] bool: node j is i or an ancestor of i."""
    m = len(parents)
    anc = np.eye(m, dtype=bool)
    for i in range(1, m):
        anc[i] |= anc[parents[i]]
    return anc


def tree_tokens(shapes, p_dc, room_b) -> jax.Array:
    """[2, B, 1 + len(shapes)] each row's tokens from a round of AR and of each tree, first
    and second moments: N = 1 + the accepted path's depth; P(N > d) is the reach of the
    depth-d nodes (one of them at most is on the path), those no deeper than room - 1."""
    out, pools = [jnp.ones((2, room_b.shape[0]))], {}
    for shape in shapes:
        reach_m, depth_m = tree_reach(shape, p_dc, pools)
        reach_bm = jnp.where(jnp.asarray(depth_m)[None, :] < room_b[:, None], reach_m, 0.0)
        out.append(1.0 + jnp.stack([reach_bm.sum(1), (reach_bm * (2 * depth_m + 1)).sum(1)]))
    return jnp.stack(out, axis=2)
