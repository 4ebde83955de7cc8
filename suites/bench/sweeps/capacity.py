"""Capacity sweeps: KV footprint per model and dtype, contiguous vs paged concurrency in a
memory budget, and prefix-block sharing, from the exact formulas in workloads.capacity.

These are closed-form (no timing); they regenerate the seeds' worked examples ([KV-capacity]'s
MHA / GQA / MQA table and 100 x 1,000-token prefix example, [PA-deep-dive]'s 42 GB budget).
"""

from __future__ import annotations

from kvbench.reports.provenance import CLOSED_FORM
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads import capacity as cap
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.geometry import parse_bytes
from kvbench.workloads.presets import PRESETS, get_preset

GIB = 2**30


def _footprint_cases(full: bool) -> list[Case]:
    dtypes = ["float16", "fp8_e4m3", "float32"] if full else ["float16", "fp8_e4m3"]
    return [{"model": m, "dtype": d} for m in PRESETS for d in dtypes]


@sweep(
    "capacity.footprint",
    "KV bytes per token, per 16-token block and at 4K tokens",
    _footprint_cases,
    tags=("capacity",),
    produced=(CLOSED_FORM,),
)
def footprint(case: Case, ctx: BenchContext) -> list[Measurement]:
    geo = get_preset(case["model"]).geometry.with_dtype(case["dtype"])
    return [
        Measurement("bytes_per_token", geo.bytes_per_token, "B"),
        Measurement("bytes_per_block16", geo.bytes_per_block(16), "B"),
        Measurement("gib_at_4k_tokens", geo.bytes_for_tokens(4096) / GIB, "GiB"),
        Measurement(
            "tokens_in_42GB",
            cap.tokens_in_budget(geo, parse_bytes("42GB", decimal_gb_as_mib=True), 16),
            "tokens",
        ),
    ]


def _concurrency_cases(full: bool) -> list[Case]:
    models = ["llama-2-70b", "llama-3-8b"] + (["mha-96", "gpt-32x32"] if full else [])
    avg = [128, 256, 512, 1024, 2048] if full else [256, 512, 1024]
    return [
        {
            "model": m,
            "budget": "42GB",
            "block_size": DEFAULT_BLOCK_SIZE,
            "avg_len": a,
            "max_len": 4096,
        }
        for m in models
        for a in avg
    ]


@sweep(
    "capacity.concurrency",
    "requests a KV budget holds: paged (whole blocks of the average length) vs "
    "contiguous (max-length reservations)",
    _concurrency_cases,
    tags=("capacity",),
    produced=(CLOSED_FORM,),
)
def concurrency(case: Case, ctx: BenchContext) -> list[Measurement]:
    geo = get_preset(case["model"]).geometry
    budget = parse_bytes(case["budget"], decimal_gb_as_mib=True)
    paged = cap.paged_concurrency(geo, budget, case["block_size"], case["avg_len"])
    contiguous = cap.contiguous_concurrency(geo, budget, case["max_len"])
    out = [
        Measurement("paged_requests", paged, "requests"),
        Measurement("contiguous_requests", contiguous, "requests"),
        Measurement(
            "blocks_in_budget", cap.blocks_in_budget(geo, budget, case["block_size"]), "blocks"
        ),
    ]
    if contiguous:
        out.append(Measurement("paged_over_contiguous", paged / contiguous, "x"))
    return out


def _prefix_cases(full: bool) -> list[Case]:
    blocks = [1, 8, 16, 32, 64, 128, 256] if full else [8, 16, 32]
    return [{"requests": 100, "prefix_tokens": 1000, "block_size": b} for b in blocks]


@sweep(
    "capacity.prefix_formula",
    "prefix-block storage saved when N requests share one prefix (closed form)",
    _prefix_cases,
    tags=("capacity", "prefix"),
    produced=(CLOSED_FORM,),
)
def prefix_formula(case: Case, ctx: BenchContext) -> list[Measurement]:
    s = cap.prefix_sharing(case["requests"], case["prefix_tokens"], case["block_size"])
    return [
        Measurement("blocks_without_sharing", s.blocks_without_sharing, "blocks"),
        Measurement("blocks_with_sharing", s.blocks_with_sharing, "blocks"),
        Measurement("saved_fraction", s.saved_fraction, "fraction"),
    ]
