"""The train_draft job: self-distillation data, then a draft LM or an EAGLE-3 head.

Stages, each resumable in `workdir`:
  1. data: the target answers training prompts (greedy) -> `<data_dir>/shard_*.npz`; with
     the 'self_instruct' source it first writes its own user prompts.
  2. train: hard-label CE and/or KL distillation (draft LM) or TTT (EAGLE-3) with optax;
     orbax checkpoints in `<workdir>/checkpoints`; progress bar and logged metrics
     (`<workdir>/metrics.jsonl`).
  3. eval: acceptance on held-out speed prompts (`speed/` under the data root, see
     `spec_jax.data_files`): the target's greedy
     responses are generated once (`<workdir>/eval_data`), then teacher-forced greedy
     acceptance per token and per-round acceptance lengths (chain of k, tree) are computed.
  4. export: the draft LM as an HF directory (config.json + bf16 model.safetensors +
     tokenizer), the head in the official EAGLE-3 layout (and optionally speculators).
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from functools import partial

import jax
import jax.numpy as jnp
import ml_collections
import ml_dtypes
import numpy as np
from absl import logging
from safetensors.numpy import save_file

from spec_jax import checkpoints, data_files
from spec_jax.checkpoints import eagle_formats
from spec_jax.jobs import runtime
from spec_jax.models import eagle3 as e3
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import forward
from spec_jax.train import batches, core, distill, generation, prompts, shards, teacher
from spec_jax.train import eagle3 as train_e3


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
        deadline = _deadline(c.data.seconds)
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
        # An unfinished self-instruct stage means the deadline has passed, so no answer
        # shard is written from the (shorter) prompt list; shard k always holds batch k.
        prompts = prompts.training_prompts(
            tuple(c.data.sources), c.data.seed, c.data.root, generated=generated
        )
        if c.data.num_prompts:
            prompts = prompts[: c.data.num_prompts]
        summary['data'] = generation.generate_dataset(
            target,
            prompts,
            data_dir,
            batch_size=c.data.batch_size,
            max_new_tokens=c.data.max_new_tokens,
            max_prompt_len=c.data.max_prompt_len,
            seed=c.data.seed,
            deadline=deadline,
        )
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
    check_training_data(workdir, examples)

    if c.kind == 'draft_lm':
        summary.update(_train_draft_lm(c, workdir, target, examples))
    else:
        summary.update(_train_eagle3(c, workdir, target, examples))
    with open(os.path.join(workdir, 'summary.json'), 'w') as f:
        json.dump(summary, f, indent=2, default=float)
    print(json.dumps(summary, indent=2, default=float))
    return summary


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
    checkpoints = os.path.join(workdir, 'checkpoints')
    if os.path.exists(path) and os.path.isdir(checkpoints) and os.listdir(checkpoints):
        with open(path) as f:
            recorded = json.load(f)
        if recorded != fingerprint:
            raise ValueError(
                f'the training examples changed since the checkpoints in {checkpoints} were '
                f'written ({recorded["examples"]} examples then, {len(examples)} now): '
                'finish the data stage before training, or train in a new workdir'
            )
        return
    with open(path, 'w') as f:
        json.dump(fingerprint, f)


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


def _deadline(seconds: float) -> float | None:
    return time.time() + seconds if seconds else None


def _metrics_logger(workdir: str):
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
    return core.train_loop(
        state=_train_state(params, opt),
        step_fn=step_fn,
        batches=_batches(c, examples),
        steps=c.train.steps,
        workdir=workdir,
        checkpoint_every=c.train.checkpoint_every,
        log_every=c.train.log_every,
        deadline=_deadline(c.train.seconds),
        tokens_per_batch=lambda b: int(b.valid_bt.sum()),
        on_log=_metrics_logger(workdir),
    )


def _train_state(params, optimizer):
    return dict(params=params, opt_state=optimizer.init(params), step=jnp.zeros((), jnp.int32))


def _batches(c, examples):
    def make(start):
        yield from batches.batch_stream(
            examples, c.train.batch_size, c.train.seq_len, c.train.seed, start, c.train.bucket
        )

    return make


# ---- draft LM ---------------------------------------------------------------------------


def draft_lm_config(c: ml_collections.ConfigDict, target_cfg: ModelConfig) -> ModelConfig:
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


def _train_draft_lm(c, workdir, target, examples) -> dict:
    dcfg = draft_lm_config(c, target.cfg)
    params = distill.init_draft(
        dcfg, target.params, jax.random.PRNGKey(c.train.seed), c.model.init_embedding
    )
    n_params = sum(x.size for x in jax.tree.leaves(params))
    logging.info('draft LM %s: %.2fM params', dcfg, n_params / 1e6)
    opt = core.make_optimizer(
        c.train.lr, c.train.steps, c.train.warmup, c.train.clip, c.train.weight_decay
    )
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
    out = dict(
        params_m=n_params / 1e6,
        train_seconds=time.time() - t0,
        steps=int(state['step']),
        last=history[-1] if history else {},
    )
    params = state['params']
    if c.eval.enabled:
        out['eval'] = evaluate_draft_lm(c, workdir, target, dcfg, params)
    if c.export.dir:
        out['export'] = export_draft_lm(
            c.export.dir, dcfg, params, target.tokenizer, c.export.dtype
        )
    return out


def ce_step_count(train: ml_collections.ConfigDict) -> int:
    """How many first steps are hard-label CE: `train.ce_steps`, where -1 means all."""
    return train.steps if train.ce_steps < 0 else min(train.ce_steps, train.steps)


def export_draft_lm(directory: str, dcfg: ModelConfig, params, tokenizer, dtype='bfloat16'):
    """Writes the draft LM as an HF LlamaForCausalLM directory readable by checkpoints.load."""
    os.makedirs(directory, exist_ok=True)
    np_dtype = np.dtype(ml_dtypes.bfloat16) if dtype == 'bfloat16' else np.dtype(dtype)
    state = checkpoints.params_to_state(dcfg, jax.device_get(params))
    state = {k: np.asarray(v, np.float32).astype(np_dtype) for k, v in state.items()}
    save_file(state, os.path.join(directory, 'model.safetensors'), metadata={'format': 'pt'})
    config = {
        'architectures': ['LlamaForCausalLM'],
        'model_type': 'llama',
        'hidden_size': dcfg.width,
        'intermediate_size': dcfg.mlp_width,
        'num_hidden_layers': dcfg.num_layers,
        'num_attention_heads': dcfg.num_heads,
        'num_key_value_heads': dcfg.num_kv_heads,
        'head_dim': dcfg.head_dim,
        'vocab_size': dcfg.vocab_size,
        'rms_norm_eps': dcfg.rms_eps,
        'rope_theta': dcfg.rope_theta,
        'max_position_embeddings': dcfg.max_position,
        'tie_word_embeddings': True,
        'hidden_act': 'silu',
        'attention_bias': False,
        'mlp_bias': False,
        'torch_dtype': dtype,
        'bos_token_id': tokenizer.token_to_id(tokenizer.bos_token) if tokenizer.bos_token else None,
        'eos_token_id': tokenizer.token_to_id(tokenizer.eos_token) if tokenizer.eos_token else None,
    }
    if dcfg.rope_scaling.to_hf():  # The draft inherits the target's (e.g. Llama 3.x).
        config['rope_scaling'] = dcfg.rope_scaling.to_hf()
    with open(os.path.join(directory, 'config.json'), 'w') as f:
        json.dump(config, f, indent=2)
    tokenizer.save(directory)
    size = os.path.getsize(os.path.join(directory, 'model.safetensors'))
    return dict(dir=directory, bytes=size)


# ---- held-out evaluation ----------------------------------------------------------------


def heldout_examples(c, target, workdir: str) -> tuple[list[shards.Example], list[str]]:
    """Target-greedy responses to held-out speed prompts (generated once, cached), and the
    speed set of each."""
    prompts = [
        prompts.Prompt(name, ({'role': 'user', 'content': text},))
        for name, text in data_files.speed_prompts(c.eval.sets, c.eval.per_set, c.data.root)
    ]
    directory = c.eval.data_dir or os.path.join(workdir, 'eval_data')
    generation.generate_dataset(
        target,
        prompts,
        directory,
        batch_size=c.eval.batch_size,
        max_new_tokens=c.eval.max_new_tokens,
        max_prompt_len=c.eval.max_prompt_len,
        seed=0,
    )
    return shards.read_examples(directory), shards.read_sources(directory)


def _per_set(hits: dict[str, list[int]]) -> dict:
    """{set: [hits, tokens]} -> {set: {'agreement', 'tokens'}}."""
    return {
        name: dict(agreement=round(h / max(n, 1), 4), tokens=n)
        for name, (h, n) in sorted(hits.items())
    }


def _round_stats(lengths: list[int]) -> dict:
    return dict(mean_accept_len=float(np.mean(lengths)) if lengths else 0.0, rounds=len(lengths))


def evaluate_draft_lm(c, workdir, target, dcfg, params) -> dict:
    """Teacher-forced greedy acceptance per token and chain-k acceptance length."""
    examples, sources = heldout_examples(c, target, workdir)
    agree, total, lengths, per_set = 0, 0, [], {}
    k = c.eval.chain
    for i in range(0, len(examples), c.eval.batch_size):
        chunk = examples[i : i + c.eval.batch_size]
        b = batches.make_batch(chunk, c.eval.seq_len, 64)
        tokens, mask, valid = (jnp.asarray(x) for x in (b.tokens_bt, b.loss_mask_bt, b.valid_bt))
        pos, m = core.positions(*tokens.shape), core.causal_mask(valid)
        t_arg, d_arg = _argmaxes(target.cfg, dcfg, target.params, params, tokens, pos, m)
        g = np.asarray(t_arg == d_arg) & b.loss_mask_bt
        agree += int(g.sum())
        total += int(b.loss_mask_bt.sum())
        for row in range(len(chunk)):
            hits = np.stack([np.roll(g[row], -(j + 1)) for j in range(k)])  # hits[j, r] = g[r+j+1]
            start, last = _span(b.loss_mask_bt[row])
            lengths += train_e3.chain_lengths(hits, start, last, k)
            counts = per_set.setdefault(sources[i + row], [0, 0])
            counts[0] += int(g[row].sum())
            counts[1] += int(b.loss_mask_bt[row].sum())
    out = dict(
        per_token_acceptance=agree / max(total, 1),
        tokens=total,
        per_set=_per_set(per_set),
        **{f'chain{k}_{key}': v for key, v in _round_stats(lengths).items()},
    )
    logging.info('held-out draft LM: %s', out)
    return out


def _span(loss_mask_t: np.ndarray) -> tuple[int, int]:
    """(r of the first round, index of the last token) of a row's response."""
    idx = np.nonzero(loss_mask_t)[0]  # prediction positions of response tokens
    if not idx.size:
        return 0, 0  # no response: no rounds
    # The first response token x_P comes from prefill; the first round's root is x_P,
    # i.e. r = P - 1 = idx[0]. The last token is x_{idx[-1] + 1}.
    return int(idx[0]), int(idx[-1]) + 1


