"""Predicted GPU time of kvbench's Triton attention kernels, from their own cost, no GPU.

For one decode or prefill call the prediction combines
    * the bytes the call must move through HBM (K and V of every cached token read once,
      queries and outputs, block tables, and for split-KV decode the partials written by
      stage 1 and read back by the reduction) and the FLOPs it does (4 * D per query
      head and key: QK^T and PV);
    * the launch grid the dispatch (`kernels.triton_ops`) would use for it, and the
      occupancy its ahead-of-time sm_80 / sm_90 compile implies (`kernels.aot`: registers
      per thread, shared memory per block, warps per block): resident blocks per SM are
      limited by registers (allocated per warp in units of 256), shared memory, 64 warps
      and 32 blocks per SM;
    * a GPU profile below (SM count, HBM bandwidth, peak FLOP/s for the dot's precision).

Model (a roofline whose memory term is Little's law over the kernel's loop, stated so a
reader can disagree):
    resident blocks per SM  r = min(occupancy limit, the grid's blocks spread over all SMs)
    bytes in flight         F = busy SMs x r x (one loop iteration's K and V tile bytes)
    HBM rate                R = min(0.90 x HBM, F / 1.5 us)   (an iteration issues its tile
                                 loads and waits about two dependent HBM round trips: the
                                 block-table entry, then the K/V it points to; 90% is what a
                                 plain device copy reaches on these parts)
    time                    t = max(bytes / R, FLOPs / (busy SMs / SMs x 0.10 x peak))
                                + 3 us per kernel launch
    HBM fraction            bytes / t / HBM
A kernel without a K/V loop tile (the split-KV reduction) keeps the warps rule: 90% of HBM
once 16 warps per SM are resident, proportionally less below. The 1.5 us and the 10% of the
16-bit tensor-core peak are measured, not datasheet figures: fitted on the first H200 run's
16 kernel cases (docs/gpu.md: median measured / predicted 1.17 for the decode, 0.99 for the
prefill) and checked on 216 tile variants that fit did not see (the tuning probe; mean
|measured / predicted - 1| 32% decode, 37% prefill, against 56% and 369% for the datasheet
roofline this replaced): `suites/conformance/test_kernels_predict_h200.py`.
It is a prediction: where a GPU ran, the measured rows stand beside it, never merged.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvbench.kernels import configs
from kvbench.kernels.aot import CompileRecord
from kvbench.workloads.errors import ConfigError

#: Warps per SM that keep HBM busy (kernels without a K/V loop tile), and the fraction of
#: peak a streaming copy reaches.
SATURATING_WARPS = 16
ATTAINABLE = 0.90
#: One K/V loop iteration's latency (s): bytes in flight / this is the HBM rate a kernel
#: can draw (Little's law). Fitted on an H200's measured decode (docs/gpu.md).
ITER_LATENCY_S = 1.5e-6
#: Fraction of the 16-bit tensor-core peak the Triton paged prefill reaches (78-101 TFLOP/s
#: of 989 measured on an H200 at its default tiles; docs/gpu.md). float32 dots keep the
#: FMA peak.
TENSOR_ATTAINABLE = 0.10
#: Host-side launch plus tail cost per kernel launch (s).
LAUNCH_SECONDS = 3e-6


@dataclass(frozen=True)
class GpuSpec:
    """What the model needs of a GPU (datasheet figures, dense, no sparsity).

    Attributes:
        name: profile key ("a100", "h100", "h200").
        arch: compute capability whose AOT compile applies (80 or 90).
        sms: streaming multiprocessors.
        hbm_bandwidth: B/s.
        tensor_flops: fp16/bf16 tensor-core FLOP/s (tl.dot on 16-bit inputs).
        fp32_flops: fp32 FMA FLOP/s (tl.dot with ieee precision on float32).
        shared_per_sm: bytes of shared memory per SM usable by resident blocks.
    """

    name: str
    arch: int
    sms: int
    hbm_bandwidth: float
    tensor_flops: float
    fp32_flops: float
    shared_per_sm: int
    registers_per_sm: int = 65_536
    max_warps_per_sm: int = 64
    max_blocks_per_sm: int = 32


GPUS: dict[str, GpuSpec] = {
    "a100": GpuSpec("a100", 80, 108, 2.039e12, 312e12, 19.5e12, 167_936),
    "h100": GpuSpec("h100", 90, 132, 3.35e12, 989e12, 67e12, 233_472),
    "h200": GpuSpec("h200", 90, 132, 4.8e12, 989e12, 67e12, 233_472),
}


@dataclass(frozen=True)
class Launch:
    """One kernel launch of a call: its configuration and grid size (blocks)."""

    config: configs.KernelConfig
    blocks: int


@dataclass(frozen=True)
class Prediction:
    """Predicted cost of one call on one GPU (seconds, bytes, FLOPs, fractions)."""

    gpu: str
    time: float
    hbm_fraction: float
    bytes: int
    flops: int
    occupancy: float  # resident warps / max warps per SM, of the main kernel
    bound: str  # "memory" or "compute"


def blocks_per_sm(rec: CompileRecord, gpu: GpuSpec) -> int:
    """Resident blocks per SM that registers, shared memory, warps and blocks allow."""
    warps = rec.num_warps
    regs_per_warp = math.ceil(max(rec.registers, 1) * 32 / 256) * 256
    by_regs = gpu.registers_per_sm // (regs_per_warp * warps)
    by_shared = gpu.shared_per_sm // rec.shared_bytes if rec.shared_bytes else gpu.max_blocks_per_sm
    return max(0, min(by_regs, by_shared, gpu.max_warps_per_sm // warps, gpu.max_blocks_per_sm))


def loop_tile_bytes(config: configs.KernelConfig) -> int:
    """Bytes of K and V one iteration of a kernel's loop loads (TILE_N tokens x D_PAD, at
    the cache's element size: 1 for fp8 K/V); 0 for a kernel without a K/V tile."""
    c = config.constexprs
    if "TILE_N" not in c or "D_PAD" not in c:
        return 0
    elem = 1 if c.get("FP8_MAN", 0) else config.dtype.itemsize
    return 2 * int(c["TILE_N"]) * int(c["D_PAD"]) * elem  # type: ignore[call-overload]


