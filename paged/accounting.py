"""What a `PagedKVCache` reports about itself: memory stats, prefix-cache stats, and the
serving accounting a serving engine reads (contract: `reference.contract.ServingCache`).

A part of the cache (`paged.cache`), read-only over the parts it is given (device pool,
prefix cache, swap space, request table), so it can never break the atomicity of the
cache's operations. Its invariant (asserted by `check`): the slot accounting adds up
(internal fragmentation and reservations are >= 0, free + reserved = capacity).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState
from kvbench.paged.prefix_cache import PrefixCache, PrefixCacheStats
from kvbench.paged.requests import RequestTable
from kvbench.paged.swap import SwapSpace
from kvbench.reference.contract import (
    CacheStats,
    Footprint,
    Occupancy,
    RequestId,
    ServingTraits,
)


@dataclass(frozen=True)
class CacheLimits:
    """A paged cache's fixed limits, set once at construction."""

    #: The longest a request may grow, in tokens.
    max_seq_len: int
    #: Blocks admission (and swap-in) keeps free: ceil(watermark * num_blocks).
    watermark_blocks: int
    #: Whether the cache holds KV tensors (False: memory-only).
    store_kv: bool
    #: Bytes of KV one token slot holds (all layers, K and V).
    bytes_per_slot: int


class CacheAccounting:
    """stats / prefix_stats / serving accounting over a paged cache's parts."""

    def __init__(
        self,
        pool: BlockPool,
        prefix: PrefixCache | None,
        swap: SwapSpace,
        requests: RequestTable,
        limits: CacheLimits,
    ) -> None:
        self.pool = pool
        self.prefix = prefix
        self.swap = swap
        self.requests = requests
        self.limits = limits

    # ------------------------------------------------------------------ serving (contract)
    def serving_traits(self) -> ServingTraits:
        """Fixed facts a serving engine reads once (contract: ServingCache)."""
        lim = self.limits
        return ServingTraits(
            block_size=self.pool.block_size,
            store_kv=lim.store_kv,
            prefix_caching=self.prefix is not None,
            can_swap=self.swap.num_blocks > 0,
            max_seq_len=lim.max_seq_len,
            watermark_blocks=lim.watermark_blocks,
        )

    def footprint(self, tokens: int) -> Footprint:
        """Blocks a request of `tokens` tokens holds alone, against the admissible pool
        (all blocks but the watermark's)."""
        need = -(-tokens // self.pool.block_size)
        return Footprint(need, self.pool.num_blocks - self.limits.watermark_blocks, "blocks")

    def next_growth(self, length: int) -> int:
        """The next block boundary at or after `length` (sharing is the caller's to know:
        a shared partial block needs a copy at the next append)."""
        bs = self.pool.block_size
        return -(-length // bs) * bs

    def occupancy(self) -> Occupancy:
        """(free, used, cached-evictable blocks, live slots, reserved = used blocks' slots)."""
        pool = self.pool
        return Occupancy(
            pool.num_free,
            pool.num_used,
            pool.num_evictable,
            pool.live_slots,
            pool.num_used * pool.block_size,
        )

    def blocks_held(self, request_ids: Sequence[RequestId]) -> int:
        """Distinct blocks (device or CPU) the requests hold, shared ones counted once."""
        get = self.requests.get
        return len({b for rid in request_ids for b in get(rid).blocks})

    # ------------------------------------------------------------------ memory stats
    def _reservation_slots(self, req: RequestState) -> int:
        """Pending prompt slots in blocks the request holds alone (a shared partial block's
        free tail is nobody's reservation: the first write copies the block)."""
        pending = req.pending_prompt
        if not pending or req.swapped:
            return 0
        bs, s = self.pool.block_size, req.seq_len
        if s % bs and self.pool.ref[req.blocks[s // bs]] > 1:
            pending -= min(req.prompt_len, (s // bs + 1) * bs) - s
        return pending

    def stats(self, cow_copies: int) -> CacheStats:
        """Memory snapshot (O(requests + blocks)); see CacheStats for the slot accounting.

        Paged specifics: reservation_slots are pending prompt slots in blocks a request
        holds alone; internal fragmentation is the rest of the used blocks' empty slots;
        free_slots include evictable cached blocks; logical_tokens counts running
        requests (a slot shared by n requests counts n times there, once in live_slots);
        num_requests includes swapped ones; cached_blocks are the prefix index's entries
        (in use or evictable); shared_blocks have refcount > 1; swapped_blocks are CPU
        blocks held now; cow_copies (the cache's count) is cumulative.
        """
        pool = self.pool
        bs = pool.block_size
        running = [r for r in self.requests.states() if not r.swapped]
        reservation = sum(self._reservation_slots(r) for r in running)
        used_slots = pool.num_used * bs
        return CacheStats(
            capacity_slots=pool.num_blocks * bs,
            live_slots=pool.live_slots,
            reservation_slots=reservation,
            internal_fragmentation_slots=used_slots - pool.live_slots - reservation,
            free_slots=pool.num_free * bs,
            external_fragmentation_slots=0,
            logical_tokens=sum(r.seq_len for r in running),
            num_requests=len(self.requests),
            bytes_per_slot=self.limits.bytes_per_slot,
            block_size=bs,
            total_blocks=pool.num_blocks,
            free_blocks=pool.num_free,
            used_blocks=pool.num_used,
            cached_blocks=len(self.prefix) if self.prefix is not None else 0,
            shared_blocks=sum(1 for c in pool.ref if c > 1),
            cow_copies=cow_copies,
            swapped_blocks=self.swap.num_used,
        )

    def prefix_stats(self) -> PrefixCacheStats:
        """Prefix-cache counters (all zero when prefix caching is off)."""
        p = self.prefix
        if p is None:
            return PrefixCacheStats(0, 0, 0, 0, 0, 0, 0)
        return PrefixCacheStats(
            p.lookups,
            p.queried_tokens,
            p.hit_blocks,
            p.hit_tokens,
            p.evictions,
            len(p),
            self.pool.num_evictable,
        )

    def check(self) -> None:
        """Assert the invariant of the module docstring."""
        s = self.stats(0)
        assert s.internal_fragmentation_slots >= 0 and s.reservation_slots >= 0
        assert s.free_slots + s.reserved_slots == s.capacity_slots
