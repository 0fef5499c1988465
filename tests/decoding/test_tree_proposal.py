"""The EAGLE-3 head's dynamic tree against a numpy port of EAGLE's tree proposal.

`eagle_topk_generate` below follows the algorithm of EAGLE's `Model.topK_genrate`
(SafeAILab/EAGLE, eagle/model/cnets.py): the root's top-k children; `depth` expansions,
each of the previous level's k best candidates (the frontier, by cumulative
log-probability) into its top-k; every child a pool candidate; the `total_tokens` best of
the pool kept in pool order, each node's parent found by a binary search of the kept pool
indices. It is written here from that description, in numpy, with the head's laws
supplied by the chain drafter (`propose` with the node's ancestors forced, the law the
chain test of tests/decoding/test_tree.py ties each tree node to), so it shares no code
with `Eagle3Drafter.propose_tree` or `trees.select`. Ties, which torch.topk leaves
unspecified, go to the lower index everywhere (a stable sort), the order `jax.lax.top_k`
and `trees.rank` give: the tied-head test pins it with exactly equal logits (two identical
LM-head rows).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from spec_jax.decoding import trees
from spec_jax.decoding.drafters import Eagle3Drafter
from spec_jax.decoding.state import prefill
from spec_jax.models.cache import KVCache
from spec_jax.testing import random_params, tiny

CFG, HEAD, V = tiny.TARGET, tiny.HEAD, tiny.V
PROMPT = [4, 5, 6, 7, 8, 9]
BRANCH, DEPTH = 3, 5  # EAGLE's depth 4 (expansions after the first level), top_k 3.
POOL = BRANCH + (DEPTH - 1) * BRANCH**2  # 39 candidates.
DRAFTER = Eagle3Drafter(HEAD)


def stable_top(x, k):
    """Indices of the k largest entries of x, ties to the lower index."""
    return np.argsort(-x, kind='stable')[:k]


def eagle_topk_generate(logp_after, top_k, depth, total_tokens):
    """A numpy port of EAGLE's topK_genrate (the tree half; no model calls).

    Args:
      logp_after: paths (lists of token ids after the root) -> the head's log-probabilities
        [len(paths), V] of the token after each path.
      top_k, depth, total_tokens: EAGLE's names (depth: expansions after the first level).

    Returns:
      (draft tokens [total_tokens], parent node of each [total_tokens] (0 the root, i >= 1
      the i-th draft), the frontier of each expanded level as token paths).
    """
    root = logp_after([[]])[0]
    top = stable_top(root, top_k)
    scores = root[top]
    scores_list, tokens_list = [scores], [top]
    parents_list = [np.zeros(1, np.int64)]  # 1-based pool index of each block's parents.
    frontier = [[int(t)] for t in top]
    front_index = np.arange(top_k)
    frontiers = []
    for i in range(depth):
        frontiers.append(frontier)
        bias = 1 + top_k**2 * max(0, i - 1) + (top_k if i > 0 else 0)
        parents_list.append(front_index + bias)
        logp = logp_after(frontier)  # [k, V]
        child = np.stack([stable_top(row, top_k) for row in logp])  # [k, k]
        cu = np.take_along_axis(logp, child, 1) + scores[:, None]
        front_index = stable_top(cu.reshape(-1), top_k)
        scores = cu.reshape(-1)[front_index]
        out_ids = front_index // top_k
        frontier = [frontier[o] + [int(child.reshape(-1)[j])] for o, j in zip(out_ids, front_index)]
        tokens_list.append(child.reshape(-1))
        scores_list.append(cu.reshape(-1))
    pool_scores = np.concatenate(scores_list)
    pool_tokens = np.concatenate(tokens_list)
    kept = np.sort(stable_top(pool_scores, total_tokens))
    parents_1b = np.concatenate(parents_list)[kept // top_k]
    node_of_parent = np.searchsorted(kept, parents_1b - 1) + 1
    node_of_parent[parents_1b == 0] = 0
    return pool_tokens[kept], node_of_parent, frontiers


def setup(target, head):
    bucket, slots, c = 8, 40, len(PROMPT)
    lengths = jnp.array([c], jnp.int32)
    prompt_bp = jnp.array([PROMPT + [0] * (bucket - c)], jnp.int32)
    logits_bv, taps, _ = prefill(
        CFG, target, KVCache.init(CFG, 1, slots), prompt_bp, lengths, DRAFTER.tap_layers
    )
    history = jnp.zeros((1, slots), jnp.int32).at[0, :c].set(jnp.array(PROMPT))
    history = history.at[0, c].set(jnp.argmax(logits_bv[0]))
    return DRAFTER.init(head, history, lengths, bucket, taps), history, lengths


@jax.jit
def chain_laws(head, state, history, lengths, forced, use):
    """The head's law [K, DEPTH, V] at each chain step with the given tokens forced."""
    rows = jax.tree.map(lambda x: jnp.tile(x, (BRANCH,) + (1,) * (x.ndim - 1)), state)
    _, _, q_kav = DRAFTER.propose(
        head, rows, jnp.tile(history, (BRANCH, 1)), jnp.tile(lengths, BRANCH),
        jax.random.split(jax.random.PRNGKey(0), BRANCH), DEPTH, jax.nn.softmax,
        forced=(forced, use),
    )  # fmt: skip
    return q_kav


