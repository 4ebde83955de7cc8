"""Block pool: a fixed set of physical blocks with reference counts and O(1) allocate/free.

Every block is in exactly one of three states:

    free       reference count 0, holds no cached prefix; on the free stack. Reused
               last-freed-first (its memory is the most likely to be warm).
    evictable  reference count 0, holds a cached prefix (it is in the prefix index); in the
               eviction queue. Still findable by a prefix lookup; reallocated only when the
               free stack is empty, in the queue's order (`paged.eviction`: LRU, least
               recently freed first, by default; LFU on request), and dropped from the
               index then.
    used       reference count >= 1 (held by that many request block-table entries);
               may or may not be in the prefix index.

A request releases its blocks tail first (`release` takes them in table order and walks
backwards), so its deepest blocks enter the LRU queue before its shared head and are
evicted first.

The pool also records, per block, how many token slots hold written KV (`fill`) and keeps
`live_slots` = sum of fill over used blocks, so stats cost O(1).

Invariants (asserted by `check`): free + evictable + used = num_blocks, each block in one
state; free blocks are not cached and have fill 0; evictable blocks are cached; refcounts
are >= 0; the counters equal their recomputation.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from itertools import compress, islice, repeat
from operator import not_

from kvbench.paged.eviction import make_queue
from kvbench.paged.prefix_cache import PrefixCache, drain
from kvbench.reference.validation import MAX_INDEX
from kvbench.workloads.block_size import check_block_size
from kvbench.workloads.errors import CapacityError, ConfigError
from kvbench.workloads.geometry import require_positive


class BlockPool:
    """Physical block bookkeeping for one device (no tensors; see module docstring)."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        prefix: PrefixCache | None = None,
        eviction: str = "lru",
    ):
        # block ids and slots go to kernels as int32
        self.num_blocks = require_positive("num_blocks", num_blocks, MAX_INDEX)
        self.block_size = check_block_size(block_size)
        self.prefix = prefix
        self._evictable: OrderedDict[int, None] = make_queue(eviction)  # type: ignore[assignment]
        self.eviction = eviction
        try:
            self.ref: list[int] = [0] * num_blocks
            self.fill: list[int] = [0] * num_blocks
            # pop() takes the end: block 0 on top, so a fresh pool hands out 0, 1, 2...
            self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        except MemoryError:
            raise CapacityError(
                f"cannot hold the bookkeeping of {num_blocks:,} blocks in host memory"
            ) from None
        self.num_used = 0
        self.live_slots = 0

    # ------------------------------------------------------------------ queries
    @property
    def num_free(self) -> int:
        """Blocks an allocation can take: free plus evictable."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        return len(self._evictable)

    def is_evictable(self, block: int) -> bool:
        return block in self._evictable

    def free_stack(self) -> list[int]:
        """The free stack, bottom first (the next allocation takes the last element)."""
        return list(self._free)

    def lru_order(self) -> list[int]:
        """Evictable blocks, next to be evicted first."""
        return list(self._evictable)

    # ------------------------------------------------------------------ mutation
    def allocate(self) -> int:
        """Take one block (free stack first, else evict the LRU cached block); refcount 1."""
        if self._free:
            block = self._free.pop()
        elif self._evictable:
            block, _ = self._evictable.popitem(last=False)
            assert self.prefix is not None
            self.prefix.drop(block)
            self.fill[block] = 0
        else:
            raise CapacityError(f"block pool exhausted: all {self.num_blocks} blocks are in use")
        self.ref[block] = 1
        self.num_used += 1
        return block

    def allocate_many(self, n: int) -> list[int]:
        """Take `n` blocks, all or none (CapacityError naming the shortfall)."""
        if n < 0:
            raise ConfigError(f"cannot allocate {n} blocks")
        if n > self.num_free:
            raise CapacityError(f"need {n} blocks, only {self.num_free} free or evictable")
        # `allocate` n times, in bulk: the top of the free stack (popped last-in first),
        # then evictions in the queue's order (nothing joins the free stack meanwhile)
        free, ref = self._free, self.ref
        take = min(n, len(free))
        out = free[len(free) - take :]
        out.reverse()
        del free[len(free) - take :]
        if take < n:
            assert self.prefix is not None
            victims = self._take_evictable(n - take)
            self.prefix.drop_many(victims)
            drain(map(self.fill.__setitem__, victims, repeat(0)))
            out += victims
        drain(map(ref.__setitem__, out, repeat(1)))
        self.num_used += n
        return out

    def _take_evictable(self, k: int) -> list[int]:
        """Remove and return the next k blocks to evict, in the queue's order (k pops
        from the front; 0 < k <= len(queue)). An LRU queue's first k are read and
        deleted (cheaper than k popitem calls, same blocks, same order)."""
        queue = self._evictable
        if type(queue) is OrderedDict:
            victims = list(islice(queue, k))
            drain(map(queue.__delitem__, victims))
            return victims
        pop = queue.popitem
        return [pop(last=False)[0] for _ in range(k)]

    def incref(self, block: int) -> None:
        """Add a reference; an evictable block comes back into use (a prefix hit)."""
        if self.ref[block] == 0:
            if block not in self._evictable:
                raise ConfigError(f"block {block} is free; allocate it instead of sharing it")
            del self._evictable[block]
            self.num_used += 1
            self.live_slots += self.fill[block]
        self.ref[block] += 1

    def incref_many(self, blocks: Sequence[int]) -> None:
        """`incref` each block in order (an admission's prefix hits); ConfigError before
        anything changes if one of them is free (at refcount 0 and not evictable)."""
        ref, evictable = self.ref, self._evictable
        for block in blocks:
            if ref[block] == 0 and block not in evictable:
                raise ConfigError(f"block {block} is free; allocate it instead of sharing it")
        used = live = 0
        fill = self.fill
        for block in blocks:
            count = ref[block]
            if count == 0:
                del evictable[block]
                used += 1
                live += fill[block]
            ref[block] = count + 1
        self.num_used += used
        self.live_slots += live

    def decref(self, block: int) -> None:
        """Drop a reference; at zero the block becomes evictable (cached) or free."""
        if self.ref[block] <= 0:
            raise ConfigError(f"block {block} has no reference to drop")
        self.ref[block] -= 1
        if self.ref[block] == 0:
            self.num_used -= 1
            self.live_slots -= self.fill[block]
            if self.prefix is not None and self.prefix.is_cached(block):
                self._evictable[block] = None
            else:
                self.fill[block] = 0
                self._free.append(block)

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each of a request's blocks, tail first. A table of
        distinct blocks, each referenced, is released in bulk at C speed (`_release_bulk`:
        the same counts, free stack and eviction queue order as one block after another)."""
        ref = self.ref
        counts = list(map(ref.__getitem__, blocks))
        if len(counts) > 1 and min(counts) >= 1 and len(set(blocks)) == len(counts):
            self._release_bulk(blocks, counts)
            return
        fill, free, evictable = self.fill, self._free, self._evictable
        cached = self.prefix.indexed_blocks() if self.prefix is not None else ()
        used = live = 0  # counter changes, written once (also when decref raises)
        try:
            for block in reversed(blocks):
                count = ref[block]
                if count > 1:
                    ref[block] = count - 1
                    continue
                if count != 1:
                    self.decref(block)  # raises: no reference to drop
                ref[block] = 0
                used += 1
                live += fill[block]
                if block in cached:
                    evictable[block] = None
                else:
                    fill[block] = 0
                    free.append(block)
        finally:
            self.num_used -= used
            self.live_slots -= live

    def _release_bulk(self, blocks: Sequence[int], counts: list[int]) -> None:
        """`release` of distinct blocks whose counts (`counts`, in table order) are all
        >= 1: shared ones lose a reference, the last references go tail first to the
        eviction queue (cached) or the free stack (not cached), as in the loop."""
        ref, fill = self.ref, self.fill
        last = list(compress(reversed(blocks), map((1).__eq__, reversed(counts))))
        if len(last) < len(counts):  # shared blocks keep their other references
            for block in compress(blocks, map((1).__lt__, counts)):
                ref[block] -= 1
        drain(map(ref.__setitem__, last, repeat(0)))
        self.num_used -= len(last)
        self.live_slots -= sum(map(fill.__getitem__, last))
        if self.prefix is None:
            cached = [False] * len(last)
        else:
            cached = list(map(self.prefix.indexed_blocks().__contains__, last))
        drain(map(self._evictable.__setitem__, compress(last, cached), repeat(None)))
        uncached = list(compress(last, map(not_, cached)))
        drain(map(fill.__setitem__, uncached, repeat(0)))
        self._free += uncached

    def undo_release(self, block: int, fill: int) -> None:
        """Take back the reference the latest `decref`/`release` of `block` dropped (the
        rollback of a failed operation, releases undone newest first): a shared block
        gets its reference back, an evictable one leaves the eviction queue (the others
        keep their order), a freed one comes off the top of the free stack, where the
        release put it, with its `fill` slots again."""
        if self.ref[block] > 0 or block in self._evictable:
            self.incref(block)
            return
        if not self._free or self._free[-1] != block:
            raise ConfigError(f"block {block} is not the last one released; cannot take it back")
        self._free.pop()
        self.ref[block] = 1
        self.fill[block] = fill
        self.num_used += 1
        self.live_slots += fill

    def set_fill(self, block: int, fill: int) -> None:
        """Record that `fill` slots of a used block hold written KV."""
        self.live_slots += fill - self.fill[block]
        self.fill[block] = fill

    def fill_span(self, blocks: Sequence[int], start: int, end: int) -> None:
        """Record that token positions [start, end) of a block table were written: the
        blocks they touch hold min(block_size, end - first position) slots each.
        Positions before `start` must already be recorded (a request writes in order)."""
        if end <= start:
            return
        bs, fill = self.block_size, self.fill
        first, last = start // bs, -(-end // bs)
        self.live_slots += end - start
        for i in range(first, last - 1):
            fill[blocks[i]] = bs
        fill[blocks[last - 1]] = end - (last - 1) * bs

    # ------------------------------------------------------------------ checks
    def snapshot(self) -> tuple[object, ...]:
        """All state as plain comparable values (for atomicity tests)."""
        return (
            list(self.ref),
            list(self.fill),
            list(self._free),
            list(self._evictable),
            self.num_used,
            self.live_slots,
        )

    def check(self) -> None:
        """Assert the invariants of the module docstring."""
        free = set(self._free)
        evictable = set(self._evictable)
        assert len(free) == len(self._free), "a block is on the free stack twice"
        assert not free & evictable, f"blocks both free and evictable: {free & evictable}"
        used = 0
        live = 0
        for block, count in enumerate(self.ref):
            assert count >= 0, f"block {block} has refcount {count}"
            cached = self.prefix is not None and self.prefix.is_cached(block)
            if count == 0:
                assert block in free or block in evictable, f"block {block} leaked (ref 0)"
                if block in free:
                    assert not cached, f"free block {block} is still in the prefix index"
                    assert self.fill[block] == 0, f"free block {block} has fill"
                else:
                    assert cached, f"evictable block {block} is not cached"
            else:
                assert block not in free and block not in evictable, f"used block {block} free"
                used += 1
                live += self.fill[block]
            assert 0 <= self.fill[block] <= self.block_size
        assert used + len(free) + len(evictable) == self.num_blocks, "block count not conserved"
        assert used == self.num_used, f"num_used {self.num_used} != {used}"
        assert live == self.live_slots, f"live_slots {self.live_slots} != {live}"
        if self.prefix is not None:
            self.prefix.check()
