"""What draft training shares: optimizer, orbax checkpoints, the resumable loop, the teacher.

A training state is a plain pytree `{'params', 'opt_state', 'step'}` saved with an orbax
CheckpointManager; the data stream is a pure function of (seed, step), so a run restored at
step s continues with exactly the batches an uninterrupted run would have seen.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from absl import logging
from tqdm import tqdm

from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward


def make_optimizer(
    lr: float,
    steps: int,
    warmup: int,
    clip: float = 1.0,
    weight_decay: float = 0.0,
    b2: float = 0.95,
) -> optax.GradientTransformation:
    """AdamW with linear warmup, cosine decay to 10 % and global-norm clipping."""
    schedule = optax.warmup_cosine_decay_schedule(
        0.0, lr, max(warmup, 1), max(steps, warmup + 1), end_value=lr * 0.1
    )
    return optax.chain(
        optax.clip_by_global_norm(clip),
        optax.adamw(schedule, b1=0.9, b2=b2, weight_decay=weight_decay),
    )


def apply_gradients(optimizer: optax.GradientTransformation, state: dict, loss_fn):
    """One optimizer step on `loss_fn(params) -> (loss, aux)` for a train state
    {'params', 'opt_state', 'step'}: (new state, loss, aux, gradient norm)."""
    (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(state['params'])
    updates, opt_state = optimizer.update(grads, state['opt_state'], state['params'])
    params = optax.apply_updates(state['params'], updates)
    new = dict(params=params, opt_state=opt_state, step=state['step'] + 1)
    return new, loss, aux, optax.tree.norm(grads)


def causal_mask(valid_bt: jax.Array) -> jax.Array:
    """[B, T, T] causal mask over valid keys; every query also sees itself (so a pad query's
    softmax is never empty; pad positions are outside every loss mask)."""
    t = valid_bt.shape[1]
    causal_tt = jnp.tril(jnp.ones((t, t), bool))
    return (causal_tt[None] & valid_bt[:, None, :]) | jnp.eye(t, dtype=bool)[None]


def positions(batch: int, t: int) -> jax.Array:
    return jnp.broadcast_to(jnp.arange(t, dtype=jnp.int32), (batch, t))


def batch_forward(cfg: ModelConfig, params: dict, tokens_bt, valid_bt, **kw):
    """`forward` over a padded training batch (positions 0..T-1, causal mask over valid
    keys, no cache): (logits, taps, None). Keywords go to `forward`. Not jitted itself."""
    b, t = tokens_bt.shape
    return forward(cfg, params, tokens_bt, positions(b, t), None, causal_mask(valid_bt), **kw)


@partial(jax.jit, static_argnames=('cfg', 'taps'))
def teacher_forward(cfg: ModelConfig, params: dict, tokens_bt, valid_bt, taps: bool = False):
    """The frozen target on a training batch: (logits [B, T, V] fp32, taps [B, T, E, D])."""
    tap_layers = cfg.hf_taps() if taps else ()
    logits, taps_bted, _ = batch_forward(cfg, params, tokens_bt, valid_bt, tap_layers=tap_layers)
    return logits, taps_bted


@partial(jax.jit, static_argnames=('cfg', 'tap_layers'))
def teacher_taps(cfg: ModelConfig, params: dict, tokens_bt, valid_bt, tap_layers):
    """The frozen target's hidden-state taps [B, T, E, D] on a training batch (the LM head
    runs on one position only: its logits are not needed)."""
    one_position = jnp.zeros((tokens_bt.shape[0], 1), jnp.int32)
    _, taps_bted, _ = batch_forward(
        cfg, params, tokens_bt, valid_bt, tap_layers=tap_layers, logits_index_bu=one_position
    )
    return taps_bted


@partial(jax.jit, static_argnames=('cfg', 'top_k'))
def teacher_topk_logprobs(cfg: ModelConfig, params: dict, tokens_bt, valid_bt, top_k: int):
    """The target's top-k next-token law on a batch: (log-probs [B, T, k], ids [B, T, k])."""
    logits, _ = teacher_forward(cfg, params, tokens_bt, valid_bt)
    return jax.lax.top_k(jax.nn.log_softmax(logits, axis=-1), top_k)


# ---- checkpoints ------------------------------------------------------------------------


