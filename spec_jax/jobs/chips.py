"""The accelerators spec_jax plans for: memory, peak bf16 compute and HBM bandwidth per chip,
and the roofline of a program on one (spec_jax/jobs/aot.py, spec_jax/jobs/memory.py).

Figures are the vendors' published per-chip numbers (dense bf16, no sparsity); a roofline
from them is an upper bound on speed: `max(flops / peak, bytes / bandwidth)` assumes the
program reaches both peaks, overlaps compute with memory traffic perfectly, and spends no
time in collectives, launches or the host.
"""

from __future__ import annotations

import dataclasses
import math

GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip (one JAX device).

    Attributes:
      name: the key of `CHIPS` (also the prefix of a TPU topology name, 'v5e:2x2').
      hbm_bytes: its memory.
      peak_flops: dense bf16 FLOP/s.
      hbm_bandwidth: bytes/s.
      platform: 'tpu' (compiled ahead of time for a topology, libtpu) or 'gpu' (the
        estimate only: no GPU compiler runs without the GPU).
      source: where the figures are published.
    """

    name: str
    hbm_bytes: int
    peak_flops: float
    hbm_bandwidth: float
    platform: str
    source: str

    def seconds(self, flops: float, bytes_accessed: float) -> float:
        """The roofline time of a program: the slower of compute and memory traffic."""
        return max(flops / self.peak_flops, bytes_accessed / self.hbm_bandwidth)

    def bound(self, flops: float, bytes_accessed: float) -> str:
        """'memory' or 'compute': which side of the roofline the program sits on."""
        memory = bytes_accessed / self.hbm_bandwidth >= flops / self.peak_flops
        return 'memory' if memory else 'compute'


CHIPS = {
    # cloud.google.com/tpu/docs/v4 ("System architecture"): 275 TFLOPs bf16, 32 GiB HBM2,
    # 1200 GBps per chip (one device: its two TensorCores run as one megacore).
    'v4': Chip('v4', 32 * GIB, 275e12, 1200e9, 'tpu', 'cloud.google.com/tpu/docs/v4'),
    # cloud.google.com/tpu/docs/v5e: 197 TFLOPs bf16, 16 GiB HBM2, 819 GBps per chip.
    'v5e': Chip('v5e', 16 * GIB, 197e12, 819e9, 'tpu', 'cloud.google.com/tpu/docs/v5e'),
    # cloud.google.com/tpu/docs/v5p: 459 TFLOPs bf16, 95 GiB HBM2e, 2765 GBps per chip.
    'v5p': Chip('v5p', 95 * GIB, 459e12, 2765e9, 'tpu', 'cloud.google.com/tpu/docs/v5p'),
    # cloud.google.com/tpu/docs/v6e (Trillium): 918 TFLOPs bf16, 32 GiB, 1640 GBps per chip.
    'v6e': Chip('v6e', 32 * GIB, 918e12, 1640e9, 'tpu', 'cloud.google.com/tpu/docs/v6e'),
    # NVIDIA H100 SXM5 datasheet (nvidia.com/en-us/data-center/h100): 80 GB HBM3 at
    # 3.35 TB/s, 989 TFLOPS bf16 dense (the datasheet's 1,979 assumes 2:4 sparsity).
    'h100': Chip('h100', 80 * 10**9, 989e12, 3.35e12, 'gpu', 'NVIDIA H100 datasheet (SXM5)'),
}


def chip(name: str) -> Chip:
    """The chip `name` ('v5e', 'h100', ...; a TPU topology name 'v5e:2x2' names its chip)."""
    key = name.split(':', 1)[0].lower()
    if key not in CHIPS:
        raise ValueError(f'unknown chip {name!r}; known: {sorted(CHIPS)}')
    return CHIPS[key]


def topology_chips(topology: str) -> int:
    """Chips of a TPU topology name ('v5e:2x2' -> 4, 'v5p:2x2x1' -> 4)."""
    kind, _, dims = topology.partition(':')
    chip(kind)
    try:
        sizes = [int(d) for d in dims.split('x')]
    except ValueError:
        sizes = []
    tpus = sorted(k for k, c in CHIPS.items() if c.platform == 'tpu')
    if not sizes or min(sizes) < 1:
        raise ValueError(
            f"topology {topology!r}: give '<chip>:<dims>', e.g. 'v5e:2x2', 'v5p:2x2x1', "
            f"'v6e:2x2', 'v4:2x2x1' (chips: {tpus})"
        )
    return math.prod(sizes)


def gib(n: float) -> str:
    """Bytes as GiB with two decimals."""
    return f'{n / GIB:.2f} GiB'
