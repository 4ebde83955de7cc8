"""Every launch the GPU dispatch can make is one the ahead-of-time table compiled.

With the Triton launch recorded instead of run (on `meta` tensors: shapes and dtypes, no
data, so long contexts and big batches cost nothing), the ops are called over dtypes,
head dims 64-256, GQA groups 1-64, single and split decode and every block size the
sweeps and the e2e check use. Each recorded launch must name a configuration that
`kernels.configs.all_configs()` lists and the committed sm_80 / sm_90 baselines hold,
pass tensors whose element types are the compiled signature's pointer types, pass
integers that fit the i32 the signature declares, and use a grid within CUDA's limits.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from kvbench.kernels import aot, configs, ops, triton_ops
from kvbench.kernels.triton_kernels import JIT

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HEAD_DIMS = (64, 80, 96, 128, 256)
GROUPS = (1, 2, 3, 4, 8, 12, 16, 32, 48, 64)
#: Block sizes of the kernel sweeps (8-128) and the e2e check (1, 16, 32).
BLOCK_SIZES = (1, 8, 16, 32, 64, 128)
#: CUDA grid limits: x, y, z.
GRID_LIMITS = (2**31 - 1, 65_535, 65_535)
I32_MAX = 2**31 - 1
META = torch.device("meta")
BASELINES = Path(aot.__file__).resolve().parents[1] / "reports" / "baselines"


def _key(cfg: configs.KernelConfig) -> tuple:
    return (cfg.kernel, cfg.dtype, tuple(sorted(cfg.constexprs.items())), cfg.num_warps)


AOT_TABLE = {_key(c) for c in configs.all_configs()}


def _baseline_table(arch: str) -> set[tuple[str, str]]:
    data = json.loads((BASELINES / f"{arch}.json").read_text())
    return {(r["kernel"], aot.config_json(r["config"])) for r in data["static"]}


class Launches:
    def __init__(self) -> None:
        self.calls: list[tuple[configs.KernelConfig, tuple[int, ...], tuple[Any, ...]]] = []

    def __call__(self, cfg: configs.KernelConfig, grid: tuple[int, ...], device, *args) -> None:
        self.calls.append((cfg, grid, args))


@pytest.fixture(scope="module")
def launches() -> Launches:
    """Every launch of the whole grid below, recorded once for the module."""
    rec = Launches()
    real = triton_ops._launch
    triton_ops._launch = rec
    try:
        _drive_everything()
    finally:
        triton_ops._launch = real
    return rec


def _empty(*shape: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=META)


def _decode(
    dtype: torch.dtype, d: int, group: int, bs: int, ctx: int, batch: int, idx=torch.int32
) -> None:
    """One decode call; `idx` is the tables' and lengths' dtype (the launcher normalizes)."""
    hkv = 2 if group * 2 <= 64 else 1
    max_blocks = -(-ctx // bs)
    k = _empty(batch * max_blocks, bs, hkv, d, dtype=dtype)
    ops.paged_decode_attention(
        _empty(batch, hkv * group, d, dtype=dtype),
        k,
        torch.empty_like(k),
        _empty(batch, max_blocks, dtype=idx),
        _empty(batch, dtype=idx),
        backend="triton",
        check_indices=False,
        max_seq_len=ctx,
    )


def _prefill(dtype: torch.dtype, d: int, group: int, bs: int, ctx: int, q: int, batch: int) -> None:
    hkv = 2 if group * 2 <= 64 else 1
    max_blocks = -(-ctx // bs)
    k = _empty(batch * max_blocks, bs, hkv, d, dtype=dtype)
    ops.paged_prefill_attention(
        _empty(batch * q, hkv * group, d, dtype=dtype),
        k,
        torch.empty_like(k),
        _empty(batch, max_blocks, dtype=torch.int32),
        _empty(batch + 1, dtype=torch.int32),
        _empty(batch, dtype=torch.int32),
        backend="triton",
        check_indices=False,
        max_seq_len=ctx,
        max_q_len=q,
    )


def _copies(dtype: torch.dtype, d: int, bs: int) -> None:
    k = _empty(64, bs, 8, d, dtype=dtype)
    v = torch.empty_like(k)
    kv = _empty(48, 8, d, dtype=dtype)
    for slots in (torch.int32, torch.int64):
        ops.write_kv(k, v, kv, kv, _empty(48, dtype=slots), backend="triton", check_indices=False)
    pairs = _empty(5, 2, dtype=torch.int64)
    ops.copy_blocks(k, v, pairs, backend="triton", check_indices=False)
    ops.swap_blocks(k, _empty(16, bs, 8, d, dtype=dtype), pairs, backend="triton",
                    check_indices=False)  # fmt: skip


def _drive_everything() -> None:
    for dtype in DTYPES:
        for d in HEAD_DIMS:
            for bs in BLOCK_SIZES:
                _copies(dtype, d, bs)
                for group in GROUPS:
                    _decode(dtype, d, group, bs, ctx=300, batch=2)  # one partition
                    _decode(dtype, d, group, bs, ctx=1300, batch=2)  # split + reduce
                    _prefill(dtype, d, group, bs, ctx=700, q=130, batch=2)
    # the largest cases of the kernel sweeps' --full grids (grid and i32 limits)
    for dtype in DTYPES:
        _decode(dtype, 128, 8, 8, ctx=8192, batch=128, idx=torch.int64)
        _prefill(dtype, 128, 4, 8, ctx=8192, q=512, batch=16)


def test_the_grid_was_driven(launches: Launches) -> None:
    kernels = {cfg.kernel for cfg, _, _ in launches.calls}
    assert kernels == {"copy_rows", "paged_decode", "paged_decode_reduce", "paged_prefill"}
    singles = {
        cfg.constexprs["SINGLE"] for cfg, _, _ in launches.calls if "SINGLE" in cfg.constexprs
    }
    assert singles == {True, False}


def test_every_launch_is_in_the_aot_table(launches: Launches) -> None:
    missing = {
        (cfg.kernel, aot.config_json(cfg.describe()))
        for cfg, _, _ in launches.calls
        if _key(cfg) not in AOT_TABLE
    }
    assert not missing, f"dispatch chooses configurations AOT never compiles: {sorted(missing)}"


@pytest.mark.parametrize("arch", ["sm80", "sm90"])
def test_every_launch_is_in_the_committed_baseline(launches: Launches, arch: str) -> None:
    table = _baseline_table(arch)
    chosen = {(cfg.kernel, aot.config_json(cfg.describe())) for cfg, _, _ in launches.calls}
    assert chosen <= table, f"not in {arch}.json: {sorted(chosen - table)}"


def test_arguments_match_the_compiled_signature(launches: Launches) -> None:
    """Tensors carry the pointer element type the AOT signature declares; integers fit
    the i32 it declares; the count of runtime arguments matches."""
    seen = set()
    for cfg, _, args in launches.calls:
        sig, _ = aot.signature(cfg)
        runtime = [n for n in JIT[cfg.kernel].arg_names if sig[n] != "constexpr"]
        assert len(args) == len(runtime), (cfg.kernel, len(args), len(runtime))
        for name, value in zip(runtime, args, strict=True):
            kind = sig[name]
            if kind.startswith("*"):
                assert isinstance(value, torch.Tensor), (cfg.kernel, name)
                got = configs.TRITON_DTYPE_NAMES[value.dtype]
                assert got == kind[1:], f"{cfg.kernel}.{name}: {got} passed, *{kind[1:]} compiled"
            elif kind == "i32":
                assert isinstance(value, int) and not isinstance(value, bool), (cfg.kernel, name)
                assert -I32_MAX - 1 <= value <= I32_MAX, (
                    f"{cfg.kernel}.{name}={value} overflows i32"
                )
            else:
                assert kind == "fp32" and isinstance(value, float), (cfg.kernel, name, kind)
            seen.add((cfg.kernel, name))
    assert len(seen) > 40


def test_grids_are_within_cuda_limits(launches: Launches) -> None:
    for cfg, grid, _ in launches.calls:
        assert len(grid) <= 3 and all(g >= 1 for g in grid), (cfg.kernel, grid)
        for g, limit in zip(grid, GRID_LIMITS, strict=False):
            assert g <= limit, f"{cfg.kernel} grid {grid} exceeds CUDA's {GRID_LIMITS}"
