"""The guard that keeps a process under vm.max_map_count frees compiled code when asked."""

import sys

import jax
import jax.numpy as jnp
import pytest

from spec_jax.decoding import code_room

pytestmark = pytest.mark.skipif(sys.platform != 'linux', reason='reads /proc')


def test_mappings_reads_proc():
    held, limit = code_room.mappings()
    with open('/proc/sys/vm/max_map_count') as f:
        assert limit == int(f.read())
    with open('/proc/self/maps') as f:
        assert abs(held - len(f.readlines())) <= 2  # reading may map a page or two


def test_ensure_room_drops_compiled_code_only_over_the_threshold():
    functions = [jax.jit(lambda x, i=i: jnp.sin(x) * i + x @ x.T) for i in range(20)]
    for f in functions:
        f(jnp.ones((5, 5))).block_until_ready()
    held, _ = code_room.mappings()
    assert not code_room.ensure_room(fraction=1.0)
    assert all(f._cache_size() == 1 for f in functions)
    assert code_room.ensure_room(fraction=0.0)
    assert all(f._cache_size() == 0 for f in functions)
    # XLA:CPU keeps about three mappings per executable; clearing gives them back.
    assert code_room.mappings()[0] <= held - 2 * len(functions)
