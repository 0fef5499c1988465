"""Chain speculative decoding: greedy exactness, lossless laws, lossy laws, stopping."""

import dataclasses
import math

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import decoding, rules
from spec_jax.decoding import batching, engine
from spec_jax.decoding.drafters import LMDrafter, NgramDrafter, PromptLookup, lookup
from spec_jax.decoding.state import DecodeSettings, row_limits
from spec_jax.decoding.stats import METER_RTOL, Stats, summarize
from spec_jax.models.config import ModelConfig
from spec_jax.models.llama import causal_forward
from spec_jax.sampling import Sampler
from spec_jax.testing import loop_copies, random_params, tiny

V, CFG, DRAFT_CFG = tiny.V, tiny.TARGET, tiny.DRAFT
PROMPTS, DEC = tiny.PROMPTS, tiny.DECODE


def gen(target, drafter, draft, prompts, num_draft, dec=DEC, seed=0, max_new_tokens=None,
        sample_ids=None, **engine_fields):  # fmt: skip
    """The engine's host entry point with a chain engine of these parts."""
    chain = decoding.Engine(CFG, dec, drafter, num_draft, **engine_fields)
    return decoding.generate(
        chain, decoding.Params(target, draft), prompts, seed=seed,
        max_new_tokens=max_new_tokens, sample_ids=sample_ids,
    )  # fmt: skip


def ar_gen(target, prompts, dec=DEC, **kw):
    return decoding.generate(decoding.Engine(CFG, dec), decoding.Params(target), prompts, **kw)


@pytest.fixture(scope='module')
def target():
    return tiny.target_params()


@pytest.fixture(scope='module')
def draft():
    return tiny.draft_params()


@pytest.fixture(scope='module')
def greedy_ar(target):
    return ar_gen(target, PROMPTS).tokens


@pytest.mark.parametrize('num_draft', [1, pytest.param(3, marks=pytest.mark.gpu), 5])
def test_greedy_speculative_equals_greedy_ar(target, draft, greedy_ar, num_draft):
    result = gen(target, LMDrafter(DRAFT_CFG), draft, PROMPTS, num_draft)
    assert result.tokens == greedy_ar
    assert 0 < result.stats['acceptance_rate'] < 1  # A real mix of accepts and rejects.
    # The target as its own draft accepts every draft: A + 1 tokens per block.
    perfect = gen(target, LMDrafter(CFG), target, PROMPTS, num_draft)
    assert perfect.tokens == greedy_ar
    assert perfect.stats['acceptance_rate'] == 1.0
    assert perfect.stats['block_efficiency'] == num_draft + 1


def test_greedy_with_other_drafters_and_batch_one(target, draft, greedy_ar):
    ngram = gen(target, NgramDrafter(2, V), None, PROMPTS, 3)
    assert ngram.tokens == greedy_ar
    looked_up = PromptLookup(LMDrafter(DRAFT_CFG), 2, 1)
    assert gen(target, looked_up, draft, PROMPTS, 3).tokens == greedy_ar
    single = gen(target, LMDrafter(DRAFT_CFG), draft, PROMPTS[1:2], 3)
    assert single.tokens == greedy_ar[1:2]


def test_draft_vocabulary_that_differs_only_by_padding():
    """A draft whose embedding table is the target's tokenizer with other padding rows:
    target V = 67 with a 61-row draft (q = 0 on ids 61-66), and V = 61 with a 67-row
    draft (its extra rows cut), both give greedy AR's tokens; undeclared, it is refused."""
    for v_target, v_draft in ((67, 61), (61, 67)):
        cfg = ModelConfig.tiny(vocab_size=v_target)
        draft_cfg = dataclasses.replace(DRAFT_CFG, vocab_size=v_draft)
        target = random_params(cfg, seed=3, std=0.16)
        draft = random_params(draft_cfg, seed=4, std=0.16)
        plain = decoding.generate(decoding.Engine(cfg, DEC), decoding.Params(target), PROMPTS)
        chain = decoding.Engine(cfg, DEC, LMDrafter(draft_cfg, vocab_size=v_target), 3)
        result = decoding.generate(chain, decoding.Params(target, draft), PROMPTS)
        assert result.tokens == plain.tokens
        assert 0 < result.stats['acceptance_rate'] < 1
        with pytest.raises(ValueError, match=f'drafts over {v_draft} ids .* has {v_target}'):
            decoding.Engine(cfg, DEC, LMDrafter(draft_cfg), 3).check()


