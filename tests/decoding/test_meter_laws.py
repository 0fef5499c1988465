"""The meter checked against its law: what the engine records per row (TV, KL, outside mass,
overshoot, JS; issue 29 point 5) equals the same measures of a law this test enumerates
itself, on the same rows.

A run decodes the tiny models (spec_jax.testing.tiny) with metering on. Every metered
position k of a row (docs/eval.md: the first token, each round's drafts and its
replacement or bonus token, the last round whole) has a context, the prompt and the row's
tokens before k, so the test recomputes the target's p (and the draft's q) there with a
plain causal forward of the models, enumerates the verification at that position in numpy
from the rule's definition (docs/laws.md; not the rule's `induced`), and sums the measures
against the matched baseline's p_A, also written out here. The meter counts the last round
whole although the limit cuts it, so the tokens past the limit come from a second run of
the same compiled loop with a larger limit: a row's noise is its own, round by round
(docs/engine.md "Randomness"), so the two runs agree on every round the first one ran
(asserted). Bound: 1e-5 on every row's sum (float32 forwards with and without a cache
differ by ~1e-6 in p).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax import decoding, rules
from spec_jax.decoding import trees
from spec_jax.decoding.drafters import Eagle3Drafter, LMDrafter
from spec_jax.decoding.state import DecodeSettings, prefill
from spec_jax.models.cache import KVCache
from spec_jax.models.llama import causal_forward
from spec_jax.sampling import Sampler
from spec_jax.testing import random_params, tiny

V, CFG, DRAFT_CFG = tiny.V, tiny.TARGET, tiny.DRAFT
SAMPLER = Sampler(temperature=1.0)
# The shapes of test_speculative's and test_tree's metering tests, so the suite's
# compilation cache serves the same loops.
CHAIN_DEC = DecodeSettings(max_new_tokens=8, prompt_bucket=8, new_tokens_bucket=8)
CHAIN_A, CHAIN_LIMIT = 3, 5  # 1 + (limit - 1) + (A + 1) <= 8 tokens of the long run.
TREE_DEC = DecodeSettings(max_new_tokens=12, prompt_bucket=8, new_tokens_bucket=8)
TREE_SHAPE = trees.TreeShape(8, 4, 2)
TREE_LIMIT = 6  # 1 + (limit - 1) + (path_len + 1) <= 12.
TREE_PROMPTS = tiny.PROMPTS * 4
TREE_CONTEXTS = 12 * TREE_LIMIT  # Rounds of the 12 rows: at most one per token.
BOUND = 1e-5
FIELDS = ('tv', 'kl', 'outside', 'overshoot', 'js', 'tv_plain')


@pytest.fixture(scope='module')
def soft_models():
    """Peaked target and draft LM (test_speculative's), and the target's EAGLE-3 head."""
    target = random_params(CFG, seed=7, embed_scale=8.0)
    return target, random_params(DRAFT_CFG, seed=8, embed_scale=8.0), tiny.head(target)


# ---- the laws, written out from docs/laws.md ----------------------------------------------


def parse(spec: str) -> tuple[str, float]:
    name, value = spec.split(':')
    return name, float(value.split('=')[1])


def allowed(name: str, value: float, p: np.ndarray) -> np.ndarray:
    """The matched baseline's allowed set A (§5): min-p's {p >= rho max p}, else all of V."""
    if name == 'minp_verify':
        return p >= value * p.max()
    return np.ones_like(p, bool)


def chain_position_law(name: str, value: float, p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """The law of the token a drafted position emits, given it is reached, by enumerating
    one verification (§4.1, §3.2, §4.3): the draft x ~ q accepted with a(x), else a draw
    from the replacement r, so pi = q a + (1 - sum q a) r."""
    ratio = np.divide(p, q, out=np.full_like(p, np.inf), where=q > 0)
    if name == 'lenience':  # a = min(1, p / (l q)), r = norm((p - q)_+).
        accept, resid = np.minimum(1.0, ratio / value), np.maximum(p - q, 0.0)
    elif name == 'cos':  # a = min(1, lam + (1 - lam) p / q), r = norm((p - q)_+).
        accept, resid = np.minimum(1.0, value + (1.0 - value) * ratio), np.maximum(p - q, 0.0)
    elif name == 'minp_verify':  # a = 1[x in A], r = p (full).
        accept, resid = allowed(name, value, p).astype(float), p.copy()
    else:
        raise ValueError(f'no enumeration for {name!r}')
    passed = q * accept
    resid = resid / resid.sum() if resid.sum() > 0 else p
    return passed + (1.0 - passed.sum()) * resid


def tree_node_law(name: str, value: float, p: np.ndarray, siblings) -> np.ndarray:
    """The law of the token a tree node emits (§2.2 skeleton, gates of §3.3 / §4.2): walk
    the siblings in order on the residual P (p without the rejected siblings, renormalised);
    sibling c passes with g(c) (min-p: P(c) >= rho max P; lenience: min(1, P(c) / l)), a
    node with every sibling rejected draws from P, EAGLE's guard draws from p when P's mass
    is <= 1e-9. A leaf (no siblings) emits p."""
    law, residual, reach, seen = np.zeros_like(p), p.copy(), 1.0, set()
    for c in siblings:
        if c < 0 or c in seen:  # Padding or a repeat.
            continue
        seen.add(c)
        norm = residual / residual.sum()
        if name == 'minp_verify':
            gate = float(norm[c] >= value * norm.max())
        elif name == 'lenience':
            gate = min(1.0, norm[c] / value)
        else:
            raise ValueError(f'no tree enumeration for {name!r}')
        law[c] += reach * gate
        reach *= 1.0 - gate
        residual[c] = 0.0
        if residual.sum() <= 1e-9:
            return law + reach * p
    return law + reach * residual / residual.sum()


def measures(pi: np.ndarray, p: np.ndarray, inside: np.ndarray) -> dict:
    """TV(pi, p_A), KL(p_A || pi), pi outside A, max pi/p, JS(pi, p_A) and TV(pi, p) in
    float64."""
    law = np.where(inside, p, 0.0) / p[inside].sum()
    m = 0.5 * (pi + law)
    with np.errstate(divide='ignore', invalid='ignore'):
        kl = np.where(law > 0, law * np.log(law / pi), 0.0).sum()
        over = np.where(pi > 0, pi / p, 0.0).max()
        js = 0.5 * sum(np.where(x > 0, x * np.log(x / m), 0.0).sum() for x in (pi, law))
    return dict(tv=0.5 * np.abs(pi - law).sum(), kl=kl, outside=pi[~inside].sum(),
                overshoot=over, js=js, tv_plain=0.5 * np.abs(pi - p).sum())  # fmt: skip


# ---- the runs and each row's positions ------------------------------------------------------


WIDTH = 32  # Every forward's rows are padded to this width: one compile per model.


@functools.partial(jax.jit, static_argnums=0)
def _probs(cfg, params, tokens_bt):
    return SAMPLER.probs(causal_forward(cfg, params, tokens_bt)[0])


def next_laws(cfg, params, prompts, tokens) -> list[np.ndarray]:
    """Per row, [len(tokens) + 1, V]: the processed law after prompt + tokens[:k], every k,
    from one causal forward of the right-padded rows."""
    rows = [list(pr) + list(tk) for pr, tk in zip(prompts, tokens)]
    assert max(map(len, rows)) <= WIDTH
    probs = _probs(cfg, params, jnp.array([r + [0] * (WIDTH - len(r)) for r in rows]))
    probs = np.asarray(probs, np.float64)
    return [probs[b, len(pr) - 1: len(pr) + len(tk)] for b, (pr, tk) in
            enumerate(zip(prompts, tokens))]  # fmt: skip


def run_twice(engine, params, prompts, limit, seed):
    """(the metered run at `limit`, the tokens of a run of the same loop at the buffer's
    limit), after checking that the longer run repeats every round of the shorter."""
    short = decoding.generate(engine, params, prompts, seed=seed, max_new_tokens=limit)
    long = decoding.generate(engine, params, prompts, seed=seed)
    rows_s, rows_l = short.stats['per_row'], long.stats['per_row']
    for b in range(len(prompts)):
        assert long.tokens[b][: len(short.tokens[b])] == short.tokens[b]
        blocks = rows_s['block_accepted'][b]
        assert rows_l['block_accepted'][b][: len(blocks)] == blocks
        assert len(long.tokens[b]) >= rows_s['metered'][b]  # Every metered context known.
    return short, long.tokens


def check_sums(short, want: list[dict]):
    """Each row's recorded sums, infinite counts and metered count against `want`."""
    rows = short.stats['per_row']
    for b, positions in enumerate(want):
        assert rows['metered'][b] == len(positions), b
        for name in FIELDS:
            values = np.array([pos[name] for pos in positions])
            finite = np.isfinite(values)
            got = rows[f'{name}_sum'][b]
            np.testing.assert_allclose(got, values[finite].sum(), rtol=BOUND, atol=BOUND,
                                       err_msg=f'row {b} {name}')  # fmt: skip
            if name in ('kl', 'overshoot'):
                assert rows[f'{name}_inf'][b] == (~finite).sum(), (b, name)
        peak = max(pos['overshoot'] for pos in positions if np.isfinite(pos['overshoot']))
        np.testing.assert_allclose(rows['max_overshoot'][b], peak, rtol=BOUND)


@pytest.mark.parametrize('spec', ['lenience:l=0.5', 'minp_verify:rho=0.3', 'cos:lam=0.8'])
def test_chain_meter_equals_the_enumerated_law(soft_models, spec):
    """Chain rounds of A = 3 drafts: position 0 (prefill) and a full round's bonus emit p;
    every drafted offset up to the first rejection emits the enumerated verification law."""
    target, draft, _ = soft_models
    name, value = parse(spec)
    engine = decoding.Engine(CFG, CHAIN_DEC, LMDrafter(DRAFT_CFG), CHAIN_A,
                             rule=rules.make(spec), sampler=SAMPLER, meter_distortion=True)
    params = decoding.Params(target, draft)
    kinds_seen, totals = set(), dict.fromkeys(FIELDS, 0.0)
    for seed in (0, 1):
        short, tokens = run_twice(engine, params, tiny.PROMPTS, CHAIN_LIMIT, seed)
        p_rows = next_laws(CFG, target, tiny.PROMPTS, tokens)
        q_rows = next_laws(DRAFT_CFG, draft, tiny.PROMPTS, tokens)
        want = []
        for b, blocks in enumerate(short.stats['per_row']['block_accepted']):
            kinds = ['bonus']  # The first token: the bonus law.
            for n in blocks:
                kinds += ['draft'] * min(n + 1, CHAIN_A) + ['bonus'] * (n == CHAIN_A)
            kinds_seen |= {(k, i > 0) for i, k in enumerate(kinds)}
            positions = []
            for k, kind in enumerate(kinds):
                p, q = p_rows[b][k], q_rows[b][k]
                pi = chain_position_law(name, value, p, q) if kind == 'draft' else p
                positions.append(measures(pi, p, allowed(name, value, p)))
            want.append(positions)
            for field in FIELDS:
                totals[field] += sum(pos[field] for pos in positions if np.isfinite(pos[field]))
            # The frontier's reference at the same drafted positions: sum min(p, q).
            overlap = sum(np.minimum(p_rows[b][k], q_rows[b][k]).sum()
                          for k, kind in enumerate(kinds) if kind == 'draft')  # fmt: skip
            got = short.stats['per_row']['overlap_sum'][b]
            np.testing.assert_allclose(got, overlap, rtol=BOUND, atol=BOUND, err_msg=f'row {b}')
        check_sums(short, want)
    assert {('draft', True), ('bonus', True)} <= kinds_seen  # Drafts and bonus tokens metered.
    assert totals['tv'] > 0.05 and totals['js'] > 0.005  # The rule distorts: sums not 0.
    assert (totals['outside'] > 0.01) == (name == 'minp_verify')
    # Against plain SD's law p: the same as against p_A where the baseline truncates nothing;
    # min-p verification's law lies nearer p than its truncated baseline's (here 2.9 vs 9.4).
    same = np.isclose(totals['tv_plain'], totals['tv'], rtol=1e-6)
    assert same == (name != 'minp_verify'), (totals['tv_plain'], totals['tv'])


def head_trees(target, head, contexts, shape):
    """(children's tokens, children's node indices) [C, M, branch] of the tree a round
    drafts whose root is each context's last token (the head's state after a prefill of the
    rest: its cache for committed positions always comes from target taps)."""
    rows = len(contexts)
    assert rows <= TREE_CONTEXTS
    contexts = contexts + contexts[:1] * (TREE_CONTEXTS - rows)  # One compiled shape.
    prompts = [c[:-1] for c in contexts]
    prompt_bp = jnp.array([p + [0] * (WIDTH - len(p)) for p in prompts], jnp.int32)
    lengths = jnp.array([len(p) for p in prompts], jnp.int32)
    pending = jnp.array([c[-1] for c in contexts], jnp.int32)
    out = _head_trees(target, head, prompt_bp, lengths, pending, shape)
    return tuple(np.asarray(x)[:rows] for x in out)


@functools.partial(jax.jit, static_argnames='shape')
def _head_trees(target, head, prompt_bp, prompt_len_b, pending_b, shape):
    drafter = Eagle3Drafter(tiny.HEAD)
    b, bucket = prompt_bp.shape
    cache = KVCache.init(CFG, b, 2 * bucket)
    _, taps, cache = prefill(CFG, target, cache, prompt_bp, prompt_len_b, drafter.tap_layers)
    history = jnp.zeros((b, 2 * bucket), jnp.int32).at[:, :bucket].set(prompt_bp)
    history = history.at[jnp.arange(b), prompt_len_b].set(pending_b)
    state = drafter.init(head, history, prompt_len_b, bucket, taps)
    _, tokens_bm, parents_bm, _ = drafter.propose_tree(head, state, prompt_len_b, shape)
    kids_bmc = rules.children_from_parents(parents_bm, shape.branch)
    sibs_bmc = jnp.take_along_axis(tokens_bm[:, None], jnp.maximum(kids_bmc, 0), -1)
    return jnp.where(kids_bmc >= 0, sibs_bmc, -1), kids_bmc


@pytest.mark.parametrize('spec', ['minp_verify:rho=0.3', 'lenience:l=0.5'])
def test_tree_meter_equals_the_enumerated_node_law(soft_models, spec):
    """Tree rounds (8 nodes, depth 4, branch 2): at each depth of the committed path the
    node law of its siblings in the round's tree (the head's tree rebuilt from the round's
    context), against p_A; the first token emits p."""
    target, _, head = soft_models
    name, value = parse(spec)
    engine = decoding.Engine(CFG, TREE_DEC, Eagle3Drafter(tiny.HEAD), rule=rules.make(spec),
                             sampler=SAMPLER, meter_distortion=True, tree=TREE_SHAPE)
    short, tokens = run_twice(engine, decoding.Params(target, head), TREE_PROMPTS, TREE_LIMIT, 0)
    p_rows = next_laws(CFG, target, TREE_PROMPTS, tokens)
    rounds = []  # (row, first position k, accepted n): the round's root is token k - 1.
    for b, blocks in enumerate(short.stats['per_row']['block_accepted']):
        k = 1
        for n in blocks:
            rounds.append((b, k, n))
            k += n + 1
    contexts = [list(TREE_PROMPTS[b]) + list(tokens[b][:k]) for b, k, _ in rounds]
    sibs_r, kids_r = head_trees(target, head, contexts, TREE_SHAPE)
    want = [[measures(p_rows[b][0], p_rows[b][0], allowed(name, value, p_rows[b][0]))]
            for b in range(len(TREE_PROMPTS))]  # fmt: skip
    depths_with_children = 0
    for (b, k, n), sibs_m, kids_m in zip(rounds, sibs_r, kids_r):
        node = 0
        for d in range(n + 1):
            p = p_rows[b][k + d]
            pi = tree_node_law(name, value, p, sibs_m[node])
            want[b].append(measures(pi, p, allowed(name, value, p)))
            depths_with_children += int((sibs_m[node] >= 0).any())
            if d < n:  # The accepted child: the path's next node.
                j = list(sibs_m[node]).index(tokens[b][k + d])
                node = kids_m[node, j]
    check_sums(short, want)
    assert sum(n for _, _, n in rounds) > 5 and depths_with_children > 10
    assert sum(short.stats['per_row']['tv_sum']) > 0.05
