"""Device profiles for modeled serving time.

A scheduler step is priced with a roofline-style model (`paged.serving.time_model.TimeModel`
applies it; these are its per-device inputs):

    step    = fixed per-step cost + max(memory time, compute time) + all-reduce time
    memory  = (weight bytes + KV bytes read) / HBM bandwidth              (per rank)
    compute = (2 x params x tokens + attention FLOPs) / peak FLOP/s       (per rank)
    swap    = bytes / host-link bandwidth                                 (per direction)

With tensor parallelism over `tp` ranks, weights, KV and FLOPs divide over the ranks and
every layer adds two all-reduces of the step's activations (tokens x hidden x 2 bytes),
each a ring: 2 (tp - 1) / tp x bytes over the interconnect plus a fixed latency.

Figures (vendor datasheets, dense fp16/bf16 tensor throughput, no sparsity):

    profile     HBM B/s    peak FLOP/s  host link B/s  interconnect B/s  HBM GB  note
    a100-40gb   1.555e12   312e12       25e9           300e9             40      A100 40GB SXM
    a100-80gb   2.039e12   312e12       25e9           300e9             80      A100 80GB SXM;
                                                                                 PCIe Gen4 x16
                                                                                 "~25 GB/s
                                                                                 effective"
                                                                                 ([PA-deep-dive])
    h100        3.35e12    989e12       50e9           450e9             80      H100 SXM; PCIe Gen5
    h200        4.8e12     989e12       50e9           450e9             141     H200 SXM
    cpu         8e9        25e9         8e9            8e9               -       this 2-core build
                                                                                 machine (numpy copy
                                                                                 ~8 GB/s, torch fp32
                                                                                 matmul ~25 GFLOP/s);
                                                                                 `kvbench bench --only
                                                                                 serving.measured`
                                                                                 fits its coefficients

Interconnect: NVLink per GPU and direction (A100: 12 NVLink3 links x 25 GB/s = 300 GB/s;
H100: 18 NVLink4 links, 450 GB/s). Fixed per-step cost on the GPUs: 1 ms, an assumption
(kernel launches, scheduling and sampling of one engine iteration), not a measurement;
all-reduce latency: 10 us per call (NCCL on NVLink, small messages), also an assumption.

Fitted efficiency (`efficiency`, `kvbench.workloads.fitted_gpu`): a100-80gb and h100
carry the fractions of HBM bandwidth and FLOP/s, and the per-kernel floor, that Vidur's
measured linear layers reach (`kvbench calibrate gpu`); the datasheet figures above stay
the fields `hbm_bandwidth` and `peak_flops`, and the step model prices with
`effective_hbm_bandwidth` / `effective_peak_flops` plus the floor once per linear kernel
(4 per layer). `datasheet()` gives the same device at 100% and no floor; the names
`<name>-datasheet` selects it. a100-40gb and h200 have no measured profile here: they
take a100-80gb's and h100's fractions (same die, other HBM), an assumption their
`efficiency.source` states (label 'fitted:a100-80gb', 'fitted:h100').

Note on [PA-deep-dive]'s swap-vs-recompute table: its recompute column (2,048 tokens of
Llama-2-70B in 190 ms) implies ~1.5e15 FLOP/s, several A100s' worth; with FLOPs / peak on
one A100 the recompute cost is ~5x higher, so `auto` picks swap even more clearly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from kvbench.workloads.efficiency import DATASHEET, Efficiency
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.fitted_gpu import FITTED

#: Assumed fixed cost of one engine iteration on a GPU (seconds; see module docstring).
GPU_STEP_OVERHEAD_S = 1e-3
#: Assumed latency of one all-reduce call over NVLink (seconds).
NVLINK_ALLREDUCE_LATENCY_S = 10e-6


@dataclass(frozen=True)
class DeviceProfile:
    """Throughput figures of one accelerator (all rates per second).

    Attributes:
        name: key used on the command line.
        hbm_bandwidth: device memory bandwidth, bytes/s.
        peak_flops: dense fp16 tensor FLOP/s.
        host_link_bandwidth: device <-> host copy rate, bytes/s (swap).
        note: where the figures come from.
        step_overhead_s: fixed cost of every engine step that runs the model, seconds.
        interconnect_bandwidth: device <-> device rate per direction (tensor-parallel
            all-reduce), bytes/s.
        allreduce_latency_s: fixed cost of one all-reduce call, seconds.
        memory_bytes: device memory (0 = not stated); set-ups check that weights and KV
            fit it.
        efficiency: achieved fractions of the two peaks and the per-kernel floor
            (`DATASHEET`: 100%, no floor; fitted profiles carry their source).
    """

    name: str
    hbm_bandwidth: float
    peak_flops: float
    host_link_bandwidth: float
    note: str = ""
    step_overhead_s: float = 0.0
    interconnect_bandwidth: float = 300e9
    allreduce_latency_s: float = 0.0
    memory_bytes: float = 0.0
    efficiency: Efficiency = DATASHEET

    def __post_init__(self) -> None:
        for f in ("hbm_bandwidth", "peak_flops", "host_link_bandwidth", "interconnect_bandwidth"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v > 0 and math.isfinite(v)):
                raise ConfigError(f"profile {self.name!r}: {f} must be > 0, got {v!r}")
        for f in ("step_overhead_s", "allreduce_latency_s", "memory_bytes"):
            v = getattr(self, f)
            if not (isinstance(v, (int, float)) and v >= 0 and math.isfinite(v)):
                raise ConfigError(f"profile {self.name!r}: {f} must be >= 0, got {v!r}")

    @property
    def effective_hbm_bandwidth(self) -> float:
        """HBM bandwidth the kernels reach: datasheet x fitted fraction, bytes/s."""
        return self.hbm_bandwidth * self.efficiency.hbm_fraction

    @property
    def effective_peak_flops(self) -> float:
        """FLOP/s the kernels reach: datasheet x fitted fraction."""
        return self.peak_flops * self.efficiency.flops_fraction

    @property
    def calibration(self) -> str:
        """'fitted' or 'datasheet': which figures the modeled times use."""
        return self.efficiency.label

    def datasheet(self) -> DeviceProfile:
        """This device at its datasheet peaks (100%, no kernel floor)."""
        if self.efficiency is DATASHEET:
            return self
        return replace(self, name=f"{self.name}-datasheet", efficiency=DATASHEET)

    def decode_seconds(self, kv_bytes_read: float, weight_bytes: float) -> float:
        """Memory time of one decode step: every weight and cached KV byte read once."""
        return (kv_bytes_read + weight_bytes) / self.effective_hbm_bandwidth

    def prefill_seconds(self, flops: float) -> float:
        """Compute-bound prefill of `flops` floating-point operations."""
        return flops / self.effective_peak_flops

    def transfer_seconds(self, nbytes: float) -> float:
        """One direction of a host-link copy of `nbytes`."""
        return nbytes / self.host_link_bandwidth

    def prefill_tokens_per_second(self, params: float) -> float:
        """Prefill rate of a dense model of `params` parameters (2 FLOPs/param/token)."""
        if params <= 0:
            raise ConfigError(f"params must be > 0, got {params!r}")
        return self.effective_peak_flops / (2.0 * params)


def _gpu(name: str, hbm: float, flops: float, link: float, nvlink: float, gb: float, note: str):
    return DeviceProfile(
        name,
        hbm,
        flops,
        link,
        note,
        step_overhead_s=GPU_STEP_OVERHEAD_S,
        interconnect_bandwidth=nvlink,
        allreduce_latency_s=NVLINK_ALLREDUCE_LATENCY_S,
        memory_bytes=gb * 1e9,
        efficiency=FITTED.get(name, DATASHEET),
    )


_PROFILES: dict[str, DeviceProfile] = {
    p.name: p
    for p in (
        _gpu("a100-40gb", 1.555e12, 312e12, 25e9, 300e9, 40, "A100 40GB SXM, PCIe Gen4 x16"),
        _gpu("a100-80gb", 2.039e12, 312e12, 25e9, 300e9, 80, "A100 80GB SXM, PCIe Gen4 x16"),
        _gpu("h100", 3.35e12, 989e12, 50e9, 450e9, 80, "H100 SXM, PCIe Gen5 x16"),
        _gpu("h200", 4.8e12, 989e12, 50e9, 450e9, 141, "H200 SXM, PCIe Gen5 x16"),
        DeviceProfile(
            "cpu",
            8e9,
            25e9,
            8e9,
            "this build machine (2-core EPYC), measured; serving.measured calibrates it",
            interconnect_bandwidth=8e9,
        ),
    )
}
PROFILES: dict[str, DeviceProfile] = {
    **_PROFILES,
    **{
        p.datasheet().name: p.datasheet()
        for p in _PROFILES.values()
        if p.calibration != "datasheet"
    },
}


def get_profile(name: str) -> DeviceProfile:
    """The profile called `name` (case-insensitive; 'a100' means a100-80gb)."""
    key = str(name).lower()
    key = {"a100": "a100-80gb", "a100-80g": "a100-80gb", "a100-40g": "a100-40gb"}.get(key, key)
    try:
        return PROFILES[key]
    except KeyError:
        raise ConfigError(
            f"unknown device profile {name!r}; known: {', '.join(PROFILES)}"
        ) from None