def test_greedy_rule_equals_greedy_ar(target, draft, greedy_ar):
    """The greedy rule emits the target's argmax whatever the temperature: at T 1 (where
    the draft samples) its first token and every later one equal greedy AR's."""
    for temperature in (0.0, 1.0):
        sampler = Sampler(temperature=temperature)
        for num_draft in (0, 3):
            drafter = LMDrafter(DRAFT_CFG) if num_draft else None
            result = gen(target, drafter, draft, PROMPTS, num_draft, rule=rules.make('greedy'),
                         sampler=sampler, seed=5)  # fmt: skip
            assert result.tokens == greedy_ar, (temperature, num_draft)


def test_stops_and_limits(target, draft, greedy_ar):
    free = greedy_ar
    stop = free[1][6]
    dec = DecodeSettings(
        max_new_tokens=20, prompt_bucket=8, new_tokens_bucket=8, stop_tokens=(stop,), pad_id=0
    )
    limits = [20, 20, 5]
    for num_draft in (2, 5):
        result = gen(target, LMDrafter(DRAFT_CFG), draft, PROMPTS, num_draft, dec,
                     max_new_tokens=limits)  # fmt: skip
        for got, want, limit in zip(result.tokens, free, limits):
            cut = want.index(stop) + 1 if stop in want[:limit] else limit
            assert got == want[:cut]


def test_sampled_rows_end_at_their_first_stop_token(soft_models):
    """Sampling, with a stop token the target often picks: every row ends at its first stop
    token (also when it is the very first token, or mid-block) or at the limit."""
    target, draft = soft_models
    sampler = Sampler(temperature=1.0)
    p1 = np.asarray(next_probs(target, [PROMPT], sampler))[0]
    stop = int(p1.argmax())
    dec = DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8,
                         stop_tokens=(stop,))  # fmt: skip
    rows = gen(target, LMDrafter(DRAFT_CFG), draft, [PROMPT] * 300, 3, dec,
               sampler=sampler).tokens  # fmt: skip
    for row in rows:  # Cut just after the first stop token within the limit, else at it.
        assert len(row) == (row.index(stop) + 1 if stop in row[:12] else 12)
    # The run covered the cases: a stop as the first token, and stops at 5+ later lengths.
    stopped_at = {len(row) for row in rows if row[-1] == stop}
    assert min(stopped_at) == 1
    assert len(stopped_at - {1, 12}) >= 5


def test_statistics_match_a_host_replay(target, draft):
    """Greedy, the engine's counters equal a replay on the host: the draft's argmax chain
    from each block's context against the target's greedy text (a draft is accepted iff
    it is the target's token there), with per-row limits that end rows mid-block."""
    a, limits = 3, [20, 11, 6]
    got = gen(target, LMDrafter(DRAFT_CFG), draft, PROMPTS, a, max_new_tokens=limits).stats
    # The target's text past each limit, for the last block's drafts.
    longer = DecodeSettings(max_new_tokens=20 + a + 1, prompt_bucket=8, new_tokens_bucket=8)
    text = ar_gen(target, PROMPTS, longer).tokens

    width = 48  # Right padding leaves a causal model's logits at real positions unchanged.
    draft_argmax = jax.jit(lambda toks: causal_forward(DRAFT_CFG, draft, toks)[0].argmax(-1))

    def draft_next(context):
        row = np.zeros((1, width), np.int32)
        row[0, : len(context)] = context
        return int(draft_argmax(jnp.asarray(row))[0, len(context) - 1])

    for r, (prompt, limit) in enumerate(zip(PROMPTS, limits)):
        emitted, block_accepted = 1, []  # Prefill emits the first token.
        reached, accepted_at = np.zeros(a), np.zeros(a)
        while emitted < limit:
            context, n = list(prompt) + text[r][:emitted], 0
            while n < a:
                reached[n] += 1
                guess = draft_next(context)
                if guess != text[r][emitted + n]:
                    break
                accepted_at[n] += 1
                context, n = context + [guess], n + 1
            block_accepted.append(n)
            emitted += n + 1
        row = {k: v[r] for k, v in got['per_row'].items()}
        assert row['block_accepted'] == block_accepted
        assert row['blocks'] == len(block_accepted)
        assert row['accepted'] == sum(block_accepted)
        assert row['drafted'] == a * len(block_accepted)
        assert row['block_efficiency'] == pytest.approx(1 + np.mean(block_accepted))
        np.testing.assert_allclose(
            row['acceptance_at_position'], accepted_at / np.maximum(reached, 1), rtol=1e-6
        )
    assert 0 < got['acceptance_rate'] < 1  # Both accepts and rejects were replayed.
    assert got['blocks'] == sum(got['per_row']['blocks'])


