"""EAGLE-3 head training with the training-time test (TTT), docs/eagle3.md §5.

Pairs (the "shift", docs/eagle3.md §2): with tokens x_0..x_{T-1}, target taps f_t and target
logits z_t (z_t predicts x_{t+1}),

    step 0, index t: hidden fc(f_t), token x_{t+1}, position t -> x_{t+2} ~ z_{t+1}
    step j, index t: hidden out_{j-1}[t], token x_{t+j+1}, pos t+j -> x_{t+j+2} ~ z_{t+j+1}

Index t at step j therefore stands for draft position t+j of a chain rooted after x_{t+1}.
Attention at step j: step-0 keys causally (index <= t) plus the keys of steps 1..j at the
same index t (the chain's own earlier entries), exactly the context a chain draft sees.
The loss is the soft cross-entropy against softmax(z restricted to the draft vocabulary),
on positions whose predicted token is a response token and whose target argmax is in the
draft vocabulary, averaged over those positions, summed over steps with weights 0.8**j.
"""

from __future__ import annotations

from functools import partial

import jax
import jax.numpy as jnp
import optax

from spec_jax.models.config import ModelConfig
from spec_jax.models.eagle3 import Eagle3Config, eagle3_forward, embed
from spec_jax.train.core import apply_gradients, batch_forward, causal_mask, positions


def shift_left(x, j: int, fill=0):
    """x[:, t + j] at t (fill past the end) along axis 1."""
    if j == 0:
        return x
    pad = jnp.full((x.shape[0], j, *x.shape[2:]), fill, x.dtype)
    return jnp.concatenate([x[:, j:], pad], axis=1)


def ttt_forward(
    cfg: Eagle3Config, params, target_embed_vd, taps_bted, tokens_bt, valid_bt, steps: int
):
    """Unrolled TTT: draft logits [steps, B, T, U] (index t of step j predicts x_{t+j+2})."""
    b, t = tokens_bt.shape
    mask = causal_mask(valid_bt)
    pos = positions(b, t)
    hidden, apply_fc = taps_bted, True
    step0_kv, diag, logits = None, [], []
    for j in range(steps):
        emb = embed(cfg, params, target_embed_vd, shift_left(tokens_bt, j + 1))
        logit, hidden, kv = eagle3_forward(
            cfg,
            params,
            emb,
            hidden,
            pos + j,
            mask,
            diag_kv=diag,
            ctx_kv=step0_kv,
            apply_fc=apply_fc,
        )
        if j == 0:
            step0_kv = kv
        else:
            diag = diag + [kv]
        logits.append(logit)
        apply_fc = False
    return jnp.stack(logits)


def teacher_from_logits(teacher_logits_btv, draft_ids_u):
    """The TTT teacher from full target logits: (softmax over the draft vocabulary [B, T, U],
    the target's argmax over its whole vocabulary [B, T])."""
    return (
        jax.nn.softmax(teacher_logits_btv[..., draft_ids_u], axis=-1),
        jnp.argmax(teacher_logits_btv, -1),
    )


def teacher_from_topk(topk_ids_bti, topk_logprobs_bti, draft_ids_u, t2d_v):
    """The TTT teacher from stored top-k labels (`teacher.teacher_topk`): the target's top-k law
    restricted to the draft vocabulary and renormalised [B, T, U], and its top-1 [B, T].

    It approximates `teacher_from_logits` by dropping the target's mass outside its top k
    (for top-16 on the embedded default, typically a few per cent of a confident law).
    """
    u = draft_ids_u.shape[0]
    index_v = jnp.full(t2d_v.shape, u, jnp.int32).at[draft_ids_u].set(jnp.arange(u))
    w_bti = jnp.exp(topk_logprobs_bti.astype(jnp.float32)) * t2d_v[topk_ids_bti]
    w_bti = w_bti / jnp.maximum(w_bti.sum(-1, keepdims=True), 1e-30)
    b, t, _ = topk_ids_bti.shape
    rows, cols = jnp.arange(b)[:, None, None], jnp.arange(t)[None, :, None]
    # Ids outside the draft vocabulary (weight 0) land in a spare last column, dropped.
    p_btu = jnp.zeros((b, t, u + 1)).at[rows, cols, index_v[topk_ids_bti]].add(w_bti)
    return p_btu[..., :u], topk_ids_bti[..., 0]


def ttt_targets(teacher, loss_mask_bt, valid_bt, steps: int):
    """Per step j: the teacher at t + j + 1 (law [B, T, U], top-1 [B, T]) and the mask of
    trained positions [B, T]."""
    p_btu, top_bt = teacher
    out = []
    for j in range(steps):
        m = shift_left(loss_mask_bt, j + 1, False) & shift_left(valid_bt, j + 1, False)
        out.append((shift_left(p_btu, j + 1), shift_left(top_bt, j + 1), m))
    return out


