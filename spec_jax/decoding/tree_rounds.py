"""A tree round: the drafter's tree, one target forward through its ancestor mask,
`rules.verify_tree`'s walk, the accepted path committed (docs/engine.md, "Tree rounds").
`engine.tree_round` is this one; an adaptive engine runs it at each tier's tree."""

from __future__ import annotations

from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp

from spec_jax import rules
from spec_jax.decoding import adaptive_trees, trees
from spec_jax.decoding.state import DecodeState
from spec_jax.decoding.trees import TreeShape
from spec_jax.decoding.verification import TargetLaw, Verification
from spec_jax.models.cache import tree_mask
from spec_jax.models.llama import forward

if TYPE_CHECKING:
    from spec_jax.decoding.engine import Engine


def tree_round(
    engine: Engine, params: dict, draft_params, s: DecodeState, shape: TreeShape | None = None
) -> DecodeState:
    """One round over a draft tree of `shape` (default `engine.tree`; an adaptive tier's
    tree otherwise) (docs/engine.md, "Tree rounds")."""
    cfg, drafter, shape = engine.cfg, engine.drafter, shape or engine.tree
    verification = Verification(engine.rule, engine.baseline)
    processed = lambda logits: verification.transform(engine.sampler.probs(logits))  # noqa: E731
    key_b, k_draft_b, k_verify_b = s.split_keys(3)
    live_b = ~s.done_b
    draft, tokens_bm, parents_bm, q_bmv = drafter.propose_tree(
        draft_params, s.draft, s.committed_b, shape, k_draft_b, processed
    )
    tokens_bm = tokens_bm.at[:, 0].set(s.pending_b())
    if shape.static:
        anc_bmm = jnp.broadcast_to(trees.static_ancestors(shape), (*tokens_bm.shape, shape.nodes))
    else:
        anc_bmm = trees.ancestors(parents_bm, shape.path_len)
    depth_bm = anc_bmm.sum(-1, dtype=jnp.int32) - 1
    logits_bmv, taps_bmed, cache = forward(
        cfg,
        params,
        tokens_bm,
        s.committed_b[:, None] + depth_bm,
        s.cache,
        tree_mask(s.cache.lengths, anc_bmm, s.cache.max_len),
        tap_layers=drafter.tap_layers,
    )
    # The processed laws of the rows the walk reads only (verify_tree's target_law).
    extra = {'target_logits_bmv': logits_bmv,
             'target_law': TargetLaw(engine.sampler, verification)}  # fmt: skip
    if shape.static:  # The children table, built once a round (a static tree's on the host).
        kids_bmc = jnp.broadcast_to(jnp.asarray(shape.tree.children), (*tokens_bm.shape,
                                    shape.tree.children.shape[1]))  # fmt: skip
    else:
        kids_bmc = rules.children_from_parents(parents_bm, shape.branch)
        extra['children'] = kids_bmc
    out = rules.verify_tree(
        verification,
        k_verify_b,
        shape.tree if shape.static else parents_bm,
        tokens_bm,
        None,
        q_bmv,
        draws=shape.sampled or 'iid',  # Read with sampled siblings only.
        max_depth=shape.path_len,
        max_children=shape.branch,
        pad_id=engine.decode.pad_id,
        **extra,
    )
    metered = None
    if engine.meter_distortion:  # The law each depth of the path emitted, given it was reached.
        kids_btc = jnp.take_along_axis(kids_bmc, out.path[..., None], axis=1)
        sibs_btc = jnp.where(kids_btc >= 0, jnp.take_along_axis(
            tokens_bm[:, None], jnp.maximum(kids_btc, 0), axis=-1), -1)  # fmt: skip
        logits_btv = jnp.take_along_axis(logits_bmv, out.path[..., None], axis=1)
        raw_btv = engine.sampler.probs(logits_btv)
        # Sampled siblings: the law the walk emits over the draws, from each node's q.
        q_btv = None if q_bmv is None else jnp.take_along_axis(q_bmv, out.path[..., None], 1)
        if verification.needs_logits:  # The node laws and baseline sets read the logits.
            pi = verification.tree_node_law(raw_btv, sibs_btc, logits_btv, q_btv)
            metered = verification.meter(pi, raw_btv, logits_btv)
        else:
            pi = verification.tree_node_law(raw_btv, sibs_btc, q_btv=q_btv)
            metered = verification.meter(pi, raw_btv)
    start_b = s.committed_b
    if s.ranks is not None:  # An adaptive tree's acceptance per depth and rank (adaptive_trees.py).
        ranks = adaptive_trees.rank_counts(out.path, out.num_accepted, kids_bmc, live_b,
                                           *s.ranks.shape[1:])  # fmt: skip
        s = s.replace(ranks=s.ranks + ranks)
    s = s.replace(key_b=key_b, stats=s.stats.update(path_result(out, kids_bmc), live_b, metered))
    s = s.commit(out.tokens, out.num_emitted, engine.decode.stop_tokens)
    # The root and the accepted nodes kept (C advanced by their count) move into place.
    s = s.replace(cache=cache.commit_path(out.path, s.committed_b - start_b))
    taps_bted = None
    if taps_bmed is not None:
        taps_bted = jnp.take_along_axis(taps_bmed, out.path[:, :, None, None], axis=1)
    draft = drafter.observe(draft_params, draft, s.history_bs, start_b, s.committed_b, taps_bted)
    return s.replace(draft=draft)


def path_result(out: rules.TreeResult, kids_bmc: jax.Array) -> rules.ChainResult:
    """A tree round's outcome in the chain's per-position form, for `Stats.update`: entry d
    is drafted depth d + 1, examined when the walk stood at depth d on a node with children
    (`kids_bmc` [B, M, C], -1 padded): a walk that stops at a leaf examined nothing deeper."""
    depth_1a = jnp.arange(out.path.shape[1] - 1)[None, :]
    n_b1 = out.num_accepted[:, None]
    leaf_b1 = jnp.take_along_axis(kids_bmc[:, :, 0], out.last_node[:, None], axis=1) < 0
    return rules.ChainResult(
        num_accepted=out.num_accepted,
        tokens=out.tokens,
        accepted=depth_1a < n_b1,
        num_emitted=out.num_emitted,
        accept_probs=jnp.zeros(out.path[:, 1:].shape, jnp.float32),
        reached=(depth_1a < n_b1) | ((depth_1a == n_b1) & ~leaf_b1),
        final_token=out.final_token,
        nonfinite=out.nonfinite,
    )
