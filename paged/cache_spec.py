"""How to build the cache a simulation runs on: `CacheSpec` names a cache kind, a model's
geometry, a KV budget and the cache's options, and `build()` returns a fresh, empty cache
typed as the contract's `ServingCache`.

This is the one place the serving simulator (`paged.serving`) gets a cache from: the
serving package names no cache class and reads caches only through
`reference.contract`. `CacheSpec.kind` is "paged" or "contiguous-max" / "contiguous-pow2"
/ "contiguous-oracle". The KV budget is converted as [PA-deep-dive] does ("42GB" = 42,000 MiB =
8,400 blocks of 5 MiB for the 70B geometry at block 16); a contiguous cache gets the same
bytes as token slots. Caches are memory-only unless `store_kv=True`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvbench.paged.cache import PagedKVCache
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.contract import ServingCache
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.capacity import blocks_in_budget
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, parse_bytes
from kvbench.workloads.presets import get_preset

CACHE_KINDS = ("paged", "contiguous-max", "contiguous-pow2", "contiguous-oracle")


@dataclass(frozen=True)
class CacheSpec:
    """How to build the cache a simulation runs on.

    Attributes:
        kind: one of CACHE_KINDS.
        model: preset name (geometry, weight bytes, parameter count).
        kv_budget: KV bytes ("42GB" read as 42,000 MiB, or an int).
        block_size: tokens per block (paged).
        max_seq_len: longest request (contiguous max reservation); paged: no limit.
        watermark: fraction of blocks admission keeps free (paged).
        cpu_blocks: swap space in blocks (paged; 0 = as many as the GPU pool).
        prefix_caching: index full blocks for reuse (paged).
        store_kv: hold real KV tensors (slow; for small geometries in tests).
        geometry: overrides the preset's geometry (tests use tiny ones).
        num_blocks: overrides the budget's block count (tests).
        index_duplicates: index a block that fills with content already cached too, as
            vLLM's BlockHashToBlockMap (paged; `PrefixCache`); the vllm-v1 replays do.
    """

    kind: str = "paged"
    model: str = "llama-2-70b"
    kv_budget: str | int = "42GB"
    block_size: int = DEFAULT_BLOCK_SIZE
    max_seq_len: int = 2048
    watermark: float = 0.01
    cpu_blocks: int = 0
    prefix_caching: bool = True
    store_kv: bool = False
    geometry: KVGeometry | None = None
    num_blocks: int | None = None
    index_duplicates: bool = False

    def resolved_geometry(self) -> KVGeometry:
        return self.geometry or get_preset(self.model).geometry

    def blocks(self) -> int:
        if self.num_blocks is not None:
            return self.num_blocks
        budget = parse_bytes(self.kv_budget, decimal_gb_as_mib=True)
        return blocks_in_budget(self.resolved_geometry(), budget, self.block_size)

    def build(self) -> ServingCache:
        """A fresh, empty cache."""
        g = self.resolved_geometry()
        blocks = self.blocks()
        if self.kind == "paged":
            return PagedKVCache(
                g,
                blocks,
                self.block_size,
                watermark=self.watermark,
                num_cpu_blocks=self.cpu_blocks or blocks,
                enable_prefix_caching=self.prefix_caching,
                store_kv=self.store_kv,
                index_duplicates=self.index_duplicates,
            )
        if self.kind.startswith("contiguous-"):
            policy = self.kind.split("-", 1)[1]
            return ContiguousKVCache(
                g, blocks * self.block_size, self.max_seq_len, policy, store_kv=self.store_kv
            )
        raise ConfigError(f"unknown cache kind {self.kind!r}; known: {', '.join(CACHE_KINDS)}")
