"""Training prompts: the built-in sources, chat datasets, and prompts built from stored text.

Prompts come from splits that are never evaluated (GSM8K train, the MBPP tasks in neither
MBPP's test split nor MBPP+, BFCL live_multiple; any chat dataset through `datasets` on a
user's machine). `training_prompts` interleaves the sources after a seeded shuffle of each;
`summarize_prompts` turns stored responses into summarization prompts; `reference_examples`
pairs prompts with the datasets' own answers (no generation). The prompts the target writes
itself are `generation.self_instruct_prompts`.
"""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import random
import re
from collections.abc import Sequence

import numpy as np

from spec_jax import data_files
from spec_jax.train import shards

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
        if not shards.finished_shards(directory):
            raise ValueError(f'data.summarize_dirs: no finished shards in {directory!r}')
        for e in shards.read_examples(directory):
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
) -> list[shards.Example]:
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
        out.append(shards.Example(tokens, mask))
    return out
