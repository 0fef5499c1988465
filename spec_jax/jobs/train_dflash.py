"""The train_dflash job: a DFlash block drafter for a target, from its own greedy text.

Stages (docs/training.md, "DFlash"), the data ones resumable in `workdir`:
  1. data: the target answers training prompts (greedy; `train.prompts` sources, never the
     speed sets or an evaluation's prompts) -> `<data_dir>/shard_*.npz` (`train.generation`),
     then once per token its taps at the drafter's layers and its top-k next-token law
     (`train.teacher` sidecars). The last `data.heldout` examples are held out.
  2. train: `train.dflash.make_topk_train_step` (anchored blocks, DFlash's position decay,
     soft CE against the stored top-k law) with AdamW, for `train.steps` steps or
     `train.seconds`, whichever ends first; the parameters go to `<workdir>/params.npz`.
  3. eval: teacher-forced greedy agreement per block position on the held-out text
     (`eval.acceptance.dflash`).
  4. export: config.json + model.safetensors in the released layout (`dflash_format.save`).
"""

from __future__ import annotations

import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from absl import logging

from spec_jax import checkpoints
from spec_jax.checkpoints import dflash_format
from spec_jax.eval import acceptance
from spec_jax.jobs import runtime
from spec_jax.models import dflash as df
from spec_jax.train import batches, core, generation, prompts, shards, teacher
from spec_jax.train import dflash as train_dflash


