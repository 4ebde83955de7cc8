"""Benchmarks of the paged memory manager's bookkeeping (pytest-benchmark).

    block pool      allocate + free operations per second (O(1) each, so flat in pool size)
    prefix lookup   prompt tokens matched per second (sha256 chain + verification)
    append          decode tokens per second in memory-only mode (the scheduler's replay path)
    admit + free    requests per second through admission with prefix hits

Rates are attached to each benchmark's extra_info (ops_per_s / tokens_per_s / requests_per_s)
from the mean round time.
"""

from __future__ import annotations

import pytest

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.prefix_cache import PrefixCache
from kvbench.workloads.geometry import KVGeometry

TINY = KVGeometry(num_layers=1, num_kv_heads=1, head_dim=1, dtype="float16")


def _rate(benchmark, key: str, per_round: int) -> None:
    mean = benchmark.stats.stats.mean
    benchmark.extra_info[key] = per_round / mean if mean else float("inf")


@pytest.mark.parametrize("num_blocks", [1024, 65536])
def test_bench_block_pool_allocate_free(benchmark, num_blocks: int) -> None:
    pool = BlockPool(num_blocks, 16)
    n = 1000

    def cycle() -> None:
        blocks = [pool.allocate() for _ in range(n)]
        pool.release(blocks)

    benchmark(cycle)
    pool.check()
    _rate(benchmark, "ops_per_s", 2 * n)


@pytest.mark.parametrize("prompt_len", [512, 4096])
def test_bench_prefix_lookup(benchmark, prompt_len: int) -> None:
    cache = PagedKVCache(TINY, prompt_len // 16 + 8, 16, store_kv=False)
    prompt = list(range(prompt_len))
    cache.admit(0, prompt)
    cache.append_tokens(0, prompt_len)
    prefix = cache.prefix
    assert isinstance(prefix, PrefixCache)
    blocks = prompt_len // 16

    def lookup() -> int:
        return len(prefix.match(prompt, (None, None), 16, blocks)[1])

    assert benchmark(lookup) == blocks
    _rate(benchmark, "tokens_per_s", prompt_len)


@pytest.mark.parametrize("batch", [64, 256])
def test_bench_memory_only_decode_append(benchmark, batch: int) -> None:
    steps = 64
    cache = PagedKVCache(
        TINY, batch * 64, 16, store_kv=False, enable_prefix_caching=False, max_seq_len=4096
    )

    def setup():
        for rid in cache.request_ids():
            cache.free(rid)
        for rid in range(batch):
            cache.admit(rid, range(100))
            cache.append_tokens(rid, 100)
        return (), {}

    def decode() -> None:
        for _ in range(steps):
            for rid in range(batch):
                cache.append_tokens(rid, 1)

    benchmark.pedantic(decode, setup=setup, rounds=5)
    cache.check()
    _rate(benchmark, "tokens_per_s", batch * steps)


def test_bench_admit_with_prefix_hits_and_free(benchmark) -> None:
    cache = PagedKVCache(TINY, 4096, 16, store_kv=False)
    system = list(range(512))
    cache.admit("warm", system)
    cache.append_tokens("warm", 512)
    n = 200

    def churn() -> None:
        for i in range(n):
            cached = cache.admit(i, [*system, i])
            cache.append_tokens(i, 513 - cached)
        for i in range(n):
            cache.free(i)

    benchmark(churn)
    cache.check()
    _rate(benchmark, "requests_per_s", n)
