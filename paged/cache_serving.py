"""The serving accounting of `PagedKVCache` (contract: `reference.contract.ServingCache`).

What a serving engine reads of a paged cache beyond the KV contract: its fixed traits,
a request's footprint in blocks, the next block boundary, the per-step occupancy and the
distinct blocks a group holds. A mixin so that `paged.cache` keeps to the KV operations.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from kvbench.reference.contract import Footprint, Occupancy, RequestId, ServingTraits

if TYPE_CHECKING:
    from kvbench.paged.block_pool import BlockPool
    from kvbench.paged.block_table import RequestState
    from kvbench.paged.prefix_cache import PrefixCache
    from kvbench.paged.swap import SwapSpace


class PagedServingAccounting:
    """Serving accounting over the attributes `PagedKVCache` sets."""

    block_size: int
    num_blocks: int
    max_seq_len: int
    watermark_blocks: int
    store_kv: bool
    prefix: PrefixCache | None
    pool: BlockPool
    swap: SwapSpace
    _requests: dict[Hashable, RequestState]

    def _get(self, request_id: RequestId) -> RequestState:
        raise NotImplementedError

    def serving_traits(self) -> ServingTraits:
        """Fixed facts a serving engine reads once (contract: ServingCache)."""
        return ServingTraits(
            block_size=self.block_size,
            store_kv=self.store_kv,
            prefix_caching=self.prefix is not None,
            can_swap=self.swap.num_blocks > 0,
            max_seq_len=self.max_seq_len,
            watermark_blocks=self.watermark_blocks,
        )

    def footprint(self, tokens: int) -> Footprint:
        """Blocks a request of `tokens` tokens holds alone, against the admissible pool
        (all blocks but the watermark's)."""
        need = -(-tokens // self.block_size)
        return Footprint(need, self.num_blocks - self.watermark_blocks, "blocks")

    def next_growth(self, request_id: RequestId, length: int) -> int:
        """The next block boundary at or after `length` (sharing is the caller's to know:
        a shared partial block needs a copy at the next append)."""
        bs = self.block_size
        return -(-length // bs) * bs

    def occupancy(self) -> Occupancy:
        """(free, used, cached-evictable blocks, live slots, reserved = used blocks' slots)."""
        pool = self.pool
        return Occupancy(
            pool.num_free,
            pool.num_used,
            pool.num_evictable,
            pool.live_slots,
            pool.num_used * self.block_size,
        )

    def blocks_held(self, request_ids: Sequence[RequestId]) -> int:
        """Distinct blocks (device or CPU) the requests hold, shared ones counted once."""
        return len({b for rid in request_ids for b in self._get(rid).blocks})
