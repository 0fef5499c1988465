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
    assert sharding.ShardingRules(heads=None).spec('rsh') == P('data', None, None)
    assert sharding.ShardingRules.replicated().spec('vd') == P(None, None)
    assert sharding.letters_of('q_dnh', 3) == 'dnh'
    assert sharding.letters_of('scale', 1) == ''
    assert sharding.letters_of('q_bias_nh', 3) == ''  # The suffix must name every axis.
    specs = sharding.param_specs({'embed_vd': np.ones((4, 2)),
                                  'norm': {'scale': np.ones(2)}})  # fmt: skip
    assert specs == {'embed_vd': P('model', None), 'norm': {'scale': P()}}
