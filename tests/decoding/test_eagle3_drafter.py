"""The EAGLE-3 chain drafter: its drafts are the training-time test's, and greedy chain
decoding with it equals greedy AR decoding."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import decoding
from spec_jax.decoding.drafters import Eagle3Drafter, PromptLookup
from spec_jax.decoding.state import prefill
from spec_jax.models import eagle3 as e3
from spec_jax.models import precision
from spec_jax.models.cache import KVCache
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import causal_forward
from spec_jax.testing import tiny
from spec_jax.train import core
from spec_jax.train import eagle3 as te

V, CFG, PROMPTS = tiny.V, tiny.TARGET, tiny.PROMPTS
# A smaller head than tiny.HEAD (2 heads of 8): its laws are compared with the TTT forward's.
HEAD = e3.Eagle3Config.for_target(
    CFG, draft_vocab_size=tiny.U, num_heads=2, num_kv_heads=1, head_dim=8, mlp_width=24
)
KEYS0, KEYS1 = (jax.random.split(jax.random.PRNGKey(i), 2) for i in (0, 1))  # A key a row.
DEC = tiny.DECODE
A = 3
ATOL = precision.law_atol(CFG.dtype)  # The laws' tolerance at the models' matmul precision.


@pytest.fixture(scope='module')
def models():
    target = tiny.target_params()
    head_params = jax.tree.map(lambda x: x * 4.0, e3.init_params(HEAD, jax.random.PRNGKey(5)))
    # A draft vocabulary that is not a prefix of V: every other id, plus a few.
    used = np.array(sorted(set(range(0, V, 2)) | {3, 7, 11, 13, 19, 23, 29}))[
        : HEAD.draft_vocab_size
    ]
    d2t, t2d = e3.vocab_maps(used, V)
    head = e3.Eagle3Head(HEAD, head_params, jnp.asarray(d2t), jnp.asarray(t2d))
    return target, head


def _ttt_law(target, head, tokens_bt, index_b, steps):
    """Softmax over V of TTT step j at index_b[b] (j < steps): [B, steps, V]."""
    return _ttt_law_jit(target, head.params, head.draft_ids_u, tokens_bt, jnp.asarray(index_b),
                        steps)  # fmt: skip


@functools.partial(jax.jit, static_argnums=5)  # One compile a row length, not one an op.
def _ttt_law_jit(target, head_params, draft_ids_u, tokens_bt, index_b, steps):
    valid = jnp.ones(tokens_bt.shape, bool)
    _, taps = core.teacher_forward(CFG, target, tokens_bt, valid, taps=True)
    logits_jbtu = te.ttt_forward(HEAD, head_params, target['embed_vd'], taps, tokens_bt, valid,
                                 steps)  # fmt: skip
    rows = jnp.arange(tokens_bt.shape[0])
    logits_bju = logits_jbtu[:, rows, index_b].transpose(1, 0, 2)
    full = jnp.full((*logits_bju.shape[:2], V), -jnp.inf).at[..., draft_ids_u].set(logits_bju)
    return jax.nn.softmax(full, -1)


@pytest.mark.gpu
def test_drafts_follow_the_training_time_test(models):
    """Round 1 after prefill, round 2 after a verification that kept a row-dependent
    number of tokens: draft j's law (q) is the TTT step j's at the root's index, to the
    tolerance of the precision the models run at (fp32: 'highest', spec_jax.models.precision)."""
    target, head = models
    drafter = Eagle3Drafter(HEAD)
    propose = jax.jit(drafter.propose, static_argnums=(5, 6))  # Compiled whole, not op by op.
    params = Eagle3Drafter.params_for(head, target)
    prompts = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    bucket, slots = 8, 32
    lengths = jnp.array([len(p) for p in prompts], jnp.int32)
    prompt_bp = jnp.array([p + [0] * (bucket - len(p)) for p in prompts], jnp.int32)
    cache = KVCache.init(CFG, 2, slots)
    logits_bv, taps_bped, cache = prefill(
        CFG, target, cache, prompt_bp, lengths, drafter.tap_layers
    )
    first = jnp.argmax(logits_bv, -1)
    history = jnp.zeros((2, slots), jnp.int32).at[:, :bucket].set(prompt_bp)
    history = history.at[jnp.arange(2), lengths].set(first)
    state = drafter.init(params, history, lengths, bucket, taps_bped)
    probs = jax.nn.softmax  # Sampled drafts at temperature 1: q is the head's whole law.
    state, x_ba, q_bav = propose(
        params, state, history, lengths, KEYS0, A, probs
    )
    rows = [list(p) + [int(first[b])] + list(map(int, x_ba[b])) for b, p in enumerate(prompts)]
    for b, row in enumerate(rows):  # Unbatched: each row's own length, no padding.
        want = _ttt_law(target, head, jnp.array([row]), np.array([len(prompts[b]) - 1]), A)
        np.testing.assert_allclose(q_bav[b], want[0], atol=ATOL)
    # Forced tokens (prompt lookup's) are drafted with one-hot q, and the head goes on from
    # them as from its own drafts.
    use_ba = jnp.array([[True, False, False], [False, True, True]])
    forced = (jnp.full((2, A), 9, jnp.int32), use_ba)
    _, y_ba, qf_bav = propose(
        params, state, history, lengths, KEYS0, A, probs, forced
    )
    np.testing.assert_array_equal(jnp.where(use_ba, y_ba, 9), 9)
    for b, p in enumerate(prompts):
        row = list(p) + [int(first[b])] + list(map(int, y_ba[b]))
        want = _ttt_law(target, head, jnp.array([row]), np.array([len(p) - 1]), A)[0]
        want = jnp.where(use_ba[b][:, None], jax.nn.one_hot(9, V), want)
        np.testing.assert_allclose(qf_bav[b], want, atol=ATOL)

    # Verify [s_C, x_1..x_A]; row 0 keeps 1 token + a replacement, row 1 all A + a bonus.
    verify = jnp.array([r[len(p) :] for r, p in zip(rows, prompts, strict=True)], jnp.int32)
    taps_bted = jnp.stack(  # The target's taps at the verified positions P .. P + A.
        [
            causal_forward(CFG, target, jnp.array([r]), HEAD.taps)[1][0, len(p) :]
            for r, p in zip(rows, prompts, strict=True)
        ]
    )
    kept = [2, A + 1]
    new_rows = []
    for b, p in enumerate(prompts):
        extra = 5 if kept[b] <= A else 6  # a replacement (or bonus) token
        new_rows.append(list(p) + list(map(int, verify[b, : kept[b]])) + [extra])
    committed = lengths + jnp.array(kept, jnp.int32)
    history2 = history
    for b, r in enumerate(new_rows):
        history2 = history2.at[b, : len(r)].set(jnp.array(r, jnp.int32))
    state = drafter.observe(params, state, history2, lengths, committed, taps_bted)
    _, y_ba, q2_bav = propose(
        params, state, history2, committed, KEYS1, A, probs
    )
    for b, r in enumerate(new_rows):
        row = r + list(map(int, y_ba[b]))
        want = _ttt_law(target, head, jnp.array([row]), np.array([len(r) - 2]), A)
        np.testing.assert_allclose(q2_bav[b], want[0], atol=ATOL)
    assert float(q_bav[..., ~np.asarray(head.t2d)].max()) == 0.0  # Only draft-vocab ids.


@pytest.mark.parametrize(
    'num_draft,lookup', [(1, 0), pytest.param(3, 0, marks=pytest.mark.gpu), (3, 1)]
)
def test_greedy_eagle3_chain_equals_greedy_ar(models, num_draft, lookup):
    """Also behind prompt lookup, whose forced tokens the head must consume as its own."""
    target, head = models
    greedy = decoding.generate(decoding.Engine(CFG, DEC), decoding.Params(target), PROMPTS)
    drafter = PromptLookup(Eagle3Drafter(HEAD), 2, lookup) if lookup else Eagle3Drafter(HEAD)
    chain = decoding.Engine(CFG, DEC, drafter, num_draft)
    params = decoding.Params(target, Eagle3Drafter.params_for(head, target))
    result = decoding.generate(chain, params, PROMPTS)
    assert result.tokens == greedy.tokens
    assert result.stats['blocks'] > 0


def test_head_for_another_target_fails_before_compiling(models):
    target, head = models
    other = e3.Eagle3Config.for_target(ModelConfig.tiny(vocab_size=V, width=40), 23)
    with pytest.raises(ValueError, match='expects target width 40'):
        decoding.generate(
            decoding.Engine(CFG, DEC, Eagle3Drafter(other), 2),
            decoding.Params(target, Eagle3Drafter.params_for(head, target)),
            PROMPTS,
        )
