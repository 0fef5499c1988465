"""Row attention against a per-head reference with repeated KV heads."""

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.models.attention import attend, from_query_rows, query_rows, to_rows

B, T, K, G, H, S = 2, 3, 2, 3, 5, 7  # N = K * G = 6 query heads.


def _reference(q_btnh, k_bskh, v_bskh, mask_bts, diag=()):
    """Per query head n (KV head n // G): one softmax over the S keys and, for new token t,
    entry t of each diagonal block. Returns [B, T, N * H]."""
    k_bsnh, v_bsnh = jnp.repeat(k_bskh, G, axis=2), jnp.repeat(v_bskh, G, axis=2)
    scores = jnp.einsum('btnh,bsnh->bnts', q_btnh, k_bsnh) / np.sqrt(H)
    scores = jnp.where(mask_bts[:, None], scores, -jnp.inf)
    diag_scores = [
        jnp.einsum('btnh,btnh->bnt', q_btnh, jnp.repeat(dk, G, axis=2))[..., None] / np.sqrt(H)
        for dk, _ in diag
    ]
    probs = jax.nn.softmax(jnp.concatenate([scores, *diag_scores], -1), -1)
    out = jnp.einsum('bnts,bsnh->btnh', probs[..., :S], v_bsnh)
    for i, (_, dv) in enumerate(diag):
        out += probs[..., S + i].transpose(0, 2, 1)[..., None] * jnp.repeat(dv, G, axis=2)
    return out.reshape(B, T, K * G * H)


def test_rows_match_per_head_attention():
    rng = np.random.default_rng(0)
    q, k, v = (
        jnp.asarray(rng.normal(size=s), jnp.float32)
        for s in [(B, T, K * G, H), (B, S, K, H), (B, S, K, H)]
    )
    mask = jnp.asarray(rng.random((B, T, S)) < 0.6).at[:, :, 0].set(True)  # Never empty.
    diag = [  # Two earlier TTT steps: (keys, values) [B, T, K, H] each.
        tuple(jnp.asarray(rng.normal(size=(B, T, K, H)), jnp.float32) for _ in range(2))
        for _ in range(2)
    ]
    for d in ((), diag):
        got = from_query_rows(
            attend(
                query_rows(q, K), to_rows(k), to_rows(v), mask, [tuple(map(to_rows, x)) for x in d]
            ),
            B,
            T,
        )
        np.testing.assert_allclose(got, _reference(q, k, v, mask, d), rtol=1e-5, atol=1e-5)
