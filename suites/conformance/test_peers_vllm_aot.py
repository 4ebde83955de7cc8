"""vLLM's Triton kernels compiled ahead of time for sm_80 / sm_90 beside kvbench's
(`kvbench kernels --peers`, suites/peers/vllm_aot.py), and kvbench's budgets: at head
dim 128, block 16, fp16, sm_90, no spills; the decode's measured 64-token tile within 128
registers and 48 KiB shared (more than vLLM's own Triton decode, stage 1 as its launcher
configures it, by choice: docs/gpu-tiles.md); each prefill tile no heavier than vLLM's
unified 2D kernel at the same BLOCK_M and warps.

Static figures from the compiler, no GPU and no timing. Skipped without vLLM.
"""

from __future__ import annotations

import pytest

from kvbench.kernels import configs
from kvbench.suites import cli
from kvbench.suites.peers import vllm_adapter, vllm_aot
from kvbench.suites.peers.base import PeerUnavailableError

SHAPE = vllm_aot.Shape("fp16", 128, 16)


@pytest.fixture(scope="module")
def records(tmp_path_factory):
    try:
        return vllm_aot.compile_peers_isolated(
            [SHAPE], archs=[90], cache_dir=tmp_path_factory.mktemp("aot"), workers=1
        )
    except PeerUnavailableError as exc:
        pytest.skip(f"vLLM unavailable: {exc}")


def _one(records, impl: str, variant: str):
    found = [r for r in records if r.impl == impl and r.variant == variant]
    assert len(found) == 1, [(r.impl, r.variant) for r in records]
    return found[0].record


def test_vllm_launches_are_recorded_and_compile(records):
    """Every kernel vLLM's launchers run for a decode, a prefill and a KV write compiles
    for sm_90 with vLLM's own choices (unified 3D: 16-token tiles; decode stage 1: BLOCK_N
    32, BLOCK_H 16, 2 stages, 8 splits at context 4096) and none spills."""
    vllm = {r.variant: r for r in records if r.impl == "vllm"}
    assert {
        "unified 3D",
        "unified 3D reduce",
        "unified 2D",
        "decode stage 1 (grouped)",
        "decode stage 2",
        "reshape_and_cache_flash",
    } <= set(vllm)
    stage1 = vllm["decode stage 1 (grouped)"]
    assert stage1.record.config["BLOCK_N"] == 32 and stage1.record.config["BLOCK_H"] == 16
    assert stage1.num_stages == 2 and stage1.record.config["NUM_KV_SPLITS"] == 8
    assert vllm["unified 3D"].record.config["TILE_SIZE"] == 16
    for r in vllm.values():
        assert r.record.spills == 0, r
        assert r.record.registers > 0 and r.record.sass_instructions > 0


def test_kvbench_decode_within_its_measured_budget(records):
    """Issue 17's goal was parity: kvbench's split decode at D=128, block 16, fp16, sm_90
    took no more registers or shared memory than vLLM's decode stage 1 (16-token tile: 72
    registers, 12,800 B). Its 64-token tile, measured 1.44-2.0x faster on an H200
    (docs/gpu-tiles.md), costs more than vLLM's, by choice: the test holds it to 0 spills,
    at most 128 registers (4 programs of 4 warps per SM) and at most 48 KiB of shared
    memory (a block's share without opting in to more), and checks it is the wide tile
    and vLLM's figures are the lower ones (so the table shows the price of the speed)."""
    mine = _one(records, "kvbench", "split decode")
    theirs = _one(records, "vllm", "decode stage 1 (grouped)")
    assert mine.config["TILE_N"] == 64
    assert mine.spills == 0
    assert theirs.registers <= mine.registers <= 128, (mine, theirs)
    assert theirs.shared_bytes <= mine.shared_bytes <= 48 * 1024, (mine, theirs)


def test_kvbench_prefill_tiles_no_heavier_than_vllm_2d(records):
    """The goal of issue 31: each prefill tile kvbench's dispatch can pick (BLOCK_M 16, 32,
    64) at D=128, block 16, fp16, sm_90 has 0 spills and no more registers or shared memory
    than vLLM's unified 2D kernel at the same BLOCK_M and warps (BLOCK_M 16 is vLLM's own
    choice; the others are its recorded launch with BLOCK_M and warps replaced), except
    the 64-row tile's 4 warps, measured 1.16-1.57x faster than 8 on an H200: no spills
    and at most 256 registers per thread, two programs per SM."""
    tiles = [r for r in records if r.impl == "kvbench" and r.role == "prefill"]
    assert len(tiles) == 3, [r.variant for r in tiles]
    for tile in tiles:
        mine = tile.record
        block_m, warps = mine.config["BLOCK_M"], mine.num_warps
        variant = (
            "unified 2D" if block_m == 16 else f"unified 2D at BLOCK_M {block_m}, {warps} warps"
        )
        theirs = _one(records, "vllm", variant)
        assert theirs.config["BLOCK_M"] == block_m and theirs.num_warps == warps
        assert mine.spills == 0
        if (block_m, warps) == (64, configs.PREFILL_M64_D128_WARPS):
            # measured on a GPU (docs/gpu-tiles.md): held to two programs per SM (the
            # 8 warps per SM of the 8-warp tile it replaced), not to vLLM's figures
            assert mine.registers * warps * 32 <= 32_768, (mine, theirs)
            continue
        assert mine.registers <= theirs.registers, (mine, theirs)
        assert mine.shared_bytes <= theirs.shared_bytes, (mine, theirs)


def test_table_and_rows(records):
    text = vllm_aot.format_table(records)
    assert "vllm.kernel_unified_attention" in text and "paged_decode" in text
    rows = vllm_aot.as_rows(records)
    assert {r["metric"] for r in rows} == {
        "registers",
        "spills",
        "shared_bytes",
        "sass_instructions",
    }
    assert {r["case"]["impl"] for r in rows} == {"kvbench", "vllm"}


def test_cli_peers_without_vllm_exits_2(monkeypatch, capsys):
    """Where vLLM is missing, `kvbench kernels --peers` says so and exits 2 (no fake rows)."""
    monkeypatch.setattr(vllm_adapter, "probe", lambda: "vLLM is not installed here (test)")
    assert cli.main(["kernels", "--peers", "--no-results"]) == 2
    assert "vLLM is not installed here (test)" in capsys.readouterr().out