def run(c: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs every stage of config `c` (configs/smollm2_135m_dflash.py) in `workdir`.

    Returns:
      A summary dict (also written to `<workdir>/summary.json`).
    """
    start = time.time()
    os.makedirs(workdir, exist_ok=True)
    runtime.log_devices()
    target = checkpoints.load(c.target, 'float32', c.seed)
    cfg = drafter_config(c, target.cfg)
    data_dir = c.data.dir or os.path.join(workdir, 'data')
    summary: dict = dict(kind='dflash', target=c.target, drafter=_cfg_summary(cfg))
    summary['data'] = generate_data(c, target, data_dir)
    summary['teacher_taps'] = teacher.teacher_taps(target, data_dir, cfg.taps)
    summary['teacher_topk'] = teacher.teacher_topk(target, data_dir, c.data.top_k)
    examples = shards.read_examples(
        data_dir, [shards.taps_name(cfg.taps), shards.topk_name(c.data.top_k)]
    )
    if len(examples) <= c.data.heldout:
        raise ValueError(
            f'{len(examples)} examples in {data_dir}, not more than data.heldout='
            f'{c.data.heldout}: generate more (data.num_prompts) or hold out fewer'
        )
    train, held = examples[: -c.data.heldout], examples[-c.data.heldout :]
    summary.update(
        examples=len(train),
        response_tokens=int(sum(e.loss_mask.sum() for e in train)),
        heldout_examples=len(held),
        data_seconds=round(time.time() - start, 1),
    )
    params, summary['train'] = fit(c, cfg, target, train, workdir)
    if c.eval.enabled:
        t0 = time.time()
        summary['eval'] = acceptance.dflash(target, cfg, params, held, seq_len=c.train.seq_len)
        summary['eval']['seconds'] = round(time.time() - t0, 1)
        logging.info('held-out dflash: %s', summary['eval'])
    if c.export.dir:
        dflash_format.save(c.export.dir, cfg, params, c.export.dtype)
        size = os.path.getsize(os.path.join(c.export.dir, 'model.safetensors'))
        summary['export'] = dict(dir=c.export.dir, bytes=size, dtype=c.export.dtype)
    summary['wall_seconds'] = round(time.time() - start, 1)
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=2, default=float)
    print(json.dumps(summary, indent=2, default=float))
    return summary


def drafter_config(c: ml_collections.ConfigDict, target_cfg) -> df.DFlashConfig:
    """The drafter's shape: `model.num_layers` layers of the target's shape, block
    `model.block_size`, taps `model.taps` (() = `DFlashConfig.for_target`'s spread)."""
    changes = dict(block_size=c.model.block_size)
    if c.model.taps:
        changes['taps'] = tuple(int(t) for t in c.model.taps)
    cfg = df.DFlashConfig.for_target(target_cfg, c.model.num_layers, **changes)
    cfg.check_target(target_cfg)
    return cfg


def generate_data(c: ml_collections.ConfigDict, target, data_dir: str) -> dict:
    """Stage 1: the first `data.num_prompts` prompts of `data.sources`, answered greedily."""
    bad = [s for s in c.data.sources if s not in prompts.SOURCES]
    if bad:
        raise ValueError(f'data.sources {bad} are not among {sorted(prompts.SOURCES)}')
    chosen = prompts.training_prompts(tuple(c.data.sources), c.data.seed, c.data.root)
    if c.data.num_prompts:
        chosen = chosen[: c.data.num_prompts]
    return generation.generate_dataset(
        target,
        chosen,
        data_dir,
        batch_size=c.data.batch_size,
        max_new_tokens=c.data.max_new_tokens,
        max_prompt_len=c.data.max_prompt_len,
        seed=c.data.seed,
    )


def fit(c, cfg: df.DFlashConfig, target, examples, workdir: str) -> tuple[dict, dict]:
    """Stage 2: (the trained drafter params, {steps, seconds, the last logged metrics})."""
    t = c.train
    optimizer = core.make_optimizer(t.lr, t.steps, t.warmup, t.clip, t.weight_decay)
    params = df.init_params(cfg, jax.random.PRNGKey(c.seed))
    state = dict(params=params, opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32))
    step = train_dflash.make_topk_train_step(cfg, optimizer, t.anchors, t.decay or None)
    embed_vd = target.params['embed_vd']
    head_vd = target.params.get('lm_head_vd', embed_vd)
    stream = batches.batch_stream(examples, t.batch_size, t.seq_len, c.seed)
    key = jax.random.PRNGKey(c.seed + 1)
    start, logged, log, done = time.time(), [], open(os.path.join(workdir, 'metrics.jsonl'), 'w'), 0
    for i in range(t.steps):
        if t.seconds and time.time() - start > t.seconds:
            break
        b = next(stream)
        token_mask = np.zeros_like(b.loss_mask_bt)
        token_mask[:, 1:] = b.loss_mask_bt[:, :-1]  # Token t is a response token.
        state, loss, aux, gnorm = step(
            state, jax.random.fold_in(key, i), embed_vd, head_vd,
            jnp.asarray(b.labels['taps']), jnp.asarray(b.labels['topk_ids']),
            jnp.asarray(b.labels['topk_logprobs']), jnp.asarray(b.tokens_bt),
            jnp.asarray(token_mask),
        )  # fmt: skip
        logged.append(dict(loss=loss, grad_norm=gnorm, **aux))
        done = i + 1
        if done % t.log_every == 0 or done == t.steps:
            row = {k: float(np.mean([float(m[k]) for m in logged])) for k in logged[0]}
            row.update(step=done, seconds=round(time.time() - start, 1))
            log.write(json.dumps(row) + '\n')
            log.flush()
            logging.info('dflash step %d: %s', done, row)
            logged = []
    log.close()
    params = jax.tree.map(np.asarray, state['params'])
    np.savez(os.path.join(workdir, 'params.npz'),
             **dflash_format.params_to_state(cfg, params))  # fmt: skip
    out = dict(steps=done, seconds=round(time.time() - start, 1))
    if os.path.getsize(os.path.join(workdir, 'metrics.jsonl')):
        with open(os.path.join(workdir, 'metrics.jsonl')) as f:
            out['last'] = json.loads(f.read().splitlines()[-1])
    return params, out


def _cfg_summary(cfg: df.DFlashConfig) -> dict:
    return dict(layers=cfg.num_layers, block_size=cfg.block_size, taps=list(cfg.taps),
                width=cfg.width, mask_token_id=cfg.mask_token_id)  # fmt: skip
