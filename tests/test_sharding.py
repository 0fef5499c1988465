"""The sharding rules as data: mesh sizes, letters -> specs (no devices needed; the
decoding checks on 8 fake devices are tests/mesh)."""

import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from spec_jax import sharding


def test_mesh_sizes_fill_the_minus_one_and_name_what_does_not_fit():
    assert sharding.mesh_shape(sharding.mesh_config(-1, 2), 8) == (4, 2)
    assert sharding.mesh_shape(sharding.mesh_config(2, 2), 8) == (2, 2)  # The first 4.
    with pytest.raises(ValueError, match='needs 16 devices; 8 are available'):
        sharding.mesh_shape(sharding.mesh_config(4, 4), 8)
    with pytest.raises(ValueError, match='do not split into 3 x -1'):
        sharding.mesh_shape(sharding.mesh_config(3, -1), 8)
    with pytest.raises(ValueError, match='at most one -1'):
        sharding.mesh_shape(sharding.mesh_config(-1, -1), 8)


def test_specs_follow_the_axis_letters():
    rules = sharding.RULES
    assert rules.spec('dnh') == P(None, 'model', None)
    assert rules.spec('rsh') == P(('data', 'model'), None, None)
    assert rules.spec('b.') == P('data', None)
    assert sharding.ShardingRules(kv_heads=None).spec('rsh') == P('data', None, None)
    assert sharding.ShardingRules(heads=None).spec('dkh') == P(None, 'model', None)
    assert sharding.DRAFT_RULES.spec('rsh') == P('data', None, None)
    assert sharding.DRAFT_RULES.spec('dnh') == P(None, None, None)
    assert sharding.ShardingRules.replicated().spec('vd') == P(None, None)
    assert sharding.letters_of('q_dnh', 3) == 'dnh'
    assert sharding.letters_of('scale', 1) == ''
    assert sharding.letters_of('q_bias_nh', 3) == ''  # The suffix must name every axis.
    specs = sharding.param_specs({'embed_vd': np.ones((4, 2)),
                                  'norm': {'scale': np.ones(2)}})  # fmt: skip
    assert specs == {'embed_vd': P('model', None), 'norm': {'scale': P()}}


class _Mesh:
    """Stands in for a Mesh where only its axis sizes are read."""

    def __init__(self, **shape):
        self.shape = shape


def test_a_model_axis_larger_than_the_kv_heads_holds_each_head_several_times():
    mesh = _Mesh(data=1, model=16)
    assert sharding.kv_repeat(8, mesh) == 2  # Qwen2.5-72B at model 16.
    assert sharding.kv_repeat(8, _Mesh(data=2, model=8)) == 1
    assert sharding.kv_repeat(8, None) == 1
    assert sharding.kv_repeat(2, mesh, sharding.DRAFT_RULES) == 1  # Heads whole.
    with pytest.raises(ValueError, match='3 KV heads do not split over mesh axis model of size 4'):
        sharding.kv_repeat(3, _Mesh(data=1, model=4))
    specs = sharding.param_specs({'k_dkh': np.ones((4, 8, 2)), 'q_dnh': np.ones((4, 64, 2))},
                                 mesh)  # fmt: skip
    assert specs == {'k_dkh': P(None, None, None), 'q_dnh': P(None, 'model', None)}
