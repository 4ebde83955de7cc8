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
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvbench.paged.prefix_cache import ExtraKeys, KeyFn, block_key, packed_chain, token_bytes
from kvbench.workloads.block_size import check_block_size


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
    keys: tuple[bytes, ...]
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
