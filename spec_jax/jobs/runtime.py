"""Pieces every job shares: reading a config file, logging the devices, the persistent
compilation cache the launchers turn on."""

from __future__ import annotations

import contextlib
import importlib.util
import os

import jax
import ml_collections
from absl import logging
from jax.experimental.compilation_cache import compilation_cache


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of a config file, as `--config path[:arg]` would give it."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


CACHE_ENV = 'SPEC_JAX_COMPILATION_CACHE'


def enable_compilation_cache(directory: str | None = None) -> str | None:
    """Turns on JAX's persistent compilation cache, so a rerun loads compiled loops from disk
    instead of compiling them again (the tiny generate job: 6.3 s cold, 1.5 s warm here).

    The directory is `directory`, else $SPEC_JAX_COMPILATION_CACHE ('off' disables it), else
    `$XDG_CACHE_HOME/spec_jax/jax` (default `~/.cache/spec_jax/jax`). Only compiles of a
    second or more are stored. Returns the directory, or None when disabled.
    """
    directory = directory or os.environ.get(CACHE_ENV)
    # JAX decides at a process's first compile whether a cache is used: start afresh.
    compilation_cache.reset_cache()
    if directory == 'off':  # Also when JAX's own variables turned a cache on.
        jax.config.update('jax_enable_compilation_cache', False)
        return None
    if not directory:
        base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
        directory = os.path.join(base, 'spec_jax', 'jax')
    os.makedirs(directory, exist_ok=True)
    jax.config.update('jax_enable_compilation_cache', True)
    jax.config.update('jax_compilation_cache_dir', directory)
    jax.config.update('jax_persistent_cache_min_compile_time_secs', 1.0)
    return directory


@contextlib.contextmanager
def compilation_cache_off():
    """Compiles inside the block neither read nor write the persistent cache, whatever turned
    it on (a bench timing compiles must not time cache loads). JAX decides once whether a cache
    is used, at the first compile after a reset, so the cache is reset on entry and on exit."""
    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update('jax_enable_compilation_cache', False)
    compilation_cache.reset_cache()
    try:
        yield
    finally:
        jax.config.update('jax_enable_compilation_cache', enabled)
        compilation_cache.reset_cache()


def log_devices() -> None:
    logging.info(
        'JAX %s, process %d/%d, devices: %s',
        jax.__version__,
        jax.process_index(),
        jax.process_count(),
        jax.devices(),
    )
