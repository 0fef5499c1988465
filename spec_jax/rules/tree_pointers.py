"""Trees from parent pointers: the static `Tree` and the children table on device.

Representation (docs/eagle3.md §4). A tree of M nodes is given by parent pointers [M]: node 0 is
the root (the last committed token, never verified), parents[i] < i for i >= 1 (depth
order), and the children of a node are visited in index order, which is the draft order
(EAGLE: descending draft probability). From the pointers we build a children table
[M, C] (-1 padded, C = the largest number of children) once, on the host for a static
`Tree`, or on device for traced per-row parents [B, M] (`children_from_parents`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np


@dataclasses.dataclass(frozen=True)
class Tree:
    """A static tree from parent pointers (hashable, so it can be a static jit argument).

    Attributes:
      parents: tuple of M ints; parents[0] is ignored (root), 0 <= parents[i] < i.
    """

    parents: tuple[int, ...]

    def __post_init__(self):
        parents = tuple(int(v) for v in np.asarray(self.parents).reshape(-1))
        if not parents:
            raise ValueError('Tree: parents is empty; it needs at least the root')
        for i, pa in enumerate(parents[1:], start=1):
            if not 0 <= pa < i:
                raise ValueError(f'Tree: parents[{i}]={pa} must satisfy 0 <= parents[i] < {i}')
        object.__setattr__(self, 'parents', parents)

    @property
    def num_nodes(self) -> int:
        return len(self.parents)

    @functools.cached_property
    def depth(self) -> np.ndarray:
        """[M] int depth of each node (root 0)."""
        d = np.zeros(self.num_nodes, np.int32)
        for i in range(1, self.num_nodes):
            d[i] = d[self.parents[i]] + 1
        return d

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @functools.cached_property
    def children(self) -> np.ndarray:
        """[M, C] int children of each node in index (draft) order, -1 padded."""
        kids = [[] for _ in range(self.num_nodes)]
        for i in range(1, self.num_nodes):
            kids[self.parents[i]].append(i)
        width = max(1, max(len(k) for k in kids))
        table = np.full((self.num_nodes, width), -1, np.int32)
        for i, k in enumerate(kids):
            table[i, : len(k)] = k
        return table

    @classmethod
    def chain(cls, length: int) -> Tree:
        """A chain root -> 1 -> ... -> length."""
        return cls(tuple([0] + list(range(length))))

    @classmethod
    def full(cls, branching: int, depth: int) -> Tree:
        """A complete tree of the given branching and depth, in depth (BFS) order."""
        parents, level = [0], [0]
        for _ in range(depth):
            nxt = []
            for node in level:
                for _ in range(branching):
                    parents.append(node)
                    nxt.append(len(parents) - 1)
            level = nxt
        return cls(tuple(parents))


def children_from_parents(parents: jax.Array, max_children: int) -> jax.Array:
    """Children table on device from parent pointers [..., M] -> [..., M, C] (-1 padded).

    Children are listed in index order; a node with more than `max_children` children
    keeps the first ones. Entry 0 of `parents` is ignored.
    """
    m = parents.shape[-1]
    nodes = jnp.arange(m)
    is_child = (parents[..., None, :] == nodes[:, None]) & (nodes > 0)  # [..., M(i), M(j)]
    rank = jnp.cumsum(is_child, axis=-1) - 1
    slot = is_child[..., None] & (rank[..., None] == jnp.arange(max_children))  # [..,M,M,C]
    return jnp.where(slot.any(-2), jnp.argmax(slot, axis=-2), -1).astype(jnp.int32)
