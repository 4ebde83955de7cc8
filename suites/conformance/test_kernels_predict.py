"""The GPU-time prediction (kernels.predict) on synthetic compile records: occupancy limits,
memory- vs compute-bound cases, and the split-KV reduction's extra launch and bytes."""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import configs, predict
from kvbench.kernels.aot import CompileRecord


def _rec(registers: int = 64, shared: int = 16_384, warps: int = 4) -> CompileRecord:
    return CompileRecord("k", {}, "sm_90", registers, 0, shared, 100, warps, "x")


def test_occupancy_limits() -> None:
    h100 = predict.GPUS["h100"]
    assert predict.blocks_per_sm(_rec(32, 0), h100) == 16  # 64 warps / 4
    assert predict.blocks_per_sm(_rec(64, 0), h100) == 8  # registers: 64 * 32 * 4 per block
    assert predict.blocks_per_sm(_rec(255, 0), h100) == 2  # registers: 256 * 32 * 4 per block
    assert predict.blocks_per_sm(_rec(32, 100_000), h100) == 2  # shared memory
    assert predict.blocks_per_sm(_rec(32, 300_000), h100) == 0


def test_big_decode_is_memory_bound_near_peak() -> None:
    h100 = predict.GPUS["h100"]
    b, hq, hkv, d, length = 32, 32, 8, 128, 4096
    launches = predict.decode_launches(b, hq, hkv, d, length, torch.float16)
    assert len(launches) == 2  # split KV: stage 1 + reduction
    kv = 2 * b * length * hkv * d * 2
    partial = predict.decode_partial_bytes(b, hq, d, length)
    p = predict.predict(
        launches, lambda c, a: _rec(), h100, kv, 0, 4 * b * hq * d * length, partial
    )
    assert p.bound == "memory"
    assert 0.5 < p.hbm_fraction < predict.ATTAINABLE
    assert p.time > kv / h100.hbm_bandwidth


def test_tiny_grid_cannot_fill_the_gpu() -> None:
    h100 = predict.GPUS["h100"]
    one = predict.decode_launches(1, 4, 1, 128, 256, torch.float16)
    assert one[0].blocks == 1
    kv = 2 * 256 * 128 * 2
    p = predict.predict(one, lambda c, a: _rec(), h100, kv, 0, 4 * 4 * 128 * 256)
    assert p.hbm_fraction < 0.01  # one block on one SM, plus the launch cost


def test_fp32_prefill_can_be_compute_bound() -> None:
    a100 = predict.GPUS["a100"]
    launches = predict.prefill_launches(4, 32, 8, 128, 2048, torch.float32)
    assert launches[0].config == configs.prefill_config(torch.float32, 128)
    flops = 4 * 4 * 32 * 128 * 2048 * 2049 // 2
    p = predict.predict(launches, lambda c, a: _rec(), a100, 2 * 4 * 2048 * 8 * 128 * 4, 0, flops)
    assert p.bound == "compute"
    assert p.time >= flops / a100.fp32_flops


@pytest.mark.parametrize("gpu", sorted(predict.GPUS))
def test_profiles_agree_with_serving_profiles(gpu: str) -> None:
    from kvbench.workloads.profiles import get_profile

    name = {"a100": "a100-80gb"}.get(gpu, gpu)
    assert predict.GPUS[gpu].hbm_bandwidth == get_profile(name).hbm_bandwidth
