"""A prompt's prefix-cache key chain, computed once and handed to several caches.

The keys of a prompt's full blocks (`prefix_cache.block_key` chained from the root) depend
on the prompt's ids, the block size and the extra keys only: not on any cache's capacity,
eviction policy or contents. A capacity sweep replays the same prompts through many caches
(`paged.hitrate.replay_many`), so it computes each prompt's chain once and passes it to
`PagedKVCache.admit(..., chain=...)`: the cache then takes the keys and the blocks' packed
ids (`prefix_cache.token_bytes`) from the chain instead of hashing and packing again, and decides everything else
(lookups with their verification, allocation, eviction, indexing) exactly as without it.

A chain is bound to the very prompt object it was computed from (`prompt`): `admit` accepts
it only with that object (an identity check), that block size, those extra keys and that
key function, so it cannot describe another prompt.

`DescribedChains` computes the same chains for a whole trace, memoised by described block
(a prompt given by block ids, `workloads.trace.BlockTokenIds`, as imported production
traces are): a prefix many requests share is packed and hashed once, not once a request,
and every cache of a replay holds the same key and packed-id objects for it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kvbench.paged.prefix_cache import (
    BlockKey,
    ExtraKeys,
    KeyFn,
    block_key,
    chain_of_packed,
    packed_chain,
    token_bytes,
)
from kvbench.workloads.block_size import check_block_size
from kvbench.workloads.trace import BLOCK_ID_BASE, BlockTokenIds


@dataclass(frozen=True, eq=False)
class BlockChain:
    """The keys and packed ids of the full blocks of `prompt`, root first.

    keys[i] = key_fn(keys[i-1] or None, ids of block i, extra); chunks[i] = the ids of
    positions [i * block_size, (i + 1) * block_size) of `prompt` as `token_bytes` (the
    form an index entry keeps and verifies: 132 bytes a block of 16, no int objects);
    there are len(prompt) // block_size of each (a partial last block has no key)."""

    prompt: Sequence[int]
    block_size: int
    extra: ExtraKeys
    key_fn: KeyFn
    keys: tuple[BlockKey, ...]
    chunks: tuple[bytes, ...]

    def truncated(self, length: int, prompt: Sequence[int]) -> BlockChain:
        """The chain of `prompt`, the first `length` ids of this chain's prompt (a prefix
        shares its full blocks' keys: each key depends only on the blocks before it)."""
        if len(prompt) != length or not 0 < length <= len(self.prompt):
            raise ValueError(
                f"prompt of {len(prompt)} ids is not the first {length} of {len(self.prompt)}"
            )
        n = length // self.block_size
        return BlockChain(
            prompt, self.block_size, self.extra, self.key_fn, self.keys[:n], self.chunks[:n]
        )


def block_tuples(ids: Sequence[int], block_size: int) -> tuple[tuple[int, ...], ...]:
    """The ids of each whole block of `ids` as a tuple, in order (len(ids) // block_size
    of them; a partial last block is left out): built at C speed, one tuple per block."""
    return tuple(zip(*[iter(ids)] * block_size, strict=False))


def block_chain(
    prompt: Sequence[int],
    block_size: int,
    extra: ExtraKeys = (None, None),
    key_fn: KeyFn = block_key,
) -> BlockChain:
    """Compute the chain of `prompt`'s full blocks (see `BlockChain`)."""
    bs = check_block_size(block_size)
    n = len(prompt) // bs
    ids = prompt[: n * bs]
    flat = ids if isinstance(ids, tuple) else tuple(ids)
    if key_fn is block_key:
        keys, chunks = packed_chain(flat, bs, extra)
    else:
        keys, chunks = [], []
        parent: bytes | None = None
        for block in block_tuples(flat, bs):
            parent = key_fn(parent, block, extra)
            keys.append(parent)
            chunks.append(token_bytes(block))
    return BlockChain(prompt, bs, extra, key_fn, tuple(keys), tuple(chunks))


#: Memo key of a described block: (parent key, block id, tokens per block, extra keys).
_MemoKey = tuple[bytes | None, int, int, ExtraKeys]