def test_ngram_rounds_verify_only_the_matched_drafts(target, greedy_ar):
    """The n-gram drafter's rounds are as wide as its matched continuation (0: an AR step):
    the row's counters equal a host replay of lookup on its greedy text."""
    a = 3
    got = gen(target, NgramDrafter(2, V), None, PROMPTS[:1], a)
    assert got.tokens == greedy_ar[:1]
    text, emitted, widths, block_accepted = list(PROMPTS[0]) + greedy_ar[0], 1, [], []
    while emitted < DEC.max_new_tokens:
        end = len(PROMPTS[0]) + emitted - 1  # The pending token's index.
        history = jnp.asarray([text[: end + 1] + [0] * a])
        tokens, known = (np.asarray(x)[0] for x in lookup(history, jnp.asarray([end]), a, 2))
        width, n = int(known.sum()), 0
        while n < width and tokens[n] == text[end + 1 + n]:
            n += 1
        widths.append(width)
        block_accepted.append(n)
        emitted += n + 1
    row = {k: v[0] for k, v in got.stats['per_row'].items()}
    assert row['block_accepted'] == block_accepted
    assert row['drafted'] == sum(widths)
    assert 0 in widths and max(widths) > 0  # Both a plain step and a verification ran.
    assert got.stats['acceptance_rate'] == pytest.approx(sum(block_accepted) / sum(widths))


# ---- laws ----------------------------------------------------------------------------------
# Many rows with one prompt are independent samples (every row draws its own noise). With
# N rows and a law over V = 31 tokens, E[TV(empirical, law)] <= 0.5 * sum_v sqrt(p_v / N)
# <= 0.5 * sqrt(V / N) = 0.044 at N = 4000; we allow 0.06 and use fixed seeds.
N = 4000
TV_BOUND = 0.06
PROMPT = [3, 1, 4, 1, 5]
LOSSLESS = rules.Lossless()


def next_probs(params, contexts, sampler, transform=lambda p: p, cfg=CFG):
    """Exact processed probabilities after each context (same length) [C, V]."""
    logits, _ = causal_forward(cfg, params, jnp.asarray(contexts))
    return transform(sampler.probs(logits[:, -1]))


def sample_rows(target, draft, sampler, seed=0, drafter=None, rule=LOSSLESS,
                baseline=False, num_draft=2):  # fmt: skip
    dec = DecodeSettings(max_new_tokens=3, prompt_bucket=8, new_tokens_bucket=8)
    drafter = drafter or LMDrafter(DRAFT_CFG)
    result = gen(target, drafter, draft, [PROMPT] * N, num_draft, dec, seed=seed, rule=rule,
                 baseline=baseline, sampler=sampler)  # fmt: skip
    return np.array(result.tokens)


def empirical(tokens, v=V):
    return np.bincount(tokens, minlength=v) / len(tokens)


def tv(a, b):
    return 0.5 * np.abs(np.asarray(a) - np.asarray(b)).sum()


@pytest.fixture(scope='module')
def soft_models():
    """A peaked (max p ~0.7, H ~1.4 nats) target and a different draft, at temperature 1."""
    return (
        random_params(CFG, seed=7, embed_scale=8.0),
        random_params(DRAFT_CFG, seed=8, embed_scale=8.0),
    )


def token_laws(target, draft, sampler, position_law, transform=lambda p: p):
    """Exact laws of generated tokens 1, 2, 3 [3, V].

    Token 1 is sampled from the target at prefill. Every later token, given the tokens
    before it, follows position_law(p, q) on that context, whichever way it was produced:
    a verified draft, a replacement after a rejection, or the first draft of the next
    block. (With num_draft = 2 token 3 is never a bonus token, whose law is p.) So
    law_k = sum over contexts c of P(c) * position_law(p(.|c), q(.|c)).
    """
    p1 = np.asarray(next_probs(target, [PROMPT], sampler, transform))[0]
    laws, chance, tails = [p1], p1, [[t] for t in range(V)]
    for _ in range(2):
        contexts = [PROMPT + tail for tail in tails]
        p = next_probs(target, contexts, sampler, transform)
        q = next_probs(draft, contexts, sampler, transform, cfg=DRAFT_CFG)
        joint = chance[:, None] * np.asarray(position_law(p, q))  # [contexts, V]
        laws.append(joint.sum(0))
        chance, tails = joint.reshape(-1), [tail + [t] for tail in tails for t in range(V)]
    return np.stack(laws)


def assert_follows(tokens, laws):
    for k, law in enumerate(laws):
        assert tv(empirical(tokens[:, k]), law) < TV_BOUND, f'token {k + 1}'


