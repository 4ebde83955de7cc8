"""Prefix cache: content keys of full blocks and the index from key to physical block.

Key of a full block (see `block_key`): sha256 over a canonical byte encoding of
(parent block's key or "root", the block's token ids, the extra keys). The extra keys are
(isolation salt, adapter id) and go into every block's key, so requests with different salts
or adapters never share a block. Because each key chains its parent's, equal keys mean equal
whole prefixes, not just equal blocks.

A hash is only a claim: every hit is verified against the entry's stored parent key, token
ids and extra keys, so a collision (possible with an injected weak `key_fn`) is a miss,
never wrong KV.

Only full blocks are ever inserted, and a full block is never written again, so an entry
stays valid for as long as its block is not reallocated (the block pool drops the entry
when it evicts the block).
"""

from __future__ import annotations

import struct
from collections import deque
from collections.abc import Callable, Iterable, KeysView, Sequence
from dataclasses import dataclass
from hashlib import sha256
from itertools import repeat
from operator import itemgetter
from typing import NamedTuple

#: Extra keys of a block: (isolation salt, adapter id); None means "none".
ExtraKeys = tuple[str | None, ...]
KeyFn = Callable[[bytes | None, Sequence[int], ExtraKeys], bytes]
#: A block's key in the index: a `key_fn` key, or an interned identity that stands for
#: one in a replay keyed by identities (`paged.block_identity`).
BlockKey = bytes | int


def parent_field(parent: BlockKey | None) -> bytes | None:
    """The parent a key function hashes for a block after `parent`: the key itself, or
    an identity's 8 bytes LE (never 32 bytes long, so never read as a sha256 key)."""
    return parent.to_bytes(8, "little") if isinstance(parent, int) else parent


_DOMAIN = b"kvbench.block.v1\x00"


def block_key(parent: bytes | None, tokens: Sequence[int], extra: ExtraKeys) -> bytes:
    """The sha256 key of a full block (32 bytes).

    Canonical encoding: a domain tag; parent as 0x00 (root) or 0x01 + its length (u32 LE)
    + its bytes; the token count (u32 LE) and each token id as int64 LE; the number of
    extra keys (u32 LE) and each as 0x00 (None) or 0x01 + UTF-8 length (u32 LE) + bytes.
    """
    if parent is None:  # `_head`, inline: this runs once per full block
        head = _ROOT
    elif len(parent) == 32:
        head = _PARENT32 + parent
    else:
        head = _head(parent)
    tail = _EXTRA_BYTES.get(extra) or _extra_bytes(extra)
    return sha256(head + token_bytes(tokens) + tail).digest()


def token_bytes(tokens: Sequence[int]) -> bytes:
    """A block's ids as `block_key` encodes them: the count (u32 LE), then each id as
    int64 LE. Index entries keep their ids in this form (4 + 8 bytes an id: 132 bytes
    for a block of 16, where a tuple of int objects took ~700), and a hit is verified
    by comparing it."""
    n = len(tokens)
    packer = _TOKEN_STRUCTS.get(n) or _token_struct(n)
    return packer.pack(n, *tokens)


def chain_keys(
    tokens: Sequence[int], block_size: int, extra: ExtraKeys, parent: bytes | None = None
) -> list[bytes]:
    """The `block_key` chain of the len(tokens) // block_size full blocks of `tokens`
    (the first block's parent `parent`): the same keys as calling `block_key` block by
    block, with the ids packed once for the whole prompt (a capacity sweep keys 10^7
    blocks)."""
    return packed_chain(tokens, block_size, extra, parent)[0]


def packed_chain(
    tokens: Sequence[int], block_size: int, extra: ExtraKeys, parent: bytes | None = None
) -> tuple[list[bytes], list[bytes]]:
    """(`chain_keys`, each full block's `token_bytes`): the keys and the ids in the form
    an index entry keeps them, both from one packing of the prompt."""
    n = len(tokens) // block_size
    if n == 0:
        return [], []
    packed = struct.pack(f"<{n * block_size}q", *tokens[: n * block_size])
    return chain_of_packed(packed, block_size, extra, parent)


