"""spec_jax: speculative decoding with lossless and lossy verification in JAX/Flax.

Subpackages (import what you need; `spec_jax.rules` and `spec_jax.sampling` need jax only):

  spec_jax.rules        verification rules as pure jnp functions, their induced laws,
                        chain and tree verifiers, matched baselines, distortion measures
  spec_jax.sampling     logits -> processed probabilities (temperature, top-k, top-p,
                        min-p, eta, epsilon, typical)
  spec_jax.models       Llama-family decoder (Flax), configs, RoPE, the KV cache pytree
  spec_jax.checkpoints  GGUF, Hugging Face safetensors and orbax loading; tokenizers
  spec_jax.decoding     one on-device engine for AR and speculative (chain) decoding

The axis alphabet used in every shape comment is documented in `spec_jax.axes`.
"""

__version__ = '0.1.0'
