"""The train_draft job: self-distillation data, then a draft LM or an EAGLE-3 head.

Stages, each resumable in `workdir` (docs/training.md):
  1. data: the target answers training prompts (greedy) -> `<data_dir>/shard_*.npz`
     (`train.prompts`, `train.generation`); with the 'self_instruct' source it first writes
     its own user prompts; teacher sidecars (top-k labels, EAGLE-3 taps) when the config
     trains on them (`train.teacher`).
  2. train: `train.fit` (draft LM: CE and/or KL distillation; EAGLE-3: TTT) with optax;
     orbax checkpoints in `<workdir>/checkpoints`, metrics in `<workdir>/metrics.jsonl`.
  3. eval: teacher-forced greedy acceptance on held-out speed prompts (`speed/` under the
     data root): the target's greedy responses are generated once (`<workdir>/eval_data`),
     then `eval.acceptance` measures them.
  4. export: the draft LM as an HF directory (`checkpoints.save_hf`), the head in the
     official EAGLE-3 layout or the speculators one (`eagle_formats.save_head`).
"""

from __future__ import annotations

import hashlib
import json
import os
import time

import ml_collections
import numpy as np
from absl import logging

from spec_jax import checkpoints, data_files
from spec_jax.checkpoints import eagle_formats
from spec_jax.eval import acceptance
from spec_jax.jobs import runtime
from spec_jax.train import fit, generation, prompts, shards, teacher
from spec_jax.train.fit import ce_step_count, soft_label_count


def run(c: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs every stage of config `c` (configs/smollm2_135m_{draft,eagle3}.py) in `workdir`.

    Returns:
      A summary dict (also written to `<workdir>/summary.json`).
    """
    check_config(c)
    os.makedirs(workdir, exist_ok=True)
    runtime.log_devices()
    target = checkpoints.load(c.target, 'float32', c.seed)
    data_dir = c.data.dir or os.path.join(workdir, 'data')
    summary: dict = dict(kind=c.kind)
    if c.data.generate:
        summary['data'] = generate_data(c, target, data_dir)
    examples = training_examples(c, target, data_dir, summary)
    check_training_data(workdir, examples)
    ev = c.eval
    measure = dict(chain=ev.chain, batch_size=ev.batch_size, seq_len=ev.seq_len)
    if c.kind == 'draft_lm':
        dcfg, params, out = fit.fit_draft_lm(c, workdir, target, examples)
        if ev.enabled:
            held = heldout_examples(c, target, workdir)
            out['eval'] = acceptance.draft_lm(target, dcfg, params, *held, **measure)
        if c.export.dir:
            out['export'] = checkpoints.save_hf(
                c.export.dir, dcfg, params, target.tokenizer, c.export.dtype
            )
    else:
        head, out = fit.fit_eagle3(c, workdir, target, examples)
        if ev.enabled:
            held = heldout_examples(c, target, workdir)
            out['eval'] = acceptance.eagle3_head(target, head, *held, tree=ev.tree, **measure)
        if c.export.dir:
            path = eagle_formats.save_head(
                c.export.dir, head, c.export.format, c.export.dtype, target_name=c.target
            )
            size = os.path.getsize(os.path.join(path, 'model.safetensors'))
            out['export'] = dict(dir=path, bytes=size)
    if 'eval' in out:
        logging.info('held-out %s: %s', c.kind, out['eval'])
    summary.update(out)
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=2, default=float)
    print(json.dumps(summary, indent=2, default=float))
    return summary


def generate_data(c: ml_collections.ConfigDict, target, data_dir: str) -> dict:
    """Stage 1: the config's training prompts (self-instruct and summarization ones made
    first), answered by the target into `data_dir`. Returns the generation's counts."""
    deadline = time.time() + c.data.seconds if c.data.seconds else None
    generated = {}
    if prompts.SELF_INSTRUCT in c.data.sources:
        si = c.data.self_instruct
        generated[prompts.SELF_INSTRUCT] = generation.self_instruct_prompts(
            target,
            si.num_prompts,
            os.path.join(data_dir, prompts.SELF_INSTRUCT),
            batch_size=si.batch_size,
            max_tokens=si.max_tokens,
            temperature=si.temperature,
            min_p=si.min_p,
            seed=c.data.seed,
            deadline=deadline,
        )
    if prompts.SUMMARIZE in c.data.sources:
        generated[prompts.SUMMARIZE] = prompts.summarize_prompts(
            target.tokenizer, tuple(c.data.summarize_dirs), c.data.seed
        )
    # An unfinished self-instruct stage means the deadline has passed, so no answer shard is
    # written from the (shorter) prompt list; shard k always holds batch k.
    chosen = prompts.training_prompts(
        tuple(c.data.sources), c.data.seed, c.data.root, generated=generated
    )
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
        deadline=deadline,
    )


