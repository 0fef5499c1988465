"""DFlash training: an anchored training block is exactly the drafter's inference block, and
steps on a fixed batch lower the loss."""

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax.decoding.drafters import DFlashDrafter
from spec_jax.decoding.state import prefill
from spec_jax.models import dflash as df
from spec_jax.models.cache import KVCache
from spec_jax.testing import tiny
from spec_jax.train import core
from spec_jax.train import dflash as tdf

CFG = tiny.TARGET
DF = df.DFlashConfig.for_target(CFG, num_layers=2, block_size=4)
TOKENS = jnp.array([[1, 2, 3, 4, 5, 6, 7, 8, 9, 10], [5, 9, 2, 8, 3, 3, 1, 0, 0, 0]], jnp.int32)
VALID = jnp.arange(10)[None, :] < jnp.array([[10], [7]])


@jax.jit
def _inference_logits(target, params, tokens_bt, anchor_b):
    """The drafter's block logits after a prefill of each row's first `anchor_b` tokens,
    with x_anchor pending: [B, B_s - 1, V]."""
    drafter, slots = DFlashDrafter(DF), 24
    batch, t = tokens_bt.shape
    prompt_bt = jnp.where(jnp.arange(t)[None, :] < anchor_b[:, None], tokens_bt, 0)
    cache = KVCache.init(CFG, batch, slots)
    _, taps, _ = prefill(CFG, target, cache, prompt_bt, anchor_b, drafter.tap_layers)
    history = jnp.zeros((batch, slots), jnp.int32).at[:, :t].set(tokens_bt)
    state = drafter.init(params, history, anchor_b, t, taps)
    return drafter.block_logits(params, state, anchor_b, DF.max_drafts)[0]


def test_training_blocks_are_the_inference_blocks():
    """Rows anchored at different positions: the training forward (whole-text context masked
    below the anchor) gives the inference forward's logits (cached context of a prefill),
    so what training fits is what the drafter proposes."""
    target = tiny.target_params()
    params = df.init_params(DF, jax.random.PRNGKey(1), std=0.3)
    drafter_params = DFlashDrafter.params_for(params, target)
    taps = core.teacher_taps(CFG, target, TOKENS, VALID, DF.taps)
    anchors = jnp.array([[3, 6], [2, 5]], jnp.int32)
    train = tdf.block_logits(DF, params, target['embed_vd'], drafter_params['head_vd'], taps,
                             TOKENS, anchors)  # fmt: skip
    for n in range(2):
        infer = _inference_logits(target, drafter_params, TOKENS, anchors[:, n])
        np.testing.assert_allclose(np.asarray(train[:, n]), np.asarray(infer), atol=1e-4)
    assert np.abs(np.asarray(train[:, 0] - train[:, 1])).max() > 1e-2  # Anchors differ.


def test_steps_lower_the_loss_on_a_fixed_batch():
    """40 AdamW steps on one batch: the weighted block loss falls by more than a tenth (a
    gradient that does not reach the parameters, or a loss on the wrong positions, does
    not)."""
    target = tiny.target_params()
    params = df.init_params(DF, jax.random.PRNGKey(2))
    head_vd = DFlashDrafter.params_for(params, target)['head_vd']
    teacher, _ = core.teacher_forward(CFG, target, TOKENS, VALID)
    taps = core.teacher_taps(CFG, target, TOKENS, VALID, DF.taps)
    optimizer = core.make_optimizer(3e-3, 40, 5)
    state = dict(params=params, opt_state=optimizer.init(params), step=0)
    step = tdf.make_train_step(DF, optimizer, anchors=4)
    losses = []
    for _ in range(40):
        key = jax.random.PRNGKey(0)  # The same anchors every step: one fixed batch.
        state, loss, aux, _ = step(state, key, target['embed_vd'], head_vd, taps, teacher,
                                   TOKENS, VALID, VALID)  # fmt: skip
        losses.append(float(loss))
        assert int(aux['positions']) > 0
    assert losses[-1] < 0.9 * losses[0], losses
