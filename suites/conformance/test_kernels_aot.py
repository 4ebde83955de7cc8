"""Ahead-of-time compile checks: the kernels are real sm_80 / sm_90 code, and affordable.

Each configuration is compiled with Triton's own compiler for a GPU target that this
machine does not have; the test fails if a configuration does not compile, spills
registers to local memory, or exceeds the architecture's shared memory or register limits.
The ci profile builds a representative set (float16, head dim 128: split and
single-partition decode, the reduction, prefill, the copy kernel); the whole table of
configurations the dispatch can choose is the slow test (cached under out/aot, so a rerun
with unchanged kernels takes seconds).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from kvbench.kernels import aot, configs

#: Registers per thread the wide (measured) decode tile may take: 4 programs of 4 warps
#: fit one SM's 65,536 registers, the occupancy of the variant measured on an H200.
WIDE_DECODE_REGISTERS = 128


def _assert_clean(records: list[aot.CompileRecord]) -> None:
    problems = [
        f"{r.kernel} {r.config} {r.arch}: {r.violations()}" for r in records if r.violations()
    ]
    assert not problems, "\n".join(problems)
    for r in records:
        assert r.registers > 0 and r.sass_instructions > 0, r


def test_headline_configurations_compile_clean() -> None:
    cfgs = aot.headline_configs()
    records = aot.compile_all(cfgs, workers=2)
    assert len(records) == len(cfgs) * len(aot.ARCHS)
    assert {r.arch for r in records} == {"sm_80", "sm_90"}
    _assert_clean(records)
    # the split decode kernel holds the GQA group's accumulators and a K/V tile; at the
    # measured 64-token tile within 128 registers (4 programs of 4 warps per SM)
    decode = [r for r in records if r.kernel == "paged_decode"]
    assert all(r.shared_bytes > 0 for r in decode)
    assert all(r.config["TILE_N"] == configs.DECODE_WIDE_TILE_N for r in decode)
    assert all(r.registers <= WIDE_DECODE_REGISTERS for r in decode), decode
    # a second call is served from the cache, record for record
    assert aot.compile_all(cfgs, workers=1) == records


@pytest.mark.slow
def test_every_configuration_compiles_clean() -> None:
    records = aot.compile_all(workers=2)
    assert len(records) == len(configs.all_configs()) * len(aot.ARCHS)
    _assert_clean(records)


def test_configuration_table_covers_the_dispatch() -> None:
    """Every configuration the launchers can pick for the supported dtypes, head dims,
    GQA ratios (1..8, MQA up to 128 heads) and partition modes is in the AOT table."""
    table = {
        (c.kernel, c.dtype, tuple(sorted(c.constexprs.items()))) for c in configs.all_configs()
    }

    def key(c: configs.KernelConfig) -> tuple:
        return (c.kernel, c.dtype, tuple(sorted(c.constexprs.items())))

    for dtype in configs.DTYPES:
        for head_dim in (16, 64, 80, 96, 128, 256):
            for group in (1, 2, 3, 4, 6, 8, 16, 32, 48, 64, 128):
                for single in (True, False):
                    assert key(configs.decode_config(dtype, head_dim, group, single)) in table
            assert key(configs.reduce_config(dtype, head_dim)) in table
            assert key(configs.prefill_config(dtype, head_dim)) in table
    for size in (2, 4):
        for identity in (True, False):
            assert key(configs.copy_config(size, identity)) in table


def test_violations_are_reported() -> None:
    """The limits check itself can fail: spills, shared memory and registers over limit."""
    ok = aot.CompileRecord("k", {}, "sm_80", 128, 0, 1024, 100, 4, "3")
    assert ok.violations() == []
    assert "spills" in dataclasses.replace(ok, spills=8).violations()[0]
    assert "shared" in dataclasses.replace(ok, shared_bytes=200_000).violations()[0]
    assert dataclasses.replace(ok, shared_bytes=200_000, arch="sm_90").violations() == []
    assert any("registers" in v for v in dataclasses.replace(ok, registers=256).violations())
    assert dataclasses.replace(ok, registers=255, num_warps=16).violations()  # block file


def test_result_rows_name_the_configuration() -> None:
    rec = aot.CompileRecord(
        "paged_decode", {"D_PAD": 128, "dtype": "fp16"}, "sm_90", 168, 0, 39168, 1300, 4, "3.9.0"
    )
    rows = aot.as_rows([rec])
    assert {r["metric"] for r in rows} == set(aot.METRICS)
    case = rows[0]["case"]
    assert case["config"] == '{"D_PAD":128,"dtype":"fp16"}'
    assert case["source_hash"] == aot.source_hash() and case["triton"] == "3.9.0"
    assert {r["metric"]: r["value"] for r in rows}["shared_bytes"] == 39168


def test_compile_failure_names_the_configuration(tmp_path: Path) -> None:
    bad = configs.KernelConfig(
        "paged_decode",
        torch.float16,
        {**configs.decode_config(torch.float16, 128, 4, False).constexprs, "D_PAD": 96},
    )  # tl.arange sizes must be powers of two
    with pytest.raises(aot.CompileCheckError, match="'D_PAD': 96"):
        aot.compile_all([bad], archs=(80,), cache_dir=tmp_path, workers=1)


def test_fp8_configurations_compile_clean_and_are_in_the_table() -> None:
    """The fp8 variants (e4m3fn / e5m2 K/V read as bytes and dequantized by bit arithmetic,
    the quantizing write, the byte copy) compile for sm_80 and sm_90 without spills."""
    cfgs = aot.fp8_headline_configs()
    table = {
        (c.kernel, c.dtype, tuple(sorted(c.constexprs.items()))) for c in configs.all_configs()
    }
    for c in cfgs:
        assert (c.kernel, c.dtype, tuple(sorted(c.constexprs.items()))) in table
    records = aot.compile_all(cfgs, workers=2)
    assert len(records) == len(cfgs) * len(aot.ARCHS)
    _assert_clean(records)


def test_register_cap_reaches_ptxas_and_the_table() -> None:
    """`KernelConfig.maxnreg` is a launch / compile option (and a key of the table) only
    where set, and ptxas honours it: the D64 single-partition decode at 56."""
    plain = dataclasses.replace(configs.decode_config(torch.float16, 64, 4, True), maxnreg=None)
    capped = dataclasses.replace(plain, maxnreg=56)
    assert "maxnreg" not in plain.launch_options() and "maxnreg" not in plain.describe()
    assert capped.launch_options() == {**plain.launch_options(), "maxnreg": 56}
    assert capped.describe() == {**plain.describe(), "maxnreg": 56}
    (rec,) = aot.compile_all([capped], archs=(80,), workers=1)  # compiles in its own process
    _assert_clean([rec])
    assert rec.registers <= 56 and rec.config["maxnreg"] == 56


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_d64_decode_fits_vllms_56_registers_without_spills(dtype: torch.dtype) -> None:
    """The head-dim-64 decode (GQA 4: 16 query-head rows) compiles within vLLM's 56
    registers per thread on sm_80 and sm_90, single-partition and split, with no spills:
    the split variant's 16-token tile fits the cap (32 tokens spilled 12-20 B)."""
    cfgs = [configs.decode_config(dtype, 64, 4, single) for single in (True, False)]
    assert all(c.maxnreg == configs.DECODE_D64_MAXNREG == 56 for c in cfgs)
    records = aot.compile_all(cfgs, workers=2)  # per config, per arch; in compile processes
    _assert_clean(records)
    assert [r.registers for r in records] == [56] * 4