def training_examples(c, target, data_dir: str, summary: dict) -> list[shards.Example]:
    """The examples of `data_dir` and `data.extra_dirs` with the sidecars the config trains
    on (written now if missing; their counts go into `summary`), plus the datasets' own
    answers (`data.reference`)."""
    for extra in c.data.extra_dirs:
        if not shards.finished_shards(extra):
            raise ValueError(f'data.extra_dirs: no finished shards in {extra!r}')
    dirs = ([data_dir] if os.path.isdir(data_dir) else []) + list(c.data.extra_dirs)
    sidecars = []
    top_k = soft_label_count(c)
    if top_k:
        summary['teacher_topk'] = {d: teacher.teacher_topk(target, d, top_k) for d in dirs}
        sidecars.append(shards.topk_name(top_k))
    if top_k and c.kind == 'eagle3':  # Cached EAGLE-3 training: the taps too, once.
        taps = target.cfg.hf_taps()
        summary['teacher_taps'] = {d: teacher.teacher_taps(target, d, taps) for d in dirs}
        sidecars.append(shards.taps_name(taps))
    examples = [e for d in dirs for e in shards.read_examples(d, sidecars)]
    if c.data.reference:
        examples += prompts.reference_examples(
            target.tokenizer,
            tuple(c.data.reference),
            c.data.seed,
            c.data.reference_limit,
            c.data.root,
        )
    if not examples:
        raise ValueError(
            f'no training examples in {data_dir}: enable data.generate or data.reference'
        )
    n_resp = int(sum(e.loss_mask.sum() for e in examples))
    logging.info('%d examples, %d response tokens', len(examples), n_resp)
    summary.update(examples=len(examples), response_tokens=n_resp)
    return examples


def heldout_examples(c, target, workdir: str) -> tuple[list[shards.Example], list[str]]:
    """Target-greedy responses to held-out speed prompts (generated once, cached), and the
    speed set of each."""
    heldout = [
        prompts.Prompt(name, ({'role': 'user', 'content': text},))
        for name, text in data_files.speed_prompts(c.eval.sets, c.eval.per_set, c.data.root)
    ]
    directory = c.eval.data_dir or os.path.join(workdir, 'eval_data')
    generation.generate_dataset(
        target,
        heldout,
        directory,
        batch_size=c.eval.batch_size,
        max_new_tokens=c.eval.max_new_tokens,
        max_prompt_len=c.eval.max_prompt_len,
        seed=0,
    )
    return shards.read_examples(directory), shards.read_sources(directory)


def check_config(c: ml_collections.ConfigDict) -> None:
    """Fails before anything loads on settings that would fail late or train the wrong thing."""
    if c.kind not in ('draft_lm', 'eagle3'):
        raise ValueError(f'kind must be draft_lm or eagle3, got {c.kind!r}')
    soft_label_count(c)
    if prompts.SUMMARIZE in c.data.sources and not c.data.summarize_dirs:
        raise ValueError(
            f'data.sources={tuple(c.data.sources)} has {prompts.SUMMARIZE!r}, whose documents are '
            'the responses stored in finished data directories: set data.summarize_dirs'
        )
    if c.kind == 'draft_lm' and c.data.reference and ce_step_count(c.train) >= c.train.steps:
        raise ValueError(
            f"data.reference={tuple(c.data.reference)} adds the datasets' own answers, whose "
            "next token is not the target's: they need KL steps, but every one of the "
            f'train.steps={c.train.steps} is a hard-label step (train.ce_steps='
            f'{c.train.ce_steps}); set train.ce_steps below train.steps'
        )
    data_files.require(data_paths(c), c.data.root)


def data_paths(c: ml_collections.ConfigDict) -> list[str]:
    """The files below the data root that config `c` reads (training sources, reference
    answers, held-out speed sets)."""
    paths = []
    if c.data.generate:
        paths += [p for name in c.data.sources for p in prompts.SOURCE_FILES.get(name, ())]
    paths += [p for name in c.data.reference for p in prompts.SOURCE_FILES.get(name, ())]
    if c.eval.enabled:
        paths += data_files.speed_files(c.eval.sets)
    return list(dict.fromkeys(paths))


def check_training_data(workdir: str, examples: list[shards.Example]) -> None:
    """Refuses to resume checkpoints that were trained on other examples.

    The batch stream (and an EAGLE-3 head's draft vocabulary) is a function of the example
    list, so resuming after the data changed (say, a rerun that generated more shards)
    would silently train on a different stream, or pair the head's rows with another
    vocabulary map. The first run records a fingerprint in `<workdir>/train_data.json`.
    """
    digest = hashlib.sha256()
    for e in examples:
        digest.update(np.asarray(e.tokens, np.int32).tobytes())
        digest.update(np.asarray(e.loss_mask, bool).tobytes())
    fingerprint = dict(examples=len(examples), sha256=digest.hexdigest())
    path = os.path.join(workdir, 'train_data.json')
    saved = os.path.join(workdir, 'checkpoints')
    if os.path.exists(path) and os.path.isdir(saved) and os.listdir(saved):
        with open(path) as f:
            recorded = json.load(f)
        if recorded != fingerprint:
            raise ValueError(
                f'the training examples changed since the checkpoints in {saved} were '
                f'written ({recorded["examples"]} examples then, {len(examples)} now): '
                'finish the data stage before training, or train in a new workdir'
            )
        return
    with open(path, 'w') as f:
        json.dump(fingerprint, f)