def ttt_loss(logits_jbtu, teacher, loss_mask_bt, valid_bt, draft_ids_u, t2d_v, step_weight=0.8):
    """Weighted soft CE over TTT steps, and per-step argmax agreement (acceptance proxy).

    Args:
      logits_jbtu: `ttt_forward`'s draft logits.
      teacher: (p_btu, top_bt) from `teacher_from_logits` or `teacher_from_topk`; step j
        at index t is trained on position t + j + 1.

    Returns:
      (loss scalar, acc [steps]): acc_j = P(draft argmax at step j == target argmax) over
      response positions (all of them, also those whose target token is outside the draft
      vocabulary, which the draft can never match).
    """
    steps = logits_jbtu.shape[0]
    total, accs = 0.0, []
    for j, (p, top, m) in enumerate(ttt_targets(teacher, loss_mask_bt, valid_bt, steps)):
        logq = jax.nn.log_softmax(logits_jbtu[j], axis=-1)
        ce_bt = -jnp.sum(p * logq, -1)
        m_loss = (m & t2d_v[top]).astype(jnp.float32)
        total = total + step_weight**j * (ce_bt * m_loss).sum() / jnp.maximum(m_loss.sum(), 1.0)
        pred = draft_ids_u[jnp.argmax(logits_jbtu[j], -1)]
        mf = m.astype(jnp.float32)
        accs.append(((pred == top) * mf).sum() / jnp.maximum(mf.sum(), 1.0))
    return total, jnp.stack(accs)


def _ttt_update(cfg, optimizer, steps, step_weight, state, embed_vd, taps, teacher, batch, vocab):
    """One optimizer step of the TTT loss on given taps and teacher: (state, metrics)."""
    tokens_bt, loss_mask_bt, valid_bt = batch
    draft_ids_u, t2d_v = vocab

    def loss_fn(params):
        logits = ttt_forward(cfg, params, embed_vd, taps, tokens_bt, valid_bt, steps)
        return ttt_loss(logits, teacher, loss_mask_bt, valid_bt, draft_ids_u, t2d_v, step_weight)

    state, loss, acc, grad_norm = apply_gradients(optimizer, state, loss_fn)
    metrics = dict(loss=loss, grad_norm=grad_norm)
    metrics.update({f'acc{j}': acc[j] for j in range(steps)})
    return state, metrics


def make_train_step(
    target_cfg: ModelConfig,
    cfg: Eagle3Config,
    optimizer: optax.GradientTransformation,
    steps: int = 7,
    step_weight: float = 0.8,
):
    """A jitted (target_params, draft_ids_u, t2d_v, state, tokens, loss_mask, valid) -> (state,
    metrics) that runs the frozen target for taps and logits, then the TTT loss."""
    update = partial(_ttt_update, cfg, optimizer, steps, step_weight)

    @partial(jax.jit, donate_argnums=(3,))
    def step(target_params, draft_ids_u, t2d_v, state, tokens_bt, loss_mask_bt, valid_bt):
        logits, taps, _ = batch_forward(
            target_cfg, target_params, tokens_bt, valid_bt, tap_layers=cfg.taps
        )
        teacher = teacher_from_logits(jax.lax.stop_gradient(logits), draft_ids_u)
        return update(
            state,
            target_params['embed_vd'],
            jax.lax.stop_gradient(taps),
            teacher,
            (tokens_bt, loss_mask_bt, valid_bt),
            (draft_ids_u, t2d_v),
        )

    return step


def make_cached_train_step(
    cfg: Eagle3Config,
    optimizer: optax.GradientTransformation,
    steps: int = 7,
    step_weight: float = 0.8,
):
    """A jitted (embed_vd, draft_ids_u, t2d_v, state, tokens, loss_mask, valid, taps,
    topk_ids, topk_logprobs) -> (state, metrics) on stored taps and top-k labels
    (`teacher.teacher_taps`, `teacher.teacher_topk`): no target forward per step."""
    update = partial(_ttt_update, cfg, optimizer, steps, step_weight)

    @partial(jax.jit, donate_argnums=(3,))
    def step(
        embed_vd,
        draft_ids_u,
        t2d_v,
        state,
        tokens_bt,
        loss_mask_bt,
        valid_bt,
        taps_bted,
        topk_ids_bti,
        topk_logprobs_bti,
    ):
        teacher = teacher_from_topk(topk_ids_bti, topk_logprobs_bti, draft_ids_u, t2d_v)
        return update(
            state,
            embed_vd,
            taps_bted.astype(jnp.float32),
            teacher,
            (tokens_bt, loss_mask_bt, valid_bt),
            (draft_ids_u, t2d_v),
        )

    return step


# ---- the head's top predictions per TTT step (held-out acceptance: eval/acceptance.py) ---


@partial(jax.jit, static_argnames=('target_cfg', 'cfg', 'steps', 'top'))
def ttt_topk(
    target_cfg,
    cfg,
    target_params,
    head_params,
    draft_ids_u,
    tokens_bt,
    valid_bt,
    steps: int,
    top: int,
):
    """Top-`top` draft predictions (target ids) per TTT step: [steps, B, T, top]."""
    one_position = jnp.zeros((tokens_bt.shape[0], 1), jnp.int32)  # Target logits unused.
    _, taps, _ = batch_forward(
        target_cfg,
        target_params,
        tokens_bt,
        valid_bt,
        tap_layers=cfg.taps,
        logits_index_bu=one_position,
    )
    logits = ttt_forward(
        cfg, head_params, target_params['embed_vd'], taps, tokens_bt, valid_bt, steps
    )
    _, idx = jax.lax.top_k(logits, top)
    return draft_ids_u[idx]
