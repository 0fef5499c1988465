"""Row attention against a per-head reference with repeated KV heads, in every row order."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.models.attention import Rows, attend

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


# Batch-major (one device), and mesh-block orders: data 2 x model 2, data 2, model 2.
ORDERS = [Rows(B, K), Rows(B, K, 'data', 2, 'model', 2), Rows(B, K, 'data', 2),
          Rows(B, K, None, 1, 'model', 2)]  # fmt: skip


@pytest.mark.parametrize('rows', ORDERS, ids=lambda r: f'{r.data}x{r.model}')
@pytest.mark.parametrize('query_block', [0, 1, 2])  # T 3: one block; 3 of 1; 2 of 2, padded.
def test_rows_match_per_head_attention(rows, query_block):
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
        out_rqh = attend(
            rows, rows.queries(q), rows.keys(k), rows.keys(v), mask,
            [tuple(map(rows.keys, x)) for x in d], query_block,
        )  # fmt: skip
        got = rows.outputs(out_rqh, T)
        np.testing.assert_allclose(got, _reference(q, k, v, mask, d), rtol=1e-5, atol=1e-5)


def test_each_mesh_block_of_rows_holds_its_batch_rows_and_kv_heads():
    """Split R into D * M contiguous blocks (what P(('data', 'model')) does): block
    (d, m) must hold exactly batch rows of data shard d and KV heads of model shard m, at
    several rows per data shard and several heads per model shard."""
    b, k, d, m = 6, 4, 3, 2
    rows = Rows(b, k, 'data', d, 'model', m)
    ids_bk = np.arange(b)[:, None] * 100 + np.arange(k)[None, :]
    ids_r = np.asarray(rows.keys(jnp.asarray(ids_bk)[:, None, :, None]))[:, 0, 0]
    per_row_b = np.asarray(rows.per_row(jnp.arange(b)))
    for block, ids in enumerate(ids_r.reshape(d * m, -1)):
        dd, mm = divmod(block, m)
        assert set(ids // 100) == set(range(dd * b // d, (dd + 1) * b // d))
        assert set(ids % 100) == set(range(mm * k // m, (mm + 1) * k // m))
    np.testing.assert_array_equal(per_row_b, ids_r // 100)
    assert Rows(b, k).keys(jnp.asarray(ids_bk)[:, None, :, None])[:, 0, 0].tolist() == (
        ids_bk.reshape(-1).tolist()  # One device: batch-major.
    )