@pytest.mark.parametrize(
    'name,distinct',
    [
        ('lossless', False),
        ('lenience:l=0.2', True),
        ('cos:lam=0.6', True),
        ('typical:eps=0.2', True),
        ('minp_verify:rho=0.3', False),
        ('speccascade:deferral=token_v1,alpha=0.6', True),
    ],
)
def test_first_tokens_follow_the_rule_law(soft_models, name, distinct):
    """Lossless: tokens 1-3 follow the target. Lossy: tokens 2 and 3 (drafted positions,
    or replacements and next-block drafts) follow rule.induced on the visited contexts."""
    target, draft = soft_models
    sampler = Sampler(temperature=1.0)
    rule = rules.make(name)
    tokens = sample_rows(target, draft, sampler, rule=rule)
    laws = token_laws(target, draft, sampler, rule.induced)
    assert_follows(tokens, laws)
    if distinct:  # The check can tell the rule's law from the target's.
        target_laws = token_laws(target, draft, sampler, lambda p, q: p)
        assert tv(laws[1], target_laws[1]) > 2 * TV_BOUND


def bhc_radius(n: int, v: int = V, delta: float = 1e-6) -> float:
    """r with P(TV(empirical law of n i.i.d. draws, law) >= r) <= delta, from the
    Bretagnolle-Huber-Carol inequality P(sum |p_hat - p| >= eps) <= 2^V exp(-n eps^2 / 2)."""
    return math.sqrt((v * math.log(2.0) + math.log(1.0 / delta)) / (2.0 * n))


@pytest.mark.parametrize('name', ['lossless', 'lenience:l=0.5'])
def test_replacement_and_bonus_tokens_through_the_engine(soft_models, name):
    """With A = 1, round 1 drafts x after the prefill token t1. Rows whose round rejected it
    (their block_accepted[0] is 0) emit t2 from the rule's replacement law at context
    PROMPT + t1; rows that accepted it emit t3 as the bonus, from the target's law one
    position later, at PROMPT + t1 + x. Both conditional laws are computed exactly from the
    models, and each is checked on its own rows.

    Power (N = 20,000 rows, 6-14k on each side; V = 31; BHC radius r <= 0.058 at
    delta = 1e-6 per check): drawing the replacement from p instead of norm((p - q)_+) moves
    the conditional law by TV 0.14 (lossless) / 0.20 (lenience), drawing the bonus from the
    target row of the draft position (p at PROMPT + t1) instead of the next one by TV 0.15;
    the test asserts that each mistake lies more than 2r away, so either makes it fail with
    probability >= 1 - 1e-6. Parameter mistakes (l or lambda off by 0.1) are smaller than
    this radius; tests/rules/test_laws.py catches them on verify_chain itself."""
    target, draft = soft_models
    sampler, rule, n = Sampler(temperature=1.0), rules.make(name), 20_000
    dec = DecodeSettings(max_new_tokens=3, prompt_bucket=8, new_tokens_bucket=8)
    result = gen(target, LMDrafter(DRAFT_CFG), draft, [PROMPT] * n, 1, dec, seed=4, rule=rule,
                 sampler=sampler)  # fmt: skip
    tokens = np.array(result.tokens)
    first_round = np.array([row[0] for row in result.stats['per_row']['block_accepted']])

    p1 = np.asarray(next_probs(target, [PROMPT], sampler))[0]  # Law of t1.
    ctx1 = [PROMPT + [t] for t in range(V)]
    p_c1 = np.asarray(next_probs(target, ctx1, sampler), np.float64)  # [t1, V]
    q_c1 = np.asarray(next_probs(draft, ctx1, sampler, cfg=DRAFT_CFG), np.float64)
    accept = np.asarray(rule.accept_all(jnp.asarray(p_c1), jnp.asarray(q_c1)), np.float64)
    reject_t1 = p1 * (1.0 - (q_c1 * accept).sum(-1))  # P(t1, rejected)
    replacement = np.asarray(rule.replacement(jnp.asarray(p_c1), jnp.asarray(q_c1)))
    want_repl = (reject_t1[:, None] * replacement).sum(0) / reject_t1.sum()
    wrong_repl = (reject_t1[:, None] * p_c1).sum(0) / reject_t1.sum()
    ctx2 = [PROMPT + [t, x] for t in range(V) for x in range(V)]
    p_c2 = np.asarray(next_probs(target, ctx2, sampler), np.float64).reshape(V, V, V)
    joint = p1[:, None] * q_c1 * accept  # P(t1, x, accepted)
    want_bonus = (joint[:, :, None] * p_c2).sum((0, 1)) / joint.sum()
    wrong_bonus = (joint.sum(1)[:, None] * p_c1).sum(0) / joint.sum()

    rejected, accepted = first_round == 0, first_round == 1
    for got, want, wrong, rows in [
        (tokens[rejected, 1], want_repl, wrong_repl, rejected.sum()),
        (tokens[accepted, 2], want_bonus, wrong_bonus, accepted.sum()),
    ]:
        r = bhc_radius(int(rows))
        assert rows > 5000 and r < 0.058
        assert tv(want, wrong) > 2 * r  # The guarded mistake is detectable...
        assert tv(empirical(got), want) < r  # ...the engine's draws follow the true law...
        assert tv(empirical(got), wrong) > r  # ...and not the mistaken one.


