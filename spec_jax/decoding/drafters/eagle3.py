"""An EAGLE-3 head drafting chains and trees from the target's feature taps (docs/engine.md)."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from spec_jax import categorical, sharding
from spec_jax.decoding import trees
from spec_jax.decoding.drafters.base import (
    OUTSIDE_DRAFT_VOCAB,
    ProbsFn,
    draw,
    forced_steps,
    gather_tokens,
    step_keys,
)
from spec_jax.models import eagle3 as e3
from spec_jax.models.cache import attention_mask, empty_layer, tree_mask

# The adaptive engine's head while following AR steps: the width of each window it runs over
# buffered positions (`follow_every`), and how many it buffers before it must (`capacity`):
# a prompt and AR steps of LAZY_CAPACITY positions in all cost the head nothing until it
# drafts.
FOLLOW_EVERY = 16
LAZY_CAPACITY = 512


@struct.dataclass
class Eagle3State:
    """An EAGLE-3 drafter's carry.

    Attributes:
      cache_k, cache_v: the head's keys/values [R, S, H] (R = B * K, as the target's cache);
        slot t holds the entry of position t (taps f_t with token x_{t+1}); slots below C
        (committed) are final, except the positions still buffered.
      hidden_bd: the head's output at position C - 1 (the input of its next step) [B, D];
        its logits there, the law of x_1, are computed when a proposal needs them
        (`Eagle3Drafter.root_logits`), so a round that follows without drafting skips the
        head's largest matmul.
      taps_bwed, tokens_bw: the target's taps and the next tokens of the positions the
        head has not yet run over (a buffered prompt, then AR steps' positions), row b's
        first `buffered_b[b]` of them, `Eagle3Drafter.capacity` at most (0 when it follows
        every step).
      first_b: each row's first buffered position.
      buffered_b: how many each row has buffered (int32 [B]: rows' prompts differ in
        length; an AR step adds one to every row).
    """

    cache_k: jax.Array
    cache_v: jax.Array
    hidden_bd: jax.Array
    taps_bwed: jax.Array
    tokens_bw: jax.Array
    first_b: jax.Array
    buffered_b: jax.Array


@dataclasses.dataclass(frozen=True)
class Eagle3Drafter:
    """An EAGLE-3 head drafting a chain from the target's feature taps (docs/eagle3.md §2).

    The head's entry at position t pairs the target's taps f_t with token x_{t+1} and
    predicts x_{t+2}. With C committed tokens and s_C pending, f_t exists for t <= C - 1
    (the target has processed those tokens), so the entry at C - 1 drafts x_1, the token
    after s_C. After prefill and after every verification (`observe`) the head runs one
    window over the positions the target just processed, [start, start + T), writing their
    entries into its cache: those below the new C are committed; those at or past it pair
    rejected drafts and are overwritten later. Its output at C - 1 is kept in the state.
    `propose` draws x_1 from it, then runs A - 1 steps that feed the head its own output
    with the drafted token (x_j at position C - 1 + j), exactly the training-time test's
    steps (tests/models/test_eagle3.py). The head's logits over its draft vocabulary U are
    scattered into V (`OUTSIDE_DRAFT_VOCAB` elsewhere), so q is a law over V.

    Following AR steps (`follow`, the adaptive engine's AR tier): with `follow_every` W > 0
    the head buffers each step's taps, up to `capacity` positions (a multiple of W; 0:
    W), and runs over them in W-wide windows when the buffer is full or before it next
    drafts (`lag`: the buffered count, priced as a catch-up), instead of a window over one
    token every step (the shipped head at 1,600 slots on this CPU: a 16-token window 2.8
    ms against 1.3 for one token at batch 1, 14.2 against 3.3 at batch 8). The entries
    are the ones the one-token windows write: each position's entry sees the same earlier
    entries. `deferred()` (what the adaptive engine runs) sets W = `FOLLOW_EVERY` and the
    capacity `LAZY_CAPACITY`: a run that stays with AR's step pays the head nothing until
    it drafts or has buffered that many (memory: B x capacity x the taps, 28 MB at batch 8
    for the shipped head in fp32, 100 MB for Llama-3.1-8B's in bf16), as a draft LM leaves
    its cache behind until it drafts; the work is the same windows, done later or never.
    Its prompt too: where the prompt bucket fits the capacity, `init` buffers the prompt's taps
    instead of running the head over them (the prompt's window made the prefill 1.041x AR's
    at batch 8 on this CPU, measured: median of 7 rounds, range 1.007-1.096;
    docs/performance.md), so a run that never drafts never runs the head; a longer prompt is
    run over at `init`.

    Params: {'head': head params, 'embed_vd': the target's input embeddings, 'draft_ids_u':
    the target id of each draft id} (`params_for`). On a mesh its cache rows split by
    `rules` (default `sharding.DRAFT_RULES`: over 'data' only, the weights on every device).
    """

    cfg: e3.Eagle3Config
    rules: sharding.ShardingRules = sharding.DRAFT_RULES
    follow_every: int = 0
    capacity: int = 0
    narrows: ClassVar[bool] = False

    def __post_init__(self):
        w, c = self.follow_every, self.capacity
        if w < 0 or c < 0 or (c and (not w or c % w)):
            raise ValueError(f'Eagle3Drafter follow_every={w}, capacity={c}: give follow_every '
                             '>= 0 and a capacity of 0 (follow_every) or a multiple of it')

    @property
    def buffer(self) -> int:
        """Positions the follow buffers at most (0: it runs every step)."""
        return self.capacity or self.follow_every

    @property
    def tap_layers(self) -> tuple[int, ...]:
        return tuple(self.cfg.taps)

    @property
    def vocab_size(self) -> int:
        return self.cfg.vocab_size

    def check(self, cfg, slots=None):
        """The head must fit the target's widths, vocabulary and layers (its cache has the
        target's slots; its positions are the target's)."""
        del slots
        self.cfg.check_target(cfg)

    def draft_len(self, history_bs, committed_b, num_draft):
        return jnp.full(history_bs.shape[:1], num_draft, jnp.int32)

    @staticmethod
    def params_for(head: e3.Eagle3Head, target_params: dict) -> dict:
        return dict(
            head=head.params, embed_vd=target_params['embed_vd'], draft_ids_u=head.draft_ids_u
        )

    def _window(self, params, state, tokens_bt, taps_bted, start_b, committed_b):
        """Head entries of positions start_b + t with tokens x_{start+t+1}; keeps the output
        at committed_b - 1 (no logits: `root_logits` when a proposal needs them); the
        buffer is left as it was."""
        t, slots = tokens_bt.shape[1], state.cache_k.shape[1]
        # A row whose C - 1 is not in the window keeps its output (a finished row that
        # committed nothing this round; a row with fewer buffered than the batch's most).
        last_b = committed_b - 1 - start_b
        inside_b = (last_b >= 0) & (last_b < t)
        last_b1 = jnp.clip(last_b, 0, t - 1)[:, None]
        none_b0 = jnp.zeros((tokens_bt.shape[0], 0), jnp.int32)  # Logits at no position.
        _, hidden_btd, (cache_k, cache_v, _) = e3.eagle3_forward(
            self.cfg,
            params['head'],
            e3.embed(self.cfg, params['head'], params['embed_vd'], tokens_bt),
            taps_bted,
            start_b[:, None] + jnp.arange(t, dtype=jnp.int32)[None, :],
            attention_mask(start_b, t, slots),
            kv=(state.cache_k, state.cache_v, start_b),
            logits_index_bu=none_b0,
            rules=self.rules,
        )
        hidden_bd = jnp.take_along_axis(hidden_btd, last_b1[:, :, None], 1)[:, 0]
        hidden_bd = jnp.where(inside_b[:, None], hidden_bd, state.hidden_bd)
        return state.replace(cache_k=cache_k, cache_v=cache_v, hidden_bd=hidden_bd)

    def root_logits(self, params, state: Eagle3State) -> jax.Array:
        """The head's logits at position C - 1 over its draft vocabulary [B, U]: the law of
        the first drafted token."""
        return e3.head_logits(self.cfg, params['head'], state.hidden_bd[:, None])[:, 0]

    def init(self, params, history_bs, prompt_len_b, bucket: int, taps_bped=None):
        batch, slots = history_bs.shape
        cfg, w = self.cfg, self.buffer
        zeros = empty_layer(
            batch, cfg.num_kv_heads, slots, cfg.head_dim, jnp.dtype(cfg.dtype), self.rules
        )
        tokens_bp = gather_tokens(history_bs, jnp.arange(1, bucket + 1)[None, :])
        start_b = jnp.zeros((batch,), jnp.int32)
        empty = Eagle3State(
            zeros, zeros, jnp.zeros((batch, cfg.width), jnp.dtype(cfg.dtype)),
            jnp.zeros((batch, w, *taps_bped.shape[2:]), taps_bped.dtype),
            jnp.zeros((batch, w), jnp.int32), start_b, jnp.zeros((batch,), jnp.int32),
        )  # fmt: skip
        if self.capacity > self.follow_every and bucket < self.capacity:
            # Lazy: the prompt's positions buffered, run over before the head first drafts.
            return empty.replace(
                taps_bwed=empty.taps_bwed.at[:, :bucket].set(taps_bped),
                tokens_bw=empty.tokens_bw.at[:, :bucket].set(tokens_bp),
                buffered_b=prompt_len_b.astype(jnp.int32),
            )  # fmt: skip
        return self._window(params, empty, tokens_bp, taps_bped, start_b, prompt_len_b)

    def observe(self, params, state, history_bs, start_b, committed_b, taps_bted):
        t = taps_bted.shape[1]
        tokens_bt = gather_tokens(history_bs, start_b[:, None] + 1 + jnp.arange(t)[None, :])
        return self._window(params, state, tokens_bt, taps_bted, start_b, committed_b)

    def follow(self, params, state, history_bs, start_b, committed_b, taps_bted):
        """`observe` after an AR step; with `follow_every` the step's taps are buffered
        and the head runs over the buffered positions when the buffer is full."""
        if not self.follow_every:
            return self.observe(params, state, history_bs, start_b, committed_b, taps_bted)
        n_b, rows = state.buffered_b, jnp.arange(start_b.shape[0])
        state = state.replace(
            taps_bwed=state.taps_bwed.at[rows, n_b].set(taps_bted[:, 0]),
            tokens_bw=state.tokens_bw.at[rows, n_b].set(
                gather_tokens(history_bs, start_b[:, None] + 1)[:, 0]),
            first_b=jnp.where(n_b == 0, start_b, state.first_b),
            buffered_b=n_b + 1,
        )  # fmt: skip
        return self._flush(params, state, committed_b, state.buffered_b.max() >= self.buffer)

    def _flush(self, params, state, committed_b, when) -> Eagle3State:
        """The head over the buffered positions, when `when`: W-wide windows in order, as
        many as cover the most any row buffered (a while loop of 0 or more trips, not
        `lax.cond`: XLA:CPU copies every buffer a conditional's branch updates, here the
        head's cache). A row's windows past its own buffered positions write entries at or
        past its C, where no mask shows them and the next window overwrites them; each
        row keeps its output at C - 1 (`_window`)."""
        w = self.follow_every
        if not w:  # Nothing is ever buffered.
            return state
        windows = jnp.where(when, (state.buffered_b.max() + w - 1) // w, 0)

        def run(carry):
            s, i = carry
            at = i * w
            s = self._window(params, s, jax.lax.dynamic_slice_in_dim(s.tokens_bw, at, w, 1),
                             jax.lax.dynamic_slice_in_dim(s.taps_bwed, at, w, 1),
                             s.first_b + at, committed_b)  # fmt: skip
            return s, i + 1

        state, _ = jax.lax.while_loop(lambda carry: carry[1] < windows, run,
                                      (state, jnp.zeros((), jnp.int32)))  # fmt: skip
        return state.replace(buffered_b=jnp.where(when, 0, state.buffered_b))

    def lag(self, state, committed_b) -> jax.Array:
        """[B] the positions each row buffered since the head last ran over it."""
        del committed_b
        return state.buffered_b

    def deferred(self) -> Eagle3Drafter:
        if self.follow_every:
            return self
        return dataclasses.replace(self, follow_every=FOLLOW_EVERY, capacity=LAZY_CAPACITY)

    def _probs(self, params, logits_bu, probs_fn):
        batch = logits_bu.shape[0]
        logits_bv = jnp.full((batch, self.vocab_size), OUTSIDE_DRAFT_VOCAB, jnp.float32)
        return probs_fn(logits_bv.at[:, params['draft_ids_u']].set(logits_bu))

    def propose(
        self, params, state: Eagle3State, history_bs, committed_b, key_b, num_draft: int,
        probs_fn: ProbsFn, forced=None,
    ):  # fmt: skip
        del history_bs
        state = self._flush(params, state, committed_b, state.buffered_b.max() > 0)
        slots = state.cache_k.shape[1]
        keys_ab = step_keys(key_b, num_draft)
        forced_scan, forced_last = forced_steps(forced)

        def step(carry, inputs):
            kv, hidden_bd, logits_bu = carry
            key_b, forced_step, j = inputs
            x_b, q_bv = draw(key_b, self._probs(params, logits_bu, probs_fn), forced_step)
            pos_b = committed_b - 1 + j  # x_j's step, at position C - 1 + j.
            logits_b1u, hidden_b1d, kv = e3.eagle3_forward(
                self.cfg,
                params['head'],
                e3.embed(self.cfg, params['head'], params['embed_vd'], x_b[:, None]),
                hidden_bd[:, None],
                pos_b[:, None],
                attention_mask(pos_b, 1, slots),
                kv=(*kv[:2], pos_b),
                apply_fc=False,
                rules=self.rules,
            )
            return (kv, hidden_b1d[:, 0], logits_b1u[:, 0]), (x_b, q_bv)

        root_bu = self.root_logits(params, state)
        carry = ((state.cache_k, state.cache_v, committed_b), state.hidden_bd, root_bu)
        steps = (keys_ab[:-1], forced_scan, jnp.arange(1, num_draft, dtype=jnp.int32))
        ((cache_k, cache_v, _), _, logits_bu), (x_ab, q_abv) = jax.lax.scan(step, carry, steps)
        # No forward for the last one.
        q_last_bv = self._probs(params, logits_bu, probs_fn)
        x_last_b, q_last_bv = draw(keys_ab[-1], q_last_bv, forced_last)
        x_ba = jnp.concatenate([x_ab.T, x_last_b[:, None]], 1)
        q_bav = jnp.concatenate([q_abv.transpose(1, 0, 2), q_last_bv[:, None]], 1)
        # The steps' cache writes sit at or past C, where no mask shows them and the next
        # window overwrites them; kept, so the cache is updated in place (returning the
        # cache from before the steps made XLA copy it every round).
        return state.replace(cache_k=cache_k, cache_v=cache_v), x_ba, q_bav

    # --- trees (docs/engine.md, "Tree rounds"; docs/eagle3.md §4) ----------------------

    def propose_tree(
        self, params, state: Eagle3State, committed_b, shape: trees.TreeShape, key_b=None,
        probs_fn: ProbsFn | None = None,
    ):  # fmt: skip
        """A draft tree after each row's pending token: (state, node tokens [B, M] (entry 0,
        the root, is the caller's), parents [B, M], q [B, M, V] or None).

        Depth-d nodes run the head at position C - 1 + d on their parent's output hidden
        with their own token, as chain step d does; they write their entries into the
        head's cache at slots C .. C + scratch - 1 (in level order) and see the committed
        slots and their ancestors' entries only. Candidates are the head's top-`branch`
        children of each expanded node, over its draft vocabulary, scored by cumulative
        log-probability without temperature (EAGLE's deterministic tree; the sampler and a
        matched baseline's truncation act on the target only); q is None. A sampled static
        tree draws each node's children from the head's processed law there (`probs_fn`,
        one key per row in `key_b`), i.i.d. (SpecInfer) or without replacement (Gumbel
        top-k, best first), which q holds (row i: the law node i's children were drawn
        from; zeros at leaves). The scratch entries are left in the
        cache: they sit at or past C, where the next window overwrites them and no mask
        shows them.
        """
        state = self._flush(params, state, committed_b, state.buffered_b.max() > 0)
        if shape.static:
            kv, tokens_bm, q_bmv = self._static_tree(params, state, committed_b, shape, key_b,
                                                     probs_fn)  # fmt: skip
            parents_bm = jnp.broadcast_to(jnp.asarray(shape.parents, jnp.int32), tokens_bm.shape)
        else:
            kv, tokens_bm, parents_bm = self._dynamic_tree(params, state, committed_b, shape)
            q_bmv = None
        return state.replace(cache_k=kv[0], cache_v=kv[1]), tokens_bm, parents_bm, q_bmv

    def _expand(self, params, kv, tokens_by, hidden_byd, seen_byz, committed_b, level, offset):
        """The head on the Y frontier nodes of depth `level` written at slots C + offset + i;
        `seen_byz` [B, Y, Z] marks the scratch entries each one attends (its ancestors
        and itself). Returns (logits over the draft vocabulary [B, Y, U], output hidden
        [B, Y, D], kv)."""
        pos_by = jnp.broadcast_to((committed_b - 1 + level)[:, None], tokens_by.shape)
        logits_byu, hidden_byd, kv = e3.eagle3_forward(
            self.cfg,
            params['head'],
            e3.embed(self.cfg, params['head'], params['embed_vd'], tokens_by),
            hidden_byd,
            pos_by,
            tree_mask(committed_b, seen_byz, kv[0].shape[1]),
            kv=(*kv, committed_b + offset),
            apply_fc=False,
            rules=self.rules,
        )
        return logits_byu, hidden_byd, kv[:2]

    def _children(self, params, logp_byu, branch):
        """The `branch` best children of each node: (log-probabilities <= 0 [B, Y, C],
        target ids [B, Y, C], C = branch), best first."""
        logp_byc, ids_byc = jax.lax.top_k(logp_byu, branch)
        return jnp.minimum(logp_byc, 0.0), params['draft_ids_u'][ids_byc]

    def _dynamic_tree(self, params, state, committed_b, shape):
        k = shape.branch

        def expand(kv, level, offset, token_by, hidden_byd, seen_byz):
            logits_byu, out_byd, kv = self._expand(
                params, kv, token_by, hidden_byd, seen_byz, committed_b, level, offset
            )
            logp_byc, child_byc = self._children(params, jax.nn.log_softmax(logits_byu, -1), k)
            return kv, logp_byc, child_byc, out_byd

        root_logp_b1u = jax.nn.log_softmax(self.root_logits(params, state), -1)[:, None]
        score_by, token_by = (x[:, 0] for x in self._children(params, root_logp_b1u, k))
        hidden_byd = jnp.repeat(state.hidden_bd[:, None], k, axis=1)
        return trees.grow(shape, score_by, token_by, hidden_byd, expand,
                          (state.cache_k, state.cache_v))  # fmt: skip

    def _static_tree(self, params, state, committed_b, shape, key_b, probs_fn):
        tree, batch = shape.tree, committed_b.shape[0]
        kids, anc_mm = tree.children, trees.static_ancestors(shape)
        rank_m = np.zeros(shape.nodes, np.int64)  # Each node's rank among its siblings.
        for row in kids:
            rank_m[row[row >= 0]] = np.arange((row >= 0).sum())
        slot_m = np.full(shape.nodes, -1)  # Scratch slot of each expanded node.
        slot_m[[i for level in shape.levels for i in level]] = np.arange(shape.scratch)
        kv = (state.cache_k, state.cache_v)
        tokens_bm = jnp.zeros((batch, shape.nodes), jnp.int32)
        parents_m = np.asarray(shape.parents)
        q_bmv = keys_mb = None
        if shape.sampled:  # The law each node's children are drawn from, a key per node.
            q_bmv = jnp.zeros((batch, shape.nodes, self.vocab_size), jnp.float32)
            keys_mb = step_keys(key_b, shape.nodes)

        def fill(tokens_bm, q_bmv, expanded, logits_byu):  # Children of the `expanded` nodes.
            if not shape.sampled:  # The r-th best for the r-th child.
                token_byc = self._children(params, jax.nn.log_softmax(logits_byu, -1),
                                           shape.branch)[1]  # fmt: skip
            for f, node in enumerate(expanded):
                row = kids[node][kids[node] >= 0]
                if shape.sampled == 'iid':  # Independent draws from the processed q.
                    q_bv = self._probs(params, logits_byu[:, f], probs_fn)
                    q_bmv = q_bmv.at[:, node].set(q_bv)
                    for child in row:
                        token_b = categorical.sample_rows(keys_mb[child], q_bv)
                        tokens_bm = tokens_bm.at[:, child].set(token_b)
                elif shape.sampled:  # Without replacement: Gumbel top-k, in draw order.
                    q_bv = self._probs(params, logits_byu[:, f], probs_fn)
                    q_bmv = q_bmv.at[:, node].set(q_bv)
                    gumbel_bv = categorical.map_rows(
                        lambda k: jax.random.gumbel(k, (self.vocab_size,)), keys_mb[node]
                    )
                    _, token_bc = jax.lax.top_k(jnp.log(q_bv) + gumbel_bv, len(row))
                    tokens_bm = tokens_bm.at[:, row].set(token_bc.astype(jnp.int32))
                else:
                    tokens_bm = tokens_bm.at[:, row].set(token_byc[:, f, rank_m[row]])
            return tokens_bm, q_bmv

        root_b1u = self.root_logits(params, state)[:, None]
        tokens_bm, q_bmv = fill(tokens_bm, q_bmv, [0], root_b1u)
        hidden_of = {0: state.hidden_bd}
        offset = 0
        for level, expanded in enumerate(shape.levels, start=1):
            if not expanded:
                break
            idx = np.asarray(expanded)
            seen_yz = np.zeros((len(idx), shape.scratch), bool)
            for f, node in enumerate(idx):
                on_path = np.flatnonzero(anc_mm[node])
                seen_yz[f, slot_m[on_path[on_path > 0]]] = True
            hidden_byd = jnp.stack([hidden_of[int(parents_m[i])] for i in idx], 1)
            logits_byu, out_byd, kv = self._expand(
                params, kv, tokens_bm[:, idx], hidden_byd,
                jnp.broadcast_to(jnp.asarray(seen_yz), (batch, *seen_yz.shape)),
                committed_b, level, offset,
            )  # fmt: skip
            tokens_bm, q_bmv = fill(tokens_bm, q_bmv, idx, logits_byu)
            hidden_of.update({int(i): out_byd[:, f] for f, i in enumerate(idx)})
            offset += len(idx)
        return kv, tokens_bm, q_bmv
