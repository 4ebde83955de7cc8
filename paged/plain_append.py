"""The common memory-only append of a `PagedKVCache`, inlined for speed (`PlainAppend`).

A part of the cache (`paged.cache`), given the request table, the block pool, the
prefix admission part, the block size and max_seq_len at construction. Trace replays
and the allocator benches append millions of times; this path takes the appends that
need no copy-on-write and no checks beyond its own, and declines (False, nothing
changed) every other, which the cache's general path then plans and explains.
`append_chained` is the narrower path of a vllm-v1 replay's decoders (no ids, every
block keyed from the request's whole-sequence chain), called by the engine directly.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.paged.block_chain import BlockChain
from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState
from kvbench.paged.prefix_admission import PrefixAdmission
from kvbench.paged.prefix_cache import BlockKey
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
        #: the prefix index (None without prefix caching)
        self.prefix = admission.prefix
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
        keys = req.keys
        full = end // bs
        if req.hashable and len(keys) < full and self.prefix is not None:
            chain = req.chain
            if (
                token_ids is None
                and chain is not None
                and len(chain.keys) >= full
                and req.tokens is not None
            ):
                self._register_chained(req, keys, chain, full)
            else:
                self.admission.register_full_blocks(req)
        return True

    def append_chained(self, request_id: RequestId, n: int) -> bool:
        """`append(request_id, n, None)` where it is a chain-keyed decode append: a
        resident request past its prompt, admitted with a chain that keys every block
        the append fills (a vllm-v1 replay, `paged.serving.engine.v1_keys`), no
        copy-on-write, within max_seq_len and the free blocks; False, nothing changed,
        for anything else (the caller then takes `PagedKVCache.append_tokens`). The same
        blocks, fills, counters, keys and index entries as `append`, with its steps
        inline: a block from the free stack taken as `BlockPool.allocate` takes it,
        `RequestState.advance` past the prompt (the unknown tail grows), one filled
        block indexed by `_register_chained` (tests compare both paths)."""
        try:
            req = self.requests.by_id[request_id]
        except (KeyError, TypeError):
            return False
        chain = req.chain
        s = req.seq_len
        end = s + n
        bs = self.block_size
        full = end // bs
        if (
            chain is None
            or type(n) is not int
            or n <= 0
            or s < req.prompt_len
            or req.swapped
            or end > self.max_seq_len
            or req.tokens is None
            or len(chain.keys) < full
        ):
            return False
        blocks, pool = req.blocks, self.pool
        first = s // bs
        last = -(-end // bs)
        held = len(blocks)
        ref = pool.ref
        if first < held and ref[blocks[first]] > 1:
            return False  # copy-on-write: the general path
        if last > held:
            fresh = last - held
            free = pool._free
            if fresh == 1 and free:  # `BlockPool.allocate` from the free stack, inline
                block = free.pop()
                ref[block] = 1
                pool.num_used += 1
                blocks.append(block)
            elif fresh > len(free) + len(pool._evictable):
                return False
            elif fresh == 1:  # ---- mutation starts: nothing below can fail
                blocks.append(pool.allocate())
            else:
                blocks += pool.allocate_many(fresh)
        fill = pool.fill
        pool.live_slots += n
        for i in range(first, last - 1):
            fill[blocks[i]] = bs
        fill[blocks[last - 1]] = end - (last - 1) * bs
        req.unknown_tail += n  # `req.advance(end, None)` past the prompt
        req.seq_len = end
        keys = req.keys
        if len(keys) < full and req.hashable and self.prefix is not None:
            self._register_chained(req, keys, chain, full)
        return True

    def _register_chained(
        self, req: RequestState, keys: list[BlockKey], chain: BlockChain, full: int
    ) -> None:
        """`PrefixAdmission.register_full_blocks` of a request whose chain covers every
        block that is full now (a chain-keyed append, `paged.serving.engine.v1_keys`):
        blocks len(keys) .. full - 1 are indexed under the chain's keys, and the rest of
        that method has nothing to do (no block past the chain, no ids to hash), save
        forgetting the admission's miss. One block (a decoder's block boundary, the
        common case) is indexed without slicing the chain."""
        prefix = self.prefix
        assert prefix is not None
        i = len(keys)
        req.miss = None
        parent = keys[-1] if i else None
        if full == i + 1:
            key = chain.keys[i]
            prefix.insert_block(req.blocks[i], key, parent, chain.chunks[i], req.extra)
            keys.append(key)
            return
        new = chain.keys[i:full]
        prefix.insert_chain(req.blocks[i:full], new, chain.chunks[i:full], parent, req.extra)
        keys.extend(new)
