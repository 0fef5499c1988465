"""DFlash drafter training: blocks anchored in a training text, each drafting its B_s - 1
masked positions at once, scored against the frozen target (spec_jax.models.dflash).

With tokens x_0..x_{T-1}, the target's taps f_t and logits z_t (z_t predicts x_{t+1}), a
block anchored at a is exactly what the drafter sees at inference with C = a committed:
context f_0..f_{a-1} (the context stream's keys at positions < a), block tokens
[x_a, mask, ..., mask] at positions a .. a + B_s - 1, bidirectional within the block.
Block position j >= 1 predicts x_{a+j}: its soft target is softmax(z_{a+j-1}), the target's
law there (DFlash's own recipe trains on target-generated text; on such text the two agree
in expectation). Position j's cross-entropy is weighted exp(-(j - 1) / decay) (DFlash's
position decay: early positions gate every later acceptance) over the positions whose
token is inside the text and a response token; the loss is their weighted mean.

Each anchor is its own attention row: the context of the whole text is repeated per anchor
and masked below a, so N anchors of B rows cost B * N block forwards over T context slots.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax

from spec_jax import sharding
from spec_jax.models import dflash as df
from spec_jax.models.attention import Rows
from spec_jax.train.core import apply_gradients, positions


def block_logits(cfg: df.DFlashConfig, params, embed_vd, head_vd, taps_bted, tokens_bt,
                 anchors_bn):  # fmt: skip
    """The drafter's logits of N blocks per row, anchored at `anchors_bn` [B, N] (each in
    [0, T)): [B, N, B_s - 1, V] (position j - 1 holds block position j)."""
    b, t = tokens_bt.shape
    n, bs = anchors_bn.shape[1], cfg.block_size
    rows = Rows.on_mesh(b * n, cfg.num_kv_heads, sharding.DRAFT_RULES)
    context = df.context(cfg, params, taps_bted, positions(b, t))
    pad = jnp.zeros((b * n * cfg.num_kv_heads, bs, cfg.head_dim), jnp.dtype(cfg.dtype))

    def cache(x_btkh):  # [B, T, K, H] -> [B * N * K, T + B_s, H], anchors repeated.
        return jnp.concatenate([rows.keys(jnp.repeat(x_btkh, n, axis=0)), pad], 1)

    caches_k = tuple(cache(k) for k, _ in context)
    caches_v = tuple(cache(v) for _, v in context)
    anchor_r = anchors_bn.reshape(-1)
    first_r = jnp.take_along_axis(tokens_bt, anchors_bn, 1).reshape(-1)
    block_rt = jnp.concatenate(
        [first_r[:, None], jnp.full((b * n, bs - 1), cfg.mask_token_id, jnp.int32)], 1
    )
    embeds_rtd = embed_vd[block_rt].astype(jnp.dtype(cfg.dtype)) * cfg.embed_scale
    slots_s = jnp.arange(t + bs)
    # Context below the anchor, and the block (slots T .. T + B_s - 1), causal if cfg says.
    in_block_ts = (slots_s[None, :] >= t) & (
        (slots_s[None, :] - t <= jnp.arange(bs)[:, None]) if cfg.causal else True
    )
    mask_rts = (slots_s[None, None, :] < anchor_r[:, None, None]) | in_block_ts[None]
    hidden_rtd, _ = df.block_forward(
        cfg, params, embeds_rtd, anchor_r[:, None] + jnp.arange(bs)[None, :],
        (caches_k, caches_v, jnp.full((b * n,), t, jnp.int32)), mask_rts,
    )  # fmt: skip
    logits_rav = df.logits(cfg, hidden_rtd[:, 1:], head_vd)
    return logits_rav.reshape(b, n, bs - 1, -1)


def block_loss(cfg: df.DFlashConfig, logits_bnav, teacher_btv, anchors_bn, loss_mask_bt,
               decay: float):  # fmt: skip
    """(the weighted soft cross-entropy, {'accuracy': top-1 agreement with the teacher's
    argmax over the scored positions, 'positions': how many were scored})."""
    t, a = teacher_btv.shape[1], logits_bnav.shape[2]
    j_a = jnp.arange(1, a + 1)
    target_bna = anchors_bn[..., None] + j_a  # The predicted token's index a + j.
    inside_bna = target_bna < t
    index_bna = jnp.clip(target_bna - 1, 0, t - 1)
    gather = jax.vmap(lambda z_tv, i_na: z_tv[i_na])  # Per row: [N, A, V].
    teacher_bnav = gather(teacher_btv, index_bna)
    scored_bna = inside_bna & gather(loss_mask_bt, jnp.clip(target_bna, 0, t - 1))
    weight_bna = jnp.where(scored_bna, jnp.exp(-(j_a - 1) / decay), 0.0)
    ce_bna = -jnp.sum(jax.nn.softmax(teacher_bnav, -1) * jax.nn.log_softmax(logits_bnav, -1), -1)
    loss = jnp.sum(weight_bna * ce_bna) / jnp.maximum(jnp.sum(weight_bna), 1e-9)
    agree = jnp.argmax(logits_bnav, -1) == jnp.argmax(teacher_bnav, -1)
    count = jnp.sum(scored_bna)
    return loss, {
        'accuracy': jnp.sum(agree & scored_bna) / jnp.maximum(count, 1),
        'positions': count,
    }


def sample_anchors(key, valid_bt, num: int):
    """[B, N] anchors drawn uniformly from each row's valid positions but its last."""
    length_b = jnp.sum(valid_bt, 1)
    u_bn = jax.random.uniform(key, (valid_bt.shape[0], num))
    return jnp.floor(u_bn * jnp.maximum(length_b - 1, 1)[:, None]).astype(jnp.int32)


