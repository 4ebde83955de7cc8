"""Paged KV cache: block pool, block tables, copy-on-write, prefix cache, swap space and
`PagedKVCache`, the implementation measured against the reference.

The serving simulator that schedules over any cache (engine, time model, latency, rate
search, calibration) is the subpackage `paged.serving`; it reads caches only through
`reference.contract` and gets one from `paged.cache_spec`."""

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState, block_table_tensor, slot_mapping
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.prefix_cache import PrefixCache, PrefixCacheStats, block_key
from kvbench.paged.snapshots import snapshots_equal
from kvbench.paged.swap import CpuBlockPool, SwapSpace

__all__ = [
    "BlockPool",
    "CpuBlockPool",
    "PagedKVCache",
    "PrefixCache",
    "PrefixCacheStats",
    "RequestState",
    "SwapSpace",
    "block_key",
    "block_table_tensor",
    "slot_mapping",
    "snapshots_equal",
]
