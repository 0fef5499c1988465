"""Rotary position embeddings in Hugging Face's rotate-half layout.

HF q/k weights load as they are; GGUF q/k rows are un-permuted at load time
(spec_jax.checkpoints.gguf) so that this one layout serves every checkpoint.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np

from spec_jax.models.config import RopeScaling


def inverse_frequencies(head_dim: int, theta: float, scaling: RopeScaling) -> np.ndarray:
    """inv_freq[j] = theta^(-2j/H), with Llama-3 or linear scaling applied. Shape [H/2]."""
    inv_freq = 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if scaling.kind == 'linear':
        inv_freq = inv_freq / scaling.factor
    elif scaling.kind == 'llama3':
        low_wavelen = scaling.original_max_position / scaling.low_freq_factor
        high_wavelen = scaling.original_max_position / scaling.high_freq_factor
        wavelen = 2 * math.pi / inv_freq
        smooth = (scaling.original_max_position / wavelen - scaling.low_freq_factor) / (
            scaling.high_freq_factor - scaling.low_freq_factor
        )
        blended = (1 - smooth) * inv_freq / scaling.factor + smooth * inv_freq
        inv_freq = np.where(
            wavelen < high_wavelen,
            inv_freq,
            np.where(wavelen > low_wavelen, inv_freq / scaling.factor, blended),
        )
    return inv_freq.astype(np.float32)


def apply_rope(x_btnh: jnp.ndarray, positions_bt: jnp.ndarray, inv_freq_h2) -> jnp.ndarray:
    """Rotates x by its positions: x * cos + rotate_half(x) * sin, computed in fp32.

    Args:
      x_btnh: queries or keys [B, T, heads, H].
      positions_bt: integer positions [B, T].
      inv_freq_h2: inverse frequencies [H/2].

    Returns:
      The rotated array, same shape and dtype as x.
    """
    angles_bth2 = positions_bt[..., None].astype(jnp.float32) * jnp.asarray(inv_freq_h2)
    cos = jnp.cos(angles_bth2)[:, :, None, :]
    sin = jnp.sin(angles_bth2)[:, :, None, :]
    x1, x2 = jnp.split(x_btnh.astype(jnp.float32), 2, axis=-1)
    rotated = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return rotated.astype(x_btnh.dtype)
