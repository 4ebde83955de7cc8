"""Device profiles for modeled serving time.

A scheduler step is priced with a roofline-style model (the issue's formulas):

    decode  = (KV bytes read + weight bytes) / HBM bandwidth      (memory-bound)
    prefill = FLOPs / peak dense fp16 FLOP/s                      (compute-bound)
    swap    = bytes / host-link bandwidth                         (per direction)

Figures (vendor datasheets, dense fp16/bf16 tensor throughput, no sparsity):

    profile     HBM B/s     peak FLOP/s   host link B/s   source / note
    a100-80gb   2.039e12    312e12        25e9            A100 80GB SXM; PCIe Gen4 x16
                                                          "~25 GB/s effective" (seed 001)
    h100        3.35e12     989e12        50e9            H100 SXM; PCIe Gen5 x16, about
                                                          twice Gen4's effective rate
    h200        4.8e12      989e12        50e9            H200 SXM (same compute as H100)
    cpu         8e9         25e9          8e9             this 2-core build machine, measured
                                                          (numpy copy ~8 GB/s read+write,
                                                          torch fp32 2048^3 matmul ~25 GFLOP/s)

Note on seed 001's swap-vs-recompute table: its recompute column (2,048 tokens of
Llama-2-70B in 190 ms) implies ~1.5e15 FLOP/s, several A100s' worth; with FLOPs / peak on
one A100 the recompute cost is ~5x higher, so `auto` picks swap even more clearly.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.workloads.errors import ConfigError


@dataclass(frozen=True)
class DeviceProfile:
    """Throughput figures of one accelerator (all rates per second).

    Attributes:
        name: key used on the command line.
        hbm_bandwidth: device memory bandwidth, bytes/s.
        peak_flops: dense fp16 tensor FLOP/s.
        host_link_bandwidth: device <-> host copy rate, bytes/s (swap).
        note: where the figures come from.
    """

    name: str
    hbm_bandwidth: float
    peak_flops: float
    host_link_bandwidth: float
    note: str = ""

    def __post_init__(self) -> None:
        for f in ("hbm_bandwidth", "peak_flops", "host_link_bandwidth"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0):
                raise ConfigError(f"profile {self.name!r}: {f} must be > 0, got {v!r}")

    def decode_seconds(self, kv_bytes_read: float, weight_bytes: float) -> float:
        """One decode step: every weight and every cached KV byte read once."""
        return (kv_bytes_read + weight_bytes) / self.hbm_bandwidth

    def prefill_seconds(self, flops: float) -> float:
        """Compute-bound prefill of `flops` floating-point operations."""
        return flops / self.peak_flops

    def transfer_seconds(self, nbytes: float) -> float:
        """One direction of a host-link copy of `nbytes`."""
        return nbytes / self.host_link_bandwidth

    def prefill_tokens_per_second(self, params: float) -> float:
        """Prefill rate of a dense model of `params` parameters (2 FLOPs/param/token)."""
        if params <= 0:
            raise ConfigError(f"params must be > 0, got {params!r}")
        return self.peak_flops / (2.0 * params)


PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        DeviceProfile("a100-80gb", 2.039e12, 312e12, 25e9, "A100 80GB SXM, PCIe Gen4 x16"),
        DeviceProfile("h100", 3.35e12, 989e12, 50e9, "H100 SXM, PCIe Gen5 x16"),
        DeviceProfile("h200", 4.8e12, 989e12, 50e9, "H200 SXM, PCIe Gen5 x16"),
        DeviceProfile("cpu", 8e9, 25e9, 8e9, "this build machine (2-core EPYC), measured"),
    )
}


def get_profile(name: str) -> DeviceProfile:
    """The profile called `name` (case-insensitive; 'a100' means a100-80gb)."""
    key = name.lower()
    key = {"a100": "a100-80gb", "a100-80g": "a100-80gb"}.get(key, key)
    try:
        return PROFILES[key]
    except KeyError:
        raise ConfigError(
            f"unknown device profile {name!r}; known: {', '.join(PROFILES)}"
        ) from None
