"""Draft trees of the tree round: their shape, the selection of M nodes from a static
candidate pool, and the ancestor masks the target and the head read (docs/engine.md,
"Tree rounds"; docs/eagle3.md §4).

A tree of M nodes is node 0, the root (the row's pending token s_C), and M - 1 drafted
nodes, given by parent pointers [B, M] with parents[i] < i (parents precede children) and
the children of a node in index order = draft order (descending draft probability), which
is what `rules.verify_tree` walks.

Dynamic trees (EAGLE-2/3): the head expands `branch` children (its top-k) of every node of
a frontier of `branch` nodes for `depth` levels; every child is a candidate scored by its
cumulative draft log-probability, the next frontier is the level's `branch` best, and the
M - 1 best candidates of the whole pool (branch + (depth - 1) * branch^2 of them) become the
tree. A child's score is at most its parent's (log-probabilities are <= 0) and a parent
precedes its children in the pool, so ranking by (score descending, pool index ascending)
puts every parent before its children, ties included: the selection is ancestor-closed.
`grow` builds one from any proposer's expansions (the EAGLE-3 head's; the target's own,
`drafters.SelfDrafter`).
Static trees (EAGLE-1, Medusa) fix the parents: node i is the r-th best child of its parent,
r its rank among its siblings. Sampled static trees draw each node's children from the
head's processed law q there, i.i.d. (SpecInfer, docs/laws.md §2.3) or without replacement
('distinct'), and hand q to the lossless verifier (`rules.verify_tree`'s sibling modes).

EAGLE's `depth` counts the expansions after the first level, so its (total_token 60,
depth 5, top_k 10) is `TreeShape(nodes=60, depth=6, branch=10)` here.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np

from spec_jax import rules

SAMPLED = ('', 'iid', 'distinct')


@dataclasses.dataclass(frozen=True)
class TreeShape:
    """The shape of a round's draft tree (hashable: part of the engine's static half).

    Attributes:
      nodes: M, the tree nodes one verification reads, the root included (M = 1: nothing
        drafted, every round an AR step).
      depth: the deepest drafted node, so the most drafts one round can accept.
      branch: children a node expands (the head's top-k) and, in a dynamic tree, the
        frontier kept per level.
      parents: () for a dynamic tree; the parent pointers of a static tree (entry 0, the
        root's, is ignored), whose nodes, depth and branch they determine (`TreeShape.fixed`).
      sampled: how a static tree's children are drawn from the head's processed law:
        '' (not drawn: its top-ranked tokens, EAGLE), 'iid' (SpecInfer) or 'distinct'
        (without replacement, Gumbel top-k).
    """

    nodes: int = 8
    depth: int = 4
    branch: int = 2
    parents: tuple[int, ...] = ()
    sampled: str = ''

    def __post_init__(self):
        for name in ('nodes', 'depth', 'branch'):
            if getattr(self, name) < 1:
                raise ValueError(f'tree {name}={getattr(self, name)} must be >= 1')
        if self.sampled not in SAMPLED:
            raise ValueError(f'tree sampled={self.sampled!r}: one of {SAMPLED}')
        if self.sampled and not self.parents:
            raise ValueError(
                f'sampled={self.sampled!r} needs a static tree (parents): a dynamic tree '
                'selects nodes by their draft scores, so its children are not draws from q'
            )
        if self.parents:
            tree = rules.Tree(self.parents)  # Validates the pointers.
            want = (tree.num_nodes, tree.max_depth, tree.children.shape[1])
            if (self.nodes, self.depth, self.branch) != want:
                raise ValueError(
                    f'a static tree of parents {self.parents} has nodes, depth, branch = {want}, '
                    f'not {(self.nodes, self.depth, self.branch)}: build it with TreeShape.fixed'
                )
        elif self.nodes - 1 > self.pool_size:
            raise ValueError(
                f'tree nodes={self.nodes} needs {self.nodes - 1} drafted nodes but the candidate '
                f'pool of branch={self.branch}, depth={self.depth} holds {self.pool_size} '
                '(branch + (depth - 1) * branch^2): lower nodes or raise branch or depth'
            )

    @classmethod
    def fixed(cls, parents, sampled: str = '') -> TreeShape:
        """A static tree from parent pointers (node 0 the root); `sampled` as the field."""
        tree = rules.Tree(tuple(parents))
        if tree.num_nodes < 2:
            raise ValueError('a static tree needs at least one drafted node besides the root')
        width = int(tree.children.shape[1])
        return cls(tree.num_nodes, tree.max_depth, width, tree.parents, sampled)

    @classmethod
    def chain(cls, length: int, sampled: str = '') -> TreeShape:
        """A static chain of `length` drafts: the head's greedy (or sampled) chain, verified
        as a tree."""
        return cls.fixed(rules.Tree.chain(length).parents, sampled)

    @property
    def static(self) -> bool:
        return bool(self.parents)

    @property
    def mode(self) -> str:
        """The `rules.verify_tree` sibling mode (a `Rule.tree_modes` entry)."""
        return self.sampled or 'deterministic'

    @property
    def path_len(self) -> int:
        """The longest accepted path, in drafted nodes."""
        return min(self.depth, self.nodes - 1)

    @property
    def levels_drafted(self) -> int:
        """Candidate levels a dynamic tree drafts: no deeper than M - 1 nodes can reach (an
        ancestor-closed selection of M - 1 nodes is at most M - 1 deep); at least one."""
        return max(1, self.path_len)

    @property
    def pool_size(self) -> int:
        """Candidates a dynamic tree selects from (a static tree: its drafted nodes)."""
        if self.parents:
            return self.nodes - 1
        return self.branch + (self.levels_drafted - 1) * self.branch**2

    @property
    def scratch(self) -> int:
        """Head cache slots one proposal writes past C (the nodes it runs the head on)."""
        if self.parents:
            return int(sum(len(level) for level in self.levels))
        return (self.levels_drafted - 1) * self.branch

    @property
    def room(self) -> int:
        """Cache slots a round needs past the committed tokens: the M verified nodes, the
        head's scratch and its window over the accepted path."""
        return max(self.nodes, self.scratch, self.path_len + 1)

    @functools.cached_property
    def tree(self) -> rules.Tree:
        """The static tree (static shapes only)."""
        return rules.Tree(self.parents)

    @functools.cached_property
    def levels(self) -> tuple[tuple[int, ...], ...]:
        """Static trees: levels[d - 1] lists the nodes of depth d that have children, in
        index order (the head runs on them; their scratch slots follow in this order)."""
        has_kids = np.zeros(self.nodes, bool)
        has_kids[list(self.parents[1:])] = True
        depth = self.tree.depth
        return tuple(
            tuple(int(i) for i in np.flatnonzero((depth == d) & has_kids))
            for d in range(1, self.depth)
        )

    def describe(self) -> str:
        if self.parents:
            kind = f'sampled ({self.sampled}) static' if self.sampled else 'static'
            return f'{kind} tree of {self.nodes} nodes, depth {self.depth}'
        return f'dynamic tree: {self.nodes} nodes, depth {self.depth}, branch {self.branch}'


def rank(score_bw: jax.Array) -> jax.Array:
    """Pool indices [B, W] by score descending, ties by index ascending (a stable sort);
    NaN ranks as -inf."""
    key = jnp.where(jnp.isnan(score_bw), jnp.inf, -score_bw)
    return jnp.argsort(key, axis=-1, stable=True).astype(jnp.int32)


def select(score_bw: jax.Array, parent_bw: jax.Array, num: int):
    """The `num` best candidates of a pool as a tree (parents precede children).

    Args:
      score_bw: [B, W] cumulative draft log-probabilities; a child's is at most its parent's.
      parent_bw: [B, W] the pool index of each candidate's parent, -1 for the root's
        children; parents precede children in the pool.
      num: M - 1, the drafted nodes to keep.

    Returns:
      (pool index of each drafted node [B, M - 1], ascending; parents [B, M]: node i's parent
      as a node index, 0 for the root and for node 0).
    """
    chosen_bm = jnp.sort(rank(score_bw)[:, :num], axis=-1)
    parent_pool_bm = jnp.take_along_axis(parent_bw, chosen_bm, axis=-1)
    found_bm = jax.vmap(jnp.searchsorted)(chosen_bm, parent_pool_bm).astype(jnp.int32)
    # Ancestor-closed by construction; a parent missing (NaN scores) hangs from the root.
    known_bm = jnp.take_along_axis(chosen_bm, jnp.minimum(found_bm, num - 1), -1) == parent_pool_bm
    parents_bm = jnp.where((parent_pool_bm >= 0) & known_bm, found_bm + 1, 0)
    root_b1 = jnp.zeros((score_bw.shape[0], 1), jnp.int32)
    return chosen_bm, jnp.concatenate([root_b1, parents_bm], axis=-1)


def grow(shape: TreeShape, score_by, token_by, carry_by, expand, state):
    """A dynamic tree (module docstring) from a proposer's expansions, the pool kept in
    the order `select` reads.

    Args:
      shape: a dynamic TreeShape; Y = C = shape.branch.
      score_by, token_by: [B, Y] the root's `branch` best children (log-probabilities <= 0,
        token ids), best first: the first frontier.
      carry_by: a pytree of [B, Y, ...] arrays, what each frontier node is expanded from
        (an EAGLE-3 head: its parent's output hidden), or None.
      expand: (state, level, offset, token_by, carry_by, seen_byz) -> (state, logp_byc,
        child_byc, out_by): runs the proposer on the frontier of depth `level` written at
        scratch slots offset + y, each seeing the scratch entries `seen_byz` [B, Y, Z]
        marks (its ancestors and itself); returns each node's `branch` best children
        (log-probabilities <= 0, ids) and its output (the next carry of its children).
      state: threaded through `expand` (a cache).

    Returns:
      (state, tokens [B, M] (entry 0, the root, left 0 for the caller), parents [B, M]).
    """
    k, batch = shape.branch, score_by.shape[0]
    pool_score, pool_token = [score_by], [token_by]
    pool_parent = [jnp.full((batch, k), -1, jnp.int32)]
    front_pool_by = jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (batch, k))
    seen_byz = jnp.zeros((batch, k, shape.scratch), bool)
    start = k  # Pool index of the level's first candidate.
    for level in range(1, shape.levels_drafted):
        offset = (level - 1) * k
        seen_byz = seen_byz | (jnp.arange(shape.scratch)[None, :]
                               == offset + jnp.arange(k)[:, None])  # fmt: skip
        state, logp_byc, child_byc, out_by = expand(state, level, offset, token_by, carry_by,
                                                    seen_byz)  # fmt: skip
        child_score_bw = (score_by[..., None] + logp_byc).reshape(batch, k * k)
        child_token_bw = child_byc.reshape(batch, k * k)
        pool_score.append(child_score_bw)
        pool_token.append(child_token_bw)
        pool_parent.append(jnp.repeat(front_pool_by, k, axis=1))
        if level < shape.levels_drafted - 1:  # The next frontier: the level's k best.
            best_by = rank(child_score_bw)[:, :k]
            parent_by = best_by // k

            def pick(x, parent_by=parent_by):
                index = parent_by.reshape(parent_by.shape + (1,) * (x.ndim - 2))
                return jnp.take_along_axis(x, index, 1)

            score_by = jnp.take_along_axis(child_score_bw, best_by, 1)
            token_by = jnp.take_along_axis(child_token_bw, best_by, 1)
            carry_by = jax.tree.map(pick, out_by)
            seen_byz = pick(seen_byz)
            front_pool_by = start + best_by
        start += k * k
    chosen_bm, parents_bm = select(
        jnp.concatenate(pool_score, 1), jnp.concatenate(pool_parent, 1), shape.nodes - 1
    )
    drafted_bm = jnp.take_along_axis(jnp.concatenate(pool_token, 1), chosen_bm, 1)
    tokens_bm = jnp.concatenate([jnp.zeros((batch, 1), jnp.int32), drafted_bm], 1)
    return state, tokens_bm.astype(jnp.int32), parents_bm


def ancestors(parents_bm: jax.Array, depth: int) -> jax.Array:
    """[B, M, M] bool: node j is on the path from the root to node i (i itself included),
    for trees no deeper than `depth` (parents precede children)."""
    m = parents_bm.shape[-1]
    eye_mm = jnp.eye(m, dtype=bool)
    anc_bmm = jnp.broadcast_to(eye_mm, (*parents_bm.shape, m))
    for _ in range(depth):  # After n steps each row holds its node's n nearest ancestors.
        anc_bmm = eye_mm | jnp.take_along_axis(anc_bmm, parents_bm[..., None], axis=-2)
    return anc_bmm


def static_ancestors(shape: TreeShape) -> np.ndarray:
    """[M, M] ancestors of a static tree (host side, numpy)."""
    anc_mm = np.eye(shape.nodes, dtype=bool)
    for i in range(1, shape.nodes):  # Parents precede children.
        anc_mm[i] |= anc_mm[shape.parents[i]]
    return anc_mm
