"""Test helpers shipped with the package: random weights without compiling anything, and a
check of compiled decode loops (processes joined as one JAX job: `testing.processes`).

`init_params` compiles a Flax init (seconds on 2 cores, per config); tests need many small
random models, so they draw weights with numpy into the shapes `jax.eval_shape` gives.
"""

from __future__ import annotations

import math
import re

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import init_params


def random_params(
    cfg: ModelConfig, seed: int = 0, std: float = 0.02, embed_scale: float = 1.0
) -> dict:
    """Random parameters for `cfg`: normal(std) matrices, norms near 1, biases near 0.

    `embed_scale` multiplies the embedding (and so, when tied, the logits): the default
    init gives nearly uniform next-token laws; 8 gives peaked but not degenerate ones.
    """
    rng = np.random.default_rng(seed)
    shapes = jax.eval_shape(init_params, cfg, jax.random.PRNGKey(0))

    def draw(path, leaf):
        name = jax.tree_util.keystr(path)
        if 'norm' in name:
            x = 1.0 + 0.1 * rng.standard_normal(leaf.shape)
        elif 'bias' in name:
            x = 0.1 * rng.standard_normal(leaf.shape)
        else:
            x = std * rng.standard_normal(leaf.shape)
            if 'embed' in name or 'lm_head' in name:
                x = x * embed_scale
        return jnp.asarray(x, leaf.dtype)  # On device: jit would copy numpy every call.

    return jax.tree_util.tree_map_with_path(draw, shapes)


def loop_copies(hlo_text: str, min_elements: int) -> list[str]:
    """The `copy` instructions inside while-loop bodies, and the branches of conditionals
    (`lax.switch`, `lax.cond`), of a compiled HLO module that move at least `min_elements`
    elements: per-iteration copies of caches or weights, which XLA inserts when a loop's
    in-place update or layout cannot be kept (see spec_jax.models.attention), and which
    XLA:CPU makes of every buffer a branch updates. Use with
    `jax.jit(f).lower(...).compile().as_text()`.

    Raises:
      ValueError: the module has no while loop (nothing to check).
    """
    bodies = set(re.findall(r'while\(.*?body=%?([\w.\-]+)', hlo_text))
    if not bodies:
        raise ValueError('loop_copies: the compiled module has no while loop')
    for names in re.findall(r'branch_computations=\{([^}]*)\}', hlo_text):
        bodies |= {n.strip().lstrip('%') for n in names.split(',')}
    bodies |= set(re.findall(r'(?:true|false)_computation=%?([\w.\-]+)', hlo_text))
    found, current = [], None
    for line in hlo_text.splitlines():
        start = re.match(r'%?([\w.\-]+) \(.*\{$', line)
        if start:
            current = start.group(1)
        elif line.startswith('}'):
            current = None
        elif current in bodies and ' copy(' in line:
            dims = re.search(r'= \w+\[([\d,]*)\]', line)
            size = math.prod(int(d) for d in dims.group(1).split(',') if d) if dims else 0
            if size >= min_elements:
                found.append(line.strip())
    return found
