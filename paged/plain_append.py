"""The common memory-only append of a `PagedKVCache`, inlined for speed (`PlainAppend`).

A part of the cache (`paged.cache`), given the request table, the block pool, the
prefix admission part, the block size and max_seq_len at construction. Trace replays
and the allocator benches append millions of times; this path takes the appends that
need no copy-on-write and no checks beyond its own, and declines (False, nothing
changed) every other, which the cache's general path then plans and explains.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.prefix_admission import PrefixAdmission
from kvbench.paged.requests import RequestTable
from kvbench.reference.contract import RequestId

#: The id types the fast path takes without `validate_token_ids` (exact ints).
_INT_ONLY = {int}


class PlainAppend:
    """`append(request_id, n, token_ids) -> bool`; the cache keeps the bound method."""

    def __init__(
        self,
        requests: RequestTable,
        pool: BlockPool,
        admission: PrefixAdmission,
        block_size: int,
        max_seq_len: int,
    ) -> None:
        self.requests = requests
        self.pool = pool
        self.admission = admission
        self.block_size = block_size
        self.max_seq_len = max_seq_len

    def append(self, request_id: RequestId, n: int, token_ids: Sequence[int | None] | None) -> bool:
        """The common memory-only append (a resident request, no ids or a list of n
        non-negative ints, no copy-on-write, within max_seq_len and the free blocks: what
        `PagedKVCache._check_growth` would pass); False, nothing changed, for anything else
        (`PagedKVCache._check_growth` then says why). Trace replays and the allocator benches call it
        millions of times, hence the checks and `PagedKVCache._grow`'s no-copy-on-write steps (with
        `BlockPool.fill_span`) inline: the same blocks, fills, ids and keys."""
        if token_ids is not None and not (
            type(token_ids) is list
            and len(token_ids) == n
            and set(map(type, token_ids)) == _INT_ONLY
            and min(token_ids) >= 0
        ):
            return False
        try:
            req = self.requests.by_id[request_id]
        except (KeyError, TypeError):
            return False
        s = req.seq_len
        end = s + n
        if req.swapped or end > self.max_seq_len:
            return False
        bs, blocks, pool = self.block_size, req.blocks, self.pool
        first = s // bs  # `_growth` (full attention's `blocks_to_grow`), inline
        last = -(-end // bs)  # blocks the request spans after the append
        held = len(blocks)
        if first < held and pool.ref[blocks[first]] > 1:
            return False  # copy-on-write: the general path
        if last > held:
            fresh = last - held
            if fresh > len(pool._free) + len(pool._evictable):  # pool.num_free
                return False
            # ---- mutation starts (`_grow`, no copy-on-write): nothing below can fail
            if fresh == 1:
                blocks.append(pool.allocate())
            else:
                blocks += pool.allocate_many(fresh)
        fill = pool.fill  # `pool.fill_span(blocks, s, end)`, inline
        pool.live_slots += n
        for i in range(first, last - 1):
            fill[blocks[i]] = bs
        fill[blocks[last - 1]] = end - (last - 1) * bs
        req.advance(end, token_ids)
        if req.hashable and len(req.keys) < end // bs and self.admission.prefix is not None:
            self.admission.register_full_blocks(req)
        return True
