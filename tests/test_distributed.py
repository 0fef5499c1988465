"""Each process's share of the work: a deterministic partition."""

import pytest

from spec_jax import distributed


def test_share_is_a_deterministic_partition():
    work = list(range(11))
    shares = [distributed.share(work, i, 3) for i in range(3)]
    assert sorted(sum(shares, [])) == work
    assert shares == [distributed.share(work, i, 3) for i in range(3)]
    assert [len(s) for s in shares] == [4, 4, 3]
    with pytest.raises(ValueError, match='process index 3 is not in'):
        distributed.share(work, 3, 3)
