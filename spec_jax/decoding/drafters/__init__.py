"""Proposers for the engine, and `make` (built like `rules.make`).

base.py     the `Drafter` protocol, shared helpers, `NoDrafter` (AR: nothing drafted)
lm.py       `LMDrafter`: a draft LM sharing the target's tokenizer
eagle3.py   `Eagle3Drafter`: an EAGLE-3 head on the target's feature taps
lookup.py   `NgramDrafter` (prompt lookup) and `PromptLookup` (lookup, then a model)
self_draft.py  `SelfDrafter`: the target as its own draft (q = p), chains and top-k trees
dflash.py   `DFlashDrafter`: a DFlash block drafter (chains; DDTree trees)
measured.py what a drafter was measured to accept (its acceptance.json): the adaptive prior
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from absl import logging

from spec_jax import checkpoints, sharding
from spec_jax.checkpoints import dflash_format, eagle_formats
from spec_jax.decoding.drafters.base import (
    OUTSIDE_DRAFT_VOCAB,
    Drafter,
    NoDrafter,
    TreeDrafter,
    fit_vocab,
)
from spec_jax.decoding.drafters.dflash import DFlashDrafter, DFlashState
from spec_jax.decoding.drafters.eagle3 import Eagle3Drafter, Eagle3State
from spec_jax.decoding.drafters.lm import LMDrafter
from spec_jax.decoding.drafters.lookup import NgramDrafter, PromptLookup, lookup
from spec_jax.decoding.drafters.self_draft import SelfDrafter
from spec_jax.models import dflash as df
from spec_jax.models import eagle3 as e3

__all__ = [
    'KINDS',
    'OUTSIDE_DRAFT_VOCAB',
    'Built',
    'DFlashDrafter',
    'DFlashState',
    'Drafter',
    'Eagle3Drafter',
    'Eagle3State',
    'LMDrafter',
    'NgramDrafter',
    'NoDrafter',
    'PromptLookup',
    'SelfDrafter',
    'TreeDrafter',
    'check_same_tokenizer',
    'fit_vocab',
    'lookup',
    'make',
    'random_head',
]


KINDS = ('none', 'lm', 'eagle3', 'ngram', 'self', 'dflash')


@dataclasses.dataclass(frozen=True)
class Built:
    """What `make` returns: the drafter, its params, and the loaded draft LM (or None)."""

    drafter: Drafter
    params: Any
    model: checkpoints.LoadedModel | None = None


def make(
    kind: str,
    target: checkpoints.LoadedModel,
    draft: str = '',
    *,
    ngram: int = 3,
    lookup: int = 0,
    dtype: str = 'float32',
    seed: int = 0,
    rules: sharding.ShardingRules = sharding.DRAFT_RULES,
) -> Built:
    """Builds a drafter for `target` by name, as `rules.make` builds a rule.

    Args:
      kind: 'none' (AR), 'lm' (a draft LM checkpoint `draft` sharing the target's
        tokenizer; a checkpoint spec as `checkpoints.load` reads), 'eagle3' (an EAGLE-3 head
        directory `draft`, official or speculators layout; 'random': random weights over
        the whole vocabulary, for smoke runs), 'ngram' (prompt lookup of up to `ngram`
        tokens) or 'self' (the target drafts for itself, q = p: `SelfDrafter`, chains and
        its own top-k trees; no `draft`) or 'dflash' (a DFlash block drafter directory
        `draft` as released: config.json + safetensors; 'random': random weights, for
        smoke runs; chains and DDTree trees).
      target: the loaded target.
      draft: the checkpoint spec or directory ('' for 'none' and 'ngram').
      ngram: the longest n-gram prompt lookup matches.
      lookup: > 0 wraps an 'lm' or 'eagle3' drafter in `PromptLookup` with n-grams of
        `ngram` down to `lookup` tokens.
      dtype, seed: for the draft LM's load ('random:' weights use the seed).
      rules: how a draft LM's or head's weights and cache split on a mesh
        (`sharding.DRAFT_SHARDINGS`: the batch only by default, or also its heads).

    Raises:
      ValueError: an unknown kind, a missing `draft`, a draft LM with another tokenizer, a
        head whose widths, vocabulary or taps do not fit the target, `lookup` with 'none'
        or 'ngram' or outside [0, ngram].
    """
    if kind not in KINDS:
        raise ValueError(f'drafter {kind!r} is not one of {KINDS}')
    v = target.cfg.vocab_size
    if lookup and kind in ('none', 'ngram', 'self'):
        raise ValueError(
            f'lookup={lookup} puts prompt lookup in front of a model drafter; drafter '
            f"{kind!r} has none: use drafter 'lm' or 'eagle3', or lookup=0"
        )
    if kind == 'none':
        return Built(NoDrafter(v), None)
    if kind == 'ngram':
        return Built(NgramDrafter(ngram, v), None)
    if kind == 'self':
        return Built(SelfDrafter(target.cfg), target.params)
    if not 0 <= lookup <= ngram:
        raise ValueError(f'lookup={lookup} must be in [0, ngram={ngram}] (0 = off)')
    if not draft:
        what = {'lm': 'a draft LM checkpoint', 'eagle3': 'an EAGLE-3 head directory',
                'dflash': 'a DFlash drafter directory'}[kind]
        raise ValueError(f'drafter {kind!r} needs a draft: {what}')
    if kind == 'dflash':
        if draft == 'random':
            cfg = df.DFlashConfig.for_target(target.cfg)
            params = df.init_params(cfg, jax.random.PRNGKey(seed))
        else:
            cfg, params = dflash_format.load(draft, target.cfg, dtype)
        drafter = DFlashDrafter(cfg, rules)
        built = Built(drafter, drafter.params_for(params, target.params))
    elif kind == 'eagle3':
        if draft == 'random':
            head = random_head(target.cfg, seed)
        else:
            head = eagle_formats.load_head(draft, target.cfg, dtype)
        drafter = Eagle3Drafter(head.cfg, rules)
        built = Built(drafter, drafter.params_for(head, target.params))
    else:
        model = checkpoints.load(draft, dtype, seed)
        check_same_tokenizer(target.tokenizer, model.tokenizer)
        built = Built(LMDrafter(model.cfg, v, rules), model.params, model)
    if lookup:
        built = dataclasses.replace(built, drafter=PromptLookup(built.drafter, ngram, lookup))
    built.drafter.check(target.cfg)
    return built


def random_head(target_cfg, seed: int) -> e3.Eagle3Head:
    """An EAGLE-3 head with random weights for `target_cfg`, over its whole vocabulary."""
    cfg = e3.Eagle3Config.for_target(target_cfg, draft_vocab_size=target_cfg.vocab_size)
    d2t, t2d = e3.vocab_maps(np.arange(target_cfg.vocab_size), target_cfg.vocab_size)
    params = e3.init_params(cfg, jax.random.PRNGKey(seed))
    return e3.Eagle3Head(cfg, params, jnp.asarray(d2t), jnp.asarray(t2d))


def check_same_tokenizer(target_tok, draft_tok) -> None:
    """Draft and target must tokenize alike; compare vocabularies when both are known.

    The vocabulary maps must be equal (the embedding tables may still differ by padding
    rows). A checkpoint without a tokenizer (HF weights alone, orbax) cannot be compared:
    a warning says so, and only the drafter's own `check` runs.
    """
    if draft_tok is None or target_tok is None:
        missing = 'draft' if draft_tok is None else 'target'
        logging.warning(
            'the %s checkpoint has no tokenizer: only the vocabulary sizes of draft and target '
            'are checked, so make sure they share one tokenizer',
            missing,
        )
        return
    draft_vocab, target_vocab = draft_tok.backend.get_vocab(), target_tok.backend.get_vocab()
    if draft_vocab != target_vocab:
        differ = sorted(set(draft_vocab.items()) ^ set(target_vocab.items()))[:3]
        raise ValueError(
            "the draft's tokenizer differs from the target's (e.g. "
            f'{differ}; {len(draft_vocab)} vs {len(target_vocab)} tokens): speculative '
            'decoding needs one shared vocabulary'
        )
