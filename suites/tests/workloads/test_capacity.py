"""Every capacity figure the seed literature prints, reproduced exactly (the documents are
cited by their keys in docs/bibliography.md: [KV-capacity], [PA-deep-dive], [paged-sim],
[vLLM-internals])."""

from __future__ import annotations

import re

import pytest

from kvbench.workloads import capacity as cap
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, parse_bytes
from kvbench.workloads.planner import plan_capacity
from kvbench.workloads.presets import PRESETS, get_preset

KiB, MiB, GiB = 1024, 1024**2, 1024**3


@pytest.mark.parametrize(
    ("preset", "per_token"),
    [
        ("llama-3-8b", 128 * KiB),  # [KV-capacity] table, [vLLM-internals]
        ("llama-2-70b", 320 * KiB),  # [KV-capacity] table
        ("mha-96", 4.5 * MiB),  # [KV-capacity] table
        ("gpt-32x32", 512 * KiB),  # [paged-sim]: 524,288 bytes
        ("mha-80x64", 2560 * KiB),  # [KV-capacity] MHA/GQA/MQA
        ("gqa-80x8", 320 * KiB),
        ("mqa-80x1", 40 * KiB),
    ],
)
def test_bytes_per_token_matches_seed(preset: str, per_token: float) -> None:
    assert get_preset(preset).geometry.bytes_per_token == per_token


@pytest.mark.parametrize(
    ("preset", "gib_at_4k"),
    [("mha-80x64", "10.00"), ("gqa-80x8", "1.25"), ("mqa-80x1", "0.16")],
)
def test_cache_at_4k_context(preset: str, gib_at_4k: str) -> None:
    geometry = get_preset(preset).geometry
    assert f"{geometry.bytes_for_tokens(4096) / GiB:.2f}" == gib_at_4k


def test_seed000_table_context_columns() -> None:
    g8b, g70b, g96 = (get_preset(n).geometry for n in ("llama-3-8b", "llama-2-70b", "mha-96"))
    assert g8b.bytes_for_tokens(4096) == 512 * MiB
    assert g8b.bytes_for_tokens(32768) == 4 * GiB
    assert g70b.bytes_for_tokens(4096) == 1.25 * GiB
    assert g70b.bytes_for_tokens(32768) == 10 * GiB
    assert g96.bytes_for_tokens(4096) == 18 * GiB
    assert g96.bytes_for_tokens(32768) == 144 * GiB


def test_reservation_waste_example() -> None:
    waste = cap.reservation_waste(get_preset("llama-2-70b").geometry, [600, 1250, 4000, 128], 8192)
    assert f"{waste.reserved_bytes / GiB:.2f}" == "10.00"
    assert f"{waste.live_bytes / GiB:.2f}" == "1.82"
    assert f"{waste.unused_fraction:.1%}" == "81.8%"


def test_tensor_parallel_rank_budget() -> None:
    geometry = get_preset("llama-2-70b").geometry
    assert geometry.bytes_for_tokens(8192) == 2.5 * GiB
    per_rank = cap.request_bytes_per_rank(geometry, 8192, tp=2, tail_allowance=1.04)
    assert f"{per_rank / GiB:.2f}" == "1.30"
    assert cap.admissible_requests_per_rank(geometry, 8192, 2, 8 * GiB, 1.04) == 6


@pytest.mark.parametrize(
    ("heads", "tp", "per_rank", "layout"),
    [(8, 2, 4, "sharded"), (1, 4, 1, "replicated"), (8, 8, 1, "sharded"), (8, 16, 1, "replicated")],
)
def test_kv_heads_per_rank(heads: int, tp: int, per_rank: int, layout: str) -> None:
    assert cap.kv_heads_per_rank(heads, tp) == per_rank
    assert cap.kv_sharding(heads, tp) == layout


def test_seed001_memory_budget() -> None:
    geometry = get_preset("llama-2-70b").geometry
    budget = parse_bytes("42000MiB")
    assert parse_bytes("42GB", decimal_gb_as_mib=True) == budget
    assert geometry.bytes_per_block(16) == 5 * MiB
    assert cap.blocks_in_budget(geometry, budget, 16) == 8400
    assert cap.tokens_in_budget(geometry, budget, 16) == 134_400
    assert cap.paged_concurrency(geometry, budget, 16, 500) == 268
    assert cap.contiguous_concurrency(geometry, budget, 2048) == 65
    # Rounding each request up to whole blocks (32 blocks for 500 tokens) costs 6 requests.
    assert cap.paged_concurrency(geometry, budget, 16, 500, round_to_blocks=True) == 262


