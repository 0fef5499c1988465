"""ModelConfig: the static description of a Llama-family decoder, plus presets.

One frozen, hashable dataclass covers Llama 2/3/3.1/3.2, Qwen2/2.5, Qwen3 and SmolLM2:
the families differ only in the fields below (qkv bias, q/k norm, explicit head
dimension, RoPE scaling, tied embeddings).
"""

from __future__ import annotations

import dataclasses
from typing import Any

FAMILIES = ('llama', 'qwen2', 'qwen3')
ROPE_TYPES = ('default', 'llama3', 'linear')
WEIGHT_FORMATS = ('float', 'int8')  # ModelConfig.weights (spec_jax.models.quant).


@dataclasses.dataclass(frozen=True)
class RopeScaling:
    """RoPE frequency scaling (HF `rope_scaling` / `rope_parameters`).

    Attributes:
      kind: 'default' (none), 'llama3' (Llama 3.1/3.2 NTK-by-parts) or 'linear'.
      factor: frequency divisor for the low-frequency band ('llama3') or all ('linear').
      low_freq_factor, high_freq_factor, original_max_position: the 'llama3' band edges.
    """

    kind: str = 'default'
    factor: float = 1.0
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position: int = 8192

    def __post_init__(self):
        if self.kind not in ROPE_TYPES:
            raise ValueError(
                f'rope scaling kind {self.kind!r} is not supported; valid: {ROPE_TYPES}'
            )

    def to_hf(self) -> dict | None:
        """The HF config.json `rope_scaling` entry (None for no scaling)."""
        if self.kind == 'default':
            return None
        out = {'rope_type': self.kind, 'factor': self.factor}
        if self.kind == 'llama3':
            out.update(
                low_freq_factor=self.low_freq_factor,
                high_freq_factor=self.high_freq_factor,
                original_max_position_embeddings=self.original_max_position,
            )
        return out


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Static shape and numerics of a decoder. Sizes use the axis letters of spec_jax.axes.

    Attributes:
      family: 'llama' (Llama 2/3, SmolLM2), 'qwen2' (qkv bias) or 'qwen3' (q/k RMSNorm).
      vocab_size: V.
      width: D, the residual-stream width.
      num_layers: L.
      num_heads: N query heads.
      num_kv_heads: K key/value heads (N must be a multiple of K).
      head_dim: H (explicit: Qwen3 does not have H = D / N).
      mlp_width: F, the SwiGLU hidden width.
      rms_eps: RMSNorm epsilon.
      rope_theta: RoPE base.
      rope_scaling: RoPE frequency scaling.
      tie_embeddings: the LM head is the transposed input embedding.
      qkv_bias: q/k/v projections have biases (Qwen2).
      qk_norm: per-head RMSNorm on q and k before RoPE (Qwen3).
      max_position: the longest context the checkpoint supports.
      dtype: compute dtype ('float32' on CPU; 'bfloat16' on TPU/GPU).
      param_dtype: storage dtype of the parameters (with weights='int8': of those left
        in float, the embedding, norms and biases).
      weights: 'float' (every parameter in param_dtype) or 'int8': the projections and an
        untied LM head stored as int8 with float32 per-output-channel scales, dequantized
        inside each matmul (spec_jax.models.quant; docs/quantization.md).
      scan_layers: run the layers under one `nn.scan` over parameters stacked on a leading
        L axis (`params['layers']`, a KV cache of [L, R, S, H] arrays) instead of unrolled
        `layer_{i}`: compile time independent of L, for TPU and GPU. Off by default and on
        CPU (the Decoder's docstring says why); checkpoints keep `layer_{i}` on disk
        (`llama.stack_layers` / `unstack_layers`, `checkpoints.load(scan_layers=True)`).
    """

    family: str = 'llama'
    vocab_size: int = 49152
    width: int = 576
    num_layers: int = 30
    num_heads: int = 9
    num_kv_heads: int = 3
    head_dim: int = 64
    mlp_width: int = 1536
    rms_eps: float = 1e-5
    rope_theta: float = 100000.0
    rope_scaling: RopeScaling = RopeScaling()
    tie_embeddings: bool = True
    qkv_bias: bool = False
    qk_norm: bool = False
    max_position: int = 8192
    dtype: str = 'float32'
    param_dtype: str = 'float32'
    weights: str = 'float'
    scan_layers: bool = False

    def __post_init__(self):
        if self.family not in FAMILIES:
            raise ValueError(
                f'model family {self.family!r} is not supported; valid families: {FAMILIES}'
            )
        if self.weights not in WEIGHT_FORMATS:
            raise ValueError(f'weights {self.weights!r} is not supported; valid: {WEIGHT_FORMATS}')
        for name in (
            'vocab_size',
            'width',
            'num_layers',
            'num_heads',
            'num_kv_heads',
            'head_dim',
            'mlp_width',
        ):
            if getattr(self, name) < 1:
                raise ValueError(f'{name} must be >= 1, got {getattr(self, name)}')
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f'num_heads ({self.num_heads}) must be a multiple of num_kv_heads '
                f'({self.num_kv_heads})'
            )

    @property
    def group_size(self) -> int:
        """G: query heads per key/value head."""
        return self.num_heads // self.num_kv_heads

    def replace(self, **changes: Any) -> ModelConfig:
        return dataclasses.replace(self, **changes)

    def hf_taps(self) -> tuple[int, int, int]:
        """The EAGLE-3 feature taps [2, L//2, L-3] in HF `hidden_states[i]` indexing."""
        n = self.num_layers
        return (2, n // 2, n - 3)

    # ---- presets -------------------------------------------------------------------------

    @classmethod
    def smollm2_135m(cls) -> ModelConfig:
        """SmolLM2-135M(-Instruct): the embedded default target."""
        return cls()

    @classmethod
    def smollm2_360m(cls) -> ModelConfig:
        return cls(width=960, num_layers=32, num_heads=15, num_kv_heads=5, mlp_width=2560)

    @classmethod
    def llama3_1_8b(cls) -> ModelConfig:
        return cls(
            vocab_size=128256,
            width=4096,
            num_layers=32,
            num_heads=32,
            num_kv_heads=8,
            head_dim=128,
            mlp_width=14336,
            rope_theta=500000.0,
            tie_embeddings=False,
            rope_scaling=RopeScaling('llama3', 8.0, 1.0, 4.0, 8192),
            max_position=131072,
        )

    @classmethod
    def llama3_2_1b(cls) -> ModelConfig:
        return cls(
            vocab_size=128256,
            width=2048,
            num_layers=16,
            num_heads=32,
            num_kv_heads=8,
            head_dim=64,
            mlp_width=8192,
            rope_theta=500000.0,
            tie_embeddings=True,
            rope_scaling=RopeScaling('llama3', 32.0, 1.0, 4.0, 8192),
            max_position=131072,
        )

    @classmethod
    def qwen2_5_0_5b(cls) -> ModelConfig:
        return cls(
            family='qwen2',
            vocab_size=151936,
            width=896,
            num_layers=24,
            num_heads=14,
            num_kv_heads=2,
            head_dim=64,
            mlp_width=4864,
            rms_eps=1e-6,
            rope_theta=1e6,
            tie_embeddings=True,
            qkv_bias=True,
            max_position=32768,
        )

    @classmethod
    def qwen3_0_6b(cls) -> ModelConfig:
        return cls(
            family='qwen3',
            vocab_size=151936,
            width=1024,
            num_layers=28,
            num_heads=16,
            num_kv_heads=8,
            head_dim=128,
            mlp_width=3072,
            rms_eps=1e-6,
            rope_theta=1e6,
            tie_embeddings=True,
            qk_norm=True,
            max_position=40960,
        )

    @classmethod
    def tiny(cls, family: str = 'llama', **changes: Any) -> ModelConfig:
        """A random-init test model with distinct prime-ish sizes (V 67, D 28, L 3, N 6, K 2)."""
        base = dict(
            family=family,
            vocab_size=67,
            width=28,
            num_layers=3,
            num_heads=6,
            num_kv_heads=2,
            head_dim=10 if family == 'qwen3' else 14,
            mlp_width=38,
            rope_theta=10000.0,
            max_position=512,
            qkv_bias=family == 'qwen2',
            qk_norm=family == 'qwen3',
            tie_embeddings=family != 'qwen2',
        )
        base.update(changes)
        return cls(**base)


PRESETS = {
    'smollm2_135m': ModelConfig.smollm2_135m,
    'smollm2_360m': ModelConfig.smollm2_360m,
    'llama3_1_8b': ModelConfig.llama3_1_8b,
    'llama3_2_1b': ModelConfig.llama3_2_1b,
    'qwen2_5_0_5b': ModelConfig.qwen2_5_0_5b,
    'qwen3_0_6b': ModelConfig.qwen3_0_6b,
    'tiny': ModelConfig.tiny,
}


def preset(name: str) -> ModelConfig:
    """Returns the preset config `name` (see PRESETS)."""
    if name not in PRESETS:
        raise ValueError(f'unknown model preset {name!r}; valid presets: {sorted(PRESETS)}')
    return PRESETS[name]()
