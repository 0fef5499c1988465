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
            drafter='lm',  # 'lm' (a draft model at `draft`) or 'ngram' (prompt lookup).
            draft=draft,  # A checkpoint spec for the draft LM (same tokenizer as the target).
            num_draft=5,  # gamma: drafted tokens per block.
            ngram=3,  # Longest n-gram the prompt-lookup drafter matches.
            rule='lossless',  # A spec_jax.rules name, with parameters: 'lenience:l=0.5'.
            baseline=False,  # Run the rule's matched baseline (truncation + lossless) instead.
            meter_distortion=False,  # Per-position TV / overshoot against the matched baseline.
        )
    )


def log_devices() -> None:
    logging.info(
        'JAX %s, process %d/%d, devices: %s',
        jax.__version__,
        jax.process_index(),
        jax.process_count(),
        jax.devices(),
    )