def _launch_time(launch: Launch, rec: CompileRecord, gpu: GpuSpec, nbytes: float, flops: float,
                 dtype: torch.dtype) -> tuple[float, float]:  # fmt: skip
    """(seconds, occupancy) of one launch moving `nbytes` and doing `flops`."""
    per_sm = blocks_per_sm(rec, gpu)
    if per_sm == 0:
        raise ConfigError(f"{rec.kernel} {rec.config} cannot be resident on {gpu.name}")
    resident = min(per_sm, max(1, math.ceil(launch.blocks / gpu.sms)))
    tile = loop_tile_bytes(launch.config)
    if tile:
        in_flight = min(gpu.sms, launch.blocks) * resident * tile
        rate = min(ATTAINABLE * gpu.hbm_bandwidth, in_flight / ITER_LATENCY_S)
    else:
        warps = min(resident * rec.num_warps, launch.blocks * rec.num_warps / gpu.sms)
        rate = ATTAINABLE * min(1.0, warps / SATURATING_WARPS) * gpu.hbm_bandwidth
    busy = min(1.0, launch.blocks / gpu.sms)
    peak = gpu.fp32_flops if dtype == torch.float32 else TENSOR_ATTAINABLE * gpu.tensor_flops
    t = max(nbytes / rate, flops / (busy * peak)) + LAUNCH_SECONDS
    return t, per_sm * rec.num_warps / gpu.max_warps_per_sm


def decode_launches(batch: int, hq: int, hkv: int, head_dim: int, max_len: int,
                    dtype: torch.dtype) -> list[Launch]:  # fmt: skip
    """The launches `triton_ops.paged_decode_attention` makes (default partition)."""
    n_parts = max(1, -(-max_len // configs.DEFAULT_PARTITION))
    cfg = configs.decode_config(dtype, head_dim, hq // hkv, n_parts == 1)
    n_chunks = -(-(hq // hkv) // cfg.int_constexpr("QH"))
    out = [Launch(cfg, batch * hkv * n_chunks * n_parts)]
    if n_parts > 1:
        out.append(Launch(configs.reduce_config(dtype, head_dim), batch * hq))
    return out


def prefill_launches(batch: int, hq: int, hkv: int, head_dim: int, max_q: int,
                     dtype: torch.dtype) -> list[Launch]:  # fmt: skip
    """The launch `triton_ops.paged_prefill_attention` makes (its tile chosen by the rows
    the longest sequence's new tokens bring: max_q x GQA group)."""
    cfg = configs.prefill_config(dtype, head_dim, max_q * (hq // hkv))
    block_m = cfg.int_constexpr("BLOCK_M")
    heads = min(hq // hkv, block_m)
    n_chunks = -(-(hq // hkv) // heads)
    q_tiles = -(-max_q // (block_m // heads))
    return [Launch(cfg, batch * hkv * n_chunks * q_tiles)]


def predict(
    launches: list[Launch],
    records: Callable[[configs.KernelConfig, int], CompileRecord],
    gpu: GpuSpec,
    kv_bytes: int,
    io_bytes: int,
    flops: int,
    partial_bytes: int = 0,
) -> Prediction:
    """Predicted time of a call whose main launch reads `kv_bytes + io_bytes` and does
    `flops`; a second launch (the split-KV reduction) reads back `partial_bytes` that
    the first wrote. `records(config, arch)` gives each launch's AOT compile record."""
    main, *rest = launches
    rec = records(main.config, gpu.arch)
    t, occ = _launch_time(main, rec, gpu, kv_bytes + io_bytes + partial_bytes, flops,
                          main.config.dtype)  # fmt: skip
    for extra in rest:
        t += _launch_time(extra, records(extra.config, gpu.arch), gpu, partial_bytes, 0,
                          extra.config.dtype)[0]  # fmt: skip
    total = kv_bytes + io_bytes + 2 * partial_bytes
    ratio = total / t / gpu.hbm_bandwidth
    fp32 = main.config.dtype == torch.float32
    compute = flops / (gpu.fp32_flops if fp32 else TENSOR_ATTAINABLE * gpu.tensor_flops)
    bound = "compute" if compute > total / gpu.hbm_bandwidth else "memory"
    return Prediction(gpu.name, t, ratio, total, flops, occ, bound)


def decode_partial_bytes(batch: int, hq: int, head_dim: int, max_len: int) -> int:
    """fp32 partial outputs, maxima and sums stage 1 writes when the KV is split."""
    n_parts = max(1, -(-max_len // configs.DEFAULT_PARTITION))
    return 0 if n_parts == 1 else batch * hq * n_parts * (head_dim + 2) * 4
