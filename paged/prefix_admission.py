"""The prefix-cache side of a `PagedKVCache`'s admission and growth: what a prompt finds
cached, what its admission costs, and the indexing of a request's newly full blocks.

A part of the cache (`paged.cache`), given the block pool and the prefix cache (None when
prefix caching is off) at construction; it reads the pool and writes only the prefix
index and the request's keys. Admission (`match`, `check_chain`, `cost`) changes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.paged.block_chain import BlockChain
from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState
from kvbench.paged.prefix_cache import (
    BlockKey,
    ExtraKeys,
    PrefixCache,
    block_key,
    packed_chain,
    parent_field,
    token_bytes,
)
from kvbench.workloads.errors import ConfigError


class PrefixAdmission:
    """Prefix matching, admission cost and full-block indexing for one cache."""

    def __init__(self, pool: BlockPool, prefix: PrefixCache | None, block_size: int) -> None:
        self.pool = pool
        self.prefix = prefix
        self.block_size = block_size

    @staticmethod
    def extra_keys(salt: str | None, adapter_id: str | None) -> ExtraKeys:
        """The extra keys of an admission's block keys: (salt, adapter_id), each a
        string or None (ConfigError naming the bad one otherwise)."""
        if salt is not None or adapter_id is not None:
            for name, value in (("salt", salt), ("adapter_id", adapter_id)):
                if value is not None and not isinstance(value, str):
                    raise ConfigError(f"{name} must be a string or None, got {value!r}")
        return (salt, adapter_id)

    def match(
        self, prompt: Sequence[int], extra: ExtraKeys, chain: BlockChain | None = None
    ) -> tuple[list[BlockKey], list[int]]:
        """(keys, cached blocks) of the longest verified chain of the prompt's full
        blocks, capped so its last token is computed again ([] without prefix caching)."""
        if self.prefix is None:
            return [], []
        max_blocks = (len(prompt) - 1) // self.block_size  # the last token is recomputed
        if chain is not None:
            return self.prefix.match_keyed(chain.keys, chain.chunks, extra, max_blocks)
        return self.prefix.match(prompt, extra, self.block_size, max_blocks)

    def check_chain(
        self, chain: BlockChain, prompt: Sequence[int], extra: ExtraKeys
    ) -> BlockChain | None:
        """The chain if it describes exactly this prompt for this cache (ConfigError
        otherwise); None where prefix caching is off (nothing is keyed)."""
        if not isinstance(chain, BlockChain):
            raise ConfigError(f"chain must be a BlockChain, got {type(chain).__name__}")
        if chain.prompt is not prompt:
            raise ConfigError("chain was computed from another prompt object than this one")
        if chain.block_size != self.block_size or chain.extra != extra:
            raise ConfigError(
                f"chain is for block size {chain.block_size} and extra keys {chain.extra!r}, "
                f"this admission has {self.block_size} and {extra!r}"
            )
        if self.prefix is None:
            return None
        if chain.key_fn is not self.prefix.key_fn:
            raise ConfigError("chain was computed with another key function than the cache's")
        return chain

    def cost(self, prompt_len: int, hits: Sequence[int]) -> int:
        """Blocks an admission takes from the free count: fresh ones plus revived hits."""
        fresh = -(-prompt_len // self.block_size) - len(hits)
        ref = self.pool.ref
        return fresh + [ref[b] for b in hits].count(0)  # + revived hits

    def register_full_blocks(self, req: RequestState) -> None:
        """Index every newly full block of the request whose token ids are all known.

        Blocks of the prompt's head (ids not copied, `RequestState.head`) are keyed in
        bulk: from the precomputed chain where there is one, else hashed from the prompt
        with `packed_chain` (the same keys as `block_key` block by block; a cache with
        another key function hashes them one by one). Later blocks are hashed one by
        one from their ids (`RequestState.known_ids`)."""
        if self.prefix is None or not req.hashable or req.tokens is None:
            return
        prefix, keys, extra, bs = self.prefix, req.keys, req.extra, self.block_size
        i = len(keys)
        full = req.seq_len // bs
        if i >= full:
            return
        parent = keys[-1] if keys else None
        chain = req.chain
        if chain is not None:  # the prompt's full blocks: keys and tuples precomputed
            stop = min(len(chain.keys), full)
            if i < stop:
                new = chain.keys[i:stop]
                prefix.insert_chain(req.blocks[i:stop], new, chain.chunks[i:stop], parent, extra)
                keys.extend(new)
                parent, i = new[-1], stop
        stop = min(req.head // bs, full)  # blocks wholly in the head
        if i < stop and prefix.key_fn is block_key:
            ids = req.prompt[i * bs : stop * bs]
            miss, req.miss = req.miss, None
            if miss is not None and miss[0] == parent and tuple(miss[1]) == tuple(ids[:bs]):
                # block i as the admission's match keyed it: same parent, same ids
                rest, packed = packed_chain(ids[bs:], bs, extra, miss[2])
                hashed = [miss[2], *rest]
                packed.insert(0, token_bytes(ids[:bs]))
            else:
                hashed, packed = packed_chain(ids, bs, extra, parent_field(parent))
            prefix.insert_chain(req.blocks[i:stop], hashed, packed, parent, extra)
            keys.extend(hashed)
            parent, i = hashed[-1], stop
        key_fn, insert, known = prefix.key_fn, prefix.insert, req.known_ids
        miss, req.miss = req.miss, None
        while (i + 1) * bs <= req.seq_len:
            chunk = known(i * bs, (i + 1) * bs)
            if len(chunk) < bs or None in chunk:  # short: it reaches into the unknown tail
                req.hashable = False
                return
            if miss is not None and miss[0] == parent and tuple(miss[1]) == chunk:
                key = miss[2]  # as the admission's match keyed it: same parent, same ids
            else:
                key = key_fn(parent_field(parent), chunk, extra)  # type: ignore[arg-type]
            miss = None
            insert(req.blocks[i], key, parent, chunk, extra)  # type: ignore[arg-type]
            keys.append(key)
            parent = key
            i += 1
