"""Meshes and shardings as data: which mesh axis each axis letter is split over.

A mesh has named axes (`MESH_AXES`: 'data' splits rows, 'model' splits heads, the MLP and
the vocabulary); `make_mesh` builds it from a config block (`mesh_config`, -1 fills). The
sharding of every array follows from the axis letters of its name or shape comment
(spec_jax/axes.py) through one frozen `ShardingRules`: `q_dnh` is [D, N, H], so with
heads over 'model' its spec is P(None, 'model', None). Parameters are placed with
`shard` (a ValueError names the array, the letter and the sizes when a mesh axis does not
divide it); inside jitted code `constrain(x, letters)` pins an activation or cache to its
spec under the current mesh (`jax.set_mesh`) and is a no-op without one, so every entry
point runs unchanged on one device or on a mesh (docs/sharding.md).

Letters and their default mesh axes:
  B   'data'            rows of a batch (tokens, lengths, decode state)
  N   'model'           query heads (tensor parallel attention)
  K   'model'           key/value heads: their own rule, so a drafter (or a model axis
                        that K does not divide) can keep them whole
  F   'model'           MLP hidden width
  V   'model'           vocabulary (embedding and LM head rows)
  R   ('data', 'model') the attention and cache rows R = B * K, in mesh-block order
                        (spec_jax.models.attention.Rows): device (d, m) holds exactly
                        its batch rows' KV heads of block m, at any rows per data shard.
Every other letter (D, H, S, T, U, X, ...) is replicated.

A model axis larger than K (Qwen2.5-72B's 8 KV heads over 16 devices) is met by holding
each KV head `kv_repeat` times (spec_jax.models.llama.repeat_kv_heads): each device then
keeps one KV head of its query heads' group, and N and K both split M ways.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

MESH_AXES = ('data', 'model')


HOSTS = ('local', 'all')


def mesh_config(data: int = 1, model: int = 1, hosts: str = 'local') -> ml_collections.ConfigDict:
    """The mesh block of a job config: the size of each `MESH_AXES` axis, one may be -1
    (all devices left); data=1, model=1: one device, no mesh. `hosts`: 'local' builds the
    mesh from this process's devices (with several processes each has its own and they
    split the work, spec_jax/distributed.py); 'all' builds one mesh over every process's
    devices (a target too large for one host), and every process runs every batch."""
    return ml_collections.ConfigDict(dict(data=data, model=model, hosts=hosts))


def mesh_shape(c, num_devices: int) -> tuple[int, int]:
    """(data, model) sizes of a mesh block over `num_devices` (at most), the -1 filled."""
    sizes = [int(c[name]) for name in MESH_AXES]
    unknown = [name for name, size in zip(MESH_AXES, sizes) if size == -1]
    if len(unknown) > 1 or any(size == 0 or size < -1 for size in sizes):
        raise ValueError(f'mesh {dict(zip(MESH_AXES, sizes))}: sizes >= 1, at most one -1')
    known = math.prod(size for size in sizes if size != -1)
    if unknown:
        if num_devices % known:
            raise ValueError(
                f'mesh {dict(zip(MESH_AXES, sizes))}: {num_devices} devices do not split '
                f'into {known} x -1'
            )
        sizes[sizes.index(-1)] = num_devices // known
    if math.prod(sizes) > num_devices:
        raise ValueError(
            f'mesh {dict(zip(MESH_AXES, sizes))} needs {math.prod(sizes)} devices; '
            f'{num_devices} are available'
        )
    return tuple(sizes)


def make_mesh(c, devices=None) -> Mesh | None:
    """The mesh of a mesh block over the first devices of `devices` (default: this
    process's, `jax.local_devices()`, or every process's with `hosts='all'`; a -1 takes
    them all), or None for one device."""
    hosts = c.get('hosts', 'local')
    if hosts not in HOSTS:
        raise ValueError(f'mesh hosts={hosts!r} is not one of {HOSTS}')
    if devices is None:
        devices = jax.devices() if hosts == 'all' else jax.local_devices()
    devices = list(devices)
    shape = mesh_shape(c, len(devices))
    if hosts == 'all' and jax.process_count() > 1 and math.prod(shape) != len(devices):
        raise ValueError(
            f"mesh hosts='all' {dict(zip(MESH_AXES, shape))} covers {math.prod(shape)} of the "
            f'{len(devices)} devices of {jax.process_count()} processes: a mesh over every '
            f"host must use them all (set one size to -1), or use hosts='local'"
        )
    if math.prod(shape) == 1:
        return None
    auto = (jax.sharding.AxisType.Auto,) * len(MESH_AXES)
    return jax.make_mesh(shape, MESH_AXES, axis_types=auto, devices=devices[: math.prod(shape)])


@dataclasses.dataclass(frozen=True)
class ShardingRules:
    """The mesh axis (or None: replicated) of each sharded axis letter."""

    batch: str | None = 'data'
    heads: str | None = 'model'
    kv_heads: str | None = 'model'
    mlp: str | None = 'model'
    vocab: str | None = 'model'

    @classmethod
    def replicated(cls) -> ShardingRules:
        """Everything on every device."""
        return cls(batch=None, heads=None, kv_heads=None, mlp=None, vocab=None)

    @classmethod
    def batch_only(cls) -> ShardingRules:
        """Weights on every device, rows (activations, caches) split over 'data': a small
        draft or head beside a sharded target (the drafters' default)."""
        return cls(heads=None, kv_heads=None, mlp=None, vocab=None)

    @classmethod
    def heads_only(cls) -> ShardingRules:
        """Attention split as the target's (query and KV heads over 'model': the q/k/v/o
        projections, the cache's rows and the attention scores), the MLP and vocabulary
        whole: a draft whose attention on every device would not fit (an EAGLE-3 head's
        prefill scores over a 2,048-token prompt: 16 GiB a chip, docs/performance.md). Its
        KV heads should divide the model axis: a draft's heads are never held twice."""
        return cls(mlp=None, vocab=None)

    def axis(self, letter: str):
        """The mesh axis (a name, a tuple of names, or None) of one axis letter."""
        letter = letter.upper()
        if letter == 'R':
            both = tuple(a for a in (self.batch, self.kv_heads) if a)
            return both if len(both) > 1 else (both[0] if both else None)
        return {'B': self.batch, 'N': self.heads, 'K': self.kv_heads, 'F': self.mlp,
                'V': self.vocab}.get(letter)  # fmt: skip

    def spec(self, letters: str, mesh: Mesh | None = None) -> P:
        """The PartitionSpec of an array whose axes are `letters` ('rsh'; '.' for an axis
        that is never split); mesh axes the mesh lacks (or of size 1) are dropped."""
        out = []
        for letter in letters:
            axis = self.axis(letter)
            names = (axis,) if isinstance(axis, str) else tuple(axis or ())
            if mesh is not None:
                names = tuple(n for n in names if mesh.shape.get(n, 1) > 1)
            out.append(names[0] if len(names) == 1 else (names or None))
        return P(*out)


RULES = ShardingRules()
DRAFT_RULES = ShardingRules.batch_only()
# A draft's sharding by its config name (`spec.draft_sharding`): 'batch' the default.
DRAFT_SHARDINGS = {'batch': DRAFT_RULES, 'heads': ShardingRules.heads_only()}


def draft_rules(name: str) -> ShardingRules:
    """The rules of a draft sharding named in a config (`DRAFT_SHARDINGS`).

    Raises:
      ValueError: an unknown name (the valid ones named).
    """
    if name not in DRAFT_SHARDINGS:
        raise ValueError(f'draft sharding {name!r} is not one of {tuple(DRAFT_SHARDINGS)}')
    return DRAFT_SHARDINGS[name]


def kv_repeat(
    num_kv_heads: int, mesh: Mesh | dict[str, int] | None, rules: ShardingRules = RULES
) -> int:
    """How many times to hold each of K KV heads so that the model axis splits them: M / K
    when the model axis M exceeds K (a multiple of it), else 1. ValueError when neither
    divides the other (no even split of the query heads' groups exists). `mesh` may be a
    mesh's axis sizes alone ({'data': d, 'model': m}: a plan in shapes)."""
    sizes = {} if mesh is None else getattr(mesh, 'shape', mesh)
    ways = 1 if rules.kv_heads is None else int(sizes.get(rules.kv_heads, 1))
    if ways <= num_kv_heads:
        return 1
    if ways % num_kv_heads:
        raise ValueError(
            f'{num_kv_heads} KV heads do not split over mesh axis {rules.kv_heads} of size '
            f'{ways}, nor does it hold each head a whole number of times: use a model axis '
            f'that divides {num_kv_heads} or is a multiple of it'
        )
    return ways // num_kv_heads


def letters_of(name: str, ndim: int) -> str:
    """An array's axis letters from its name suffix ('q_dnh' -> 'dnh'); '' if the name
    carries none (norm scales: replicated)."""
    suffix = name.rsplit('_', 1)[-1] if '_' in name else ''
    return suffix if len(suffix) == ndim and suffix.isalpha() else ''


def param_specs(params, mesh: Mesh | None = None, rules: ShardingRules = RULES):
    """The PartitionSpec of every parameter, from its name's axis letters. A KV-head axis
    K smaller than its mesh axis (a multiple of K) is kept whole: each device needs the
    heads of its query heads' group (`kv_repeat` then splits a copy of each)."""

    def one(path, x):
        letters = letters_of(_key(path[-1]), np.ndim(x)) if path else ''
        if not letters and len(path) > 1 and _key(path[0]) == 'layers' and np.ndim(x) > 1:
            inner = letters_of(_key(path[-1]), np.ndim(x) - 1)  # Scanned layers: [L, ...].
            letters = 'l' + inner if inner else ''
        if not letters:
            return P()
        spec = list(rules.spec(letters, mesh))
        if mesh is not None and 'k' in letters:
            i = letters.index('k')
            if kv_repeat(np.shape(x)[i], mesh, rules) > 1:
                spec[i] = None
        return P(*spec)

    return jax.tree_util.tree_map_with_path(one, params)


def check_divides(params, specs, mesh: Mesh) -> None:
    """ValueError naming the first array a mesh axis does not divide."""
    flat = jax.tree_util.tree_flatten_with_path(params)[0]
    for (path, x), spec in zip(flat, jax.tree.leaves(specs, is_leaf=_is_spec)):
        for dim, (size, axis) in enumerate(zip(np.shape(x), tuple(spec))):
            names = (axis,) if isinstance(axis, str) else tuple(axis or ())
            ways = math.prod(mesh.shape[n] for n in names)
            if size % ways:
                name = '/'.join(_key(k) for k in path)
                raise ValueError(
                    f'{name} {tuple(np.shape(x))}: axis {dim} of size {size} does not split '
                    f'over mesh axis {"x".join(names)} of size {ways} (mesh '
                    f'{dict(mesh.shape)}); use a mesh whose {"x".join(names)} size divides '
                    f'{size}, or replicate it (ShardingRules)'
                )


def checked_specs(params, mesh: Mesh | None, rules: ShardingRules = RULES):
    """`param_specs` of `params` (arrays or shapes) on `mesh`, divisibility checked first
    (`check_divides`); without a mesh, unchecked."""
    specs = param_specs(params, mesh, rules)
    if mesh is not None:
        check_divides(params, specs, mesh)
    return specs


def shard(params, mesh: Mesh | None, rules: ShardingRules = RULES):
    """Places a parameter pytree on `mesh` by `rules` (checked first); None: unchanged."""
    if mesh is None:
        return params
    specs = checked_specs(params, mesh, rules)
    return jax.tree.map(lambda x, s: put(x, NamedSharding(mesh, s)), params, specs)


def place_rows(x, mesh: Mesh | None, rules: ShardingRules = RULES):
    """A host array with leading batch axis B on `mesh`, rows split over the batch axis."""
    if mesh is None:
        return jnp.asarray(x)
    spec = rules.spec('b' + '.' * (np.ndim(x) - 1), mesh)
    return put(x, NamedSharding(mesh, spec))


def put(x, where: NamedSharding) -> jax.Array:
    """`x` (the same value in every process) placed by `where`; on a mesh over several
    processes each process places only its own devices' slices."""
    if where.is_fully_addressable:
        return jax.device_put(x, where)
    host = np.asarray(x)
    return jax.make_array_from_callback(host.shape, where, lambda index: host[index])


def to_host(tree):
    """The numpy value of every array of `tree`, also of arrays split over several
    processes (gathered: every process gets the whole value)."""
    if all(getattr(x, 'is_fully_addressable', True) for x in jax.tree.leaves(tree)):
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def mesh_of(tree) -> Mesh | None:
    """The mesh the first NamedSharding-placed array of `tree` lives on, or None."""
    for x in jax.tree.leaves(tree):
        sharding = getattr(x, 'sharding', None)
        if isinstance(sharding, NamedSharding) and sharding.mesh.size > 1:
            return sharding.mesh
    return None


def use_mesh(mesh: Mesh | None):
    """`jax.set_mesh(mesh)` as a context, or a context that does nothing for None."""
    return contextlib.nullcontext() if mesh is None else jax.set_mesh(mesh)


def constrain(x: jax.Array, letters: str, rules: ShardingRules = RULES) -> jax.Array:
    """Inside jit: x pinned to the spec of its `letters` on the current mesh
    (`jax.set_mesh`); unchanged without one."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return x
    return jax.lax.with_sharding_constraint(x, rules.spec(letters, mesh))


def data_size(mesh: Mesh | None, rules: ShardingRules = RULES) -> int:
    """How many ways the batch is split on `mesh` (1 without one)."""
    if mesh is None or rules.batch is None:
        return 1
    return int(mesh.shape.get(rules.batch, 1))


def _key(k: Any) -> str:
    return str(getattr(k, 'key', getattr(k, 'name', getattr(k, 'idx', k))))


def _is_spec(x) -> bool:
    return isinstance(x, P)
