"""The cost of verification rules against the target forward they follow.

    python launch/bench.py --config configs/bench_rules.py     # B=64, A=8, V=49152, 128256
    python launch/bench.py --config configs/bench_rules.py --config.vocabs='(49152,)' \
        --config.rules="('lossless', 'minp_verify:rho=0.3')"
    python launch/bench.py --config configs/bench_rules.py:tiny   # seconds
"""

import ml_collections


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
    if arg not in (None, '', 'tiny'):
        raise ValueError(f"unknown config arg {arg!r}; valid: '', 'tiny'")
    tiny = arg == 'tiny'
    c = ml_collections.ConfigDict()
    c.kinds = ('rules',)
    c.model = 'random:tiny' if tiny else 'embedded'  # The forward the rules are set against.
    c.dtype = 'float32'
    c.seed = 0
    c.batch = 4 if tiny else 64
    c.num_draft = 3 if tiny else 8
    c.vocabs = (1031,) if tiny else (49152, 128256)
    c.rules = (
        'lossless',
        'lenience:l=0.5',
        'minp_verify:rho=0.3',
        'eta_verify:eta=0.1',
        'speccascade:deferral=token_v3,alpha=0.7',
    )
    c.prefix = 16 if tiny else 128  # Committed tokens in the KV cache of the forward.
    c.rounds = 2 if tiny else 7
    return c
