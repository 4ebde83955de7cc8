"""A plain model of a prefix-caching block allocator under eviction, parameterized by the
design rules an `AllocatorAdapter` declares in its `traits`: the oracle of the eviction
differential (suites/conformance/test_peers_allocator.py).

What it models, per operation: the prompt tokens served from the prefix cache, whether
the operation is refused (not enough free blocks, nothing changed), and the free and
cached block counts after it. Physical block ids are not modelled: blocks without a key
are interchangeable, so only the order of cached evictable blocks matters.

Rules (shared by kvbench and vLLM, see docs/plugins.md):
    * only full blocks are keyed; a key is (salt, every token id up to the block's end),
      so equal keys mean equal whole prefixes under the same salt;
    * a hit is the longest run of leading full blocks whose keys are indexed, capped so
      the prompt's last token is computed again;
    * a block is keyed (cached) when its last token is written ("fill");
    * a freed block with reference count 0 is reused first when it holds no key, else it
      joins the tail of an LRU queue; a request's blocks are freed tail first;
    * an allocation takes an unkeyed free block first, else evicts the LRU head.
Declared differences (`AllocatorTraits`):
    * indexes_duplicates: a block filled with a key already indexed under another block is
      indexed as well (vLLM) or left unkeyed (kvbench); an unkeyed duplicate is reused
      before any cached block, which changes what is evicted next;
    * empty_salt_is_no_salt: salt "" keys blocks as no salt at all (vLLM) or as its own
      tenant (kvbench).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvbench.suites.peers.base import AllocatorTraits

Key = tuple[object, tuple[int, ...]]


@dataclass
class _Block:
    ref: int = 0
    key: Key | None = None  # set only while the block is indexed


@dataclass
class _Request:
    salt: object
    tokens: list[int]
    blocks: list[_Block] = field(default_factory=list)


class Refused(Exception):
    """The model refuses an operation (the peer must raise CapacityError)."""


class AllocatorModel:
    """The allocator rules above over `num_blocks` usable blocks of `block_size` tokens."""

    def __init__(self, num_blocks: int, block_size: int, traits: AllocatorTraits) -> None:
        self.bs = block_size
        self.traits = traits
        self.unkeyed_free = num_blocks  # interchangeable free blocks without a key
        self.lru: list[_Block] = []  # evictable keyed blocks, evicted from the front
        self.index: dict[Key, list[_Block]] = {}  # key -> indexed blocks, oldest first
        self.requests: dict[Hashable, _Request] = {}

    # ------------------------------------------------------------------ counts
    @property
    def free(self) -> int:
        return self.unkeyed_free + len(self.lru)

    @property
    def cached(self) -> int:
        return sum(len(v) for v in self.index.values())

    # ------------------------------------------------------------------ helpers
    def _salt(self, salt: object) -> object:
        return None if salt == "" and self.traits.empty_salt_is_no_salt else salt

    def _key(self, req: _Request, i: int) -> Key:
        return (req.salt, tuple(req.tokens[: (i + 1) * self.bs]))

    def _allocate(self) -> _Block:
        if self.unkeyed_free:
            self.unkeyed_free -= 1
            return _Block(ref=1)
        block = self.lru.pop(0)
        assert block.key is not None  # only indexed (keyed) blocks are in the LRU
        copies = self.index[block.key]
        copies.remove(block)
        if not copies:
            del self.index[block.key]
        return _Block(ref=1)

    def _fill(self, req: _Request, start: int) -> None:
        """Key the request's blocks from `start` that its tokens now fill."""
        for i in range(start, len(req.tokens) // self.bs):
            block = req.blocks[i]
            if block.key is not None:
                continue
            key = self._key(req, i)
            if key in self.index and not self.traits.indexes_duplicates:
                continue  # the duplicate stays unkeyed
            block.key = key
            self.index.setdefault(key, []).append(block)

    # ------------------------------------------------------------------ operations
    def admit(self, rid: Hashable, prompt: Sequence[int], salt: object = None) -> int:
        req = _Request(self._salt(salt), list(prompt))
        cap = (len(prompt) - 1) // self.bs
        hits: list[_Block] = []
        for i in range(cap):
            copies = self.index.get(self._key(req, i))
            if not copies:
                break
            hits.append(copies[0])
        need = -(-len(prompt) // self.bs)
        cost = need - len(hits) + sum(1 for b in hits if b.ref == 0)
        if cost > self.free:
            raise Refused(f"admit {rid!r}: needs {cost}, {self.free} free")
        for b in hits:
            if b.ref == 0:
                self.lru.remove(b)
            b.ref += 1
        req.blocks = hits + [self._allocate() for _ in range(need - len(hits))]
        self._fill(req, len(hits))
        self.requests[rid] = req
        return len(hits) * self.bs

    def append(self, rid: Hashable, tokens: Sequence[int]) -> None:
        req = self.requests[rid]
        need = -(-(len(req.tokens) + len(tokens)) // self.bs) - len(req.blocks)
        if need > self.free:
            raise Refused(f"append {rid!r}: needs {need}, {self.free} free")
        start = len(req.tokens) // self.bs
        req.blocks += [self._allocate() for _ in range(need)]
        req.tokens += list(tokens)
        self._fill(req, start)

    def free_request(self, rid: Hashable) -> None:
        req = self.requests.pop(rid)
        for b in reversed(req.blocks):
            b.ref -= 1
            if b.ref == 0:
                if b.key is None:
                    self.unkeyed_free += 1
                else:
                    self.lru.append(b)
