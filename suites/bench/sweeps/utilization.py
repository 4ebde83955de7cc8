"""Static utilization: N requests of sampled lengths held at once, contiguous (each
reserves max_len slots) vs paged (whole blocks), as [paged-sim] measures it.

Lengths come from a seeded workload distribution ([paged-sim]'s normal(500, 200) clipped to
[200, 2048], or ShareGPT-like / Alpaca-like prompt + output). The contiguous figure is
read from the reference `ContiguousKVCache` (memory-only) holding the requests; the paged
figure from `paged.PagedKVCache` (memory-only) when it is importable, otherwise from the block formula
(case `impl` says which). Utilization = live token slots / slots held by requests.
"""

from __future__ import annotations

import importlib

import numpy as np
import torch

from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reports.provenance import CLOSED_FORM, COUNTED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads import capacity as cap
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.distributions import named
from kvbench.workloads.geometry import KVGeometry

#: A one-element geometry: the caches' bookkeeping is what is measured, not bytes.
TINY = KVGeometry(1, 1, 1, "float16")
WORKLOADS = ("seed002", "sharegpt", "alpaca")


def sample_lengths(workload: str, n: int, rng: np.random.Generator, max_len: int) -> np.ndarray:
    """n total sequence lengths (prompt + output) of a named workload, capped at max_len."""
    if workload == "seed002":
        lengths = named("seed002").sample(rng, n)
    else:
        lengths = named(f"{workload}-input").sample(rng, n) + named(f"{workload}-output").sample(
            rng, n
        )
    return np.minimum(lengths, max_len)


def paged_cache_available() -> bool:
    try:
        importlib.import_module("kvbench.paged.cache")
    except ImportError:
        return False
    return hasattr(importlib.import_module("kvbench.paged"), "PagedKVCache") or hasattr(
        importlib.import_module("kvbench.paged.cache"), "PagedKVCache"
    )


def _cases(full: bool) -> list[Case]:
    batches = [10, 25, 50, 100, 200]
    workloads = WORKLOADS if full else ("seed002", "sharegpt")
    impls = ["contiguous-max", "paged" if paged_cache_available() else "paged-formula"]
    return [
        {"workload": w, "batch": b, "impl": impl, "max_len": 2048, "block_size": DEFAULT_BLOCK_SIZE}
        for w in workloads
        for b in batches
        for impl in impls
    ]


def _fill(cache, lengths: np.ndarray) -> None:  # type: ignore[no-untyped-def]
    for i, n in enumerate(lengths.tolist()):
        cache.admit(i, list(range(n)))
        kv = torch.zeros(1, n, 1, 1, dtype=torch.float16)
        cache.append(i, kv, kv)


def _paged_cache(lengths: np.ndarray, block_size: int):  # type: ignore[no-untyped-def]
    from kvbench.paged.cache import PagedKVCache

    blocks = sum(cap.blocks_for_tokens(int(n), block_size) for n in lengths)
    return PagedKVCache(
        TINY,
        num_blocks=blocks,
        block_size=block_size,
        store_kv=False,
        enable_prefix_caching=False,
    )


@sweep(
    "utilization.static",
    "KV slots holding live tokens / slots held, N requests at once ([paged-sim])",
    _cases,
    tags=("utilization",),
    produced=(
        COUNTED,
        CLOSED_FORM,
    ),
)
def utilization_static(case: Case, ctx: BenchContext) -> list[Measurement]:
    rng = ctx.rng(case["batch"], WORKLOADS.index(case["workload"]))
    lengths = sample_lengths(case["workload"], case["batch"], rng, case["max_len"])
    live = int(lengths.sum())
    if case["impl"] == "contiguous-max":
        cache = ContiguousKVCache(
            TINY, case["batch"] * case["max_len"], case["max_len"], "max", store_kv=False
        )
        _fill(cache, lengths)
        st = cache.stats()
        held, used = st.reserved_slots, st.live_slots
    elif case["impl"] == "paged":
        cache = _paged_cache(lengths, case["block_size"])
        start = 0
        for i, n in enumerate(lengths.tolist()):  # memory-only: bookkeeping, no kernels
            cache.admit(i, list(range(start, start + n)))  # distinct ids: nothing shared
            cache.append_tokens(i, n)
            start += n
        st = cache.stats()
        held, used = st.reserved_slots, st.live_slots
    else:
        held = sum(cap.slots_for_tokens(int(n), case["block_size"]) for n in lengths)
        used = live
    if used != live:
        raise AssertionError(f"cache reports {used} live slots for {live} appended tokens")
    return [
        Measurement("utilization", used / held, "fraction"),
        Measurement("live_slots", used, "tokens"),
        Measurement("held_slots", held, "tokens"),
        Measurement("mean_length", float(lengths.mean()), "tokens"),
    ]
