"""Fitting a draft from a train_draft config (configs/smollm2_135m_{draft,eagle3}.py).

`fit_draft_lm` and `fit_eagle3` build the draft's initial parameters and its step function
from the config, then run the resumable loop (`core.train_loop`: orbax checkpoints in
`<workdir>/checkpoints`, metrics appended to `<workdir>/metrics.jsonl`, a deadline):

  draft LM   the first `train.ce_steps` steps are cheap (hard-label CE on the target's
             tokens, or KL to stored top-k soft labels), the rest KL to the target's
             logits (a target forward per step); docs/training.md
  EAGLE-3    the training-time test (TTT) with a target forward per step, or from stored
             taps and top-k labels (`train.teacher_topk` > 0); `model.init_from`
             fine-tunes an exported head with its own sizes and draft vocabulary
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from spec_jax.checkpoints import eagle_formats
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig
from spec_jax.train import batches, core, distill, shards
from spec_jax.train import eagle3 as train_e3


def soft_label_count(c: ml_collections.ConfigDict) -> int:
    """`train.teacher_topk`, checked: k > 0 stores the target's top-k law once per token and
    trains on it (draft LM: soft labels for the cheap steps; EAGLE-3: with the taps also
    stored, no target forward per step)."""
    k = c.train.get('teacher_topk', 0)
    if not k:
        return 0
    if c.data.reference:
        raise ValueError(
            f'train.teacher_topk={k} needs stored shards; data.reference={c.data.reference} '
            'examples have no soft labels: set one of them to 0 / ()'
        )
    if not 0 < k <= 1024:
        raise ValueError(f'train.teacher_topk must be in [0, 1024], got {k}')
    return k


def ce_step_count(train: ml_collections.ConfigDict) -> int:
    """How many first steps are hard-label CE: `train.ce_steps`, where -1 means all."""
    return train.steps if train.ce_steps < 0 else min(train.ce_steps, train.steps)


def metrics_logger(workdir: str):
    """Appends logged metrics to `<workdir>/metrics.jsonl`. The first log of a resumed run
    first drops the lines a crashed run wrote after its last checkpoint (steps at or past
    this log's), so every step appears once."""
    path = os.path.join(workdir, 'metrics.jsonl')
    first = [True]

    def log(step, metrics):
        if first[0] and os.path.exists(path):
            with open(path) as f:
                kept = [line for line in f if line.strip() and json.loads(line)['step'] < step]
            with open(path, 'w') as f:
                f.writelines(kept)
        first[0] = False
        with open(path, 'a') as f:
            f.write(json.dumps(dict(metrics, step=step, time=time.time())) + '\n')

    return log


def _train(c, params, opt, step_fn, examples, workdir):
    """The config's training loop (checkpoints, metrics, deadline) from fresh state."""
    t = c.train

    def stream(start):
        yield from batches.batch_stream(examples, t.batch_size, t.seq_len, t.seed, start, t.bucket)

    state = dict(params=params, opt_state=opt.init(params), step=jnp.zeros((), jnp.int32))
    return core.train_loop(
        state=state,
        step_fn=step_fn,
        batches=stream,
        steps=t.steps,
        workdir=workdir,
        checkpoint_every=t.checkpoint_every,
        log_every=t.log_every,
        deadline=time.time() + t.seconds if t.seconds else None,
        tokens_per_batch=lambda b: int(b.valid_bt.sum()),
        on_log=metrics_logger(workdir),
    )


def _optimizer(t: ml_collections.ConfigDict):
    return core.make_optimizer(t.lr, t.steps, t.warmup, t.clip, t.weight_decay)


def _summary(n_params, t0, state, history, **extra) -> dict:
    return dict(
        params_m=n_params / 1e6,
        train_seconds=time.time() - t0,
        steps=int(state['step']),
        last=history[-1] if history else {},
        **extra,
    )


def draft_lm_config(c: ml_collections.ConfigDict, target_cfg: ModelConfig) -> ModelConfig:
    """The draft LM's ModelConfig: the sizes of `c.model`, the target's vocabulary and RoPE."""
    m = c.model
    return distill.draft_config(
        target_cfg,
        width=m.width,
        num_layers=m.num_layers,
        num_heads=m.num_heads,
        num_kv_heads=m.num_kv_heads,
        head_dim=m.head_dim,
        mlp_width=m.mlp_width,
    )


def fit_draft_lm(c, workdir: str, target, examples: Sequence[shards.Example]):
    """Trains the draft LM of config `c` on `examples` distilled from `target`.

    Returns:
      (its ModelConfig, its trained parameters, a summary dict).
    """
    dcfg = draft_lm_config(c, target.cfg)
    params = distill.init_draft(
        dcfg, target.params, jax.random.PRNGKey(c.train.seed), c.model.init_embedding
    )
    n_params = sum(x.size for x in jax.tree.leaves(params))
    logging.info('draft LM %s: %.2fM params', dcfg, n_params / 1e6)
    opt = _optimizer(c.train)
    step = distill.make_train_step(target.cfg, dcfg, opt, c.train.temperature)
    ce_step = distill.make_ce_step(dcfg, opt)
    topk_step = distill.make_topk_step(dcfg, opt)
    tparams = target.params
    ce_steps = ce_step_count(c.train)
    soft = soft_label_count(c) > 0

    def step_fn(state, b, step_index):
        args = (jnp.asarray(b.tokens_bt), jnp.asarray(b.loss_mask_bt), jnp.asarray(b.valid_bt))
        if step_index >= ce_steps:
            return step(tparams, state, *args)
        # Cheap steps without a teacher forward: stored soft labels, or the next token.
        if soft:
            return topk_step(state, *args, b.labels['topk_ids'], b.labels['topk_logprobs'])
        return ce_step(state, *args)

    t0 = time.time()
    state, history = _train(c, params, opt, step_fn, examples, workdir)
    return dcfg, state['params'], _summary(n_params, t0, state, history)


def fit_eagle3(c, workdir: str, target, examples: Sequence[shards.Example]):
    """Trains the EAGLE-3 head of config `c` for `target` on `examples`.

    The draft vocabulary is the `model.draft_vocab_size` most frequent response tokens (the
    stop ids always in), or the fine-tuned head's own.

    Returns:
      (the trained Eagle3Head, a summary dict).
    """
    counts = batches.token_counts(examples, target.cfg.vocab_size)
    m = c.model
    if m.init_from:  # Fine-tune a head: its own sizes and draft vocabulary.
        start = eagle_formats.load_head(m.init_from, target.cfg)
        hcfg, params = start.cfg, start.params
        used = np.asarray(start.draft_ids_u)
    else:
        used = e3.draft_vocab_from_counts(
            counts, m.draft_vocab_size, always=target.tokenizer.stop_ids
        )
        sizes = ('num_heads', 'num_kv_heads', 'head_dim', 'mlp_width')
        switches = {k: bool(m.get(k)) for k in ('fc_norm', 'norm_output')}  # EAGLE-3.1
        hcfg = e3.Eagle3Config.for_target(
            target.cfg, m.draft_vocab_size, **{k: m[k] for k in sizes if m.get(k)}, **switches
        )
        params = e3.init_params(hcfg, jax.random.PRNGKey(c.train.seed))
        if m.init_from_target:
            params = e3.init_from_target(hcfg, params, target.params, used)
    d2t, t2d = e3.vocab_maps(used, target.cfg.vocab_size)
    coverage = float(counts[used].sum() / max(counts.sum(), 1))
    logging.info('draft vocab %d covers %.4f of response tokens', len(used), coverage)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    opt = _optimizer(c.train)
    draft_ids = jnp.asarray(used.astype(np.int32))
    t2d_j = jnp.asarray(t2d)
    ttt = (c.train.ttt_steps, c.train.step_weight)
    if soft_label_count(c):  # Stored taps and top-k labels: no target forward per step.
        cached = train_e3.make_cached_train_step(hcfg, opt, *ttt)
        embed_vd = target.params['embed_vd']

        def step_fn(state, b, _):
            labels = [b.labels[k] for k in ('taps', 'topk_ids', 'topk_logprobs')]
            batch = (b.tokens_bt, b.loss_mask_bt, b.valid_bt, *labels)
            return cached(embed_vd, draft_ids, t2d_j, state, *map(jnp.asarray, batch))

    else:
        online = train_e3.make_train_step(target.cfg, hcfg, opt, *ttt)
        tparams = target.params

        def step_fn(state, b, _):
            batch = (b.tokens_bt, b.loss_mask_bt, b.valid_bt)
            return online(tparams, draft_ids, t2d_j, state, *map(jnp.asarray, batch))

    t0 = time.time()
    state, history = _train(c, params, opt, step_fn, examples, workdir)
    head = e3.Eagle3Head(hcfg, state['params'], jnp.asarray(d2t), t2d_j)
    return head, _summary(n_params, t0, state, history, vocab_coverage=coverage)
