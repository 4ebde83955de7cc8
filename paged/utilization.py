"""Slot utilization measured from real caches (not formulas): [paged-sim]'s experiments.

1. Naive vs paged utilization at several batch sizes. Each request's length is drawn from
   normal(mean, std), truncated to an integer and clipped to [min_len, max_len] ([paged-sim]:
   normal(500, 200) clipped to [200, 2048], numpy's legacy generator seeded with 42, one
   draw of `batch` lengths per batch size in order 10, 25, 50, 100, 200). Every request is
   admitted into a ContiguousKVCache reserving max_len slots per request and into a
   PagedKVCache (block 16), and all its tokens are appended; utilization is the caches'
   own live_slots / reserved_slots.
2. A shared system prompt ([paged-sim]: 200 tokens, 10 requests): device blocks used with no
   sharing, with fork sharing (copy-on-write; the seed's mechanism), after one request
   diverges, and with automatic prefix caching (full blocks only, so each request keeps
   a private copy of the partial last block).

Both caches run memory-only on a one-element geometry: utilization does not depend on
the bytes per token, and memory-only mode has the same bookkeeping.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from kvbench.paged.cache import PagedKVCache
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE, check_block_size
from kvbench.workloads.capacity import blocks_for_tokens
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, require_positive

SEED002_BATCH_SIZES = (10, 25, 50, 100, 200)
#: One layer, one head, one element: the cheapest geometry (utilization is per slot).
TINY = KVGeometry(num_layers=1, num_kv_heads=1, head_dim=1, dtype="float32")


@dataclass(frozen=True)
class UtilizationRow:
    """One batch: live and reserved slots of each cache and their ratio."""

    batch_size: int
    live_tokens: int
    naive_reserved: int
    paged_reserved: int
    naive_utilization: float
    paged_utilization: float
    paged_blocks: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


@dataclass(frozen=True)
class SharingRow:
    """Device blocks used by `requests` requests sharing a `prompt_len`-token prompt."""

    requests: int
    prompt_len: int
    block_size: int
    no_sharing: int
    fork_sharing: int
    after_one_diverges: int
    prefix_caching: int

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def seed002_lengths(
    batch_sizes: Sequence[int] = SEED002_BATCH_SIZES,
    *,
    seed: int = 42,
    mean: float = 500.0,
    std: float = 200.0,
    min_len: int = 200,
    max_len: int = 2048,
) -> list[np.ndarray]:
    """Request lengths per batch, drawn as [paged-sim] draws them (legacy numpy generator:
    normal, truncate to int, clip), one batch after another from one stream."""
    if not 1 <= min_len <= max_len:
        raise ConfigError(f"need 1 <= min_len <= max_len, got {min_len} and {max_len}")
    rng = np.random.RandomState(seed)
    out = []
    for n in batch_sizes:
        require_positive("batch size", int(n))
        out.append(np.clip(rng.normal(mean, std, n).astype(int), min_len, max_len))
    return out


def measure_batch(
    lengths: Iterable[int], block_size: int = DEFAULT_BLOCK_SIZE, max_len: int = 2048
) -> UtilizationRow:
    """Fill a contiguous (max_len reservation) and a paged cache with requests of these
    lengths (prompt = the whole length, all appended) and read their stats."""
    lens = [int(n) for n in lengths]
    if not lens:
        raise ConfigError("a batch needs at least one request")
    check_block_size(block_size)
    naive = ContiguousKVCache(TINY, len(lens) * max_len, max_len, "max", store_kv=False)
    blocks = sum(blocks_for_tokens(n, block_size) for n in lens)
    paged = PagedKVCache(
        TINY, blocks, block_size, max_seq_len=max_len, store_kv=False, enable_prefix_caching=False
    )
    for i, n in enumerate(lens):
        naive.admit(i, range(n))
        kv = torch.zeros(1, n, 1, 1)
        naive.append(i, kv, kv)
        paged.admit(i, range(n))
        paged.append_tokens(i, n)
    ns, ps = naive.stats(), paged.stats()
    assert ns.live_slots == ps.live_slots == sum(lens)
    return UtilizationRow(
        batch_size=len(lens),
        live_tokens=ps.live_slots,
        naive_reserved=ns.reserved_slots,
        paged_reserved=ps.reserved_slots,
        naive_utilization=ns.utilization,
        paged_utilization=ps.utilization,
        paged_blocks=ps.used_blocks,
    )


def utilization_table(
    batch_sizes: Sequence[int] = SEED002_BATCH_SIZES,
    *,
    block_size: int = DEFAULT_BLOCK_SIZE,
    seed: int = 42,
    mean: float = 500.0,
    std: float = 200.0,
    min_len: int = 200,
    max_len: int = 2048,
) -> list[UtilizationRow]:
    """[paged-sim]'s utilization table, measured."""
    batches = seed002_lengths(
        batch_sizes, seed=seed, mean=mean, std=std, min_len=min_len, max_len=max_len
    )
    return [measure_batch(b, block_size, max_len) for b in batches]


def shared_prompt_blocks(
    requests: int = 10, prompt_len: int = 200, block_size: int = DEFAULT_BLOCK_SIZE
) -> SharingRow:
    """Device blocks for `requests` requests whose prompt is the same `prompt_len` tokens."""
    require_positive("requests", requests)
    require_positive("prompt_len", prompt_len)
    prompt = list(range(1, prompt_len + 1))
    blocks = requests * (blocks_for_tokens(prompt_len, block_size) + 1)

    def cache(prefix: bool) -> PagedKVCache:
        return PagedKVCache(TINY, blocks, block_size, store_kv=False, enable_prefix_caching=prefix)

    def fill(c: PagedKVCache, rid: int) -> None:
        cached = c.admit(rid, prompt)
        c.append_tokens(rid, prompt_len - cached)

    plain = cache(False)
    for r in range(requests):
        fill(plain, r)
    forked = cache(False)
    fill(forked, 0)
    for r in range(1, requests):
        forked.fork(0, r)
    fork_blocks = forked.stats().used_blocks
    forked.append_tokens(min(3, requests - 1), 1, [0])  # one request generates a token
    shared = cache(True)
    for r in range(requests):
        fill(shared, r)
    for c in (plain, forked, shared):
        c.check()
    return SharingRow(
        requests=requests,
        prompt_len=prompt_len,
        block_size=block_size,
        no_sharing=plain.stats().used_blocks,
        fork_sharing=fork_blocks,
        after_one_diverges=forked.stats().used_blocks,
        prefix_caching=shared.stats().used_blocks,
    )