@partial(jax.jit, static_argnums=(0, 1))
def _argmaxes(tcfg, dcfg, tparams, dparams, tokens, pos, mask):
    t, _, _ = forward(tcfg, tparams, tokens, pos, None, mask)
    d, _, _ = forward(dcfg, dparams, tokens, pos, None, mask)
    return jnp.argmax(t, -1), jnp.argmax(d, -1)


# ---- EAGLE-3 ----------------------------------------------------------------------------


def _train_eagle3(c, workdir, target, examples) -> dict:
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
        hcfg = e3.Eagle3Config.for_target(
            target.cfg,
            m.draft_vocab_size,
            **{k: m[k] for k in ('num_heads', 'num_kv_heads', 'head_dim', 'mlp_width') if m.get(k)},
        )
        params = e3.init_params(hcfg, jax.random.PRNGKey(c.train.seed))
        if m.init_from_target:
            params = e3.init_from_target(hcfg, params, target.params, used)
    d2t, t2d = e3.vocab_maps(used, target.cfg.vocab_size)
    coverage = float(counts[used].sum() / max(counts.sum(), 1))
    logging.info('draft vocab %d covers %.4f of response tokens', len(used), coverage)
    n_params = sum(x.size for x in jax.tree.leaves(params))
    opt = core.make_optimizer(
        c.train.lr, c.train.steps, c.train.warmup, c.train.clip, c.train.weight_decay
    )
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
    out = dict(
        params_m=n_params / 1e6,
        train_seconds=time.time() - t0,
        vocab_coverage=coverage,
        steps=int(state['step']),
        last=history[-1] if history else {},
    )
    if c.eval.enabled:
        out['eval'] = evaluate_eagle3(c, workdir, target, head)
    if c.export.dir:
        eagle_formats.save_head(
            c.export.dir, head, c.export.format, c.export.dtype, target_name=c.target
        )
        out['export'] = dict(
            dir=c.export.dir, bytes=os.path.getsize(os.path.join(c.export.dir, 'model.safetensors'))
        )
    return out