def test_prompt_lookup_keeps_the_target_law(soft_models):
    """Looked-up drafts carry one-hot q: lossless verification still gives the target's
    law. PROMPT repeats tokens, so the first drafted position is looked up whenever the
    first token is one of them."""
    target, draft = soft_models
    sampler = Sampler(temperature=1.0)
    drafter = PromptLookup(LMDrafter(DRAFT_CFG), 2, 1)
    tokens = sample_rows(target, draft, sampler, 2, drafter)
    laws = token_laws(target, draft, sampler, lambda p, q: p)
    assert laws[0][list(set(PROMPT))].sum() > 0.2  # Lookup fires on a fair share of rows.
    assert_follows(tokens, laws)


def test_ngram_rounds_keep_the_target_law(soft_models):
    """The n-gram drafter under lossless verification, its rounds as wide as the longest
    live row's match (shorter rows verify their filler), gives the target's law."""
    target, draft = soft_models
    sampler = Sampler(temperature=1.0)
    tokens = sample_rows(target, None, sampler, 3, NgramDrafter(2, V))
    assert_follows(tokens, token_laws(target, draft, sampler, lambda p, q: p))


def test_lookup_finds_the_latest_longest_match():
    history = jnp.array(
        [
            [5, 6, 7, 8, 9, 5, 6, 7, 0, 0],  # "5 6 7" before: propose 8 9 5 6
            [1, 2, 3, 4, 2, 3, 0, 0, 0, 0],  # "2 3" at 1..2: 4 2 3, then past the text
            [1, 2, 3, 4, 0, 0, 0, 0, 0, 0],  # no earlier 4
        ]
    )
    end = jnp.array([7, 5, 3])  # the pending token's index
    tokens, known = lookup(history, end, 4, 3)
    np.testing.assert_array_equal(known, [[1, 1, 1, 1], [1, 1, 1, 0], [0, 0, 0, 0]])
    np.testing.assert_array_equal(tokens[0], [8, 9, 5, 6])
    np.testing.assert_array_equal(tokens[1, :3], [4, 2, 3])
    _, known = lookup(history, end, 4, 3, min_n=3)  # only 3-grams: row 1 has none
    np.testing.assert_array_equal(known[:, 0], [1, 0, 0])


@pytest.mark.parametrize(
    'name',
    [
        'minp_verify:rho=0.3',  # min-p
        'eta_verify:eta=0.05',  # eta sampling
        'typical:eps=0.2',  # the typical acceptance set (+ argmax)
        'speccascade:deferral=token_v2,alpha=0.3',  # the gap set {p >= max p - alpha}
        'greedy',  # argmax
    ],
)
def test_matched_baseline_equals_truncation_sampling(soft_models, name):
    """Every truncation a matched baseline uses, through the engine: tokens 1-3 follow
    plain truncation sampling of the target."""
    target, draft = soft_models
    sampler = Sampler(temperature=1.0)
    base = rules.matched_baseline(rules.make(name))
    tokens = sample_rows(target, draft, sampler, seed=1, rule=rules.make(name), baseline=True)
    laws = token_laws(target, draft, sampler, lambda p, q: p, base.transform)
    assert_follows(tokens, laws)
    plain = token_laws(target, draft, sampler, lambda p, q: p)
    assert tv(laws[1], plain[1]) > 2 * TV_BOUND  # The truncation changes the law.


