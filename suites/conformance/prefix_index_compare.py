"""Two prefix indexes that hold the same blocks under keys in one-to-one correspondence:
what a replay keyed by identities (`paged.block_identity`, `v1_keys.KeyChains.plan`)
must leave beside the same replay keyed by sha256 chains."""

from __future__ import annotations

from kvbench.paged.cache import PagedKVCache


def same_index_up_to_keys(a: PagedKVCache, b: PagedKVCache) -> int:
    """Assert both indexes hold the same blocks, each with the same extra keys, under keys
    (and parents) that map one to one, the key index and its duplicates alike; return
    how many of `a`'s blocks are held under identities (int keys)."""
    assert a.prefix is not None and b.prefix is not None
    ea, eb = a.prefix._by_block, b.prefix._by_block
    assert ea.keys() == eb.keys(), "the indexes hold different blocks"
    forward: dict[object, object] = {None: None}
    for block in ea:
        for x, y in ((ea[block].key, eb[block].key), (ea[block].parent, eb[block].parent)):
            assert forward.setdefault(x, y) == y, f"block {block}: key {x!r} maps to two keys"
        assert ea[block].extra == eb[block].extra, f"block {block}: extra keys"
    assert len(set(forward.values())) == len(forward), "two keys map to one"
    assert {forward[k]: v for k, v in a.prefix._by_key.items()} == b.prefix._by_key
    assert {forward[k]: v for k, v in a.prefix._dups.items()} == b.prefix._dups
    return sum(type(ea[block].key) is int for block in ea)
