"""Pieces every job shares: reading a config file, logging the devices."""

from __future__ import annotations

import importlib.util
import os

import jax
import ml_collections
from absl import logging


def load_config(path: str, arg: str | None = None) -> ml_collections.ConfigDict:
    """`get_config(arg)` of a config file, as `--config path[:arg]` would give it."""
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(arg)


def log_devices() -> None:
    logging.info(
        'JAX %s, process %d/%d, devices: %s',
        jax.__version__,
        jax.process_index(),
        jax.process_count(),
        jax.devices(),
    )