def evaluate_eagle3(c, workdir, target, head) -> dict:
    """Greedy acceptance of the head on held-out target-greedy text: per-depth agreement,
    chain-k and static-tree acceptance lengths (exact for greedy verification)."""
    examples, sources = heldout_examples(c, target, workdir)
    k = c.eval.chain
    branching = tuple(c.eval.tree)
    depth = max(k, len(branching))
    top = max(branching)
    chain, tree, hit_sum, hit_n, per_set = [], [], np.zeros(depth), np.zeros(depth), {}
    for i in range(0, len(examples), c.eval.batch_size):
        chunk = examples[i : i + c.eval.batch_size]
        b = batches.make_batch(chunk, c.eval.seq_len, 64)
        topk = np.asarray(
            train_e3.ttt_topk(
                target.cfg,
                head.cfg,
                target.params,
                head.params,
                head.draft_ids_u,
                jnp.asarray(b.tokens_bt),
                jnp.asarray(b.valid_bt),
                depth,
                top,
            )
        )
        hits1 = train_e3.tree_hits(topk, b.tokens_bt, (1,) * depth)
        hitsb = train_e3.tree_hits(topk, b.tokens_bt, branching)
        for row in range(len(chunk)):
            start, last = _span(b.loss_mask_bt[row])
            chain += train_e3.chain_lengths(hits1[:, row], start, last, k)
            tree += train_e3.chain_lengths(hitsb[:, row], start, last, len(branching))
            for j in range(depth):
                hit_sum[j] += hits1[j, row, start : last - j - 1].sum()
                hit_n[j] += max(last - j - 1 - start, 0)
            counts = per_set.setdefault(sources[i + row], [0, 0])  # depth 1
            counts[0] += int(hits1[0, row, start : last - 1].sum())
            counts[1] += max(last - 1 - start, 0)
    out = dict(
        depth_agreement=(hit_sum / np.maximum(hit_n, 1)).round(4).tolist(),
        per_set=_per_set(per_set),  # depth-1 agreement by speed set
        tree_nodes=train_e3.tree_size(branching),
        tree_branching=list(branching),
        **{f'chain{k}_{key}': v for key, v in _round_stats(chain).items()},
        **{f'tree_{key}': v for key, v in _round_stats(tree).items()},
    )
    logging.info('held-out EAGLE-3: %s', out)
    return out