def chain_of_packed(
    packed: bytes, block_size: int, extra: ExtraKeys, parent: bytes | None = None
) -> tuple[list[bytes], list[bytes]]:
    """`packed_chain` of ids already packed as int64 LE (len(packed) // (8 * block_size)
    full blocks): each block's `token_bytes` is a slice, each key one sha256 of the
    `block_key` encoding (the parent field inline: a chain's parents are 32-byte keys)."""
    step = 8 * block_size
    count = _U32.pack(block_size)
    starts = range(0, len(packed) - step + 1, step)
    slices = map(slice, starts, range(step, len(packed) + 1, step))
    chunks = list(map(count.__add__, map(packed.__getitem__, slices)))
    if not chunks:
        return [], []
    tail = _EXTRA_BYTES.get(extra) or _extra_bytes(extra)
    key = sha256(_head(parent) + chunks[0] + tail).digest()
    keys = [key]
    append = keys.append
    for chunk in chunks[1:]:
        key = sha256(_PARENT32 + key + chunk + tail).digest()
        append(key)
    return keys, chunks


def _head(parent: bytes | None) -> bytes:
    """The encoding's domain tag and parent field (see `block_key`)."""
    if parent is None:
        return _ROOT
    if len(parent) == 32:
        return _PARENT32 + parent
    return _DOMAIN + b"\x01" + _U32.pack(len(parent)) + parent


_U32 = struct.Struct("<I")
#: Encoding prefixes: the domain tag then the root marker, or a 32-byte parent's header.
_ROOT = _DOMAIN + b"\x00"
_PARENT32 = _DOMAIN + b"\x01" + _U32.pack(32)
#: Memoized encodings (plain dict lookups: this runs once per full block).
_TOKEN_STRUCTS: dict[int, struct.Struct] = {}
_EXTRA_BYTES: dict[ExtraKeys, bytes] = {}


def _token_struct(n: int) -> struct.Struct:
    packer = struct.Struct(f"<I{n}q")
    if len(_TOKEN_STRUCTS) < 256:
        _TOKEN_STRUCTS[n] = packer
    return packer


def _extra_bytes(extra: ExtraKeys) -> bytes:
    out = [_U32.pack(len(extra))]
    for item in extra:
        if item is None:
            out.append(b"\x00")
        else:
            raw = item.encode("utf-8")
            out.append(b"\x01" + _U32.pack(len(raw)) + raw)
    encoded = b"".join(out)
    if len(_EXTRA_BYTES) < 4096:
        _EXTRA_BYTES[extra] = encoded
    return encoded


#: Token ids `PrefixCache.match`'s key memo holds at most (over all its entries; 8 bytes
#: of tuple per id, the int objects are the prompts'): 2 MiB of ids at any block size.
_KEY_MEMO_IDS = 1 << 18


class _Entry(NamedTuple):
    """What an index entry verifies a hit against (a tuple: one is made per full block);
    the block's ids as `token_bytes` (`tokens` unpacks them)."""

    key: BlockKey
    parent: BlockKey | None
    packed: bytes
    extra: ExtraKeys

    @property
    def tokens(self) -> tuple[int, ...]:
        """The block's ids (unpacked from `packed`)."""
        n = _U32.unpack_from(self.packed)[0]
        return struct.unpack_from(f"<{n}q", self.packed, 4)


#: Builds an `_Entry` from one tuple without the named tuple's Python-level __new__.
_new_entry = tuple.__new__
#: Runs an iterator to its end at C speed (`drain(map(d.__delitem__, keys))`): the
#: index's and the block pool's bulk updates.
drain: Callable[[Iterable[object]], None] = deque[object](maxlen=0).extend
#: An entry's key (`_Entry.key` at C speed).
_first = itemgetter(0)


