"""kvbench's own implementations as the first peer adapters.

* `KVBenchAllocator` drives `paged.PagedKVCache` in memory-only mode (store_kv=False: the
  same block pool, prefix cache and admission as the full cache, without tensors).
* `KVBenchAttention` is one layer of `[num_blocks, block_size, num_kv_heads, head_dim]`
  K/V tensors with `kernels.ops.write_kv` and `kernels.ops.paged_decode_attention`
  (torch backend by default: the CPU path the benches compare with vLLM's native op).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from kvbench.kernels import ops
from kvbench.paged.cache import PagedKVCache
from kvbench.suites.peers.base import (
    AllocatorTraits,
    AttentionTraits,
    BlockCounts,
    PeerSpec,
    basic_unsupported,
)
from kvbench.workloads.geometry import KVGeometry

#: A tiny geometry: the allocator runs without tensors, so only its shape of bookkeeping
#: matters (one layer, one KV head).
_MEMORY_ONLY_GEOMETRY = KVGeometry(num_layers=1, num_kv_heads=1, head_dim=8, dtype="float16")


class KVBenchAllocator:
    """`PagedKVCache` (memory only, prefix caching on, no watermark) as an AllocatorAdapter."""

    name = "kvbench"
    traits = AllocatorTraits(
        reserved_blocks=(),
        dedups_full_blocks=False,
        indexes_duplicates=False,
        eviction="lru-tail-first",
        fresh_reuse="lifo",
        caches_at="fill",
        empty_salt_is_no_salt=False,
    )

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.num_usable_blocks = num_blocks
        self.cache = PagedKVCache(
            _MEMORY_ONLY_GEOMETRY,
            num_blocks,
            block_size,
            max_seq_len=num_blocks * block_size,
            store_kv=False,
            enable_prefix_caching=True,
        )

    def admit(self, request_id: Hashable, prompt: Sequence[int], salt: str | None = None) -> int:
        cached = self.cache.admit(request_id, prompt, salt=salt)
        rest = len(prompt) - cached
        if rest:  # inside the admitted reservation: cannot run out of blocks
            ids = prompt[cached:]  # a list's slice is a new list already: no second copy
            self.cache.append_tokens(request_id, rest, ids if type(ids) is list else list(ids))
        return cached

    def append(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        # the cache copies the ids it keeps (it never holds on to the caller's list)
        ids = token_ids if type(token_ids) is list else list(token_ids)
        self.cache.append_tokens(request_id, len(ids), ids)

    def free(self, request_id: Hashable) -> None:
        self.cache.free(request_id)

    def block_table(self, request_id: Hashable) -> list[int]:
        return list(self.cache.block_table(request_id))

    def ref_count(self, block: int) -> int:
        return self.cache.pool.ref[block]

    def counts(self) -> BlockCounts:
        pool = self.cache.pool
        cached = len(self.cache.prefix) if self.cache.prefix is not None else 0
        return BlockCounts(free=pool.num_free, used=pool.num_used, cached=cached)

    def is_cached(self, block: int) -> bool:
        return self.cache.prefix is not None and self.cache.prefix.is_cached(block)

    def snapshot(self) -> Any:
        return self.cache.snapshot()

    def check(self) -> None:
        """kvbench's own invariant check (pool, prefix index, requests)."""
        self.cache.check()


class KVBenchAttention:
    """kvbench's paged layout and `kernels.ops` decode as an AttentionAdapter."""

    name = "kvbench"
    traits = AttentionTraits(
        layout="[num_blocks, block_size, num_kv_heads, head_dim] (K and V separate)",
        # The torch path gathers whole blocks but zeroes K/V past each length before SDPA,
        # so NaN in an unwritten tail slot never reaches the output (checked by the suite).
        needs_finite_tail=False,
    )

    def __init__(self, backend: str | None = "torch") -> None:
        self.backend = backend

    def unsupported(
        self,
        dtype: torch.dtype,
        block_size: int,
        head_dim: int,
        num_q_heads: int,
        num_kv_heads: int,
    ) -> str | None:
        return basic_unsupported(dtype, num_q_heads, num_kv_heads)

    def make_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)

    def write(
        self, cache: Any, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        k_cache, v_cache = cache
        ops.write_kv(k_cache, v_cache, key, value, slot_mapping, backend=self.backend)

    def fill_(self, cache: Any, value: float) -> None:
        for t in cache:
            t.fill_(value)

    def decode_fn(
        self,
        cache: Any,
        query: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> Callable[[], torch.Tensor]:
        k_cache, v_cache = cache
        out = torch.empty_like(query)
        backend = self.backend
        longest = int(seq_lens.max()) if seq_lens.numel() else None  # once, outside timing

        def run() -> torch.Tensor:
            return ops.paged_decode_attention(
                query,
                k_cache,
                v_cache,
                block_tables,
                seq_lens,
                scale,
                out=out,
                backend=backend,
                check_indices=False,
                max_seq_len=longest,
            )

        return run


def _version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("kvbench")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def peer_spec() -> PeerSpec:
    """kvbench's own adapters (always available)."""
    return PeerSpec(
        name="kvbench",
        allocator=KVBenchAllocator,
        attention=KVBenchAttention,
        version=_version,
        description="kvbench's PagedKVCache (memory-only) and kernels.ops (torch backend)",
    )
