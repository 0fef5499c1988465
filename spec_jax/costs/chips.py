"""The chips spec_jax plans for: memory, peak bf16 compute (fp32 for the CPU), HBM and
interconnect bandwidth per chip, and the roofline of a program on one (spec_jax/jobs/aot.py,
spec_jax/costs/memory.py; measured efficiencies: spec_jax/costs/calibration.py).

Figures are the vendors' published per-chip numbers (dense bf16, no sparsity); memories are
in bytes as the device reports them where one has been seen (nvidia-smi's MiB), else the
datasheet's. A roofline from them is an upper bound on speed: `max(flops / peak, bytes /
bandwidth)` assumes the program reaches both peaks, overlaps compute with memory traffic
perfectly, and spends no time in collectives, launches or the host.
"""

from __future__ import annotations

import dataclasses
import math

GIB = 1 << 30
MIB = 1 << 20


@dataclasses.dataclass(frozen=True)
class Chip:
    """One accelerator chip (one JAX device).

    Attributes:
      name: the key of `CHIPS` (also the prefix of a TPU topology name, 'v5e:2x2').
      hbm_bytes: its memory.
      peak_flops: dense bf16 FLOP/s.
      hbm_bandwidth: bytes/s.
      platform: 'tpu' (compiled ahead of time for a topology, libtpu), 'gpu' (the
        estimate only: no GPU compiler runs without the GPU) or 'cpu'.
      source: where the figures are published.
      interconnect: bytes/s one way between chips (half the published bidirectional
        figure: ICI for a TPU, NVLink for a GPU); 0 where not at hand.
      device_kinds: `jax.Device.device_kind` strings of the chip (`of_device`).
      slot_multiple: cache slots a row are padded to a multiple of this (128 on GPUs and
        TPUs: a slot axis off the multiple cost the H200's T 1 forward 7.3 ms at 4,156
        slots against 5.55 at 4,096; 1 on a CPU).
    """

    name: str
    hbm_bytes: int
    peak_flops: float
    hbm_bandwidth: float
    platform: str
    source: str
    interconnect: float = 0.0
    device_kinds: tuple[str, ...] = ()
    slot_multiple: int = 128

    def slots(self, n: int) -> int:
        """`n` cache slots padded to the chip's multiple."""
        return -(-n // self.slot_multiple) * self.slot_multiple

    def seconds(self, flops: float, bytes_accessed: float) -> float:
        """The roofline time of a program: the slower of compute and memory traffic."""
        return max(flops / self.peak_flops, bytes_accessed / self.hbm_bandwidth)

    def bound(self, flops: float, bytes_accessed: float) -> str:
        """'memory' or 'compute': which side of the roofline the program sits on."""
        memory = bytes_accessed / self.hbm_bandwidth >= flops / self.peak_flops
        return 'memory' if memory else 'compute'

    def all_reduce_seconds(self, num_bytes: float, chips: int) -> float | None:
        """A ring all-reduce of `num_bytes` per chip over `chips` chips at the interconnect's
        one-way bandwidth: 2 (n - 1) / n x bytes / bandwidth (no latency counted); None where
        the bandwidth is not at hand."""
        if chips <= 1 or not num_bytes:
            return 0.0
        if not self.interconnect:
            return None
        return 2 * (chips - 1) / chips * num_bytes / self.interconnect


CHIPS = {
    # cloud.google.com/tpu/docs/v4 ("System architecture"): 275 TFLOPs bf16, 32 GiB HBM2,
    # 1200 GBps per chip (one device: its two TensorCores run as one megacore).
    'v4': Chip('v4', 32 * GIB, 275e12, 1200e9, 'tpu', 'cloud.google.com/tpu/docs/v4',
               device_kinds=('TPU v4',)),  # fmt: skip
    # cloud.google.com/tpu/docs/v5e: 197 TFLOPs bf16, 16 GiB HBM2, 819 GBps, ICI 400 GBps
    # bidirectional (1,600 Gbps) per chip.
    'v5e': Chip('v5e', 16 * GIB, 197e12, 819e9, 'tpu', 'cloud.google.com/tpu/docs/v5e',
                200e9, ('TPU v5 lite', 'TPU v5e')),  # fmt: skip
    # cloud.google.com/tpu/docs/v5p: 459 TFLOPs bf16, 95 GiB HBM2e, 2765 GBps, ICI 1200 GBps
    # bidirectional per chip.
    'v5p': Chip('v5p', 95 * GIB, 459e12, 2765e9, 'tpu', 'cloud.google.com/tpu/docs/v5p',
                600e9, ('TPU v5p',)),  # fmt: skip
    # cloud.google.com/tpu/docs/v6e (Trillium): 918 TFLOPs bf16, 32 GiB, 1640 GBps, ICI
    # 800 GBps bidirectional per chip.
    'v6e': Chip('v6e', 32 * GIB, 918e12, 1640e9, 'tpu', 'cloud.google.com/tpu/docs/v6e',
                400e9, ('TPU v6 lite', 'TPU v6e')),  # fmt: skip
    # NVIDIA H100 SXM5 datasheet (nvidia.com/en-us/data-center/h100): HBM3 at 3.35 TB/s
    # (nvidia-smi: 81,559 MiB), 989 TFLOPS bf16 dense (the datasheet's 1,979 assumes 2:4
    # sparsity), NVLink 900 GB/s bidirectional.
    'h100': Chip('h100', 81_559 * MIB, 989e12, 3.35e12, 'gpu', 'NVIDIA H100 datasheet (SXM5)',
                 450e9, ('NVIDIA H100 80GB HBM3',)),  # fmt: skip
    # NVIDIA H200 datasheet (nvidia.com/en-us/data-center/h200): HBM3e at 4.8 TB/s (nvidia-smi:
    # 143,771 MiB), 989 TFLOPS bf16 dense, NVLink 900 GB/s bidirectional. Calibrated
    # (spec_jax/costs/calibration.py, 2026-12-04).
    'h200': Chip('h200', 143_771 * MIB, 989e12, 4.8e12, 'gpu', 'NVIDIA H200 datasheet (SXM)',
                 450e9, ('NVIDIA H200',)),  # fmt: skip
    # NVIDIA DGX B200 datasheet: 1,440 GB for 8 GPUs (180 GB each; no device seen), HBM3e at
    # 8 TB/s, 2.25 PFLOPS bf16 dense (HGX B200, 1,000 W; 4.5 with sparsity), NVLink 5 at
    # 1.8 TB/s bidirectional.
    'b200': Chip('b200', 180 * 10**9, 2.25e15, 8e12, 'gpu', 'NVIDIA DGX/HGX B200 datasheets',
                 900e9, ('NVIDIA B200',)),  # fmt: skip
    # This project's CPU, a chip like any other (lscpu and free -b, 2026-12-06): 2 cores of
    # an Intel Xeon (family 6 model 207, KVM) at 2.1 GHz with AVX-512 and two FMA units,
    # 2 x 2.1e9 x 64 = 269 GFLOP/s fp32; no published bandwidth for the VM: 33 GB/s, what
    # an XLA fp32 sum and matvec over 1 GiB reached here (33.1, 32.4 GB/s; load 0.8);
    # 25.3 GB of RAM. Calibrated from its own bench (configs/bench_accel.py:cpu).
    'cpu': Chip('cpu', 25_324_961_792, 2.688e11, 33e9, 'cpu', "this machine's lscpu and an "
                'XLA matvec', device_kinds=('cpu',), slot_multiple=1),  # fmt: skip
}


def chip(name: str) -> Chip:
    """The chip `name` ('v5e', 'h100', ...; a TPU topology name 'v5e:2x2' names its chip)."""
    key = name.split(':', 1)[0].lower()
    if key not in CHIPS:
        raise ValueError(f'unknown chip {name!r}; known: {sorted(CHIPS)}')
    return CHIPS[key]


def of_device(device) -> Chip | None:
    """The chip of a `jax.Device` (by its `device_kind`), or None (a CPU, an unknown kind)."""
    kind = getattr(device, 'device_kind', '')
    for c in CHIPS.values():
        if kind in c.device_kinds:
            return c
    return None


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
