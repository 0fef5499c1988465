"""Self-distillation data: the target answers training prompts; we keep ids and loss masks.

Prompts come from splits that are never evaluated (GSM8K train, the MBPP tasks in neither
MBPP's test split nor MBPP+, BFCL live_multiple; any chat dataset through `datasets` on a
user's machine). The target
generates a response to each (greedy by default) and every example is stored as

    tokens = chat-template prompt ids + response ids,   loss_mask = 1 on the response only

in numbered shards `<dir>/shard_00000.npz`, each written atomically (tmp file + rename).
Prompt order is a fixed function of the seed, shard k always holds batch k, so a crashed
run continues at the first missing shard and loses no finished work. Teacher outputs that
training reuses every epoch (top-k soft labels, EAGLE-3 feature taps) are stored once per
token in sidecars `<dir>/<name>_00000.npz` beside the shards (`write_sidecar`).
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import re
import time
from collections.abc import Iterator, Sequence

import numpy as np
from absl import logging
from tqdm import tqdm

from spec_jax import data_files, decoding
from spec_jax.sampling import Sampler
from spec_jax.train import core

# MBPP's test split (task ids 11-510) is evaluated, and so is MBPP+, whose tasks come from
# every MBPP split (160 of the 170 sanitized train/validation/prompt tasks are in it):
# drafts train on neither (`mbpp_training_rows`).
MBPP_TEST_IDS = range(11, 511)

# The files of each built-in source, below the data root (`spec_jax.data_files`).
GSM8K_TRAIN = 'gsm8k/train.jsonl'
MBPP_SANITIZED = 'mbpp/sanitized-mbpp.json'
MBPPPLUS = 'mbppplus'
BFCL_LIVE_MULTIPLE = 'bfcl/BFCL_v4_live_multiple.json'
SOURCE_FILES = {
    'gsm8k': (GSM8K_TRAIN,),
    'mbpp': (MBPP_SANITIZED, MBPPPLUS),
    'bfcl': (BFCL_LIVE_MULTIPLE,),
}


@dataclasses.dataclass(frozen=True)
class Prompt:
    """One training prompt: chat messages (the target's template renders them)."""

    source: str
    messages: tuple[dict, ...]


def gsm8k_train(root: str = '') -> list[Prompt]:
    rows = data_files.read_jsonl(GSM8K_TRAIN, root)
    return [Prompt('gsm8k', ({'role': 'user', 'content': r['question']},)) for r in rows]


def mbppplus_task_ids(root: str = '') -> set[int]:
    """The MBPP task ids that MBPP+ evaluates: from `mbppplus/task_ids.json` (the bundled
    list, every release) and from the `task_id` of every `mbppplus/*.jsonl` row.

    Raises:
      DataFileError: neither is there, so the exclusion cannot be checked.
    """
    folder = data_files.locate(MBPPPLUS, root)
    ids: set[str] = set()
    listed = os.path.join(folder, 'task_ids.json')
    if os.path.exists(listed):
        with open(listed) as f:
            ids |= {t for release in json.load(f).values() for t in release}
    for path in sorted(glob.glob(os.path.join(folder, '*.jsonl'))):
        with open(path) as f:
            ids |= {json.loads(x)['task_id'] for x in f if x.strip()}
    if not ids:
        raise data_files.DataFileError(
            f'no MBPP+ task ids in {folder} (task_ids.json or MbppPlus-*.jsonl): MBPP+ '
            "evaluates tasks from every MBPP split, so the 'mbpp' source needs their ids to "
            "leave them out; add the MBPP+ release there or drop 'mbpp' from the sources"
        )
    return {int(t.split('/')[1]) for t in ids}


def mbpp_training_rows(root: str = '') -> list[dict]:
    """Sanitized-MBPP rows that no benchmark evaluates: outside MBPP's test split and not an
    MBPP+ task (`mbppplus_task_ids`; 10 tasks on the public data)."""
    path = data_files.locate(MBPP_SANITIZED, root)
    evaluated = set(MBPP_TEST_IDS) | mbppplus_task_ids(root)
    with open(path) as f:
        return [r for r in json.load(f) if r['task_id'] not in evaluated]


def mbpp_train(root: str = '') -> list[Prompt]:
    out = []
    for r in mbpp_training_rows(root):
        text = f'{r["prompt"]}\nYour code should pass this test:\n{r["test_list"][0]}'
        out.append(Prompt('mbpp', ({'role': 'user', 'content': text},)))
    return out


def bfcl_live_multiple(root: str = '') -> list[Prompt]:
    rows = data_files.read_jsonl(BFCL_LIVE_MULTIPLE, root)
    out = []
    for r in rows:
        tools = json.dumps(r['function'])
        system = (
            'You can call these functions. Answer with a Python-style call such as '
            f'func(arg=value).\nFunctions: {tools}'
        )
        turns = [m for m in r['question'][0] if m['role'] in ('user', 'assistant')]
        out.append(Prompt('bfcl', ({'role': 'system', 'content': system}, *turns)))
    return out


def hf_chat_dataset(name: str, split: str = 'train', field: str = 'messages') -> list[Prompt]:
    """Prompts from any chat dataset through `datasets` (the last assistant turn dropped)."""
    import datasets  # Imported on use: loading it costs a second, and only hub sources need it.

    try:
        rows = datasets.load_dataset(name, split=split)
    except Exception as e:  # Hub, network or file errors: name what was being looked up.
        raise ValueError(
            f'data source {name!r} is none of the built-in sources '
            f'{sorted(SOURCES) + list(GENERATED)} and datasets.load_dataset({name!r}, '
            f'split={split!r}) failed: {e}'
        ) from e
    out = []
    for row in rows:
        msgs = [dict(role=m['role'], content=m['content']) for m in row[field]]
        while msgs and msgs[-1]['role'] == 'assistant':
            msgs.pop()
        if msgs:
            out.append(Prompt(name, tuple(msgs)))
    return out


SOURCES = {'gsm8k': gsm8k_train, 'mbpp': mbpp_train, 'bfcl': bfcl_live_multiple}
# Prompts the target writes itself (see self_instruct_prompts); the job generates them.
SELF_INSTRUCT = 'self_instruct'
# "Summarize: <text>" over responses already stored in other data directories
# (summarize_prompts); the job builds them.
SUMMARIZE = 'summarize'
GENERATED = (SELF_INSTRUCT, SUMMARIZE)

# How summarization prompts open. The first is the CNN/DM style of the speed prompts.
SUMMARIZE_TEMPLATES = (
    'Summarize: {}',
    'Summarize the following text in a few sentences.\n\n{}',
    'What are the key points of this text?\n\n{}',
    '{}\n\nTL;DR:',
)


def summarize_prompts(
    tok, directories: Sequence[str], seed: int, min_tokens: int = 48
) -> list[Prompt]:
    """Summarization prompts whose documents are the stored responses of `directories`.

    No local training split has long documents to summarize or quote from, and a draft
    learns copying from context only on text that asks for it. The target's own answers
    (advice, explanations, worked solutions) are documents enough: each response with at
    least `min_tokens` tokens becomes one prompt, in one of `SUMMARIZE_TEMPLATES` chosen
    by a seeded generator.
    """
    rng = random.Random(seed)
    out = []
    for directory in directories:
        if not finished_shards(directory):
            raise ValueError(f'data.summarize_dirs: no finished shards in {directory!r}')
        for e in read_examples(directory):
            response = e.tokens[e.loss_mask]
            response = response[~np.isin(response, tok.stop_ids)]
            if len(response) < min_tokens:
                continue
            text = tok.decode(response.tolist()).strip()
            template = SUMMARIZE_TEMPLATES[rng.randrange(len(SUMMARIZE_TEMPLATES))]
            out.append(Prompt(SUMMARIZE, ({'role': 'user', 'content': template.format(text)},)))
    return out


def training_prompts(
    sources: Sequence[str],
    seed: int,
    root: str = '',
    generated: dict[str, list[Prompt]] | None = None,
) -> list[Prompt]:
    """The prompts of `sources`, interleaved round-robin after a seeded shuffle of each.

    Interleaving keeps the mix of sources the same in every prefix, so a run stopped early
    still trains on all of them. `generated` maps the names in `GENERATED` to prompts made
    elsewhere (`self_instruct_prompts`, `summarize_prompts`).
    """
    generated = generated or {}
    lists = []
    for i, name in enumerate(sources):
        if name in generated:
            prompts = list(generated[name])
        elif name in GENERATED:
            raise ValueError(
                f'{name!r} prompts are made by the job (self_instruct_prompts, '
                f'summarize_prompts): pass generated={{{name!r}: prompts}}'
            )
        elif name in SOURCES:
            prompts = SOURCES[name](root)
        else:
            prompts = hf_chat_dataset(name)
        random.Random(seed * 1000 + i).shuffle(prompts)
        lists.append(prompts)
    out = []
    for j in range(max(len(x) for x in lists)):
        out.extend(x[j] for x in lists if j < len(x))
    return out


def reference_examples(
    tok, sources: Sequence[str], seed: int, limit: int = 0, root: str = ''
) -> list[Example]:
    """Prompts with the dataset's OWN answers as the assistant turn (no generation).

    Cheap extra distillation text: the loss is still KL to the target's logits at every
    response position, only the context is not target-generated. GSM8K calculator
    annotations (<<48/2=24>>) are removed.
    """
    mbpp = mbpp_training_rows(root) if 'mbpp' in sources else []
    pairs = []
    if 'gsm8k' in sources:
        gsm = data_files.read_jsonl(GSM8K_TRAIN, root)
        pairs += [(r['question'], re.sub(r'<<[^>]*>>', '', r['answer'])) for r in gsm]
    if 'mbpp' in sources:
        pairs += [
            (f'{r["prompt"]}\nYour code should pass this test:\n{r["test_list"][0]}', r['code'])
            for r in mbpp
        ]
    random.Random(seed).shuffle(pairs)
    if limit:
        pairs = pairs[:limit]
    out = []
    for question, answer in pairs:
        msgs = [{'role': 'user', 'content': question}]
        prompt = tok.encode_chat(msgs)
        full = tok.encode_chat(
            msgs + [{'role': 'assistant', 'content': answer}], add_generation_prompt=False
        )
        if full[: len(prompt)] != prompt or len(full) <= len(prompt):
            continue
        tokens = np.array(full, np.int32)
        if len(tokens) > len(prompt) + 1 and tokens[-1] not in tok.stop_ids:
            tokens = tokens[:-1] if tokens[-2] in tok.stop_ids else tokens  # trailing newline
        mask = np.zeros(len(tokens), bool)
        mask[len(prompt) :] = True
        out.append(Example(tokens, mask))
    return out


# ---- storage ----------------------------------------------------------------------------


@dataclasses.dataclass
class Example:
    """One stored example.

    Attributes:
      tokens: [T] int32.
      loss_mask: [T] bool, True on response tokens.
      labels: per-position teacher outputs read from sidecars (`write_sidecar`), axis 0
        aligned with `tokens`: 'topk_ids' [T, k] int32 and 'topk_logprobs' [T, k] (row t is
        the target's law of token t+1 given tokens[:t+1]; `teacher_topk`), 'taps' [T, E, D]
        (the target's EAGLE-3 feature taps at position t; `teacher_taps`).
    """

    tokens: np.ndarray
    loss_mask: np.ndarray
    labels: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def shard_path(directory: str, k: int) -> str:
    return os.path.join(directory, f'shard_{k:05d}.npz')


def write_shard(directory: str, k: int, examples: Sequence[Example], meta: dict) -> None:
    """Writes shard k atomically: a crash never leaves a half-written shard."""
    os.makedirs(directory, exist_ok=True)
    lengths = np.array([len(e.tokens) for e in examples], np.int32)
    tmp = shard_path(directory, k) + '.tmp.npz'
    np.savez(
        tmp,
        tokens=np.concatenate([e.tokens for e in examples]).astype(np.int32),
        loss_mask=np.concatenate([e.loss_mask for e in examples]).astype(bool),
        lengths=lengths,
        meta=np.frombuffer(json.dumps(meta).encode(), np.uint8),
    )
    os.replace(tmp, shard_path(directory, k))


def read_shard(path: str) -> list[Example]:
    with np.load(path) as z:
        tokens, mask, lengths = z['tokens'], z['loss_mask'], z['lengths']
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    return [
        Example(tokens[s : s + n], mask[s : s + n]) for s, n in zip(starts, lengths, strict=True)
    ]


def read_examples(directory: str, sidecars: Sequence[str] = ()) -> list[Example]:
    """Every example of every finished shard of `directory`, in shard order, with the
    labels of the named sidecars attached (e.g. `topk_name(16)`, `taps_name(taps)`; each
    must have been written for every shard)."""
    out = []
    for k in sorted(finished_shards(directory)):
        examples = read_shard(shard_path(directory, k))
        for name in sidecars:
            path = sidecar_path(directory, name, k)
            if not os.path.exists(path):
                raise ValueError(
                    f'no {name!r} labels {path}: run teacher_topk / teacher_taps on '
                    f'{directory!r} first'
                )
            with np.load(path) as z:
                arrays = {key: z[key] for key in z.files}
            start = 0
            for e in examples:
                end = start + len(e.tokens)
                e.labels.update({key: a[start:end] for key, a in arrays.items()})
                start = end
        out.extend(examples)
    return out


def read_sources(directory: str) -> list[str]:
    """The source of each example of `read_examples(directory)`, from the shards' meta
    ('?' where a shard does not record them)."""
    out = []
    for k in sorted(finished_shards(directory)):
        with np.load(shard_path(directory, k)) as z:
            meta = json.loads(bytes(z['meta']).decode())
            out += meta.get('sources', ['?'] * len(z['lengths']))
    return out


def finished_shards(directory: str) -> set[int]:
    paths = glob.glob(os.path.join(directory, 'shard_[0-9][0-9][0-9][0-9][0-9].npz'))
    return {int(os.path.basename(p)[6:11]) for p in paths}


# ---- sidecars: teacher outputs stored once per token ------------------------------------


def sidecar_path(directory: str, name: str, k: int) -> str:
    """Sidecar `name` of shard k: `<dir>/<name>_<k>.npz` next to `shard_<k>.npz`."""
    return os.path.join(directory, f'{name}_{k:05d}.npz')


def write_sidecar(
    directory: str,
    name: str,
    compute,
    *,
    batch_size: int = 8,
    bucket: int = 64,
    progress: bool = True,
) -> dict:
    """Runs `compute(tokens_bt, valid_bt) -> {key: [B, T, ...] array}` over every finished
    shard and stores the per-position results as sidecar `name` (`read_examples` attaches
    them as `Example.labels`).

    One teacher forward per token, once, instead of one per training step. Each shard's
    sidecar is written atomically, so a rerun skips finished shards. Every position is
    stored, in the shard's token order. The teacher sees each whole example, so a row that
    `make_batch` left-truncates keeps labels computed with its full context.

    Returns:
      Counts: shards written now, shards total, tokens, seconds.
    """
    shards = sorted(finished_shards(directory))
    todo = [k for k in shards if not os.path.exists(sidecar_path(directory, name, k))]
    written, tokens, start = 0, 0, time.time()
    for k in tqdm(todo, desc=name, unit='shard', disable=not progress):
        examples = read_shard(shard_path(directory, k))
        rows_out: list[dict] = [{} for _ in examples]
        order = np.argsort([len(e.tokens) for e in examples], kind='stable')
        for s in range(0, len(order), batch_size):
            rows = order[s : s + batch_size]
            # Whole examples, padded to a multiple of `bucket`: few compiled shapes.
            padded = -(-max(len(examples[i].tokens) for i in rows) // bucket) * bucket
            b = make_batch([examples[i] for i in rows], padded, bucket)
            arrays = {key: np.asarray(a) for key, a in compute(b.tokens_bt, b.valid_bt).items()}
            for r, i in enumerate(rows):
                n = len(examples[i].tokens)
                rows_out[i] = {key: a[r, :n] for key, a in arrays.items()}
            tokens += int(b.valid_bt.sum())
        tmp = sidecar_path(directory, name, k) + '.tmp.npz'
        np.savez(tmp, **{key: np.concatenate([r[key] for r in rows_out]) for key in rows_out[0]})
        os.replace(tmp, sidecar_path(directory, name, k))
        written += 1
    return dict(
        shards_written=written, shards_total=len(shards), tokens=tokens, seconds=time.time() - start
    )


def topk_name(top_k: int) -> str:
    return f'top{top_k}'


def teacher_topk(model, directory: str, top_k: int, **kw) -> dict:
    """Stores the target's top-`top_k` next-token law of every position as sidecar
    `top<k>`: labels 'topk_ids' [T, k] int32 and 'topk_logprobs' [T, k] float16, the soft
    labels of `distill.make_topk_step` and of cached EAGLE-3 training."""

    def compute(tokens_bt, valid_bt):
        lp, ids = core.teacher_topk_logprobs(model.cfg, model.params, tokens_bt, valid_bt, top_k)
        return dict(topk_ids=np.asarray(ids, np.int32), topk_logprobs=np.float16(lp))

    return write_sidecar(directory, topk_name(top_k), compute, **kw)


def taps_name(tap_layers: Sequence[int]) -> str:
    return 'taps' + '-'.join(str(i) for i in tap_layers)


def teacher_taps(model, directory: str, tap_layers: Sequence[int], **kw) -> dict:
    """Stores the target's hidden-state taps of every position as sidecar `taps<i-j-k>`:
    label 'taps' [T, E, D] float16 (about 3.5 KB a token for the embedded default), the
    features of cached EAGLE-3 training (no target forward per step).

    Raises:
      ValueError: a tap leaves float16's range (|x| > 65,000).
    """
    tap_layers = tuple(tap_layers)

    def compute(tokens_bt, valid_bt):
        taps = np.asarray(
            core.teacher_taps(model.cfg, model.params, tokens_bt, valid_bt, tap_layers)
        )
        if np.abs(taps).max() > 65000:
            raise ValueError(
                f'a tap of layers {tap_layers} reaches {np.abs(taps).max():.3g}, past float16 '
                'range: train this target without stored taps (train.teacher_topk=0)'
            )
        return dict(taps=taps.astype(np.float16))

    return write_sidecar(directory, taps_name(tap_layers), compute, **kw)


# ---- generation -------------------------------------------------------------------------


def generate_dataset(
    model,
    prompts: Sequence[Prompt],
    directory: str,
    *,
    batch_size: int = 16,
    max_new_tokens: int = 192,
    max_prompt_len: int = 512,
    prompt_bucket: int = 64,
    seed: int = 0,
    deadline: float | None = None,
    progress: bool = True,
) -> dict:
    """Self-distillation: the target (greedy) answers `prompts`; resumable shard by shard.

    Args:
      model: a checkpoints.LoadedModel (cfg, params, tokenizer) — the target.
      prompts: training prompts in a fixed order.
      directory: shard directory; shards already there are skipped.
      batch_size: prompts per generate call (= per shard).
      max_new_tokens: response length cap.
      max_prompt_len: longer prompts are dropped (deterministically).
      prompt_bucket: prompt padding bucket (fewer compiled shapes).
      seed: generation seed.
      deadline: time.time() after which no new batch starts.
      progress: show a tqdm bar.

    Returns:
      Counts: shards written now, shards total, response tokens written now, seconds.
    """
    tok = model.tokenizer
    settings = decoding.DecodeSettings(
        max_new_tokens=max_new_tokens,
        stop_tokens=tok.stop_ids,
        max_prompt_len=max_prompt_len,
        prompt_bucket=prompt_bucket,
        pad_id=tok.pad_id or 0,
    )
    engine = decoding.Engine(model.cfg, settings)  # Greedy AR.
    encoded = []
    for p in prompts:
        ids = tok.encode_chat(list(p.messages))
        if len(ids) <= max_prompt_len:
            encoded.append((p.source, ids))
    # Sort windows of 16 batches by prompt length: similar lengths share a prompt bucket.
    window = batch_size * 16
    encoded = [
        x
        for i in range(0, len(encoded), window)
        for x in sorted(encoded[i : i + window], key=lambda x: len(x[1]))
    ]
    batches = [encoded[i : i + batch_size] for i in range(0, len(encoded), batch_size)]
    done = finished_shards(directory)
    _check_shards(directory, done, batches)
    todo = [k for k in range(len(batches)) if k not in done]
    if done:
        logging.info(
            'resuming data generation: %d of %d shards already in %s',
            len(done),
            len(batches),
            directory,
        )
    written, new_tokens, start = 0, 0, time.time()
    bar = tqdm(todo, desc='self-distill', unit='batch', disable=not progress)
    for k in bar:
        if deadline is not None and time.time() > deadline:
            break
        batch = batches[k]
        result = decoding.generate(
            engine, decoding.Params(model.params), [ids for _, ids in batch], seed=seed + k
        )
        examples = []
        for (_, ids), out in zip(batch, result.tokens, strict=True):
            tokens = np.array(list(ids) + list(out), np.int32)
            mask = np.zeros(len(tokens), bool)
            mask[len(ids) :] = True
            examples.append(Example(tokens, mask))
        write_shard(directory, k, examples, dict(sources=[s for s, _ in batch], seed=seed + k))
        written += 1
        new_tokens += sum(len(o) for o in result.tokens)
        bar.set_postfix(tok_s=f'{new_tokens / (time.time() - start):.0f}')
    return dict(
        shards_written=written,
        shards_total=len(batches),
        tokens=new_tokens,
        seconds=time.time() - start,
    )


def _check_shards(directory: str, done: set[int], batches: Sequence[Sequence[tuple]]):
    """Fails loudly unless every finished shard k holds the prompts of batch k: a directory
    reused with other prompts, order or batch size would otherwise mix in stale answers."""
    if done and max(done) >= len(batches):
        raise ValueError(
            f'{shard_path(directory, max(done))} exists, but these prompts make only '
            f'{len(batches)} batches: the directory was generated from other prompts or '
            'another batch size; use a new directory'
        )
    for k in sorted(done):
        stored = read_shard(shard_path(directory, k))
        same = len(stored) == len(batches[k]) and all(
            len(e.tokens) >= len(ids)
            and np.array_equal(e.tokens[: len(ids)], ids)
            and not e.loss_mask[: len(ids)].any()
            for e, (_, ids) in zip(stored, batches[k], strict=False)
        )
        if not same:
            raise ValueError(
                f'{shard_path(directory, k)} does not hold the prompts of batch {k}: the '
                'directory was generated from other prompts, another order or another batch '
                'size; use a new directory'
            )


def self_instruct_prompts(
    model,
    num_prompts: int,
    directory: str,
    *,
    batch_size: int = 64,
    max_tokens: int = 64,
    temperature: float = 1.0,
    min_p: float = 0.02,
    seed: int = 0,
    deadline: float | None = None,
    progress: bool = True,
) -> list[Prompt]:
    """User prompts written by the target itself (Magpie: Xu et al., 2024).

    The target is given its chat template up to the start of a user turn and samples the
    user's message; an instruction-tuned model writes the kind of requests it was tuned on,
    so its answers to them cover chat text (advice, writing, explanations, code) that no
    local training split has. Only messages that end with a stop token within `max_tokens`
    are kept. Batch k uses seed + k and is stored atomically as `<directory>/prompts_k.json`,
    so a rerun continues where a crashed one stopped.

    Returns:
      The prompts of every finished batch (at most ceil(num_prompts / batch_size) batches).
    """
    tok = model.tokenizer
    marker = '\x00'
    rendered = tok.apply_chat_template(
        [{'role': 'user', 'content': marker}], add_generation_prompt=False
    )
    prefix = tok.encode(rendered.split(marker)[0])
    settings = decoding.DecodeSettings(
        max_new_tokens=max_tokens,
        stop_tokens=tok.stop_ids,
        max_prompt_len=len(prefix),
        prompt_bucket=len(prefix),
        pad_id=tok.pad_id or 0,
    )
    engine = decoding.Engine(
        model.cfg, settings, sampler=Sampler(temperature=temperature, min_p=min_p)
    )
    os.makedirs(directory, exist_ok=True)
    out = []
    num_batches = -(-num_prompts // batch_size)
    for k in tqdm(range(num_batches), desc='self-instruct', disable=not progress):
        path = os.path.join(directory, f'prompts_{k:05d}.json')
        if not os.path.exists(path):
            if deadline is not None and time.time() > deadline:
                break
            result = decoding.generate(
                engine, decoding.Params(model.params), [prefix] * batch_size, seed=seed + k
            )
            texts = [
                tok.decode(ids[:-1]).strip()
                for ids in result.tokens
                if len(ids) > 4 and ids[-1] in tok.stop_ids
            ]
            with open(path + '.tmp', 'w') as f:
                json.dump(texts, f)
            os.replace(path + '.tmp', path)
        with open(path) as f:
            out.extend(
                Prompt(SELF_INSTRUCT, ({'role': 'user', 'content': t},)) for t in json.load(f)
            )
    return out


# ---- batching for training --------------------------------------------------------------


# Pad values of batched labels (default 0): pads get no weight in a soft-label loss.
LABEL_PAD = {'topk_logprobs': -1e9}


@dataclasses.dataclass
class TrainBatch:
    """A padded training batch.

    Attributes:
      tokens_bt: [B, T] int32 (pad 0).
      loss_mask_bt: [B, T] bool, True where the NEXT token (t+1) is a response token, i.e.
        the positions whose prediction is trained.
      valid_bt: [B, T] bool, real (non-pad) tokens.
      labels: the examples' labels padded like the tokens: [B, T, ...] each (`LABEL_PAD`).
    """

    tokens_bt: np.ndarray
    loss_mask_bt: np.ndarray
    valid_bt: np.ndarray
    labels: dict[str, np.ndarray] = dataclasses.field(default_factory=dict)


def make_batch(examples: Sequence[Example], seq_len: int, bucket: int = 64) -> TrainBatch:
    """Packs examples into a [B, T] batch, T = the longest (capped at seq_len) rounded up to
    a multiple of `bucket` (so only seq_len / bucket shapes are ever compiled).

    An example longer than seq_len keeps its LAST seq_len tokens (the response survives).
    The loss mask is shifted to prediction positions: position t predicts token t+1, so it
    is trained when token t+1 is a response token. Labels come along when every example
    has them (padded with `LABEL_PAD`).
    """
    b = len(examples)
    longest = max(min(len(e.tokens), seq_len) for e in examples)
    t = min(-(-longest // bucket) * bucket, max(seq_len, 1))
    tokens = np.zeros((b, t), np.int32)
    mask = np.zeros((b, t), bool)
    valid = np.zeros((b, t), bool)
    keys = set.intersection(*(set(e.labels) for e in examples))
    labels = {}
    for key in sorted(keys):
        first = examples[0].labels[key]
        dtype = np.float32 if key in LABEL_PAD else first.dtype
        labels[key] = np.full((b, t, *first.shape[1:]), LABEL_PAD.get(key, 0), dtype)
    for i, e in enumerate(examples):
        toks, lm = e.tokens[-seq_len:], e.loss_mask[-seq_len:]
        n = len(toks)
        tokens[i, :n] = toks
        valid[i, :n] = True
        mask[i, : n - 1] = lm[1:n]
        for key, a in labels.items():
            a[i, :n] = e.labels[key][-seq_len:]
    return TrainBatch(tokens, mask, valid, labels)


def epoch_batches(
    examples: Sequence[Example], batch_size: int, seed: int, epoch: int, sort_window: int = 32
) -> list[np.ndarray]:
    """The batches (index arrays) of one epoch: a seeded permutation, sorted by length in
    windows of `sort_window` batches (less padding), batch order shuffled again."""
    n = len(examples)
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(n)
    if n < batch_size:
        order = np.resize(order, batch_size)
    lengths = np.array([len(examples[i].tokens) for i in order])
    w = batch_size * sort_window
    chunks = []
    for s in range(0, len(order), w):
        idx = order[s : s + w][np.argsort(lengths[s : s + w], kind='stable')]
        chunks.extend(idx[j : j + batch_size] for j in range(0, len(idx), batch_size))
    chunks = [c for c in chunks if len(c) == batch_size]
    return [chunks[i] for i in rng.permutation(len(chunks))]


def batch_stream(
    examples: Sequence[Example],
    batch_size: int,
    seq_len: int,
    seed: int,
    start_step: int = 0,
    bucket: int = 64,
) -> Iterator[TrainBatch]:
    """An endless, deterministic stream of batches.

    Batch `s` depends only on (examples, seed, s), so a resumed run at `start_step` sees
    exactly the batches an uninterrupted run would.
    """
    step = start_step
    cache: dict[int, list[np.ndarray]] = {}
    per_epoch = len(epoch_batches(examples, batch_size, seed, 0))
    while True:
        epoch, j = divmod(step, per_epoch)
        if epoch not in cache:
            cache.clear()
            cache[epoch] = epoch_batches(examples, batch_size, seed, epoch)
        yield make_batch([examples[i] for i in cache[epoch][j]], seq_len, bucket)
        step += 1


def token_counts(examples: Sequence[Example], vocab_size: int) -> np.ndarray:
    """Frequency of each token id over the response (loss-masked) tokens [V]."""
    counts = np.zeros(vocab_size, np.int64)
    for e in examples:
        np.add.at(counts, e.tokens[e.loss_mask], 1)
    return counts
