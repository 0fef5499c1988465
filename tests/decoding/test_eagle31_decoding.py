"""Greedy chain decoding with an EAGLE-3.1 head (fc_norm, norm_output) equals greedy AR."""

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax import decoding
from spec_jax.decoding.drafters import Eagle3Drafter
from spec_jax.models import eagle3 as e3
from spec_jax.testing import tiny

HEAD31 = tiny.HEAD.replace(fc_norm=True, norm_output=True)


def test_greedy_eagle31_chain_equals_greedy_ar():
    """Batch 3, two drafts a round, so the second draft runs on the fed-back normed hidden."""
    target = tiny.target_params()
    rng = np.random.default_rng(5)
    shapes = jax.eval_shape(lambda: e3.init_params(HEAD31, jax.random.PRNGKey(0)))  # no compile
    params = jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(np.float32), shapes)
    params['fc_norm_ed'] = rng.uniform(0.5, 1.5, params['fc_norm_ed'].shape).astype(np.float32)
    for norm in ('hidden_norm', 'input_norm', 'mlp_norm'):  # Unit norms, as Flax's init.
        params['midlayer'][norm]['scale'] = np.ones_like(params['midlayer'][norm]['scale'])
    params = e3.init_from_target(HEAD31, params, target, jnp.asarray(tiny.DRAFT_IDS))
    d2t, t2d = e3.vocab_maps(tiny.DRAFT_IDS, tiny.V)
    head = e3.Eagle3Head(HEAD31, params, jnp.asarray(d2t), jnp.asarray(t2d))
    greedy = decoding.generate(
        decoding.Engine(tiny.TARGET, tiny.DECODE), decoding.Params(target), tiny.PROMPTS
    )
    chain = decoding.Engine(tiny.TARGET, tiny.DECODE, Eagle3Drafter(HEAD31), 2)
    params = decoding.Params(target, Eagle3Drafter.params_for(head, target))
    result = decoding.generate(chain, params, tiny.PROMPTS)
    assert result.tokens == greedy.tokens
    assert result.stats['blocks'] > 0 and sum(result.stats['per_row']['accepted']) > 0
