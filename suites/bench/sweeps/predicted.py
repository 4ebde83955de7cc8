"""kernel.predicted: the GPU time of every kernel.decode and kernel.prefill case, predicted
from the kernel's own bytes, FLOPs and ahead-of-time compile (kernels.predict) on the
A100, H100 and H200 profiles. No GPU is needed: the sm_80 / sm_90 compile records come
from kernels.aot (cached in out/aot). Its rows are predictions and live in their own
sweep, so no page or verdict mixes them with measured times; where a GPU ran, the
kernel.decode / kernel.prefill rows of that run are the measured side to set beside them.

The headline case of issue 16 (batch 32 x 4,096 tokens, fp16, D 128, block 16, 32 query /
8 KV heads) is always in the grid.
"""

from __future__ import annotations

import functools

import torch

from kvbench.reports.provenance import PREDICTED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.suites.bench.sweeps import kernels as kernel_sweeps
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.torch_dtypes import torch_dtype

GPUS = ("a100", "h100", "h200")
HEADLINE = {
    "block_size": DEFAULT_BLOCK_SIZE,
    "ctx_len": 4096,
    "batch": 32,
    "dtype": "float16",
    "gqa": 4,
}
#: fp16 prefill cases that reach each of the Triton prefill's tiles (16 rows for a 16-token
#: extend, 32 and 64 for 64- and 512-token runs at GQA 4), so the predictions cover the
#: configurations the GPU dispatch picks, whatever dtype the CPU sweep defaults to.
PREFILL_TIERS = [
    {
        "block_size": DEFAULT_BLOCK_SIZE,
        "ctx_len": 2048,
        "q_len": n,
        "batch": 8,
        "dtype": "float16",
        "gqa": 4,
    }
    for n in (16, 64, 512)
]


def _cases(full: bool) -> list[Case]:
    decode = kernel_sweeps._decode_cases(full)
    if HEADLINE not in decode:
        decode = [*decode, HEADLINE]
    prefill = kernel_sweeps._prefill_cases(full)
    prefill += [c for c in PREFILL_TIERS if c not in prefill]
    return [
        {"kernel": kind, "gpu": gpu, **case}
        for kind, cases in (("decode", decode), ("prefill", prefill))
        for case in cases
        for gpu in GPUS
    ]


@functools.cache
def _record(cfg, arch: int):  # type: ignore[no-untyped-def]
    from kvbench.kernels import aot

    return aot.compile_all([cfg], archs=(arch,))[0]


@sweep(
    "kernel.predicted",
    "predicted GPU time and HBM fraction of every kernel case (bytes, FLOPs and the "
    "sm_80 / sm_90 compile's occupancy over A100 / H100 / H200 profiles); predicted, not "
    "measured",
    _cases,
    requires=("kvbench.kernels.predict", "triton"),
    tags=("kernel",),
    produced=(PREDICTED,),
)
def predicted(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.kernels import predict

    gpu = predict.GPUS[case["gpu"]]
    dt = torch_dtype(case["dtype"])
    esize = torch.empty(0, dtype=dt).element_size()
    b, length, bs, g = case["batch"], case["ctx_len"], case["block_size"], case["gqa"]
    hkv, d = kernel_sweeps.NUM_KV_HEADS, kernel_sweeps.HEAD_DIM
    hq = hkv * g
    kv = 2 * b * length * hkv * d * esize
    tables = b * -(-length // bs) * 4
    if case["kernel"] == "decode":
        launches = predict.decode_launches(b, hq, hkv, d, length, dt)
        io = 2 * b * hq * d * esize + tables
        flops = 4 * b * hq * d * length
        partial = predict.decode_partial_bytes(b, hq, d, length)
    else:
        n = case["q_len"]
        launches = predict.prefill_launches(b, hq, hkv, d, n, dt)
        io = 2 * b * n * hq * d * esize + tables
        flops = 4 * b * hq * d * (n * (length - n) + n * (n + 1) // 2)
        partial = 0
    p = predict.predict(launches, _record, gpu, kv, io, flops, partial)
    return [
        Measurement("predicted_time", p.time, "s"),
        Measurement("predicted_hbm_fraction", p.hbm_fraction, "fraction"),
        Measurement("predicted_occupancy", p.occupancy, "fraction"),
        Measurement("predicted_bytes", p.bytes, "B"),
        Measurement("predicted_flops", p.flops, "FLOP"),
        Measurement("predicted_compute_bound", float(p.bound == "compute"), "bool"),
        # the query rows per program of the chosen configuration (decode: query heads)
        Measurement("predicted_tile_rows", _tile_rows(launches[0].config), "rows"),
    ]


def _tile_rows(cfg) -> float:  # type: ignore[no-untyped-def]
    """BLOCK_M of a prefill configuration, QH of a decode one."""
    return float(cfg.constexprs.get("BLOCK_M", cfg.constexprs.get("QH", 0)))