class DescribedChains:
    """`packed_chain` of a trace's prompts, memoised by described block.

    A prompt given by block ids (`BlockTokenIds`: blocks of `bt` tokens, bt a multiple of
    the block size) has full blocks whose keys within one described block depend only on
    the key before it (the parent), its block id and the extra keys: so the keys and
    packed ids of a described block's bt // block_size blocks are computed once per
    (parent, block id, bt, extra) and reused by every later prompt with that prefix. The
    result is exactly `packed_chain` of the prompt's ids (tested); any other prompt, or a
    bt the block size does not divide, is packed and hashed as before.

    Memory: the memo holds the keys and packed ids of at most 2 * `limit` token ids (8
    bytes an id packed, plus a 32-byte key and ~100 bytes of objects a block): two
    generations; when the newer holds `limit` ids it becomes the older and the older is
    dropped, and a hit in the older moves to the newer (so a prefix in use stays). Only
    speed and object sharing depend on `limit`."""

    def __init__(self, block_size: int, limit: int = 1 << 22) -> None:
        self.block_size = check_block_size(block_size)
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1 (token ids), got {limit!r}")
        self.limit = limit
        self._new: dict[_MemoKey, tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}
        self._old: dict[_MemoKey, tuple[tuple[bytes, ...], tuple[bytes, ...]]] = {}
        self._held = 0  # token ids in `_new`
        #: positions 0 .. bt - 1 as int64, by bt (a described block's ids are a range)
        self._offsets: dict[int, np.ndarray] = {}
        #: described blocks found in the memo / computed
        self.hits = 0
        self.misses = 0

    def packed(
        self, prompt: Sequence[int], extra: ExtraKeys, tail: Sequence[int] = ()
    ) -> tuple[list[bytes], list[bytes]]:
        """(keys, packed ids) of the full blocks of `prompt` then `tail`: equal to
        `packed_chain((*prompt, *tail), block_size, extra)`."""
        bs = self.block_size
        described = prompt.described() if isinstance(prompt, BlockTokenIds) else None
        if described is None or described[1] % bs:
            keys, chunks = packed_chain((*prompt, *tail), bs, extra)
            return keys, chunks
        blocks, bt = described
        whole = len(prompt) // bt  # described blocks wholly in the prompt
        keys = []
        chunks = []
        parent: bytes | None = None
        for k in range(whole):
            memo: _MemoKey = (parent, blocks[k], bt, extra)
            got = self._new.get(memo)
            if got is None:
                got = self._old.pop(memo, None)
                if got is None:
                    self.misses += 1
                    ks, cs = chain_of_packed(self._ids(blocks[k], bt), bs, extra, parent)
                    got = (tuple(ks), tuple(cs))
                else:
                    self.hits += 1
                if self._held >= self.limit:
                    self._old, self._new, self._held = self._new, {}, 0
                self._new[memo] = got
                self._held += bt
            else:
                self.hits += 1
            keys += got[0]
            chunks += got[1]
            parent = got[0][-1]
        rest = prompt[whole * bt :]
        if len(rest) or len(tail):
            ks, cs = packed_chain((*rest, *tail), bs, extra, parent)
            keys += ks
            chunks += cs
        return keys, chunks

    def _ids(self, block: int, bt: int) -> bytes:
        """The ids of described block `block` of `bt` tokens (`BlockTokenIds`: BLOCK_ID_BASE
        + block * bt + position) packed as int64 LE, from a range at C speed."""
        offsets = self._offsets.get(bt)
        if offsets is None:
            offsets = self._offsets[bt] = np.arange(bt, dtype="<i8")
        return (offsets + (BLOCK_ID_BASE + block * bt)).astype("<i8", copy=False).tobytes()

    def chain(self, prompt: Sequence[int], extra: ExtraKeys = (None, None)) -> BlockChain:
        """`block_chain(prompt, block_size, extra)`, from the memo."""
        n = len(prompt) // self.block_size
        keys, chunks = self.packed(prompt, extra)
        return BlockChain(
            prompt, self.block_size, extra, block_key, tuple(keys[:n]), tuple(chunks[:n])
        )