@dataclass(frozen=True)
class PrefixCacheStats:
    """Prefix-cache counters since construction (successful admissions only).

    lookups: admissions that looked up their prompt; queried_tokens: prompt tokens of
    those admissions; hit_blocks / hit_tokens: blocks and tokens served from the cache;
    hit_rate = hit_tokens / queried_tokens; evictions: cached blocks reallocated;
    cached_blocks: entries in the index now (in use or evictable);
    evictable_blocks: cached blocks at reference count 0.
    """

    lookups: int
    queried_tokens: int
    hit_blocks: int
    hit_tokens: int
    evictions: int
    cached_blocks: int
    evictable_blocks: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


class PrefixCache:
    """The key -> block index with verified lookup. Knows nothing of reference counts;
    the block pool owns block states and calls `drop` when it evicts a cached block.

    Invariant: `_by_key` and `_by_block` are inverse bijections (checked by `check`).

    `index_duplicates=True` indexes a block that fills with content another indexed
    block already holds as well, as vLLM's BlockHashToBlockMap does (`_dups[key]`, in
    insertion order): a lookup serves the oldest surviving block of the key; a duplicate
    counts as cached, so it is freed to the LRU tail and evicted (`drop`) like any cached
    block, and when the served block is evicted the next duplicate serves the key. The
    default leaves the duplicate unindexed (a fresh block, reused first when freed).
    """

    def __init__(self, key_fn: KeyFn = block_key, *, index_duplicates: bool = False) -> None:
        self.key_fn = key_fn
        self._by_key: dict[BlockKey, int] = {}
        self._by_block: dict[int, _Entry] = {}
        self.index_duplicates = index_duplicates
        #: later blocks of a key already served by `_by_key` (index_duplicates only)
        self._dups: dict[BlockKey, list[int]] = {}
        self.lookups = 0
        self.queried_tokens = 0
        self.hit_blocks = 0
        self.hit_tokens = 0
        self.evictions = 0
        #: (parent key, ids, key) of the block the last `match` stopped at (its key was
        #: computed, it was not cached), or None; lets the admission that follows key that
        #: block once, not again when it fills. Not state: snapshots leave it out.
        self.miss: tuple[bytes | None, Sequence[int], bytes] | None = None
        #: `match`'s memo of (block_key, token_bytes) by exact content (parent, ids,
        #: extra); cleared when it holds _KEY_MEMO_IDS token ids. Not state: snapshots
        #: leave it out.
        self._key_memo: dict[
            tuple[bytes | None, tuple[int, ...], ExtraKeys], tuple[bytes, bytes]
        ] = {}

    def __len__(self) -> int:
        return len(self._by_block)

    def is_cached(self, block: int) -> bool:
        return block in self._by_block

    def indexed_blocks(self) -> KeysView[int]:
        """A live view of the indexed physical blocks (O(1) membership)."""
        return self._by_block.keys()

    def key_of(self, block: int) -> BlockKey | None:
        entry = self._by_block.get(block)
        return entry.key if entry else None

    def get(
        self, key: bytes, parent: bytes | None, tokens: Sequence[int], extra: ExtraKeys
    ) -> int | None:
        """The block cached under `key` if its stored content matches exactly, else None."""
        block = self._by_key.get(key)
        if block is None:
            return None
        entry = self._by_block[block]
        if entry.parent != parent or entry.extra != extra or entry.packed != token_bytes(tokens):
            return None  # a hash collision: never serve another prefix's KV
        return block

    def match(
        self, tokens: Sequence[int], extra: ExtraKeys, block_size: int, max_blocks: int
    ) -> tuple[list[BlockKey], list[int]]:
        """Walk the chain of the leading full blocks of `tokens`; return the keys and
        physical blocks of the longest cached prefix of at most `max_blocks` blocks."""
        keys: list[BlockKey] = []
        blocks: list[int] = []
        parent: bytes | None = None
        key_fn, by_key, by_block = self.key_fn, self._by_key, self._by_block
        memo = self._key_memo if key_fn is block_key else None
        self.miss = None
        tail = _EXTRA_BYTES.get(extra) or _extra_bytes(extra)
        for i in range(max_blocks):
            chunk = tokens[i * block_size : (i + 1) * block_size]
            if memo is not None and type(chunk) is tuple:
                # block_key is a pure function: a shared prefix is hashed once, not once
                # per admission (an exact-content memo, so the keys are block_key's)
                content = (parent, chunk, extra)
                found = memo.get(content)
                if found is None:
                    packed = token_bytes(chunk)
                    head = _ROOT if parent is None else _head(parent)
                    key = sha256(head + packed + tail).digest()  # block_key, inline
                    if len(memo) * block_size >= _KEY_MEMO_IDS:
                        memo.clear()
                    memo[content] = (key, packed)
                else:
                    key, packed = found
            elif key_fn is block_key:  # block_key, inline: the ids are packed once, for
                packed = token_bytes(chunk)  # the key and for verifying a hit
                key = sha256(_head(parent) + packed + tail).digest()
            else:
                key = key_fn(parent, chunk, extra)
                packed = b""  # packed below only if the key is indexed
            block = by_key.get(key)  # `get`, inline: this runs once per prompt block
            if block is not None:
                entry = by_block[block]
                if entry.parent != parent or entry.extra != extra:
                    block = None
                elif entry.packed != (packed or token_bytes(chunk)):
                    block = None  # a hash collision: never serve another prefix's KV
            if block is None:
                self.miss = (parent, chunk, key)
                break
            keys.append(key)
            blocks.append(block)
            parent = key
        return keys, blocks

    def match_keyed(
        self,
        keys: Sequence[BlockKey],
        chunks: Sequence[bytes],
        extra: ExtraKeys,
        max_blocks: int,
    ) -> tuple[list[BlockKey], list[int]]:
        """`match` with the chain's keys and blocks' `token_bytes` given
        (`paged.block_chain`): the same walk and the same verification of every hit,
        without hashing."""
        by_key, by_block = self._by_key, self._by_block
        blocks: list[int] = []
        parent: BlockKey | None = None
        self.miss = None
        for key, chunk in zip(keys[:max_blocks], chunks, strict=False):
            block = by_key.get(key)
            if block is None:
                break
            entry = by_block[block]
            if entry.parent != parent or entry.extra != extra or entry.packed != chunk:
                break  # a hash collision: never serve another prefix's KV
            blocks.append(block)
            parent = key
        return list(keys[: len(blocks)]), blocks

    def insert(
        self,
        block: int,
        key: bytes,
        parent: bytes | None,
        tokens: Sequence[int],
        extra: ExtraKeys,
    ) -> bool:
        """Index a full block under `key`; False (nothing changes) if the key is taken
        (another block already holds this prefix) or the block is already indexed."""
        if block in self._by_block:
            return False
        return self._insert_packed(block, key, parent, token_bytes(tokens), extra)

    def _insert_packed(
        self, block: int, key: BlockKey, parent: BlockKey | None, packed: bytes, extra: ExtraKeys
    ) -> bool:
        """`insert` of a block not yet indexed, its ids given as `token_bytes`."""
        by_key, by_block = self._by_key, self._by_block
        if key in by_key:
            if not self.index_duplicates:
                return False
            self._dups.setdefault(key, []).append(block)
            by_block[block] = _new_entry(_Entry, (key, parent, packed, extra))
            return True
        by_key[key] = block
        by_block[block] = _new_entry(_Entry, (key, parent, packed, extra))
        return True

    def insert_chain(
        self,
        blocks: Sequence[int],
        keys: Sequence[BlockKey],
        chunks: Sequence[bytes],
        parent: BlockKey | None,
        extra: ExtraKeys,
    ) -> None:
        """`insert` each (blocks[i], keys[i], chunks[i]) of a chain in order, chunks[i]
        the block's `token_bytes`, the parent of each the key before it (`parent` for
        the first): a replay's bulk indexing. Where no block and no key is indexed yet
        and all are distinct (a chain of fresh blocks, the common case) every insert
        takes a new key: the two dicts are updated at C speed, the same entries in the
        same order as one insert after another."""
        by_key, by_block = self._by_key, self._by_block
        n = len(blocks)
        if (
            n > 1
            and len(keys) == n == len(chunks)
            and by_block.keys().isdisjoint(blocks)
            and by_key.keys().isdisjoint(keys)
        ):
            fresh = dict(zip(keys, blocks, strict=True))
            if len(fresh) == n and len(set(blocks)) == n:
                parents = [parent, *keys[: n - 1]]
                by_key.update(fresh)
                by_block.update(
                    zip(
                        blocks,
                        map(_new_entry, repeat(_Entry), zip(keys, parents, chunks, repeat(extra))),
                        strict=True,
                    )
                )
                return
        if self.index_duplicates:
            for block, key, chunk in zip(blocks, keys, chunks, strict=True):
                if block not in by_block:
                    self._insert_packed(block, key, parent, chunk, extra)
                parent = key
            return
        for block, key, chunk in zip(blocks, keys, chunks, strict=True):
            if key not in by_key and block not in by_block:
                by_key[key] = block
                by_block[block] = _new_entry(_Entry, (key, parent, chunk, extra))
            parent = key

    def insert_block(
        self, block: int, key: BlockKey, parent: BlockKey | None, packed: bytes, extra: ExtraKeys
    ) -> None:
        """`insert_chain` of one block (a chain-keyed append's block boundary), its ids
        given as `token_bytes`: the same entries, without the chain's slices."""
        if self.index_duplicates:
            if block not in self._by_block:
                self._insert_packed(block, key, parent, packed, extra)
        elif key not in self._by_key and block not in self._by_block:
            self._by_key[key] = block
            self._by_block[block] = _new_entry(_Entry, (key, parent, packed, extra))

    def drop(self, block: int) -> None:
        """Forget a block (the pool is reallocating it)."""
        entry = self._by_block.pop(block)
        self._unkey(entry.key, block)
        self.evictions += 1

    def _unkey(self, key: BlockKey, block: int) -> None:
        """Take `block` out of the key index (its next duplicate then serves the key)."""
        dups = self._dups.get(key) if self._dups else None
        if dups is None:
            del self._by_key[key]
        elif self._by_key[key] == block:
            self._by_key[key] = dups.pop(0)
        else:
            dups.remove(block)
        if dups is not None and not dups:
            del self._dups[key]

    def drop_many(self, blocks: Sequence[int]) -> None:
        """`drop` each block in order (the pool is reallocating them). Where none of
        their keys has duplicates (always, without `index_duplicates`) each drop deletes
        its key: done at C speed, in bulk."""
        pop, by_key = self._by_block.pop, self._by_key
        keys = list(map(_first, map(pop, blocks)))
        if self._dups and not self._dups.keys().isdisjoint(keys):
            for block, key in zip(blocks, keys, strict=True):
                self._unkey(key, block)
        else:
            drain(map(by_key.__delitem__, keys))
        self.evictions += len(keys)

    def record_lookup(self, queried_tokens: int, hit_blocks: int, hit_tokens: int) -> None:
        self.lookups += 1
        self.queried_tokens += queried_tokens
        self.hit_blocks += hit_blocks
        self.hit_tokens += hit_tokens

    def snapshot(self) -> tuple[object, ...]:
        """Everything, as plain comparable values (for atomicity tests)."""
        return (
            dict(self._by_key),
            dict(self._by_block),
            {k: list(v) for k, v in self._dups.items()},
            self.lookups,
            self.queried_tokens,
            self.hit_blocks,
            self.hit_tokens,
            self.evictions,
        )

    def check(self) -> None:
        """Assert the index is a bijection and every entry's key matches its content."""
        assert len(self._by_key) + sum(map(len, self._dups.values())) == len(self._by_block)
        for key, blocks in self._dups.items():
            assert blocks and key in self._by_key, f"duplicates of an unserved key {key!r}"
            assert all(self._by_block[b].key == key for b in blocks), "a duplicate's key"
        for key, block in self._by_key.items():
            entry = self._by_block[block]
            assert entry.key == key, f"block {block} indexed under a key not its own"
            assert len(entry.packed) > 4, f"block {block} cached with no tokens"
