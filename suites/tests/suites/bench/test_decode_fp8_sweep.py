"""kernel.decode_fp8 against independent arithmetic: bytes, paired ratios, accuracy rows."""

from __future__ import annotations

import torch

from kvbench.suites.bench import (
    catalog,  # noqa: F401  (registers the sweeps)
    registry,
)
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.harness import TimingConfig
from kvbench.suites.bench.sweeps.kernels import HEAD_DIM, NUM_KV_HEADS

FAST = TimingConfig(warmup=1, repeats=3, min_sample_s=0.0)


def test_fp8_decode_sweep_rows_follow_from_the_case() -> None:
    sw = registry.get_sweep("kernel.decode_fp8")
    b, length, g = 2, 40, 2
    case = {"block_size": 16, "ctx_len": length, "batch": b, "gqa": g, "kv_dtype": "fp8_e5m2",
            "scales": "head", "head_spread": 256}  # fmt: skip
    got = {m.metric: m for m in sw.measure(case, BenchContext(torch.device("cpu"), FAST))}
    kv = 2 * b * length * NUM_KV_HEADS * HEAD_DIM
    fixed = 2 * b * NUM_KV_HEADS * g * HEAD_DIM * 2 + b * 3 * 4  # q + out (fp16), tables
    assert got["bytes_per_call_fp8"].value == kv + fixed  # one byte per K/V element
    assert got["bytes_per_call_float16"].value == 2 * kv + fixed
    for base in ("float16", "bfloat16"):  # a median of per-repeat ratios: within extremes
        ratio, a, c = got[f"ratio_fp8_vs_{base}"], got["time_fp8"].stats, got[f"time_{base}"].stats
        assert a["min"] / c["max"] <= ratio.value <= a["max"] / c["min"]
        assert ratio.stats is not None and ratio.stats["n"] == 3
    assert got["rel_err_fp8_vs_dequantized_fp64"].value <= 2e-3  # float16's oracle tolerance
    # storing K/V in 8 bits costs more accuracy than in 16
    assert got["rel_err_fp8_vs_exact_fp64"].value > got["rel_err_float16_vs_exact_fp64"].value
    assert got["bandwidth_fraction"].value > 0