@pytest.mark.gpu
def test_distortion_metering(soft_models):
    """Through the engine, every emitted position is metered (the first token, drafts,
    replacement and bonus tokens): lossless and a matched baseline emit their reference law
    (TV 0; the baseline's p_A overshoots p by 1/p(A)), CoS does not; AR rounds are metered
    too."""
    target, draft = soft_models
    dec = DecodeSettings(max_new_tokens=8, prompt_bucket=8, new_tokens_bucket=8)
    sampler = Sampler(temperature=1.0)
    cases = [('lossless', False, 3), ('cos:lam=0.8', False, 3), ('minp_verify:rho=0.3', True, 3),
             ('minp_verify:rho=0.3', False, 0)]  # fmt: skip
    for name, baseline, num_draft in cases:
        if num_draft:
            result = gen(target, LMDrafter(DRAFT_CFG), draft, PROMPTS, num_draft, dec,
                         rule=rules.make(name), baseline=baseline, meter_distortion=True,
                         sampler=sampler)  # fmt: skip
        else:
            ar = decoding.Engine(CFG, dec, rule=rules.make(name), meter_distortion=True,
                                 sampler=sampler)  # fmt: skip
            result = decoding.generate(ar, decoding.Params(target), PROMPTS)
        stats, rows = result.stats, result.stats['per_row']
        assert sum(rows['metered']) == sum(rows['emitted']) + len(PROMPTS), name
        if name == 'lossless' or baseline:
            assert stats['mean_tv'] < 1e-5 and stats['mean_kl'] < 1e-5, name
            # The flags at the meter's relative tolerance (a GPU metered lossless's pi/p as
            # 1.0000001): a baseline's p_A overshoots p; neither leaves A.
            assert not stats['outside'], name
            assert stats['overshoots'] == baseline, name
        else:
            assert stats['mean_tv'] > 0.01 and stats['mean_kl'] > 0.001, name
        if name.startswith('minp') and not baseline:  # AR with the rule's bonus law p.
            assert stats['mean_outside'] > 0.01 and stats['outside']
            assert abs(stats['mean_tv'] - stats['mean_outside']) < 1e-5  # TV(p, p_A) = 1-p(A)
        assert stats['max_overshoot'] >= max(stats['overshoot_at_position'])  # + first token
        assert stats['max_overshoot'] == max(rows['max_overshoot'])


