"""Sharing and preemption sweeps driven through `paged.PagedKVCache` (memory-only mode):
copy-on-write savings for parallel sampling and beam search, prefix-caching savings for
[PA-deep-dive]'s scenarios and [KV-capacity]'s 100 x 1,000-token example, and swap vs recompute.

Each sharing sweep runs the same work twice on the same cache class: once sharing (fork /
prefix cache on) and once without (independent requests, prefix cache off), and reports
saved = 1 - blocks_with / blocks_without. For sampling and beam search the blocks are
averaged over every generation step (the memory a serving loop holds over time), as the
PagedAttention paper reports its savings; the peak is recorded too.

Beam search model: at each step the w new beams pick their parents uniformly at random
among the w current beams (seeded); a parent picked k times is forked k - 1 times and a
parent never picked is freed. The sharing this yields depends on that model: real beam
searches, whose beams share longer histories, share at least as much.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from kvbench.reports.provenance import CLOSED_FORM, COUNTED, MEASURED, MODELED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads import capacity as cap
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.distributions import named
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.presets import get_preset
from kvbench.workloads.profiles import PROFILES, get_profile

TINY = KVGeometry(1, 1, 1, "float16")


class _Ids:
    """Fresh token ids that never collide (so no accidental prefix hits)."""

    def __init__(self, start: int = 1_000_000) -> None:
        self.next = start

    def take(self, n: int) -> list[int]:
        out = list(range(self.next, self.next + n))
        self.next += n
        return out


def _cache(num_blocks: int, block_size: int, prefix: bool):  # type: ignore[no-untyped-def]
    from kvbench.paged.cache import PagedKVCache

    return PagedKVCache(TINY, num_blocks, block_size, enable_prefix_caching=prefix, store_kv=False)


def _admit_prefilled(cache, rid: object, prompt: list[int]) -> None:  # type: ignore[no-untyped-def]
    cached = cache.admit(rid, prompt)
    rest = len(prompt) - cached
    if rest:
        cache.append_tokens(rid, rest, prompt[cached:])


def _lengths(workload: str, rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return named(f"{workload}-input").sample(rng, n), named(f"{workload}-output").sample(rng, n)


# --------------------------------------------------------------------- parallel sampling


def _sampling_cases(full: bool) -> list[Case]:
    return [
        {"workload": w, "n": n, "requests": 50 if full else 12, "block_size": DEFAULT_BLOCK_SIZE}
        for w in ("sharegpt", "alpaca")
        for n in (2, 4, 6)
    ]


def _run_sampling(
    prompts: list[list[int]], outs: list[int], n: int, bs: int, share: bool
) -> tuple[float, int]:
    """Mean and peak used blocks while every prompt generates n samples of its length."""
    total = (
        sum(cap.blocks_for_tokens(len(p) + o, bs) * n for p, o in zip(prompts, outs, strict=True))
        + 8
    )
    cache = _cache(total, bs, prefix=False)
    ids = _Ids()
    live: list[tuple[object, int]] = []  # (request id, tokens left)
    for r, (prompt, out) in enumerate(zip(prompts, outs, strict=True)):
        if share:
            _admit_prefilled(cache, (r, 0), prompt)
            for s in range(1, n):
                cache.fork((r, 0), (r, s))
        else:
            for s in range(n):
                _admit_prefilled(cache, (r, s), prompt)
        live.extend(((r, s), out) for s in range(n))
    used: list[int] = []
    while live:
        nxt = []
        for rid, left in live:
            cache.append_tokens(rid, 1, ids.take(1))
            if left > 1:
                nxt.append((rid, left - 1))
        used.append(cache.stats().used_blocks)
        for rid, left in live:
            if left == 1:
                cache.free(rid)
        live = nxt
    return float(np.mean(used)), max(used)


@sweep(
    "cow.parallel_sampling",
    "KV blocks saved by sharing the prompt among n parallel samples (fork + CoW)",
    _sampling_cases,
    requires=("kvbench.paged.cache",),
    tags=("cow", "serving"),
    produced=(COUNTED,),
)
def parallel_sampling(case: Case, ctx: BenchContext) -> list[Measurement]:
    rng = ctx.rng(case["n"], case["requests"], len(case["workload"]))
    p_len, o_len = _lengths(case["workload"], rng, case["requests"])
    ids = _Ids(0)
    prompts = [ids.take(int(n)) for n in p_len]
    outs = [int(o) for o in o_len]
    mean_with, peak_with = _run_sampling(prompts, outs, case["n"], case["block_size"], True)
    mean_without, peak_without = _run_sampling(prompts, outs, case["n"], case["block_size"], False)
    return [
        Measurement("saved_fraction", 1 - mean_with / mean_without, "fraction"),
        Measurement("peak_saved_fraction", 1 - peak_with / peak_without, "fraction"),
        Measurement("mean_blocks_shared", mean_with, "blocks"),
        Measurement("mean_blocks_unshared", mean_without, "blocks"),
    ]


# --------------------------------------------------------------------- beam search


def _beam_cases(full: bool) -> list[Case]:
    return [
        {"workload": w, "width": k, "requests": 20 if full else 6, "block_size": DEFAULT_BLOCK_SIZE}
        for w in ("sharegpt", "alpaca")
        for k in (2, 4, 6)
    ]


def _run_beams(
    prompts: list[list[int]],
    outs: list[int],
    width: int,
    bs: int,
    rng: np.random.Generator,
    share: bool,
) -> tuple[float, int]:
    """Mean / peak used blocks of beam searches run side by side (see module docstring)."""
    total = (
        sum(
            cap.blocks_for_tokens(len(p) + o, bs) * width
            for p, o in zip(prompts, outs, strict=True)
        )
        * 2
        + 16
    )
    cache = _cache(total, bs, prefix=False)
    ids = _Ids()
    serial = [0]

    def new_id(r: int) -> tuple[int, int]:
        serial[0] += 1
        return (r, serial[0])

    beams: dict[int, list[tuple[int, int]]] = {}  # request -> its live beams' ids
    for r, prompt in enumerate(prompts):
        if share:
            first = new_id(r)
            _admit_prefilled(cache, first, prompt)
            beams[r] = [first]
            for _ in range(width - 1):
                child = new_id(r)
                cache.fork(first, child)
                beams[r].append(child)
        else:
            beams[r] = []
            for _ in range(width):
                b = new_id(r)
                _admit_prefilled(cache, b, prompt)
                beams[r].append(b)
    steps_left = dict(enumerate(outs))
    used: list[int] = []
    # One parent choice per request per step, drawn up front so both runs see the same.
    while beams:
        for r in list(beams):
            current = beams[r]
            for b in current:
                cache.append_tokens(b, 1, ids.take(1))
            steps_left[r] -= 1
            if steps_left[r] == 0:
                continue
            parents = sorted(rng.integers(0, width, size=width).tolist())
            nxt: list[tuple[int, int]] = []
            for p in sorted(set(parents)):
                nxt.append(current[p])
                for _ in range(parents.count(p) - 1):
                    child = new_id(r)
                    if share:
                        cache.fork(current[p], child)
                    else:  # an unshared engine copies the parent's whole history
                        length = cache.seq_len(current[p])
                        _admit_prefilled(cache, child, ids.take(length))
                    nxt.append(child)
            for i, b in enumerate(current):
                if i not in parents:
                    cache.free(b)
            beams[r] = nxt
        used.append(cache.stats().used_blocks)
        for r in [r for r, left in steps_left.items() if left == 0 and r in beams]:
            for b in beams.pop(r):
                cache.free(b)
    return float(np.mean(used)), max(used)


@sweep(
    "cow.beam_search",
    "KV blocks saved by sharing beam histories (fork + CoW) in beam search of width w",
    _beam_cases,
    requires=("kvbench.paged.cache",),
    tags=("cow", "serving"),
    produced=(COUNTED,),
)
def beam_search(case: Case, ctx: BenchContext) -> list[Measurement]:
    rng = ctx.rng(case["width"], case["requests"], len(case["workload"]), 7)
    p_len, o_len = _lengths(case["workload"], rng, case["requests"])
    ids = _Ids(0)
    prompts = [ids.take(int(n)) for n in p_len]
    outs = [int(o) for o in o_len]
    seed = int(rng.integers(0, 2**31))
    mean_with, peak_with = _run_beams(
        prompts, outs, case["width"], case["block_size"], np.random.default_rng(seed), True
    )
    mean_without, peak_without = _run_beams(
        prompts, outs, case["width"], case["block_size"], np.random.default_rng(seed), False
    )
    return [
        Measurement("saved_fraction", 1 - mean_with / mean_without, "fraction"),
        Measurement("peak_saved_fraction", 1 - peak_with / peak_without, "fraction"),
        Measurement("mean_blocks_shared", mean_with, "blocks"),
        Measurement("mean_blocks_unshared", mean_without, "blocks"),
    ]


# --------------------------------------------------------------------- prefix caching

#: [PA-deep-dive]'s prefix-caching table: scenario -> (shared prompt tokens, unique tokens per
#: request, concurrent requests, published saving).
SCENARIOS: dict[str, tuple[int, int, int, float]] = {
    "chatbot": (500, 200, 64, 0.70),
    "rag": (2000, 300, 32, 0.80),
    "code-assistant": (800, 500, 48, 0.40),
    "translation": (100, 400, 64, 0.20),
    "no-shared-prefix": (0, 500, 64, 0.0),
}


def _scenario_cases(full: bool) -> list[Case]:
    sizes = (8, 16, 32) if full else (16,)
    return [{"scenario": s, "block_size": b} for s in SCENARIOS for b in sizes]


def _held_blocks(prefix_len: int, unique: int, n: int, bs: int, caching: bool) -> int:
    """Blocks held by n requests whose prompt is a shared prefix + unique tokens."""
    total = n * cap.blocks_for_tokens(prefix_len + unique, bs) + 8
    cache = _cache(total, bs, prefix=caching)
    shared = list(range(prefix_len))
    ids = _Ids()
    for r in range(n):
        _admit_prefilled(cache, r, shared + ids.take(unique))
    return cache.stats().used_blocks


@sweep(
    "prefix.scenarios",
    "KV memory saved by prefix caching in [PA-deep-dive]'s scenarios (shared prompt + unique)",
    _scenario_cases,
    requires=("kvbench.paged.cache",),
    tags=("prefix", "serving"),
    produced=(
        COUNTED,
        CLOSED_FORM,
    ),
)
def prefix_scenarios(case: Case, ctx: BenchContext) -> list[Measurement]:
    prefix_len, unique, n, published = SCENARIOS[case["scenario"]]
    bs = case["block_size"]
    with_cache = _held_blocks(prefix_len, unique, n, bs, True)
    without = _held_blocks(prefix_len, unique, n, bs, False)
    formula = 1 - (prefix_len + n * unique) / (n * (prefix_len + unique))
    return [
        Measurement("saved_fraction", 1 - with_cache / without, "fraction"),
        Measurement("blocks_with_caching", with_cache, "blocks"),
        Measurement("blocks_without_caching", without, "blocks"),
        Measurement("token_formula_saved_fraction", formula, "fraction"),
        Measurement("published_saved_fraction", published, "fraction"),
    ]


def _shared_cases(full: bool) -> list[Case]:
    sizes = (8, 16, 32, 64) if full else (16,)
    return [
        {"requests": 100, "prefix_tokens": 1000, "block_size": b, "mode": m}
        for b in sizes
        for m in ("fork", "prefix-cache")
    ]


@sweep(
    "prefix.shared_prompt",
    "prefix blocks held by 100 requests sharing a 1,000-token prompt ([KV-capacity] example)",
    _shared_cases,
    requires=("kvbench.paged.cache",),
    tags=("prefix", "serving"),
    produced=(COUNTED,),
)
def shared_prompt(case: Case, ctx: BenchContext) -> list[Measurement]:
    n, length, bs = case["requests"], case["prefix_tokens"], case["block_size"]
    prompt = list(range(length))
    cache = _cache(
        n * cap.blocks_for_tokens(length, bs) + 8, bs, prefix=case["mode"] == "prefix-cache"
    )
    if case["mode"] == "fork":
        _admit_prefilled(cache, 0, prompt)
        for r in range(1, n):
            cache.fork(0, r)
    else:
        for r in range(n):
            _admit_prefilled(cache, r, prompt)
    held = cache.stats().used_blocks
    without = n * cap.blocks_for_tokens(length, bs)
    return [
        Measurement("blocks_held", held, "blocks"),
        Measurement("blocks_without_sharing", without, "blocks"),
        Measurement("saved_fraction", 1 - held / without, "fraction"),
    ]


# --------------------------------------------------------------------- swap vs recompute


def _swap_cases(full: bool) -> list[Case]:
    sizes = (8, 16, 32, 64, 128) if full else (16,)
    profiles = [*PROFILES, "measured"]
    return [
        {
            "model": "llama-2-70b",
            "profile": p,
            "calibration": "measured" if p == "measured" else get_profile(p).calibration,
            "seq_len": L,
            "block_size": b,
        }
        for p in profiles
        for b in sizes
        for L in (128, 256, 512, 1024, 2048, 4096)
    ]


#: Bytes moved by each host-link copy that measures the link (32 blocks of 5 MiB).
LINK_BYTES = 32 * 5 * 2**20


def measured_host_link(ctx: BenchContext) -> dict[str, Any]:
    """The host link of this machine in B/s, measured once per process: one contiguous
    copy of `LINK_BYTES` from a device buffer into page-locked host memory ("d2h") and
    one back ("h2d"), each timed on its own, and "link", the rate of a swap out and in
    (their harmonic mean). On a CPU both buffers are host memory: a memcpy, not a link."""
    if "host_link" not in ctx.cache:
        dev = ctx.device
        n = LINK_BYTES // 2
        on_device = torch.randn(n, device=dev).to(torch.float16)
        host = torch.empty(n, dtype=torch.float16, pin_memory=dev.type == "cuda")
        d2h = ctx.time(lambda: host.copy_(on_device, non_blocking=True))
        h2d = ctx.time(lambda: on_device.copy_(host, non_blocking=True))
        out_bw, in_bw = LINK_BYTES / d2h["median"], LINK_BYTES / h2d["median"]
        ctx.cache["host_link"] = {
            "d2h": out_bw,
            "h2d": in_bw,
            "link": 2 / (1 / out_bw + 1 / in_bw),
            "d2h_stats": _bandwidth_stats(d2h),
            "h2d_stats": _bandwidth_stats(h2d),
        }
    return ctx.cache["host_link"]


def _bandwidth_stats(times: dict[str, float | int]) -> dict[str, float | int]:
    """Repeat statistics of a copy's bandwidth (B/s) from those of its time: the slowest
    time is the lowest bandwidth, so q1 and q3 (and min and max) swap."""
    return {
        "median": LINK_BYTES / times["median"],
        "q1": LINK_BYTES / times["q3"],
        "q3": LINK_BYTES / times["q1"],
        "min": LINK_BYTES / times["max"],
        "max": LINK_BYTES / times["min"],
        "n": times["n"],
    }


@sweep(
    "preempt.swap_vs_recompute",
    "cost of preempting one request: swap out + in over the host link vs recomputing "
    "its prefill ([PA-deep-dive]'s cost model), per device profile (fitted efficiency and, "
    "as '<name>-datasheet', the datasheet peaks: the calibration parameter) and with the "
    "link measured here (one contiguous pinned copy each way)",
    _swap_cases,
    requires=("kvbench.kernels.ops",),
    tags=("preemption",),
    produced=(
        MODELED,
        MEASURED,
    ),
)
def swap_vs_recompute(case: Case, ctx: BenchContext) -> Iterable[Measurement]:
    preset = get_preset(case["model"])
    geo = preset.geometry
    blocks = cap.blocks_for_tokens(case["seq_len"], case["block_size"])
    nbytes = blocks * geo.bytes_per_block(case["block_size"])
    params = preset.weight_bytes / 2
    extra: list[Measurement] = []
    if case["profile"] == "measured":
        measured = measured_host_link(ctx)
        link = measured["link"]
        prof = get_profile("cpu") if not ctx.is_gpu else _gpu_profile()
        extra = [
            Measurement("host_link_d2h_bandwidth", measured["d2h"], "B/s", measured["d2h_stats"]),
            Measurement("host_link_h2d_bandwidth", measured["h2d"], "B/s", measured["h2d_stats"]),
        ]
    else:
        prof = get_profile(case["profile"])
        link = prof.host_link_bandwidth
    swap_s = 2 * nbytes / link
    recompute_s = case["seq_len"] / prof.prefill_tokens_per_second(params)
    return [
        Measurement("swap_seconds", swap_s, "s"),
        Measurement("recompute_seconds", recompute_s, "s"),
        Measurement("swap_over_recompute", swap_s / recompute_s, "x"),
        Measurement("swap_bytes_each_way", nbytes, "B"),
        Measurement("host_link_bandwidth", link, "B/s"),
        *extra,
    ]


def _gpu_profile():  # type: ignore[no-untyped-def]
    name = torch.cuda.get_device_name(0).lower()
    for key in ("h200", "h100", "a100"):
        if key in name:
            return get_profile(key)
    return get_profile("a100-80gb")
