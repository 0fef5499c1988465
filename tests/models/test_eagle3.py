"""EAGLE-3 head: the token/feature shift, TTT == chain drafting with a KV cache, configs."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.models import eagle3 as e3
from spec_jax.models import llama
from spec_jax.models.cache import empty_layer
from spec_jax.models.config import ModelConfig
from spec_jax.train import batches, core, shards
from spec_jax.train import eagle3 as te

TARGET = ModelConfig.tiny(num_layers=6)
HEAD = e3.Eagle3Config.for_target(
    TARGET, draft_vocab_size=31, num_heads=4, num_kv_heads=2, head_dim=6, mlp_width=23
)
B, T, S = 2, 11, 16


@pytest.fixture(scope='module')
def setup():
    tp = llama.init_params(TARGET, jax.random.PRNGKey(0))
    hp = e3.init_params(HEAD, jax.random.PRNGKey(1))
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, TARGET.vocab_size, (B, T)), jnp.int32)
    valid = jnp.ones((B, T), bool)
    logits, taps = core.teacher_forward(TARGET, tp, tokens, valid, taps=True)
    ttt = jax.jit(te.ttt_forward, static_argnums=(0, 6))(
        HEAD, hp, tp['embed_vd'], taps, tokens, valid, 3
    )
    return tp, hp, tokens, logits, taps, ttt


@jax.jit
def _cached_call(hp, emb, hidden_or_taps, pos, mask, ck, cv, lens):
    apply_fc = hidden_or_taps.ndim == 4
    return e3.eagle3_forward(
        HEAD, hp, emb, hidden_or_taps, pos, mask, kv=(ck, cv, lens), apply_fc=apply_fc
    )


def test_taps_are_hf_hidden_states(setup):
    tp, _, tokens, _, taps, _ = setup
    assert TARGET.hf_taps() == (2, 3, 3)
    assert taps.shape == (B, T, 3, TARGET.width)
    # hidden_states[0] is the embedding output; tap i is the stream ENTERING layer i.
    _, emb_tap, _ = llama.forward(
        TARGET,
        tp,
        tokens,
        core.positions(B, T),
        None,
        core.causal_mask(jnp.ones((B, T), bool)),
        tap_layers=(0,),
    )
    np.testing.assert_allclose(emb_tap[:, :, 0], tp['embed_vd'][tokens], atol=1e-6)


def test_shift_pairs_by_hand(setup):
    """Step 0 built pair by pair (feature t, token t+1, position t) with a KV cache, like
    inference, equals TTT step 0; its target is the teacher's logits at t+1."""
    tp, hp, tokens, logits, taps, ttt = setup
    tok, tap = np.asarray(tokens), np.asarray(taps)
    ck = empty_layer(B, HEAD.num_kv_heads, S, HEAD.head_dim, jnp.float32)
    cv = jnp.zeros_like(ck)
    for t in range(T - 1):
        emb = tp['embed_vd'][jnp.asarray(tok[:, t + 1 : t + 2])]  # token t+1
        feat = jnp.asarray(tap[:, t : t + 1])  # feature of position t
        pos = jnp.full((B, 1), t, jnp.int32)
        mask = jnp.broadcast_to(jnp.arange(S) <= t, (B, 1, S))
        lg, _, (ck, cv, _) = _cached_call(
            hp, emb, feat, pos, mask, ck, cv, jnp.full((B,), t, jnp.int32)
        )
        np.testing.assert_allclose(lg[:, 0], ttt[0][:, t], atol=2e-5)
    # Targets: index t at step j is trained on the teacher at t+j+1 (the law of x_{t+j+2})
    # where x_{t+j+2} is a response token.
    loss_mask = np.zeros((B, T), bool)
    loss_mask[:, 4:] = True
    draft_ids = jnp.arange(HEAD.draft_vocab_size)
    p_btu, top_bt = te.teacher_from_logits(logits, draft_ids)
    (p0, top0, m0), (p1, _, m1) = te.ttt_targets(
        (p_btu, top_bt), jnp.asarray(loss_mask), jnp.ones((B, T), bool), 2
    )
    want = jax.nn.softmax(logits[..., : HEAD.draft_vocab_size], -1)
    np.testing.assert_allclose(p0[:, : T - 1], want[:, 1:], rtol=1e-6)
    np.testing.assert_allclose(p1[:, : T - 2], want[:, 2:], rtol=1e-6)
    np.testing.assert_array_equal(top0[:, : T - 1], np.argmax(logits[:, 1:], -1))
    assert not np.asarray(m0[:, T - 1]).any() and not np.asarray(m1[:, T - 2 :]).any()
    np.testing.assert_array_equal(m0[:, : T - 1], loss_mask[:, 1:])


