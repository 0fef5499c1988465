"""The axis alphabet of spec_jax, documented once.

Every einsum string, shape comment, parameter name suffix and sharding field in the
package uses these letters, so that `x_btd` always means an array of shape
[batch, new tokens, model width].

  B  batch (rows decoded together)
  T  new tokens in one model call (1 for a decode step, A+1 for chain verification,
     M for tree verification, the prompt bucket for prefill), or a training row's tokens
  O  a row's output buffer (its new tokens, `max_new_tokens` rounded up; also the rounds
     that fill it: each emits at least one token)
  S  cache length (slots of the KV cache; static, the row's `max_len`)
  N  query heads
  K  key/value heads (GQA: N = K * G)
  G  query heads per key/value head
  H  head dimension
  D  model width (residual stream)
  F  MLP hidden width
  V  vocabulary
  A  draft length (gamma: drafted tokens per block)
  C  children (siblings) of one tree node, in draft order
  M  tree nodes verified in one call
  L  layers
  P  prompt positions (the prompt bucket, in prefill)
  U  an EAGLE-3 head's draft vocabulary (U <= V; `d2t` maps it into V)
  E  EAGLE-3 feature taps (3: low, middle, high)
  I  the entries kept of a teacher's top-k law (stored soft labels: ids and log-probs)
  J  the training-time-test steps of EAGLE-3 training (each feeds the head its own
     previous outputs)
  X  an EAGLE-3 layer's concatenated input: [embedding, hidden] (2 D), or the taps E D
     before `fc`
  Y  a draft tree's frontier: the nodes one head call expands (`branch` per level)
  W  a dynamic draft tree's candidate pool (branch + (levels - 1) * branch^2)
  Z  the head's scratch slots past C in one tree proposal
  R  attention rows: one per (batch row, KV head), R = B * K, in mesh-block order
     (batch-major on one device; the KV cache's leading axis; spec_jax.models.attention)
  Q  queries of one KV head in one call, Q = T * G, token-major

Sharded arrays take their PartitionSpec from these letters (spec_jax.sharding: B over
'data'; N, K, F, V over 'model'; R over both).

Example: `jnp.einsum('rqh,rsh->rqs', q, k)` computes attention scores of the new tokens
against every cache slot without materialising repeated key/value heads.
"""
