"""Pieces every job shares: building a model from a config, samplers, logging."""

from __future__ import annotations

import importlib.util
import os

import jax
import ml_collections
from absl import logging

from spec_jax import checkpoints
from spec_jax.checkpoints import gguf
from spec_jax.models.config import preset
from spec_jax.models.llama import init_params
from spec_jax.sampling import Sampler

RANDOM_PREFIX = 'random:'


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of a config file, as `--config path[:arg]` would give it."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def load_model(spec: str, dtype: str = 'float32', seed: int = 0) -> checkpoints.LoadedModel:
    """Loads a checkpoint (see spec_jax.checkpoints.load) or builds a random model.

    `random:<preset>` (e.g. `random:tiny`) initialises a preset at random and pairs it with
    the embedded tokenizer, with the vocabulary widened to the tokenizer's: a fast stand-in
    for tests and smoke runs.
    """
    if not spec.startswith(RANDOM_PREFIX):
        return checkpoints.load(spec, dtype=dtype)
    tokenizer = gguf.load_gguf_tokenizer(gguf.embedded_default_path())
    cfg = preset(spec[len(RANDOM_PREFIX) :]).replace(
        vocab_size=tokenizer.vocab_size, dtype=dtype, param_dtype=dtype
    )
    params = init_params(cfg, jax.random.PRNGKey(seed))
    return checkpoints.LoadedModel(cfg, params, tokenizer, source=spec)


def sampler_from_config(c: ml_collections.ConfigDict) -> Sampler:
    """A Sampler from a config block; 0 / 1.0 values switch a truncation off."""
    return Sampler(
        temperature=c.temperature,
        top_k=c.top_k or None,
        top_p=None if c.top_p >= 1.0 else c.top_p,
        min_p=c.min_p or None,
        typical_p=None if c.typical_p >= 1.0 else c.typical_p,
        epsilon=c.epsilon or None,
        eta=c.eta or None,
    )


def sampling_config(temperature: float = 0.0) -> ml_collections.ConfigDict:
    """The sampling block of a config: every transform, switched off but temperature."""
    return ml_collections.ConfigDict(
        dict(
            temperature=temperature,
            top_k=0,
            top_p=1.0,
            min_p=0.0,
            typical_p=1.0,
            epsilon=0.0,
            eta=0.0,
        )
    )


def spec_config(enabled: bool = False, draft: str = '') -> ml_collections.ConfigDict:
    """The speculative-decoding block of a config (see configs/smollm2_135m_chain.py)."""
    return ml_collections.ConfigDict(
        dict(
            enabled=enabled,
            # 'lm' (a draft LM at `draft`), 'eagle3' (an EAGLE-3 head directory at `draft`,
            # official or speculators layout) or 'ngram' (prompt lookup).
            drafter='lm',
            draft=draft,  # The draft LM's checkpoint spec (same tokenizer) or the head's dir.
            num_draft=5,  # gamma: drafted tokens per block.
            ngram=3,  # Longest n-gram prompt lookup matches ('ngram' drafter, `lookup`).
            # k > 0: prompt lookup first: where the last n tokens (ngram >= n >= k) occurred
            # earlier, the tokens that followed are drafted; the 'lm' / 'eagle3' drafter
            # drafts the rest (drafters.PromptLookup). 0: off.
            lookup=0,
            rule='lossless',  # A spec_jax.rules name, with parameters: 'lenience:l=0.5'.
            baseline=False,  # Run the rule's matched baseline (truncation + lossless) instead.
            meter_distortion=False,  # Per-position TV / overshoot against the matched baseline.
        )
    )


DRAFTERS = ('lm', 'eagle3', 'ngram')


def make_drafter(
    kind: str,
    draft: str,
    target: checkpoints.LoadedModel,
    ngram: int = 3,
    lookup: int = 0,
    **load,
):
    """A chain drafter for `target`: (drafter, draft params, the draft LM or None).

    Args:
      kind: 'lm' (draft LM checkpoint `draft`, sharing the target's tokenizer), 'eagle3'
        (EAGLE-3 head directory `draft`) or 'ngram' (prompt lookup of up to `ngram` tokens).
      draft: the checkpoint spec or directory ('' for ngram).
      target: the loaded target.
      ngram: the longest n-gram prompt lookup matches.
      lookup: > 0 wraps an 'lm' or 'eagle3' drafter in `drafters.PromptLookup` with
        n-grams of `ngram` down to `lookup` tokens.
      **load: dtype / seed for `load_model` (draft LM) or dtype for the head.

    Raises:
      ValueError: an unknown kind, a missing `draft`, a draft LM with another tokenizer, a
        head whose widths, vocabulary or taps do not fit the target, `lookup` with the
        'ngram' drafter or outside [0, ngram].
    """
    from spec_jax.decoding import drafters

    if kind not in DRAFTERS:
        raise ValueError(f'drafter {kind!r} is not one of {DRAFTERS}')
    if lookup and kind == 'ngram':
        raise ValueError(
            f"lookup={lookup} puts prompt lookup in front of a model drafter; drafter 'ngram' "
            "is prompt lookup alone: use drafter 'lm' or 'eagle3', or lookup=0"
        )
    if kind == 'ngram':
        return drafters.NgramDrafter(ngram, target.cfg.vocab_size), None, None
    if not 0 <= lookup <= ngram:
        raise ValueError(f'lookup={lookup} must be in [0, ngram={ngram}] (0 = off)')
    drafter, params, model = _model_drafter(kind, draft, target, **load)
    if lookup:
        drafter = drafters.PromptLookup(drafter, ngram, lookup)
    return drafter, params, model


def _model_drafter(kind: str, draft: str, target: checkpoints.LoadedModel, **load):
    from spec_jax.decoding import drafters

    if not draft:
        what = 'a draft LM checkpoint' if kind == 'lm' else 'an EAGLE-3 head directory'
        raise ValueError(f'drafter {kind!r} needs a draft: {what}')
    if kind == 'eagle3':
        from spec_jax.checkpoints import eagle_formats

        head = eagle_formats.load_head(draft, target.cfg, load.get('dtype', 'float32'))
        drafter = drafters.Eagle3Drafter(head.cfg)
        return drafter, drafter.params_for(head, target.params), None
    model = load_model(draft, **load)
    check_same_tokenizer(target.tokenizer, model.tokenizer)
    return drafters.LMDrafter(model.cfg), model.params, model


def check_same_tokenizer(target_tok, draft_tok) -> None:
    """Draft and target must tokenize alike; compare vocabularies when both are known.

    A checkpoint without a tokenizer (HF weights alone, orbax) cannot be compared: only
    the vocabulary sizes are checked then (by the engine), and a warning says so.
    """
    if draft_tok is None or target_tok is None:
        missing = 'draft' if draft_tok is None else 'target'
        logging.warning(
            'the %s checkpoint has no tokenizer: only the vocabulary sizes of draft and target '
            'are checked, so make sure they share one tokenizer',
            missing,
        )
        return
    if draft_tok.backend.get_vocab() != target_tok.backend.get_vocab():
        raise ValueError(
            "the draft's tokenizer differs from the target's: speculative "
            'decoding needs one shared vocabulary'
        )


def log_devices() -> None:
    logging.info(
        'JAX %s, process %d/%d, devices: %s',
        jax.__version__,
        jax.process_index(),
        jax.process_count(),
        jax.devices(),
    )