def logp_fn(head, state, history, lengths):
    def logp_after(paths):
        forced, use = np.zeros((BRANCH, DEPTH), np.int32), np.zeros((BRANCH, DEPTH), bool)
        for i, path in enumerate(paths):
            forced[i, : len(path)], use[i, : len(path)] = path, True
        q = np.asarray(chain_laws(head, state, history, lengths, forced, use), np.float64)
        law = q[np.arange(len(paths)), [len(path) for path in paths]]
        with np.errstate(divide='ignore'):
            return np.log(law)  # -inf off the draft vocabulary: never a top-k child.

    return logp_after


@functools.cache
def tree_fn(nodes):
    shape = trees.TreeShape(nodes=nodes, depth=DEPTH, branch=BRANCH)
    return jax.jit(lambda h, s, c: DRAFTER.propose_tree(h, s, c, shape)[1:3])


def propose(head, state, lengths, nodes):
    """(the drafted tokens [M - 1], parents [M]) of the head's dynamic tree of M nodes."""
    tokens, parents = tree_fn(nodes)(head, state, lengths)
    return np.asarray(tokens)[0, 1:], np.asarray(parents)[0]


def node_depths(parents):
    depth = np.zeros(len(parents), np.int64)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


@pytest.fixture(scope='module')
def peaked():
    """A peaked target (max p ~0.7 at T 1) and its head, its LM head scaled 12x so that its
    top child is near-certain and deep candidates outscore shallow ones (the tree reaches
    depth 4 of 5), and the same head with the LM-head row of the root's second-best draft
    token copied into the row of a later one (exact ties at every node)."""
    target = random_params(CFG, seed=7, embed_scale=8.0)
    head = tiny.head(target)
    head = {**head, 'head': {**head['head'], 'lm_head_ud': 12.0 * head['head']['lm_head_ud']}}
    state, _, _ = setup(target, head)
    order = np.argsort(-np.asarray(DRAFTER.root_logits(head, state)[0]), kind='stable')
    src, dst = int(order[1]), int(max(order[1:4]))
    dst = dst if dst != src else int(order[2])
    rows = np.asarray(head['head']['lm_head_ud']).copy()
    rows[dst] = rows[src]
    tied = {**head, 'head': {**head['head'], 'lm_head_ud': jnp.asarray(rows)}}
    return target, head, tied, (min(src, dst), max(src, dst))


@pytest.mark.parametrize('which', ['head', 'tied'])
def test_the_heads_tree_is_eagles_topk_generate(peaked, which):
    """With the whole pool kept (M - 1 = 39) the tree is the pool: each level's frontier
    (the k best candidates) and its top-k children, in pool order, parents included; with
    M - 1 = 15 it is the port's global top-15, parents by binary search, reaching depth
    >= 4 (the head is peaked enough for deep candidates to win)."""
    target, head, tied, _ = peaked
    params = head if which == 'head' else tied
    state, history, lengths = setup(target, params)
    logp_after = logp_fn(params, state, history, lengths)
    for total in (POOL, 15):
        want_tokens, want_parents, _ = eagle_topk_generate(logp_after, BRANCH, DEPTH - 1, total)
        tokens, parents = propose(params, state, lengths, total + 1)
        np.testing.assert_array_equal(tokens, want_tokens, err_msg=f'{which} M-1={total}')
        np.testing.assert_array_equal(parents[1:], want_parents, err_msg=f'{which} M-1={total}')
    assert node_depths(parents).max() >= 4


def test_exact_ties_go_to_the_lower_index(peaked):
    """Two identical LM-head rows u1 < u2 give every node exactly tied children: u1's token
    is always the earlier sibling, and where the top-k cuts between them only u1's is kept;
    the tied pair are the root's second and third children here, so the tie is decided."""
    target, _, tied, (u1, u2) = peaked
    state, _, lengths = setup(target, tied)
    ids = np.asarray(tied['draft_ids_u'])
    t1, t2 = int(ids[u1]), int(ids[u2])
    logits = np.asarray(DRAFTER.root_logits(tied, state)[0])
    assert logits[u1] == logits[u2]
    tokens, parents = propose(tied, state, lengths, POOL + 1)
    tokens = np.concatenate([[-1], tokens])
    both = 0
    for node in range(len(parents)):
        kids = [i for i in range(1, len(parents)) if parents[i] == node]
        toks = [int(tokens[i]) for i in kids]
        if t2 in toks:
            assert t1 in toks and toks.index(t1) == toks.index(t2) - 1, (node, toks)
            both += 1
    assert both >= 1
    root_kids = [int(tokens[i]) for i in range(1, len(parents)) if parents[i] == 0]
    assert t1 in root_kids and t2 in root_kids