@pytest.mark.parametrize('name', ['cos:lam=0.8', 'minp_verify:rho=0.3'])
def test_distortion_per_position_by_hand(name):
    """The metered counters against numpy: at every emitted offset of a live row's round
    (the reached drafts, then the replacement or bonus token), TV(pi, p_A), KL(p_A || pi),
    pi outside A, max pi/p and JS(pi, p_A), where pi is the rule's induced law at drafted
    offsets and its bonus law at the last one."""
    rule = rules.make(name)
    base_rule = rules.matched_baseline(rule)
    verification = engine.Verification(rule, False)
    rng = np.random.default_rng(0)
    b, a = 3, 3
    live = np.array([True, True, False])
    stats = Stats.zeros(b, a, 8)
    sums = {k: np.zeros(b) for k in ('tv', 'kl', 'outside', 'overshoot', 'js')}
    tv_bt, count_bt = np.zeros((b, a + 1)), np.zeros((b, a + 1))
    for block in range(4):
        p = rng.dirichlet(np.full(V, 0.3), size=(b, a + 1)).astype(np.float32)
        q = rng.dirichlet(np.full(V, 0.3), size=(b, a)).astype(np.float32)
        x = np.array(
            [[rng.choice(V, p=q[i, j] / q[i, j].sum()) for j in range(a)] for i in range(b)]
        )
        out = rules.verify_chain(rule, jax.random.PRNGKey(block), p, q, jnp.asarray(x))
        pi_law = verification.emitted_law(jnp.asarray(p), jnp.asarray(q))
        stats = stats.update(out, jnp.asarray(live), verification.meter(pi_law, p))
        pi = np.concatenate([np.asarray(rule.induced(p[:, :-1], q)), p[:, -1:]], 1)
        np.testing.assert_allclose(np.asarray(pi_law), pi, atol=1e-6)
        law = np.asarray(base_rule.law(p), np.float64)
        inside = np.asarray(base_rule.allowed(p))
        mask = (np.arange(a + 1)[None] <= np.asarray(out.num_accepted)[:, None]) & live[:, None]
        with np.errstate(divide='ignore', invalid='ignore'):
            kl = np.where(law > 0, law * np.log(law / pi), 0.0).sum(-1)
        tv = 0.5 * np.abs(pi - law).sum(-1)
        m = 0.5 * (pi + law)
        with np.errstate(divide='ignore', invalid='ignore'):
            js = 0.5 * sum(np.where(x > 0, x * np.log(x / m), 0.0).sum(-1) for x in (pi, law))
        for k, v in [('tv', tv), ('kl', kl), ('outside', np.where(inside, 0, pi).sum(-1)),
                     ('overshoot', (pi / p).max(-1)), ('js', js)]:  # fmt: skip
            sums[k] += np.where(mask, v, 0.0).sum(1)
        tv_bt += np.where(mask, tv, 0.0)
        count_bt += mask
    assert count_bt[:2, 1].sum() > 0 and count_bt[:2, a].sum() < 8  # Accepts and rejects.
    for k, v in sums.items():
        np.testing.assert_allclose(getattr(stats, k), v, rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(stats.metered, count_bt.sum(1))
    if name.startswith('minp'):
        assert sums['outside'][:2].min() > 0  # Truncation rules leak outside A...
        assert (np.asarray(stats.outside) < np.asarray(stats.tv) + 1e-6).all()  # ... <= TV.
    else:
        assert np.all(np.asarray(stats.outside) == 0)  # CoS's baseline truncates nothing.
    summary = summarize(stats)
    np.testing.assert_allclose(
        summary['tv_at_position'], tv_bt.sum(0) / np.maximum(count_bt.sum(0), 1), rtol=1e-4
    )
    np.testing.assert_allclose(summary['mean_tv'], sums['tv'].sum() / count_bt.sum(), rtol=1e-4)
    assert summary['per_row']['mean_tv'][2] is None  # A row never metered has no figure.


def _loop_args(prompts, limit, seed=0):
    batch = batching.pack_prompts(prompts, prompt_bucket=8, max_prompt_len=64)
    return (jnp.asarray(batch.tokens), jnp.asarray(batch.lengths),
            jnp.asarray(row_limits(limit, len(prompts), 20)),
            jnp.arange(len(prompts), dtype=jnp.int32), jax.random.PRNGKey(seed))  # fmt: skip


def test_no_retrace_across_values(target, draft):
    """New prompts, limits, temperatures, seeds, rule parameters and the baseline flag all
    run through one compiled loop: 6 values of lenience's l and its matched baseline, then
    min-p verification at 6 values of rho and its baseline (a second compile: another
    rule class)."""
    traced = jax.jit(chex.assert_max_traces(engine.decode_loop.__wrapped__, n=2))
    chain = decoding.Engine(CFG, DEC, LMDrafter(DRAFT_CFG), 3)
    runs = [
        ([[1, 2, 3], [4]], 20, 0.0, 0, 'lenience', 'l', 1.0, False),
        ([[5, 5, 5, 5, 5, 5], [6, 7]], 7, 0.8, 1, 'lenience', 'l', 0.9, False),
    ]
    runs += [([[1, 2], [3]], 20, 0.8, 2, 'lenience', 'l', v, False) for v in (0.05, 0.5, 1.0)]
    runs += [([[1, 2], [3]], 20, 0.8, 2, 'lenience', 'l', 0.5, True)]
    runs += [([[3], [1, 2]], 5, 0.7, 2, 'minp_verify', 'rho', r, r == 0.3)
             for r in (0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.3)]  # fmt: skip
    accepted = {}
    for prompts, limit, temperature, seed, name, field, value, baseline in runs:
        run = chain.replace(rule=rules.make(name, **{field: value}), baseline=baseline,
                            sampler=Sampler(temperature=temperature))  # fmt: skip
        stats = traced(run, target, draft, *_loop_args(prompts, limit, seed))[2]
        accepted[(name, value, baseline)] = int(stats.accepted.sum())
    # The traced values took effect: at l = 0.05 nearly every draft passes, at 1 few.
    assert accepted[('lenience', 0.05, False)] > accepted[('lenience', 1.0, False)] + 5


def test_loop_copies_neither_cache_nor_weights(target):
    """A chain round, and an AR step (a round with nothing drafted), update the target's
    cache in place and read the weights in place. With a [B, K, S, H] cache and B = 1,
    XLA:CPU copied every layer's keys and values four times per step, and re-laid out the
    [N, H, D] output weights (spec_jax.models.attention)."""
    for run in (decoding.Engine(CFG, DEC), decoding.Engine(CFG, DEC, NgramDrafter(2, V), 3)):
        args = _loop_args([[1, 2, 3]], 20)
        hlo = engine.decode_loop.lower(run, target, None, *args).compile().as_text()
        slots = run.slots(8)
        assert loop_copies(hlo, CFG.num_kv_heads * slots * CFG.head_dim // 2) == [], run.mode


def test_bad_input_fails_before_compiling(target, draft):
    other = ModelConfig.tiny(vocab_size=V + 2, num_layers=1)
    with pytest.raises(ValueError, match="drafts over 33 ids but the target's vocabulary has 31"):
        gen(target, LMDrafter(other), None, PROMPTS, 3)
    with pytest.raises(ValueError, match='num_draft=0 with drafter LMDrafter'):
        decoding.Engine(CFG, DEC, LMDrafter(DRAFT_CFG), 0)
    with pytest.raises(ValueError, match='num_draft .* must be >= 0'):
        decoding.Engine(CFG, DEC, LMDrafter(DRAFT_CFG), -1)
    with pytest.raises(ValueError, match='unknown rule'):
        rules.make('speculative_magic')
    with pytest.raises(ValueError, match="NgramDrafter needs the target's vocabulary size"):
        NgramDrafter(3)
    long_dec = DecodeSettings(max_new_tokens=400, max_prompt_len=100)
    too_long = r'\+ num_draft \+ 1 needs 713 positions but the draft supports 512'
    with pytest.raises(ValueError, match=too_long):
        gen(target, LMDrafter(DRAFT_CFG), draft, PROMPTS, 200, long_dec)
    # Slots: prompt bucket 8 + output buffer 24 + num_draft + 1: 36 fit at num_draft 3...
    short = dataclasses.replace(DRAFT_CFG, max_position=36)
    gen(target, LMDrafter(short), draft, PROMPTS[:1], 3)
    knobs = 'lower max_prompt_len, max_new_tokens or num_draft'
    with pytest.raises(ValueError, match=f'the draft supports 36; {knobs}'):  # ...38 do not.
        gen(target, LMDrafter(short), draft, PROMPTS[:1], 5)
    with pytest.raises(ValueError, match=r'sample_ids must be 3 ids'):
        gen(target, LMDrafter(DRAFT_CFG), draft, PROMPTS, 3, sample_ids=[0, 1])


def test_meter_counts_narrow_rounds_and_infinite_values():
    """A round of width 1 (of A = 3) puts its bonus at offset A and its draft at 0; KL and
    overshoot sum over finite positions only, the infinite ones are counted."""
    n = jnp.array([1, 0])  # Row 0 accepted its one draft (bonus emitted); row 1 rejected it.
    out = rules.ChainResult(
        num_accepted=n, tokens=jnp.zeros((2, 2), jnp.int32), accepted=jnp.array([[1], [0]]) > 0,
        num_emitted=n + 1, accept_probs=jnp.ones((2, 1)), reached=jnp.ones((2, 1), bool),
        final_token=jnp.zeros(2, jnp.int32),
    )  # fmt: skip
    inf = jnp.inf
    metered = rules.Metered(
        tv=jnp.array([[0.1, 0.2], [0.3, 0.4]]), kl=jnp.array([[inf, 0.5], [0.2, 9.0]]),
        outside=jnp.zeros((2, 2)), overshoot=jnp.array([[2.0, 3.0], [inf, 9.0]]),
        js=jnp.array([[0.01, 0.02], [0.03, 0.04]]), tv_plain=jnp.array([[0.2, 0.3], [0.4, 0.5]]),
    )  # fmt: skip
    st = Stats.zeros(2, 3, 8).update(out, jnp.array([True, True]), metered)
    np.testing.assert_array_equal(st.metered_at_bt, [[1, 0, 0, 1], [1, 0, 0, 0]])
    np.testing.assert_allclose(st.tv_at_bt, [[0.1, 0, 0, 0.2], [0.3, 0, 0, 0]], rtol=1e-6)
    np.testing.assert_allclose(st.kl, [0.5, 0.2], rtol=1e-6)  # Offset 1 of row 1: not emitted.
    np.testing.assert_allclose(st.js, [0.03, 0.03], rtol=1e-6)
    np.testing.assert_allclose(st.tv_plain, [0.5, 0.4], rtol=1e-6)
    np.testing.assert_array_equal(st.kl_inf, [1, 0])
    np.testing.assert_array_equal(st.overshoot_inf, [0, 1])
    np.testing.assert_allclose(st.overshoot_max, [3.0, 0.0])
    summary = summarize(st)
    assert summary['kl_inf_fraction'] == pytest.approx(1 / 3)
    assert summary['mean_kl'] == pytest.approx(0.7 / 2)
    assert st.full_blocks.tolist() == [0, 0]  # A width-1 round is not a full-gamma block.


def test_meter_flags_at_the_stated_tolerance():
    """pi/p metered at 1 + 1e-7 (fp32 roundoff: a GPU metered lossless SD's so) and an
    outside mass of 1e-7 raise no flag; twice the tolerance raises both."""

    def flags(overshoot, outside):
        z = jnp.zeros(1)
        metered = rules.Metered(tv=z, kl=z, outside=jnp.full(1, outside), js=z, tv_plain=z,
                                overshoot=jnp.full(1, overshoot))  # fmt: skip
        summary = summarize(Stats.zeros(1, 3, 8).meter(metered, jnp.array([True])))
        return summary['overshoots'], summary['outside']

    assert flags(1.0000001, 1e-7) == (False, False)
    assert flags(1 + 2 * METER_RTOL, 2 * METER_RTOL) == (True, True)
