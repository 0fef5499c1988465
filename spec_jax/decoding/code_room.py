"""Keeps a long-lived process under the kernel's limit on memory mappings.

XLA:CPU loads each compiled kernel into pages of its own: about three memory mappings per
kernel, which is 1,000-1,300 per compiled decode loop of the embedded default (measured:
chain with an EAGLE-3 head about 1,000, plain AR about 1,300). Linux caps a process at
`vm.max_map_count` mappings (65,530 by default), and the compile that crosses the cap
segfaults. A script that sweeps some fifty settings in one process (each a new static
argument, so a new loop) would crash there; `ensure_room` drops JAX's compiled code first,
and the next call compiles again.
"""

from __future__ import annotations

import logging

import jax

log = logging.getLogger(__name__)

_MAPS = '/proc/self/maps'
_LIMIT = '/proc/sys/vm/max_map_count'


def mappings() -> tuple[int, int] | None:
    """(memory mappings this process holds, the kernel's limit), or None where /proc does
    not tell (not Linux)."""
    try:
        with open(_LIMIT) as f:
            limit = int(f.read())
        with open(_MAPS, 'rb') as f:
            held = sum(1 for _ in f)
    except (OSError, ValueError):
        return None
    return held, limit


def ensure_room(fraction: float = 0.75) -> bool:
    """Clears JAX's caches when this process holds more than `fraction` of its mapping limit.

    Called before each decode loop is run, so that compiling it cannot cross the limit: at
    the default, a quarter of the limit (16k mappings) stays free, more than a decode loop
    of a 32-layer model needs. The check reads /proc/self/maps, about 1 us per mapping
    (2 ms at the 2k a run of the embedded default holds, 45 ms at the threshold), against
    a loop that runs for hundreds of milliseconds or more.

    Returns:
      Whether the caches were cleared.
    """
    state = mappings()
    if state is None or state[0] <= fraction * state[1]:
        return False
    log.warning(
        'this process holds %d of its %d memory mappings (vm.max_map_count); dropping '
        "JAX's compiled code so that the next compile does not crash",
        *state,
    )
    jax.clear_caches()
    return True