def test_prefix_sharing_example() -> None:
    sharing = cap.prefix_sharing(num_requests=100, prefix_tokens=1000, block_size=16)
    assert sharing.blocks_with_sharing == 63
    assert sharing.blocks_without_sharing == 6300
    assert f"{sharing.saved_fraction:.1%}" == "99.0%"


def test_contiguous_utilization_example() -> None:
    assert f"{cap.utilization(500, 2048):.1%}" == "24.4%"


@pytest.mark.parametrize(("live", "slots"), [(505, 512), (1000, 1008), (4096, 4096), (0, 0)])
def test_paged_slots(live: int, slots: int) -> None:
    assert cap.slots_for_tokens(live, 16) == slots


def test_plan_agrees_with_formulas() -> None:
    plan = plan_capacity(
        "llama-2-70b", get_preset("llama-2-70b").geometry, parse_bytes("42000MiB"), 16, 500, 2048
    )
    assert (plan.blocks, plan.token_slots) == (8400, 134_400)
    assert (plan.paged_concurrent_requests, plan.contiguous_concurrent_requests) == (268, 65)
    tp2 = plan_capacity(
        "llama-2-70b", get_preset("llama-2-70b").geometry, 8 * GiB, 16, 500, 8192, tp=2
    )
    assert tp2.kv_heads_per_rank == 4
    assert tp2.bytes_per_token_per_rank == 160 * KiB
    assert tp2.max_len_requests_admissible == 6


def test_fp8_and_dtype_aliases() -> None:
    g = KVGeometry(32, 8, 128, "fp8")
    assert g.dtype == "fp8_e4m3" and g.bytes_per_token == 64 * KiB
    assert KVGeometry(32, 8, 128, "e5m2").dtype_bytes == 1
    assert KVGeometry(32, 8, 128, "bf16").dtype == "bfloat16"


def test_presets_have_sources() -> None:
    """Every preset names where its numbers come from: a document by its key in
    docs/bibliography.md (`[KV-capacity]`, ...), or a paper (the vLLM paper's OPT set-ups)."""
    for preset in PRESETS.values():
        cited = re.search(r"\[[A-Za-z][\w-]*\]", preset.source or "")
        assert cited or "paper" in preset.source, preset.source


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"num_layers": 0, "num_kv_heads": 8, "head_dim": 128}, "num_layers"),
        ({"num_layers": 32, "num_kv_heads": -1, "head_dim": 128}, "num_kv_heads"),
        ({"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "dtype": "int3"}, "int3"),
        ({"num_layers": 32, "num_kv_heads": 8, "head_dim": 128, "num_q_heads": 12}, "12"),
    ],
)
def test_bad_geometry_names_the_value(kwargs: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        KVGeometry(**kwargs)


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda: get_preset("llama-9000"), "llama-9000"),
        (lambda: parse_bytes("12 parsecs"), "parsecs"),
        (lambda: parse_bytes("-4GB"), "-4GB"),
        (lambda: cap.blocks_for_tokens(10, 0), "block_size"),
        (lambda: cap.kv_heads_per_rank(8, 0), "tp"),
        (lambda: cap.kv_heads_per_rank(8, 3), "tp=3 cannot split 8 KV heads"),
        (lambda: cap.kv_sharding(8, 3), "tp=3"),
        (lambda: cap.reservation_waste(get_preset("gqa-80x8").geometry, [9000], 8192), "9000"),
        (lambda: cap.request_bytes_per_rank(get_preset("gqa-80x8").geometry, 8, 1, 0.5), "0.5"),
    ],
)
def test_bad_capacity_input_names_the_value(call, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        call()


def test_watermark_blocks_is_the_least_integer_at_or_above_the_fraction() -> None:
    """A fractional watermark rounds up (0.01 of 150 blocks keeps 2, not 1: the mutation
    check's `int()` in place of `ceil` survived every test whose product was whole), and
    float noise above a whole number does not add a block."""
    assert cap.watermark_blocks(0.01, 150) == 2  # 1.5 blocks
    assert cap.watermark_blocks(0.25, 10) == 3  # 2.5 blocks
    assert cap.watermark_blocks(0.2, 10) == 2  # exactly 2
    assert 0.07 * 100 > 7 and cap.watermark_blocks(0.07, 100) == 7  # 7.000000000000001
    assert cap.watermark_blocks(0.0, 1000) == 0