def test_teacher_from_topk_is_the_restricted_renormalised_law(setup):
    """Stored top-k labels give the target's law restricted to its top k and to the draft
    vocabulary, renormalised; with k = V and every token drafted it is the full law."""
    _, _, _, logits, _, _ = setup
    v = TARGET.vocab_size
    logp = jax.nn.log_softmax(logits, -1)
    every = jnp.arange(v, dtype=jnp.int32)
    lp, ids = jax.lax.top_k(logp, v)
    full, top = te.teacher_from_topk(ids, lp, every, jnp.ones(v, bool))
    np.testing.assert_allclose(full, jnp.exp(logp), atol=1e-6)
    np.testing.assert_array_equal(top, jnp.argmax(logits, -1))
    # k = 4, draft vocabulary = the even ids, listed in reverse (draft index != target id).
    draft_ids = jnp.arange(v - 2 if v % 2 else v - 1, -1, -2, dtype=jnp.int32)
    t2d = jnp.zeros(v, bool).at[draft_ids].set(True)
    lp4, ids4 = jax.lax.top_k(logp, 4)
    p_btu, _ = te.teacher_from_topk(ids4, lp4, draft_ids, t2d)
    keep = np.zeros(logp.shape, bool)
    np.put_along_axis(keep, np.asarray(ids4), True, -1)
    keep &= np.asarray(t2d)
    want = np.where(keep, np.exp(np.asarray(logp)), 0.0)
    want = want / np.maximum(want.sum(-1, keepdims=True), 1e-30)
    np.testing.assert_allclose(p_btu, want[..., np.asarray(draft_ids)], atol=1e-6)


def test_ttt_equals_chain_drafting(setup):
    """Step j of the training-time test at index r-1 == depth j+1 of a chain draft rooted at
    x_r (draft fed its own hidden, tokens x_{r+j}, positions r-1+j, KV cache)."""
    tp, hp, tokens, _, taps, ttt = setup
    r = 6
    ck = empty_layer(B, HEAD.num_kv_heads, S, HEAD.head_dim, jnp.float32)
    cv = jnp.zeros_like(ck)
    emb = tp['embed_vd'][tokens[:, 1 : r + 1]]
    pos = jnp.broadcast_to(jnp.arange(r), (B, r))
    mask = jnp.broadcast_to(jnp.arange(S)[None, :] <= jnp.arange(r)[:, None], (B, r, S))
    lg, hid, (ck, cv, _) = e3.eagle3_forward(
        HEAD, hp, emb, taps[:, :r], pos, mask, kv=(ck, cv, jnp.zeros((B,), jnp.int32))
    )
    np.testing.assert_allclose(lg[:, r - 1], ttt[0][:, r - 1], atol=2e-5)
    h = hid[:, r - 1 : r]
    for j in (1, 2):
        emb = tp['embed_vd'][tokens[:, r + j : r + j + 1]]
        pos = jnp.full((B, 1), r - 1 + j, jnp.int32)
        mask = jnp.broadcast_to(jnp.arange(S) <= r - 1 + j, (B, 1, S))
        lg, h, (ck, cv, _) = e3.eagle3_forward(
            HEAD,
            hp,
            emb,
            h,
            pos,
            mask,
            kv=(ck, cv, jnp.full((B,), r - 1 + j, jnp.int32)),
            apply_fc=False,
        )
        np.testing.assert_allclose(lg[:, 0], ttt[j][:, r - 1], atol=2e-5)


