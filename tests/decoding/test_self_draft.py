"""The target as its own draft (`SelfDrafter`, q = p): greedy exactness in chain and tree
rounds, and the acceptance q = p must give (every draft of a chain at T 0 and T 1; the first
sibling of every tree node is the target's argmax, so every tree round accepts a draft)."""

import jax
import jax.numpy as jnp
import pytest

from spec_jax import decoding, rules
from spec_jax.decoding import engine, trees
from spec_jax.decoding.drafters import SelfDrafter
from spec_jax.sampling import Sampler
from spec_jax.testing import loop_copies, tiny

CFG, PROMPTS, DEC = tiny.TARGET, tiny.PROMPTS, tiny.DECODE
SHAPE = trees.TreeShape(nodes=7, depth=3, branch=2)


@pytest.fixture(scope='module')
def target():
    return tiny.target_params()


def run(target, **fields):
    eng = decoding.Engine(CFG, DEC, **fields)
    draft = None if isinstance(eng.drafter, decoding.drafters.NoDrafter) else target
    return decoding.generate(eng, decoding.Params(target, draft), PROMPTS)


def test_greedy_chain_and_tree_equal_ar_and_accept_as_q_equals_p(target):
    ar = run(target)
    chain = run(target, drafter=SelfDrafter(CFG), num_draft=3)
    tree = run(target, drafter=SelfDrafter(CFG), tree=SHAPE)
    assert chain.tokens == ar.tokens
    assert tree.tokens == ar.tokens
    # q = p: greedy drafts are the target's argmax, so every drafted token is accepted.
    assert chain.stats['acceptance_rate'] == 1.0
    # The tree's first sibling at each node is the argmax: no round accepts nothing.
    assert min(min(b) for b in tree.stats['per_row']['block_accepted']) >= 1


def test_chain_updates_its_cache_in_place(target):
    """A chain round's draft steps write the drafter's cache in place: no per-round copy of
    a layer's keys or values (its chain once returned the cache from before its steps,
    which XLA copied every round: this check failed on it)."""
    eng = decoding.Engine(CFG, DEC, SelfDrafter(CFG), 3)
    prompts_bp = jnp.asarray([[1, 2, 3, 0, 0, 0, 0, 0], [4, 5, 0, 0, 0, 0, 0, 0]], jnp.int32)
    args = (prompts_bp, jnp.array([3, 2], jnp.int32), jnp.array([20, 20], jnp.int32),
            jnp.arange(2, dtype=jnp.int32), jax.random.key(0))  # fmt: skip
    hlo = engine.decode_loop.lower(eng, target, target, *args).compile().as_text()
    assert loop_copies(hlo, CFG.num_kv_heads * eng.slots(8) * CFG.head_dim // 2) == []


def test_sampled_chain_accepts_every_draft_at_q_equal_p(target):
    """T 1, lossless: a draft is rejected with probability TV(p, q) ~ 1e-6 at q = p; a cache
    or window off by one position makes q another law and rejects some of 45 drafts (the
    tiny target's p is far from one-hot)."""
    res = run(target, drafter=SelfDrafter(CFG), num_draft=3, sampler=Sampler(temperature=1.0),
              rule=rules.make('lossless'))  # fmt: skip
    assert res.stats['acceptance_rate'] == 1.0
    assert sum(res.stats['per_row']['drafted']) >= 45


def test_refuses_static_trees_and_rounds_past_its_window(target):
    with pytest.raises(ValueError, match='dynamic trees'):
        run(target, drafter=SelfDrafter(CFG), tree=trees.TreeShape.chain(3))
    with pytest.raises(ValueError, match='raise window'):
        run(target, drafter=SelfDrafter(CFG, window=3), num_draft=3)