def test_register_cap_only_on_16_bit_d64_decode() -> None:
    assert configs.decode_config(torch.float16, 128, 4, False).maxnreg is None
    assert configs.decode_config(torch.float32, 64, 4, True).maxnreg is None
    assert configs.decode_config(torch.float16, 64, 32, True).maxnreg is None  # QH 32
    # fp8 K/V dequantizes in registers: not capped here
    assert configs.decode_config(torch.float16, 64, 4, True, torch.float8_e4m3fn).maxnreg is None


def test_measured_gpu_tiles_are_the_defaults() -> None:
    """The tiles measured fastest on a GPU (H200, 2026-11-28, docs/gpu-tiles.md) are what
    the dispatch picks at the measured shape (fp16 / bf16, head dim 128, GQA 4): the split
    and single decode step 64 KV tokens with 4 warps and 2 stages; the 64-row prefill runs
    4 warps with 32 keys per step. Elsewhere the older tiles stay (QH 32, other head dims,
    fp8 K/V, float32), and the default partition is unchanged."""
    for dtype in configs.FP8_QUERY_DTYPES:
        for single in (False, True):
            for windowed in (False, True):
                cfg = configs.decode_config(dtype, 128, 4, single, windowed=windowed)
                assert cfg.constexprs["TILE_N"] == configs.DECODE_WIDE_TILE_N == 64
                assert (cfg.num_warps, cfg.num_stages, cfg.maxnreg) == (4, 2, None)
        pre = configs.prefill_config(dtype, 128, 4 * 128)
        assert (pre.int_constexpr("BLOCK_M"), pre.int_constexpr("TILE_N")) == (64, 32)
        assert pre.num_warps == configs.PREFILL_M64_D128_WARPS == 4
        assert configs.prefill_config(dtype, 64, 4 * 128).num_warps == 8  # not measured
    assert configs.DEFAULT_PARTITION == 512
    f16 = torch.float16
    assert configs.decode_config(f16, 128, 32, False).constexprs["TILE_N"] == 32  # QH 32
    assert configs.decode_config(f16, 64, 32, False).constexprs["TILE_N"] == 64  # fits
    fp8 = configs.decode_config(f16, 128, 4, False, torch.float8_e4m3fn)
    assert fp8.constexprs["TILE_N"] == 16  # the wide tile spills 16-32 B on sm_80
    assert configs.decode_config(torch.float32, 128, 4, False).constexprs["TILE_N"] == 32


@pytest.mark.slow
def test_wide_decode_tiles_fit_their_budget() -> None:
    """Every decode variant the dispatch gives the measured wide tile (fp16 / bf16, split
    and single, full and windowed) compiles for sm_80 and sm_90 without spills within
    `WIDE_DECODE_REGISTERS`: the rule `configs.DECODE_WIDE` was chosen by."""
    wide = [
        c
        for c in configs.all_configs()
        if c.kernel == "paged_decode"
        and c.constexprs["TILE_N"] == configs.DECODE_WIDE_TILE_N
        and c.dtype != torch.float32
    ]
    assert len(wide) >= 8, wide
    records = aot.compile_all(wide, workers=2)
    _assert_clean(records)
    assert all(r.registers <= WIDE_DECODE_REGISTERS for r in records), records
