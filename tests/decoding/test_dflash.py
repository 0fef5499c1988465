"""The DFlash block drafter and DDTree: greedy equals AR (chain and tree, batch 3), every
rule verifies its block, DDTree's lossless law is the target's, and the released format's
loader (on synthesized files)."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from spec_jax import checkpoints, decoding, rules
from spec_jax.checkpoints import dflash_format
from spec_jax.decoding import drafters, trees
from spec_jax.decoding.drafters import DFlashDrafter
from spec_jax.decoding.state import DecodeSettings, prefill
from spec_jax.decoding.verification import raw_inputs
from spec_jax.models import dflash as df
from spec_jax.models.cache import KVCache
from spec_jax.models.llama import causal_forward, forward
from spec_jax.sampling import Sampler
from spec_jax.testing import random_params, tiny

V, CFG, PROMPTS, DEC = tiny.V, tiny.TARGET, tiny.PROMPTS, tiny.DECODE
DF = df.DFlashConfig.for_target(CFG, num_layers=2, block_size=5)
DDTREE = trees.TreeShape(nodes=10, depth=4, branch=5)
SAMPLER = Sampler(temperature=1.0)


def draft_params(target, seed=0):
    return DFlashDrafter.params_for(df.init_params(DF, jax.random.PRNGKey(seed), std=0.3), target)


@pytest.fixture(scope='module')
def models():
    target = tiny.target_params()
    return target, draft_params(target)


def run(models, prompts=PROMPTS, dec=DEC, **fields):
    eng = decoding.Engine(CFG, dec, drafter=DFlashDrafter(DF), **fields)
    return decoding.generate(eng, decoding.Params(*models), prompts)


def test_greedy_chain_and_ddtree_equal_greedy_ar(models):
    ar = decoding.generate(decoding.Engine(CFG, DEC), decoding.Params(models[0]), PROMPTS)
    chain = run(models, num_draft=DF.max_drafts)
    tree = run(models, tree=DDTREE)
    assert chain.tokens == ar.tokens
    assert tree.tokens == ar.tokens
    # The DDTree rounds committed drafted nodes (random weights: the top-5 marginals of 31
    # ids hold the target's argmax now and then), so commits of several tokens are tested.
    assert tree.stats['block_efficiency'] > 1.0
    assert max(max(b) for b in tree.stats['per_row']['block_accepted']) >= 1
    with pytest.raises(ValueError, match='do not fit a DFlash block of size 5'):
        run(models, num_draft=5)
    with pytest.raises(ValueError, match='dynamic trees'):
        run(models, tree=trees.TreeShape.chain(3))


@jax.jit
def _block(target, params, prompt_bp, lengths_b, key_b):
    """A prefilled batch's first DFlash proposal (T 1) and the target's laws over it."""
    drafter = DFlashDrafter(DF)
    bucket, slots = prompt_bp.shape[1], 32
    cache = KVCache.init(CFG, prompt_bp.shape[0], slots)
    logits_bv, taps_bped, cache = prefill(CFG, target, cache, prompt_bp, lengths_b,
                                          drafter.tap_layers)  # fmt: skip
    pending_b = jnp.argmax(logits_bv, -1).astype(jnp.int32)
    history_bs = jnp.zeros((prompt_bp.shape[0], slots), jnp.int32).at[:, :bucket].set(prompt_bp)
    history_bs = history_bs.at[jnp.arange(prompt_bp.shape[0]), lengths_b].set(pending_b)
    state = drafter.init(params, history_bs, lengths_b, bucket, taps_bped)
    a = DF.max_drafts
    _, x_ba, q_bav = drafter.propose(params, state, history_bs, lengths_b, key_b, a, SAMPLER.probs)
    verify_bt = jnp.concatenate([pending_b[:, None], x_ba], 1)
    t = verify_bt.shape[1]  # The target's verification forward after the prompt.
    logits_btv, _, _ = forward(CFG, target, verify_bt, cache.positions(t), cache,
                               cache.causal_mask(t))  # fmt: skip
    return history_bs, x_ba, q_bav, logits_btv


def test_every_rule_verifies_a_dflash_block(models):
    """Smoke over the registry at one shape: every rule's `verify_chain` on a DFlash block
    (q: the block's per-position marginals at T 1) keeps 0..A drafts and emits ids in V."""
    target, params = models
    prompts = [p + [0] * (16 - len(p)) for p in PROMPTS]
    lengths = jnp.array([len(p) for p in PROMPTS], jnp.int32)
    keys = jax.random.split(jax.random.PRNGKey(0), len(PROMPTS))
    history, x_ba, q_bav, logits = _block(target, params, jnp.array(prompts), lengths, keys)
    np.testing.assert_allclose(np.asarray(q_bav).sum(-1), 1.0, atol=1e-5)
    picked = np.take_along_axis(np.asarray(q_bav), np.asarray(x_ba)[..., None], -1)
    assert (picked > 0).all()  # Each draft was drawn from its own q row.
    accepted_rb, tokens_rba = _verify_all(keys, logits, q_bav, x_ba, history, lengths)
    assert ((accepted_rb >= 0) & (accepted_rb <= DF.max_drafts)).all()
    assert ((tokens_rba >= 0) & (tokens_rba < V)).all()


@jax.jit
def _verify_all(keys, logits_btv, q_bav, x_ba, history_bs, lengths_b):
    """Every registered rule's `verify_chain` on one block, in one compiled program:
    (accepted [R, B], tokens [R, B, A + 1]) for the R rules."""
    p_btv = SAMPLER.probs(logits_btv)
    accepted, tokens = [], []
    for name in rules.names():
        rule = rules.make(name)
        extra = {}
        if rule.needs_logits:
            extra = {'raw': raw_inputs(SAMPLER, logits_btv, q_bav, history_bs, lengths_b + 1)}
        out = rules.verify_chain(rule, keys, p_btv, q_bav, x_ba, **extra)
        accepted.append(out.num_accepted)
        tokens.append(out.tokens)
    return jnp.stack(accepted), jnp.stack(tokens)


@jax.jit
def _laws_after(target, params, text_bp, lengths_b, pending_b, extra_bt, garbage_b):
    """The DFlash q of a round, after prefill of `text_bp` and, when `extra_bt` [B, T - 1]
    is not empty, after a verification of [s, extra..., garbage] that committed every
    extra token (the garbage one rejected)."""
    drafter, batch, slots = DFlashDrafter(DF), text_bp.shape[0], 32
    bucket = text_bp.shape[1]
    cache = KVCache.init(CFG, batch, slots)
    _, taps_bped, cache = prefill(CFG, target, cache, text_bp, lengths_b, drafter.tap_layers)
    rows = jnp.arange(batch)
    history_bs = jnp.zeros((batch, slots), jnp.int32).at[:, :bucket].set(text_bp)
    t = extra_bt.shape[1] + 1
    first_b = pending_b if t == 1 else extra_bt[:, 0]
    history_bs = history_bs.at[rows, lengths_b].set(first_b)
    state = drafter.init(params, history_bs, lengths_b, bucket, taps_bped)
    committed_b = lengths_b
    if t > 1:  # Verify [first, extra[1:], garbage]; commit all but the garbage.
        verify_bt = jnp.concatenate([extra_bt, garbage_b[:, None]], 1)
        _, taps_bted, cache = forward(
            CFG,
            target,
            verify_bt,
            cache.positions(t),
            cache,
            cache.causal_mask(t),
            tap_layers=drafter.tap_layers,
        )
        for j in range(1, t - 1):
            history_bs = history_bs.at[rows, lengths_b + j].set(extra_bt[:, j])
        committed_b = lengths_b + t - 1
        history_bs = history_bs.at[rows, committed_b].set(pending_b)
        state = drafter.observe(params, state, history_bs, lengths_b, committed_b, taps_bted)
    keys = jax.random.split(jax.random.PRNGKey(0), batch)
    return drafter.propose(params, state, history_bs, committed_b, keys, DF.max_drafts,
                           SAMPLER.probs)[2]  # fmt: skip


def test_laws_after_a_verification_are_those_of_a_fresh_prefill(models):
    """The context cache's bookkeeping: after a verification that committed 3 tokens of
    each row (a rejected draft's taps written past C), the block's laws equal those of a
    prefill of the whole committed text (rows of different lengths), to fp32 rounding."""
    target, params = models
    short = [[1, 2, 3], [4, 5, 6, 7, 8, 9]]
    extra = [[11, 12, 13], [14, 15, 16]]
    pending = jnp.array([17, 18], jnp.int32)

    def padded(rows):
        return jnp.array([r + [0] * (16 - len(r)) for r in rows], jnp.int32)

    after = _laws_after(
        target,
        params,
        padded(short),
        jnp.array([3, 6], jnp.int32),
        pending,
        jnp.array(extra, jnp.int32),
        jnp.array([19, 20], jnp.int32),
    )
    whole = [s + e for s, e in zip(short, extra)]
    fresh = _laws_after(
        target,
        params,
        padded(whole),
        jnp.array([6, 9], jnp.int32),
        pending,
        jnp.zeros((2, 0), jnp.int32),
        jnp.zeros((2,), jnp.int32),
    )
    np.testing.assert_allclose(np.asarray(after), np.asarray(fresh), atol=2e-5)
    assert tv(np.asarray(after)[0, 0], np.asarray(after)[1, 0]) > 1e-3  # Rows differ.


# ---- DDTree's law ---------------------------------------------------------------------------
# N rows of one prompt are independent samples of tokens 1-3. With a law over V = 31 ids,
# E[TV(empirical, law)] <= 0.5 * sqrt(V / N) = 0.044 at N = 4000; the bound is 0.06 (fixed
# seed), so a verifier whose law is more than 0.12 from the target's in TV fails.
N, TV_BOUND, PROMPT = 4000, 0.06, [3, 1, 4, 1, 5]


def tv(a, b):
    return 0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum(-1)


def target_laws(target):
    """Tokens 1-3 of plain sampling from the target at T 1: [3, V]."""
    laws, chance, tails = [], np.ones(1), [[]]
    for _ in range(3):
        logits, _ = causal_forward(CFG, target, jnp.asarray([PROMPT + t for t in tails]))
        p = np.asarray(SAMPLER.probs(logits[:, -1]), np.float64)
        joint = chance[:, None] * p
        laws.append(joint.sum(0))
        chance, tails = joint.reshape(-1), [t + [x] for t in tails for x in range(V)]
    return np.stack(laws)


def test_lossless_ddtree_follows_the_target():
    """The target-only walk over DDTree's deterministic tree, lossless rule, T 1: tokens 1-3
    follow the target's law within TV_BOUND (above). A peaked target (max p ~0.7) makes the
    tree's top-5 marginals hold the sampled token often enough that rounds commit paths."""
    target = random_params(CFG, seed=7, embed_scale=8.0)
    dec = DecodeSettings(max_new_tokens=3, prompt_bucket=8, new_tokens_bucket=8)
    result = run((target, draft_params(target)), [PROMPT] * N, dec, tree=DDTREE,
                 sampler=SAMPLER, rule=rules.make('lossless'))  # fmt: skip
    assert result.stats['block_efficiency'] > 1.05
    tokens = np.array(result.tokens)
    laws = target_laws(target)
    for k in range(3):
        got = np.bincount(tokens[:, k], minlength=V) / N
        assert tv(got, laws[k]) < TV_BOUND, f'token {k + 1}'


# ---- the released format ---------------------------------------------------------------------


def test_loader_reads_the_released_format_and_names_bad_tensors(tmp_path, models):
    target, params = models
    directory = str(tmp_path / 'dflash')
    dflash_format.save(directory, DF, params['dflash'])
    with open(os.path.join(directory, 'config.json')) as f:
        config = json.load(f)
    assert config['architectures'] == ['DFlashDraftModel']
    assert config['dflash_config']['target_layer_ids'] == [t - 1 for t in DF.taps]
    state = load_file(os.path.join(directory, 'model.safetensors'))
    assert state['fc.weight'].shape == (DF.width, len(DF.taps) * DF.width)
    assert state['layers.1.self_attn.q_proj.weight'].shape == (DF.num_heads * DF.head_dim,
                                                               DF.width)  # fmt: skip
    cfg, loaded = dflash_format.load(directory, CFG)
    assert cfg == DF
    jax.tree.map(np.testing.assert_array_equal, loaded, params['dflash'])
    built = drafters.make('dflash', checkpoints.LoadedModel(CFG, target, None), directory)
    assert isinstance(built.drafter, DFlashDrafter) and built.drafter.cfg == DF

    def broken(change):
        bad = dict(state)
        change(bad)
        save_file(bad, os.path.join(directory, 'model.safetensors'))
        return pytest.raises(checkpoints.CheckpointError)

    with broken(lambda s: s.pop('layers.0.self_attn.k_norm.weight')) as e:
        dflash_format.load(directory, CFG)
    assert 'layers.0.self_attn.k_norm.weight' in str(e.value)
    with broken(lambda s: s.update({'layers.1.mlp.up_proj.weight': np.zeros((3, 4), np.float32)})
                ) as e:  # fmt: skip
        dflash_format.load(directory, CFG)
    assert 'layers.1.mlp.up_proj.weight' in str(e.value) and '(3, 4)' in str(e.value)
    extra = 'candidate_selector.predecessor_codebook'  # A DFlash2 tensor.
    with broken(lambda s: s.update({extra: state['norm.weight']})) as e:
        dflash_format.load(directory, CFG)
    assert extra in str(e.value)
    for change, message in [
        ({'architectures': ['DFlash2DraftModel']}, 'DFlash2DraftModel'),
        ({'dflash_config': {**config['dflash_config'], 'target_layer_ids': []}},
         'target_layer_ids'),
        ({'layer_types': ['sliding_attention'] * 2}, 'sliding_attention'),
    ]:  # fmt: skip
        with open(os.path.join(directory, 'config.json'), 'w') as f:
            json.dump({**config, **change}, f)
        with pytest.raises(checkpoints.CheckpointError, match=message):
            dflash_format.load(directory, CFG)
    with pytest.raises(ValueError, match=r'taps \[3\] are outside'):
        DFlashDrafter(df.DFlashConfig.for_target(CFG, taps=(3,))).check(CFG)
