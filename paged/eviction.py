"""Eviction policies of the prefix cache: which evictable cached block a full pool
reallocates first.

A policy is the pool's set of evictable blocks (cached, reference count 0), kept as a
mapping-like container the block pool drives with four operations:

    queue[block] = None          the block became evictable (its last holder released it)
    del queue[block]             a prefix hit revived it (it is in use again)
    queue.popitem(last=False)    take the block to evict next: (block, None)
    iter(queue)                  the evictable blocks, next to be evicted first

Policies (`QUEUES`, chosen by name; "lru" is the default and is exactly the pool's
original queue, an OrderedDict). `QUEUES` is the one registry: the caches, `kvbench
hitrate`'s --policy and the trace.prefix_capacity sweep's full grid all read it, so a new
policy is a queue class and its entry here:

    lru   least recently released first.
    lfu   fewest uses first, then least recently released (as SGLang's
          `--radix-eviction-policy lfu`). A block's use count is the number of times it
          has been released to reference count 0 since it was cached (in a serial replay,
          the requests that used it); it resets when the block is evicted (its content is
          gone).
    slru  segmented LRU: blocks released once since cached (probationary) are evicted
          before blocks released again after a hit (protected, at most 4/5 of the
          queue), each segment least recently released first (`SLRUQueue`).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Iterator, MutableMapping

from kvbench.workloads.errors import ConfigError


class LFUQueue:
    """Evictable blocks by (use count, release order): a heap with lazy deletion.

    Invariant: `_live[block]` is the key of every evictable block; the heap holds those
    keys plus stale ones (of revived or re-released blocks), which `popitem` skips; it
    is rebuilt when stale entries outnumber live ones.

    A key is one int, uses * 2**80 + order * 2**32 + block: ordered exactly as
    the tuple (uses, order, block) (order < 2**48 and block < 2**32, a pool's int32 ids),
    and compared in one step where a tuple compares field by field (a 5M-block heap
    compares ~23 keys per pop)."""

    def __init__(self) -> None:
        self._live: dict[int, int] = {}
        self._uses: dict[int, int] = {}
        self._heap: list[int] = []
        self._order = 0

    def __len__(self) -> int:
        return len(self._live)

    def __contains__(self, block: object) -> bool:
        return block in self._live

    def __iter__(self) -> Iterator[int]:
        return iter(sorted(self._live, key=self._live.__getitem__))

    def __setitem__(self, block: int, _value: None) -> None:
        uses = self._uses.get(block, 0) + 1
        self._uses[block] = uses
        self._order += 1
        if not 0 <= block <= _BLOCK_MASK:  # a pool's ids are int32: never in practice
            raise ConfigError(f"block id {block} does not fit an LFU key")
        code = (uses << _USES_SHIFT) | (self._order << _BLOCK_BITS) | block
        self._live[block] = code
        heapq.heappush(self._heap, code)

    def __delitem__(self, block: int) -> None:
        del self._live[block]  # KeyError like a dict; the heap entry goes stale
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = list(self._live.values())
            heapq.heapify(self._heap)

    def popitem(self, last: bool = True) -> tuple[int, None]:
        """The next block to evict (fewest uses, least recently released), removed."""
        if last:
            raise ConfigError("an LFU queue evicts from the front only (last=False)")
        heap, live = self._heap, self._live
        while heap:
            code = heapq.heappop(heap)
            block = code & _BLOCK_MASK
            if live.get(block) == code:
                del live[block]
                del self._uses[block]  # evicted: its content (and history) is gone
                return block, None
        raise KeyError("popitem(): the LFU queue is empty")


_BLOCK_BITS = 32
_ORDER_BITS = 48
_BLOCK_MASK = (1 << _BLOCK_BITS) - 1
_USES_SHIFT = _ORDER_BITS + _BLOCK_BITS  # release orders stay below 2**48


class SLRUQueue:
    """Segmented LRU: evictable blocks in two least-recently-released queues.

    A block released for the first time since it was cached joins the probationary
    segment; released again (it was hit and revived in between) it joins the protected
    segment. After each release the protected segment holds at most PROTECTED_SHARE of
    the queue (len(queue) * 4 // 5): its least recently released blocks move to the
    probationary segment's most recent end until it does. Eviction takes the least
    recently released probationary block, or the protected one when no probationary
    block is left. A block's history goes with its content when it is evicted.

    Once-used blocks (a prompt's tail seen once) so leave before blocks that were hit,
    whatever their release order: LRU's weakness on scans that SLRU is known for fixing
    (Karedla et al., "Caching strategies to improve disk system performance", 1994)."""

    def __init__(self) -> None:
        self._probation: OrderedDict[int, None] = OrderedDict()
        self._protected: OrderedDict[int, None] = OrderedDict()
        self._seen: set[int] = set()  # released at least once since cached

    def __len__(self) -> int:
        return len(self._probation) + len(self._protected)

    def __contains__(self, block: object) -> bool:
        return block in self._probation or block in self._protected

    def __iter__(self) -> Iterator[int]:
        yield from self._probation
        yield from self._protected

    def __setitem__(self, block: int, _value: None) -> None:
        if block in self._seen:
            protected, probation = self._protected, self._probation
            protected[block] = None
            limit = len(self) * PROTECTED_SHARE[0] // PROTECTED_SHARE[1]
            while len(protected) > limit:
                demoted, _ = protected.popitem(last=False)
                probation[demoted] = None
        else:
            self._seen.add(block)
            self._probation[block] = None

    def __delitem__(self, block: int) -> None:
        if block in self._probation:
            del self._probation[block]
        else:
            del self._protected[block]  # KeyError like a dict

    def popitem(self, last: bool = True) -> tuple[int, None]:
        """The next block to evict (module docstring), removed; its history forgotten."""
        if last:
            raise ConfigError("an SLRU queue evicts from the front only (last=False)")
        segment = self._probation or self._protected
        if not segment:
            raise KeyError("popitem(): the SLRU queue is empty")
        block, _ = segment.popitem(last=False)
        self._seen.discard(block)
        return block, None


#: The protected segment's largest share of an SLRU queue, as (numerator, denominator).
PROTECTED_SHARE = (4, 5)


#: Policy name -> a factory of its empty queue (the registry: module docstring).
QUEUES: dict[str, Callable[[], MutableMapping[int, None] | LFUQueue | SLRUQueue]] = {
    "lru": OrderedDict,
    "lfu": LFUQueue,
    "slru": SLRUQueue,
}
#: Policy names `make_queue` accepts.
POLICIES = tuple(QUEUES)


def make_queue(policy: str = "lru") -> MutableMapping[int, None] | LFUQueue | SLRUQueue:
    """An empty evictable-block queue of `policy` (ConfigError naming the known ones)."""
    factory = QUEUES.get(policy)
    if factory is None:
        raise ConfigError(f"unknown eviction policy {policy!r}; known: {', '.join(POLICIES)}")
    return factory()
