"""BlockPool and PrefixCache: exact reuse order, eviction order, refcounts, verified hits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.prefix_cache import PrefixCache, block_key, token_bytes
from kvbench.workloads.errors import CapacityError, ConfigError


def _cache(pool: BlockPool, block: int, tokens: list[int], parent: bytes | None = None) -> bytes:
    assert pool.prefix is not None
    key = block_key(parent, tokens, (None, None))
    assert pool.prefix.insert(block, key, parent, tokens, (None, None))
    pool.set_fill(block, pool.block_size)
    return key


def test_fresh_pool_hands_out_blocks_in_order_and_conserves_count() -> None:
    pool = BlockPool(4, 2)
    assert [pool.allocate() for _ in range(4)] == [0, 1, 2, 3]
    assert pool.num_free == 0 and pool.num_used == 4
    with pytest.raises(CapacityError, match="all 4 blocks"):
        pool.allocate()
    pool.check()


def test_never_cached_blocks_are_reused_last_freed_first() -> None:
    pool = BlockPool(6, 4)
    blocks = pool.allocate_many(5)
    pool.decref(blocks[1])
    pool.decref(blocks[3])
    assert pool.allocate() == blocks[3]
    assert pool.allocate() == blocks[1]
    assert pool.allocate() == 5
    pool.check()


def test_release_walks_the_table_tail_first() -> None:
    pool = BlockPool(4, 4)
    table = pool.allocate_many(3)  # [0, 1, 2]
    pool.release(table)
    # tail pushed first, head last: the head is on top of the stack and comes back first
    assert pool.free_stack()[-3:] == [2, 1, 0]
    assert pool.allocate_many(3) == [0, 1, 2]
    pool.check()


def test_cached_blocks_are_evicted_lru_with_a_requests_tail_first() -> None:
    pool = BlockPool(5, 2, PrefixCache())
    table = pool.allocate_many(3)
    parent = None
    for b in table:
        parent = _cache(pool, b, [b, b], parent)
    other = pool.allocate()
    _cache(pool, other, [9, 9])
    pool.release(table)  # tail first: 2, 1, 0 enter the LRU queue in that order
    pool.decref(other)
    assert pool.lru_order() == [2, 1, 0, other]
    assert pool.num_free == 5 and pool.num_evictable == 4
    # the free stack goes first, then eviction in LRU order
    assert pool.free_stack() == [4]
    assert pool.allocate() == 4
    evicted = [pool.allocate() for _ in range(4)]
    assert evicted == [2, 1, 0, other]
    assert pool.prefix is not None and pool.prefix.evictions == 4 and len(pool.prefix) == 0
    pool.check()


def test_a_hit_revives_an_evictable_block_and_only_refcount_zero_is_evictable() -> None:
    pool = BlockPool(3, 2, PrefixCache())
    a = pool.allocate()
    _cache(pool, a, [1, 2])
    pool.incref(a)  # shared by two tables
    pool.decref(a)
    assert not pool.is_evictable(a) and pool.ref[a] == 1
    pool.decref(a)
    assert pool.is_evictable(a)
    pool.incref(a)  # a prefix hit brings it back, with its KV slots live again
    assert pool.ref[a] == 1 and not pool.is_evictable(a) and pool.live_slots == 2
    # with a in use, the other two blocks are all an allocation can take
    pool.allocate_many(2)
    with pytest.raises(CapacityError):
        pool.allocate()
    pool.check()


def test_allocate_many_is_all_or_nothing() -> None:
    pool = BlockPool(3, 2)
    pool.allocate()
    before = pool.snapshot()
    with pytest.raises(CapacityError, match="need 3 blocks, only 2"):
        pool.allocate_many(3)
    assert pool.snapshot() == before


@pytest.mark.parametrize("bad", [0, -1, 1.5, True])
def test_bad_sizes_are_rejected(bad: object) -> None:
    with pytest.raises(ConfigError, match="num_blocks"):
        BlockPool(bad, 16)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="block_size"):
        BlockPool(4, bad)  # type: ignore[arg-type]


def test_sharing_a_free_block_or_dropping_a_missing_reference_is_an_error() -> None:
    pool = BlockPool(2, 2)
    with pytest.raises(ConfigError, match="block 0 is free"):
        pool.incref(0)
    with pytest.raises(ConfigError, match="no reference"):
        pool.decref(1)
    pool.check()


def test_check_catches_a_leaked_block() -> None:
    pool = BlockPool(2, 2)
    pool.allocate()
    pool.ref[0] = 0  # corrupt: a block with no references on neither list
    with pytest.raises(AssertionError, match="leaked"):
        pool.check()


# ---------------------------------------------------------------------- keys and lookups


def test_block_key_is_sha256_over_a_canonical_encoding() -> None:
    k = block_key(None, [1, 2, 3], ("salt", None))
    assert len(k) == 32
    assert k == block_key(None, (1, 2, 3), ("salt", None))
    assert k != block_key(None, [1, 2, 3], (None, None))
    assert k != block_key(None, [1, 2, 3], ("salt", "adapter"))
    assert k != block_key(b"\x00" * 32, [1, 2, 3], ("salt", None))
    # no ambiguity between a token boundary and the extra keys, or between None and ""
    assert block_key(None, [1], ("",)) != block_key(None, [1], (None,))
    assert block_key(None, [1, 2], ()) != block_key(None, [1], ())
    # chaining: the same block under another parent has another key
    p1, p2 = block_key(None, [5], ()), block_key(None, [6], ())
    assert block_key(p1, [7], ()) != block_key(p2, [7], ())


def test_match_walks_the_chain_and_stops_at_the_first_miss() -> None:
    cache = PrefixCache()
    extra = (None, None)
    tokens = [1, 2, 3, 4, 5, 6]
    parent = None
    for i, block in enumerate([7, 8]):
        chunk = tokens[2 * i : 2 * i + 2]
        key = block_key(parent, chunk, extra)
        cache.insert(block, key, parent, chunk, extra)
        parent = key
    keys, blocks = cache.match(tokens, extra, 2, 3)
    assert blocks == [7, 8] and len(keys) == 2
    assert cache.match(tokens, extra, 2, 1)[1] == [7]
    assert cache.match([1, 2, 9, 9, 5, 6], extra, 2, 3)[1] == [7]
    assert cache.match(tokens, ("other salt", None), 2, 3)[1] == []


def test_a_hash_collision_is_a_miss_not_wrong_kv() -> None:
    cache = PrefixCache(key_fn=lambda parent, tokens, extra: b"same")
    extra = (None, None)
    assert cache.insert(3, b"same", None, [1, 2], extra)
    assert cache.match([1, 2, 0], extra, 2, 1)[1] == [3]
    assert cache.match([4, 5, 0], extra, 2, 1)[1] == []  # same key, other tokens
    assert cache.match([1, 2, 0], ("s", None), 2, 1)[1] == []  # same key, other salt
    assert not cache.insert(4, b"same", None, [4, 5], extra)  # the key is taken


@pytest.mark.parametrize("index_duplicates", [False, True])
def test_a_duplicate_full_block_is_indexed_only_under_vllms_rule(index_duplicates: bool) -> None:
    """Two blocks fill with the same content: kvbench's default leaves the second
    unindexed (a fresh block, reused first when freed); `index_duplicates` indexes both
    as vLLM's BlockHashToBlockMap does: the first serves the key, the second is cached
    (freed to the LRU tail) and serves the key once the first is evicted."""
    pool = BlockPool(4, 2, PrefixCache(index_duplicates=index_duplicates))
    assert pool.prefix is not None
    a, b = pool.allocate(), pool.allocate()
    key = _cache(pool, a, [7, 7])
    dup = pool.prefix.insert(b, key, None, [7, 7], (None, None))
    pool.set_fill(b, 2)
    assert dup == index_duplicates
    assert pool.prefix.is_cached(b) == index_duplicates
    assert pool.prefix.get(key, None, [7, 7], (None, None)) == a
    pool.check()
    pool.release([a])
    pool.release([b])
    if index_duplicates:  # both evictable, LRU: a then b
        assert pool.lru_order() == [a, b]
        pool.allocate_many(3)  # the two never-used blocks, then a is evicted
        assert pool.prefix.get(key, None, [7, 7], (None, None)) == b
    else:  # b went back to the free stack, reused before any cached block
        assert pool.free_stack()[-1] == b
        assert pool.allocate() == b
    pool.check()


def test_index_duplicates_must_be_a_bool() -> None:
    from kvbench.paged.cache import PagedKVCache
    from kvbench.workloads.errors import ConfigError
    from kvbench.workloads.geometry import KVGeometry

    with pytest.raises(ConfigError, match="index_duplicates must be a bool, got 'yes'"):
        PagedKVCache(KVGeometry(1, 1, 4, "float32"), 8, 4, index_duplicates="yes")  # type: ignore[arg-type]


@settings(max_examples=60, deadline=None)
@given(st.data(), st.booleans(), st.sampled_from(["lru", "lfu", "slru"]))
def test_bulk_bookkeeping_equals_one_block_at_a_time(
    data: st.DataObject, index_duplicates: bool, eviction: str
) -> None:
    """The replay's bulk paths (`insert_chain`, `allocate_many` with `drop_many`,
    `release`) leave a pool and its index exactly as the one-block-at-a-time operations
    they stand for (`insert`, `allocate`, `decref` tail first): keys drawn from a small
    set so chains collide with indexed keys and with themselves, tables sharing blocks."""
    n = data.draw(st.integers(4, 12), label="blocks")
    pools = [
        BlockPool(n, 2, PrefixCache(index_duplicates=index_duplicates), eviction) for _ in "ab"
    ]
    held: list[list[int]] = []
    extra = (None, None)
    for _ in range(data.draw(st.integers(1, 12), label="ops")):
        op = data.draw(st.sampled_from(["allocate", "share", "release"]))
        if op == "allocate" and pools[0].num_free:
            k = data.draw(st.integers(1, pools[0].num_free))
            bulk = pools[0].allocate_many(k)
            assert bulk == [pools[1].allocate() for _ in range(k)]
            keys = [bytes([data.draw(st.integers(0, 5))]) for _ in bulk]
            ids = [[key[0], key[0]] for key in keys]
            parent = data.draw(st.sampled_from([None, b"\x00"]))
            pools[0].prefix.insert_chain(bulk, keys, [token_bytes(t) for t in ids], parent, extra)  # type: ignore[union-attr]
            for block, key, tokens in zip(bulk, keys, ids, strict=True):
                pools[1].prefix.insert(block, key, parent, tokens, extra)  # type: ignore[union-attr]
                parent = key
            for pool in pools:
                pool.fill_span(bulk, 0, 2 * len(bulk))
            held.append(bulk)
        elif op == "share" and held:
            table = held[data.draw(st.integers(0, len(held) - 1))]
            for pool in pools:
                pool.incref_many(table)
            held.append(list(table))
        elif op == "release" and held:
            table = held.pop(data.draw(st.integers(0, len(held) - 1)))
            pools[0].release(table)
            for block in reversed(table):
                pools[1].decref(block)
        assert pools[0].snapshot() == pools[1].snapshot()
        assert pools[0].prefix.snapshot() == pools[1].prefix.snapshot()  # type: ignore[union-attr]
        pools[0].check()