def make_train_step(cfg: df.DFlashConfig, optimizer: optax.GradientTransformation,
                    anchors: int = 4, decay: float | None = None):  # fmt: skip
    """A jitted step (state, key, embed_vd, head_vd, taps [B, T, E, D], teacher logits
    [B, T, V], tokens [B, T], valid [B, T], loss_mask [B, T]) -> (state, loss, aux, grad
    norm) for a train state {'params', 'opt_state', 'step'} (`core.apply_gradients`).
    `decay` defaults to (B_s - 1) / 2."""
    decay = float(decay or (cfg.block_size - 1) / 2)

    @partial(jax.jit, donate_argnums=0)
    def step(state, key, embed_vd, head_vd, taps, teacher, tokens, valid, loss_mask):
        anchors_bn = sample_anchors(key, valid, anchors)

        def loss_fn(params):
            logits = block_logits(cfg, params, embed_vd, head_vd, taps, tokens, anchors_bn)
            return block_loss(cfg, logits, teacher, anchors_bn, loss_mask & valid, decay)

        return apply_gradients(optimizer, state, loss_fn)

    return step


def response_anchors(key, token_mask_bt, num: int):
    """[B, N] anchors a drawn uniformly from each row's positions whose next token x_{a+1}
    is a response token (`token_mask_bt` [B, T]: token t is a response token), so block
    position 1 is always scored. A row without one draws anchor 0 (nothing scored)."""
    next_bt = jnp.concatenate([token_mask_bt[:, 1:], jnp.zeros_like(token_mask_bt[:, :1])], 1)
    logits_bt = jnp.where(next_bt, 0.0, -jnp.inf)
    logits_bt = jnp.where(jnp.any(next_bt, 1, keepdims=True), logits_bt, 0.0)
    return jax.random.categorical(key, logits_bt, axis=-1, shape=(num, token_mask_bt.shape[0])).T


def topk_block_loss(logits_bnav, ids_btk, logprobs_btk, anchors_bn, token_mask_bt,
                    decay: float):  # fmt: skip
    """`block_loss` against the target's stored top-k law (`teacher.teacher_topk`: ids and
    log-probabilities [B, T, k] of the token after t, renormalised over the k): the same
    position weights and mask, the soft cross-entropy over the k ids; agreement with ids[0]."""
    t, a = ids_btk.shape[1], logits_bnav.shape[2]
    j_a = jnp.arange(1, a + 1)
    target_bna = anchors_bn[..., None] + j_a
    index_bna = jnp.clip(target_bna - 1, 0, t - 1)
    gather = jax.vmap(lambda z_tk, i_na: z_tk[i_na])
    ids_bnak = gather(ids_btk, index_bna)
    p_bnak = jax.nn.softmax(gather(logprobs_btk, index_bna).astype(jnp.float32), -1)
    scored_bna = (target_bna < t) & gather(token_mask_bt, jnp.clip(target_bna, 0, t - 1))
    weight_bna = jnp.where(scored_bna, jnp.exp(-(j_a - 1) / decay), 0.0)
    logp_bnav = jax.nn.log_softmax(logits_bnav, -1)
    ce_bna = -jnp.sum(p_bnak * jnp.take_along_axis(logp_bnav, ids_bnak, -1), -1)
    loss = jnp.sum(weight_bna * ce_bna) / jnp.maximum(jnp.sum(weight_bna), 1e-9)
    agree_bna = (jnp.argmax(logits_bnav, -1) == ids_bnak[..., 0]) & scored_bna
    count_a = jnp.sum(scored_bna, (0, 1))
    return loss, {
        'accuracy': jnp.sum(agree_bna) / jnp.maximum(jnp.sum(count_a), 1),
        'acc1': jnp.sum(agree_bna[..., 0]) / jnp.maximum(count_a[0], 1),
        'positions': jnp.sum(count_a),
    }


def make_topk_train_step(cfg: df.DFlashConfig, optimizer: optax.GradientTransformation,
                         anchors: int = 8, decay: float | None = None):  # fmt: skip
    """The cached-teacher step (the recipe's): (state, key, embed_vd, head_vd, taps
    [B, T, E, D] (stored, float16 ok), top-k ids [B, T, k], top-k log-probs [B, T, k],
    tokens [B, T], token_mask [B, T] (token t is a response token)) -> (state, loss, aux,
    grad norm); anchors drawn by `response_anchors`."""
    decay = float(decay or (cfg.block_size - 1) / 2)

    @partial(jax.jit, donate_argnums=0)
    def step(state, key, embed_vd, head_vd, taps, ids, logprobs, tokens, token_mask):
        anchors_bn = response_anchors(key, token_mask, anchors)

        def loss_fn(params):
            logits = block_logits(cfg, params, embed_vd, head_vd, taps, tokens, anchors_bn)
            return topk_block_loss(logits, ids, logprobs, anchors_bn, token_mask, decay)

        return apply_gradients(optimizer, state, loss_fn)

    return step