@pytest.mark.parametrize('norm_output', [False, True])
def test_head_logits_later_equal_the_calls_own(setup, norm_output):
    """`head_logits` on a call's output hidden gives the logits the call computes (EAGLE-3
    and 3.1's normed outputs): a drafter can skip them where it only follows the text."""
    tp, _, tokens, _, taps, _ = setup
    cfg = dataclasses.replace(HEAD, norm_output=norm_output)
    hp = e3.init_params(cfg, jax.random.PRNGKey(3))
    hp = {**hp, 'norm': {'scale': 1.0 + jnp.arange(cfg.width) / cfg.width}}  # Not all ones.
    mask = jnp.broadcast_to(jnp.tril(jnp.ones((T, T), bool)), (B, T, T))
    lg, hid, _ = e3.eagle3_forward(cfg, hp, tp['embed_vd'][tokens], taps,
                                   core.positions(B, T), mask)  # fmt: skip
    np.testing.assert_allclose(e3.head_logits(cfg, hp, hid), lg, rtol=1e-6, atol=1e-6)
    other = e3.head_logits(dataclasses.replace(cfg, norm_output=not norm_output), hp, hid)
    assert float(jnp.abs(other - lg).max()) > 1e-3  # The norm, once, is what is checked.


def test_make_batch_loss_mask_is_shifted():
    ex = shards.Example(np.arange(1, 8, dtype=np.int32), np.array([0, 0, 0, 1, 1, 1, 1], bool))
    b = batches.make_batch([ex], seq_len=16, bucket=4)
    assert b.tokens_bt.shape == (1, 8)
    # Position t predicts token t+1: trained where token t+1 is a response token.
    np.testing.assert_array_equal(b.loss_mask_bt[0], [0, 0, 1, 1, 1, 1, 0, 0])
    np.testing.assert_array_equal(b.valid_bt[0], [1] * 7 + [0])
    short = batches.make_batch([ex], seq_len=5, bucket=4)  # keeps the LAST 5 tokens
    np.testing.assert_array_equal(short.tokens_bt[0], [3, 4, 5, 6, 7])


def test_vocab_maps_and_draft_vocab():
    counts = np.array([5, 0, 9, 9, 1, 7, 0, 2])
    used = e3.draft_vocab_from_counts(counts, 4, always=(6,))
    np.testing.assert_array_equal(used, [2, 3, 5, 6])
    d2t, t2d = e3.vocab_maps(used, 8)
    np.testing.assert_array_equal(np.arange(4) + d2t, used)
    np.testing.assert_array_equal(np.nonzero(t2d)[0], used)
    with pytest.raises(ValueError, match='larger than the target vocab'):
        e3.draft_vocab_from_counts(counts, 9)


def test_config_errors():
    with pytest.raises(ValueError, match='draft_vocab_size'):
        e3.Eagle3Config.for_target(TARGET, draft_vocab_size=TARGET.vocab_size + 1)
    head = e3.Eagle3Config.for_target(TARGET, draft_vocab_size=31)
    with pytest.raises(ValueError, match='target width'):
        head.check_target(TARGET.replace(width=32))
    with pytest.raises(ValueError, match='tap layers'):
        head.check_target(TARGET.replace(num_layers=3))


def test_init_from_target(setup):
    tp, hp, *_ = setup
    ids = np.array([0, 3, 5] + list(range(10, 38)))
    p = e3.init_from_target(HEAD, hp, tp, ids)
    np.testing.assert_array_equal(p['lm_head_ud'], np.asarray(tp['embed_vd'])[ids])
    np.testing.assert_array_equal(p['norm']['scale'], tp['final_norm']['scale'])
    d = HEAD.width
    fc = np.asarray(p['fc_xd'])
    np.testing.assert_allclose(
        fc[2 * d :], np.eye(d) + 0.1 * np.asarray(hp['fc_xd'])[2 * d :], atol=1e-6
    )
