"""Eviction policies of the prefix cache: which evictable cached block a full pool
reallocates first.

A policy is the pool's set of evictable blocks (cached, reference count 0), kept as a
mapping-like container the block pool drives with four operations:

    queue[block] = None          the block became evictable (its last holder released it)
    del queue[block]             a prefix hit revived it (it is in use again)
    queue.popitem(last=False)    take the block to evict next: (block, None)
    iter(queue)                  the evictable blocks, next to be evicted first

Policies (`POLICIES`, chosen by name; "lru" is the default and is exactly the pool's
original queue, an OrderedDict):

    lru   least recently released first.
    lfu   fewest uses first, then least recently released (as SGLang's
          `--radix-eviction-policy lfu`). A block's use count is the number of times it
          has been released to reference count 0 since it was cached (in a serial replay,
          the requests that used it); it resets when the block is evicted (its content is
          gone).
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterator, MutableMapping

from kvbench.workloads.errors import ConfigError

#: Policy names `make_queue` accepts.
POLICIES = ("lru", "lfu")


class LFUQueue:
    """Evictable blocks by (use count, release order): a heap with lazy deletion.

    Invariant: `_live[block]` is the (count, order) key of every evictable block; the heap
    holds those keys plus stale ones (of revived or re-released blocks), which `popitem`
    skips; it is rebuilt when stale entries outnumber live ones."""

    def __init__(self) -> None:
        self._live: dict[int, tuple[int, int]] = {}
        self._uses: dict[int, int] = {}
        self._heap: list[tuple[int, int, int]] = []
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
        key = (uses, self._order)
        self._live[block] = key
        heapq.heappush(self._heap, (uses, self._order, block))

    def __delitem__(self, block: int) -> None:
        del self._live[block]  # KeyError like a dict; the heap entry goes stale
        if len(self._heap) > 2 * len(self._live) + 64:
            self._heap = [(c, o, b) for b, (c, o) in self._live.items()]
            heapq.heapify(self._heap)

    def popitem(self, last: bool = True) -> tuple[int, None]:
        """The next block to evict (fewest uses, least recently released), removed."""
        if last:
            raise ConfigError("an LFU queue evicts from the front only (last=False)")
        heap, live = self._heap, self._live
        while heap:
            uses, order, block = heapq.heappop(heap)
            if live.get(block) == (uses, order):
                del live[block]
                del self._uses[block]  # evicted: its content (and history) is gone
                return block, None
        raise KeyError("popitem(): the LFU queue is empty")


def make_queue(policy: str = "lru") -> MutableMapping[int, None] | LFUQueue:
    """An empty evictable-block queue of `policy` (ConfigError naming the known ones)."""
    if policy == "lru":
        return OrderedDict()
    if policy == "lfu":
        return LFUQueue()
    raise ConfigError(f"unknown eviction policy {policy!r}; known: {', '.join(POLICIES)}")
