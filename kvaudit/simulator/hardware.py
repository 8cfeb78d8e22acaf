"""GPU profiles: the peak rates and bandwidths the cost model's roofline runs on.

Figures are the vendors' datasheet peaks for dense tensor math (the datasheets quote
2:4 sparsity, twice these) and one direction of the host link (they quote both
directions added). Sources are listed in docs/boundaries.md.
"""

from __future__ import annotations

from typing import Final

import msgspec

from kvaudit.simulator.specs import load_spec

# Bytes per weight at each precision prefill can run at.
WEIGHT_BYTES: Final[dict[str, int]] = {"bf16": 2, "fp8": 1}
PRECISIONS: Final = tuple(WEIGHT_BYTES)


class GpuProfile(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU (or one replica's worth of them) in SI units.

    bf16_flops, fp8_flops: dense peak tensor FLOP/s; fp8_flops None where there is no FP8.
    hbm_bytes_per_s: GPU memory bandwidth.
    host_bytes_per_s: host memory to GPU, one direction (PCIe, or NVLink-C2C on Grace Hopper).
    """

    name: str
    bf16_flops: float
    hbm_bytes_per_s: float
    host_bytes_per_s: float
    fp8_flops: float | None = None

    def __post_init__(self) -> None:
        rates = (self.bf16_flops, self.hbm_bytes_per_s, self.host_bytes_per_s, self.fp8_flops or 1.0)
        if min(rates) <= 0:
            raise ValueError(f"GPU {self.name}: rates and bandwidths must be positive")

    def peak_flops(self, precision: str) -> float:
        """Raises ValueError for an unknown precision, or one this GPU has no tensor cores for."""
        rates = {"bf16": self.bf16_flops, "fp8": self.fp8_flops}
        if precision not in rates:
            raise ValueError(f"precision {precision!r}: expected one of {', '.join(PRECISIONS)}")
        rate = rates[precision]
        if rate is None:
            raise ValueError(f"GPU {self.name}: no {precision} tensor cores")
        return rate


GPUS: Final[dict[str, GpuProfile]] = {
    # H100 SXM5: 80 GB HBM3; PCIe Gen5 x16.
    "h100": GpuProfile(
        name="NVIDIA H100 SXM", bf16_flops=989.4e12, fp8_flops=1978.9e12, hbm_bytes_per_s=3.35e12, host_bytes_per_s=64e9
    ),
    # H200 SXM: the H100's compute with 141 GB of HBM3e.
    "h200": GpuProfile(
        name="NVIDIA H200 SXM", bf16_flops=989.4e12, fp8_flops=1978.9e12, hbm_bytes_per_s=4.8e12, host_bytes_per_s=64e9
    ),
    # GH200 (96 GB HBM3): an H100 joined to a Grace CPU by NVLink-C2C, 900 GB/s both ways.
    "gh200": GpuProfile(
        name="NVIDIA GH200", bf16_flops=989.4e12, fp8_flops=1978.9e12, hbm_bytes_per_s=4.0e12, host_bytes_per_s=450e9
    ),
    # A100 SXM4 80 GB: HBM2e, PCIe Gen4 x16, no FP8 tensor cores.
    "a100": GpuProfile(name="NVIDIA A100 SXM 80GB", bf16_flops=312e12, hbm_bytes_per_s=2.039e12, host_bytes_per_s=32e9),
    # L40S: 48 GB GDDR6, PCIe Gen4 x16.
    "l40s": GpuProfile(
        name="NVIDIA L40S", bf16_flops=362.05e12, fp8_flops=733e12, hbm_bytes_per_s=0.864e12, host_bytes_per_s=32e9
    ),
}


def load_gpu(spec: str) -> GpuProfile:
    """A profile name, or a JSON file with name, bf16_flops, hbm_bytes_per_s, host_bytes_per_s (and fp8_flops).

    Raises:
        ValueError: neither a profile nor a readable profile file.
    """
    return load_spec(spec, GPUS, GpuProfile, "GPU profile")