class Checkpointer:
    """Orbax CheckpointManager around a {'params', 'opt_state', 'step'} pytree."""

    def __init__(self, directory: str, max_to_keep: int = 2):
        self.directory = os.path.abspath(directory)
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=max_to_keep)
        )

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, state: dict) -> None:
        self.manager.save(step, args=ocp.args.StandardSave(state), force=True)
        self.manager.wait_until_finished()

    def restore(self, like: dict, step: int | None = None) -> dict:
        step = self.latest_step() if step is None else step
        abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype), like)
        return self.manager.restore(step, args=ocp.args.StandardRestore(abstract))

    def close(self) -> None:
        self.manager.close()


def train_loop(
    *,
    state: dict,
    step_fn: Callable[[dict, object, int], tuple[dict, dict]],
    batches: Callable[[int], Iterator],
    steps: int,
    workdir: str | None,
    checkpoint_every: int = 200,
    checkpoint_seconds: float = 300.0,
    log_every: int = 20,
    stop_after: int | None = None,
    deadline: float | None = None,
    progress: bool = True,
    tokens_per_batch: Callable[[object], int] | None = None,
    on_log: Callable[[int, dict], None] | None = None,
) -> tuple[dict, list[dict]]:
    """The resumable training loop shared by the draft LM and the EAGLE-3 head.

    Args:
      state: the initial {'params', 'opt_state', 'step'}; replaced by the latest checkpoint
        in `workdir/checkpoints` when there is one.
      step_fn: (state, batch, step) -> (state, metrics), jitted by the caller; `step` is
        the index of the step being taken as a host int, so choosing a phase by it costs
        no device sync (reading state['step'] would wait for the step in flight).
      batches: start_step -> iterator of batches (deterministic in the step).
      steps: total steps of the run.
      workdir: where checkpoints go (None: no checkpoints).
      checkpoint_every: save every this many steps (and at the end).
      checkpoint_seconds: also save when this much time passed since the last save.
      log_every: average and log metrics every this many steps.
      stop_after: simulate a crash: return after this many steps of this call, without the
        final checkpoint (tests).
      deadline: time.time() after which the loop checkpoints and stops.
      progress: tqdm bar.
      tokens_per_batch: counts the trained tokens of a batch (for tokens/s).
      on_log: called with (step, averaged metrics) at each log.

    Returns:
      (final state, list of logged metric dicts with 'step', 'tokens_per_s').
    """
    ckpt = Checkpointer(os.path.join(workdir, 'checkpoints')) if workdir else None
    if ckpt is not None and ckpt.latest_step() is not None:
        state = ckpt.restore(state)
        logging.info('resumed from step %d in %s', int(state['step']), ckpt.directory)
    start = int(state['step'])
    history: list[dict] = []
    acc: dict[str, list] = {}
    last_save, t0, tokens = time.time(), time.time(), 0
    bar = tqdm(total=steps, initial=start, desc='train', unit='step', disable=not progress)
    it = batches(start)
    step, in_flight = start, None
    try:
        while step < steps:
            batch = next(it)
            state, metrics = step_fn(state, batch, step)
            # Wait for the previous step (one step stays in flight, so an accelerator never
            # idles while the host prepares a batch). Without a wait the host runs ahead
            # until the next log or checkpoint: the bar, tokens/s and the deadline would read
            # dispatch time, and that checkpoint would seem to take the queued steps' time.
            jax.block_until_ready(in_flight)
            in_flight = metrics
            step += 1
            tokens += tokens_per_batch(batch) if tokens_per_batch else 0
            for k, v in metrics.items():
                acc.setdefault(k, []).append(v)
            bar.update(1)
            if step % log_every == 0 or step == steps:
                avg = {k: float(np.mean(jax.device_get(v))) for k, v in acc.items()}
                avg.update(step=step, tokens_per_s=tokens / max(time.time() - t0, 1e-9))
                history.append(avg)
                acc = {}
                bar.set_postfix({k: f'{v:.3g}' for k, v in avg.items() if k != 'step'})
                logging.info('step %d %s', step, avg)
                if on_log:
                    on_log(step, avg)
            if stop_after is not None and step - start >= stop_after:
                return state, history
            late = deadline is not None and time.time() > deadline
            if ckpt is not None and (
                step % checkpoint_every == 0
                or step == steps
                or late
                or time.time() - last_save > checkpoint_seconds
            ):
                ckpt.save(step, state)
                last_save = time.time()
            if late:
                logging.info('deadline reached at step %d', step)
                break
    finally:
        bar.close()
        if ckpt is not None:
            ckpt.close()
    return state, history
