"""Precomputed key chains (paged.block_chain) and the one-pass capacity sweep
(paged.hitrate.replay_many): the fast path decides exactly what the straightforward one
does, request by request and block by block.

Oracles: `replay` (one cache, keys hashed block by block by `block_key`), the independent
LRU model of block identities (`workloads.prefix_oracle`), and a cache fed the same calls
without a chain (compared snapshot for snapshot)."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged.block_chain import block_chain
from kvbench.paged.block_pool import BlockPool
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.hitrate import TINY, ReplayConfig, replay, replay_many
from kvbench.paged.prefix_cache import PrefixCache, block_key, chain_keys
from kvbench.workloads import prefix_oracle as po
from kvbench.workloads.errors import CapacityError, ConfigError
from kvbench.workloads.sharing import generate
from kvbench.workloads.shipped import shipped_trace
from kvbench.workloads.trace import Trace


@functools.lru_cache(maxsize=1)
def _mooncake_slice() -> Trace:
    return Trace(shipped_trace("mooncake-conversation").requests[:150])


@pytest.mark.parametrize("block_size", [512, 16])
def test_one_pass_equals_one_replay_per_cache_on_the_mooncake_trace(block_size: int) -> None:
    trace = _mooncake_slice()
    acc = po.block_accesses(trace, block_size)
    configs = [
        ReplayConfig(cap, policy)
        for cap in (10_000, 200_000, 1_000_000, 3_000_000)
        for policy in ("lru", "lfu")
    ]
    limit = acc.footprint_blocks()
    fast = replay_many(trace, configs, block_size, pool_limit=limit)
    slow = [
        replay(trace, c.capacity_tokens, block_size, c.policy, pool_limit=limit) for c in configs
    ]
    assert fast == slow
    for c, r in zip(configs, fast, strict=True):
        if c.policy == "lru":
            assert r.hit_tokens == po.lru_model_hit_tokens(acc, c.capacity_tokens)
    assert len({r.hit_tokens for r in fast}) >= 2  # the capacities differ in what they hit


@settings(max_examples=10, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    sharing=st.sampled_from(["system-prompt", "multi-turn"]),
    block_size=st.sampled_from([1, 4, 16]),
    capacities=st.lists(st.integers(16, 8_000), min_size=1, max_size=4),
)
def test_one_pass_equals_one_replay_per_cache_on_synthetic_traces(
    seed: int, sharing: str, block_size: int, capacities: list[int]
) -> None:
    trace = generate(
        "sharegpt", 30, seed=seed, sharing=sharing, system_tokens=96, tenants=3, turns=3
    )
    configs = [ReplayConfig(c, p) for c in capacities for p in ("lru", "lfu")]
    fast = replay_many(trace, configs, block_size)
    assert fast == [replay(trace, c.capacity_tokens, block_size, c.policy) for c in configs]


def test_chain_keys_are_block_keys_chained() -> None:
    tokens = list(range(10**12, 10**12 + 50))
    for bs in (1, 7, 16):
        for extra in ((None, None), ("tenant", None), ("t", "lora")):
            parent, want = None, []
            for i in range(len(tokens) // bs):
                parent = block_key(parent, tokens[i * bs : (i + 1) * bs], extra)
                want.append(parent)
            assert chain_keys(tokens, bs, extra) == want
            assert list(block_chain(tuple(tokens), bs, extra).keys) == want


def _cache() -> PagedKVCache:
    return PagedKVCache(TINY, num_blocks=12, block_size=4, store_kv=False)


def test_a_cache_given_chains_ends_in_the_same_state_as_one_hashing() -> None:
    """Same calls (hits, evictions, explicit ids over the prompt, outputs), with and
    without chains: equal snapshots after every call."""
    prompts = [tuple(range(100, 114)), (*range(100, 110), 7, 8, 9), tuple(range(100, 121))]
    plain, chained = _cache(), _cache()
    for rid, prompt in enumerate(prompts * 2):
        salt = "s" if rid == 4 else None
        chain = block_chain(prompt, 4, (salt, None))
        assert plain.admit(rid, prompt, salt=salt) == chained.admit(
            rid, prompt, salt=salt, chain=chain
        )
        assert plain.snapshot() == chained.snapshot()
        for cache in (plain, chained):
            if rid == 2:  # explicit ids that differ from the prompt's: hashed, not chained
                left = len(prompt) - cache.seq_len(rid)
                cache.append_tokens(rid, left, token_ids=[5] * left)
            else:
                cache.append_tokens(rid, len(prompt) - cache.seq_len(rid))
            cache.append_tokens(rid, 3)
        assert plain.snapshot() == chained.snapshot()
        for cache in (plain, chained):
            cache.free(rid)
            cache.check()
        assert plain.snapshot() == chained.snapshot()


def test_a_chain_for_another_prompt_or_cache_is_refused_and_changes_nothing() -> None:
    cache = _cache()
    prompt = tuple(range(100, 114))
    before = cache.snapshot()
    bad = {
        "another prompt object": block_chain(tuple(range(100, 114)), 4),
        "another block size": block_chain(prompt, 2),
        "other extra keys": block_chain(prompt, 4, ("tenant", None)),
        "another key function": block_chain(prompt, 4, key_fn=lambda p, t, e: bytes(32)),
    }
    for why, chain in bad.items():
        with pytest.raises(ConfigError):
            cache.admit(0, prompt, chain=chain)
        assert cache.snapshot() == before, why
    with pytest.raises(ConfigError, match="BlockChain"):
        cache.admit(0, prompt, chain=object())  # type: ignore[arg-type]
    assert cache.snapshot() == before


@settings(max_examples=40, deadline=None)
@given(
    cached=st.integers(0, 10),
    freed=st.integers(0, 10),
    n=st.integers(0, 12),
    policy=st.sampled_from(["lru", "lfu"]),
)
def test_bulk_allocation_equals_one_block_at_a_time(
    cached: int, freed: int, n: int, policy: str
) -> None:
    """allocate_many takes the same blocks in the same order as n calls of allocate:
    the free stack's top first, then evictions in the policy's order."""

    def pool() -> BlockPool:
        p = BlockPool(24, 4, PrefixCache(), policy)
        blocks = [p.allocate() for _ in range(cached + freed)]
        for i, b in enumerate(blocks[:cached]):
            p.prefix.insert(b, bytes([i]) * 32, None, (i,), (None, None))  # type: ignore[union-attr]
        p.release(blocks[::2] + blocks[1::2])
        return p

    bulk, single = pool(), pool()
    if n > bulk.num_free:
        with pytest.raises(CapacityError):
            bulk.allocate_many(n)
        return
    assert bulk.allocate_many(n) == [single.allocate() for _ in range(n)]
    assert bulk.snapshot() == single.snapshot()
    assert bulk.prefix.snapshot() == single.prefix.snapshot()  # type: ignore[union-attr]
    bulk.check()


def _hashed_one_by_one(parent: bytes | None, tokens, extra):  # type: ignore[no-untyped-def]
    """block_key under another name: a cache given it keys every block one at a time
    from stored ids (the straightforward path), with exactly block_key's keys."""
    return block_key(parent, tokens, extra)


@settings(max_examples=60, deadline=None)
@given(
    ops=st.lists(
        st.tuples(
            st.sampled_from(["admit", "append", "append_ids", "append_none", "fork", "free"]),
            st.integers(0, 5),
            st.integers(1, 9),
            st.integers(0, 3),
        ),
        min_size=1,
        max_size=40,
    ),
    block_size=st.sampled_from([1, 2, 4]),
    chained=st.booleans(),
    policy=st.sampled_from(["lru", "lfu"]),
)
def test_bulk_keying_of_the_prompt_head_equals_keying_block_by_block(
    ops: list[tuple[str, int, int, int]], block_size: int, chained: bool, policy: str
) -> None:
    """The prompt's head (ids kept as the prompt, not copied) is keyed in bulk
    (`chain_keys`, or the chain given); a cache whose key function is not `block_key`
    itself keys every block one at a time from stored ids. Same calls, same snapshots
    (index, entries, token ids, refcounts, queues) after every call."""
    stems = [tuple(range(100, 120)), (*range(100, 108), *range(300, 312)), tuple(range(500, 520))]

    def make(key_fn):  # type: ignore[no-untyped-def]
        return PagedKVCache(
            TINY, num_blocks=24, block_size=block_size, store_kv=False, key_fn=key_fn,
            eviction_policy=policy,
        )  # fmt: skip

    bulk, plain = make(block_key), make(_hashed_one_by_one)
    live: list[int] = []
    next_id = 0
    for kind, pick, n, variant in ops:
        calls: list = []
        if kind == "admit" or not live:
            prompt = stems[variant % 3][: 4 + n + variant]
            salt = "s" if variant == 3 else None
            rid = next_id
            next_id += 1
            calls = [("admit", rid, prompt, salt)]
        else:
            rid = live[pick % len(live)]
            if kind == "free":
                calls = [("free", rid)]
            elif kind == "fork":
                calls = [("fork", rid, next_id)]
                next_id += 1
            else:
                ids = {"append": None, "append_ids": [7 + variant] * n}.get(kind, [None] * n)
                calls = [("append", rid, n, ids)]
        outcomes = []
        for cache in (bulk, plain):
            try:
                for call in calls:
                    if call[0] == "admit":
                        _, r, prompt, salt = call
                        chain = (
                            block_chain(prompt, block_size, (salt, None), cache.prefix.key_fn)  # type: ignore[union-attr]
                            if chained
                            else None
                        )
                        cached = cache.admit(r, prompt, salt=salt, chain=chain)
                        cache.append_tokens(r, len(prompt) - cached) if variant % 2 else None
                        outcomes.append(cached)
                    elif call[0] == "free":
                        cache.free(call[1])
                    elif call[0] == "fork":
                        cache.fork(call[1], call[2])
                    else:
                        _, r, k, ids = call
                        cache.append_tokens(r, k, ids)
                outcomes.append("ok")
            except (CapacityError, ConfigError) as exc:
                outcomes.append(type(exc).__name__)
        assert outcomes[: len(outcomes) // 2] == outcomes[len(outcomes) // 2 :]
        if outcomes[-1] == "ok":
            if calls[0][0] == "admit":
                live.append(calls[0][1])
            elif calls[0][0] == "fork":
                live.append(calls[0][2])
            elif calls[0][0] == "free":
                live.remove(calls[0][1])
        snap_b, snap_p = bulk.snapshot(), plain.snapshot()
        assert snap_b == snap_p
        for cache in (bulk, plain):
            cache.check()
            for r in cache.request_ids():
                assert cache.token_ids(r) == plain.token_ids(r)


@pytest.mark.parametrize("ids_from", ["prompt", "other", "none"])
def test_the_key_the_match_computed_is_reused_only_for_the_same_ids_and_parent(
    ids_from: str,
) -> None:
    """Admission keys the first block its prefix match misses (`PrefixCache.miss`);
    registration reuses that key only when the block fills with the same ids under the
    same parent. Oracle: every index entry's key recomputed with `block_key` from its
    stored parent, ids and extra keys, after a hit, a miss and a fill with the prompt's
    ids, other ids or no ids (the prompt's head)."""
    cache = PagedKVCache(TINY, num_blocks=16, block_size=4, store_kv=False)
    stem = list(range(100, 108))  # two full blocks, shared
    cache.admit("a", [*stem, 1, 2, 3, 4, 5])
    cache.append_tokens("a", 13, [*stem, 1, 2, 3, 4, 5])
    prompt = [*stem, 9, 9, 9, 9, 7]  # hits the stem, misses block 2 (keyed by the match)
    assert cache.admit("b", prompt) == 8
    assert cache.prefix is not None and cache.prefix.miss is not None
    if ids_from == "prompt":
        cache.append_tokens("b", 5, prompt[8:])
    elif ids_from == "other":
        cache.append_tokens("b", 5, [6, 6, 6, 6, 7])  # not the ids the match keyed
    else:
        cache.append_tokens("b", 5)
    entries = cache.prefix.snapshot()[1]
    assert isinstance(entries, dict) and len(entries) == 4  # a: 3 blocks, b: its block 2
    for entry in entries.values():
        assert entry.key == block_key(entry.parent, entry.tokens, entry.extra)
    block2 = cache.block_table("b")[2]
    want_ids = (6, 6, 6, 6) if ids_from == "other" else (9, 9, 9, 9)
    assert entries[block2].tokens == want_ids
    cache.check()


@settings(max_examples=30, deadline=None)
@given(
    block_size=st.sampled_from([4, 8, 16]),
    per=st.sampled_from([1, 2, 4]),
    limit=st.sampled_from([1, 20, 1 << 22]),
    prompts=st.lists(
        st.tuples(
            st.lists(st.integers(0, 5), min_size=1, max_size=6),  # block ids (shared often)
            st.integers(0, 15),  # tokens cut from the last described block
            st.sampled_from([None, "a"]),  # salt
            st.integers(0, 40),  # tail ids after the prompt
        ),
        min_size=1,
        max_size=8,
    ),
)
def test_memoised_described_chains_equal_packed_chains(
    block_size: int, per: int, limit: int, prompts: list[tuple[list[int], int, str | None, int]]
) -> None:
    """`DescribedChains.packed` equals `packed_chain` over the prompt's listed ids (then a
    tail) for prompts given by block ids, whatever the memo holds (a tiny limit drops
    generations between prompts); a block size that does not divide the described
    blocks takes the plain path, with the same result."""
    from kvbench.paged.block_chain import DescribedChains
    from kvbench.paged.prefix_cache import packed_chain
    from kvbench.workloads.trace import block_token_ids

    bt = block_size * per
    for memo_bs in (block_size, 3):
        memo = DescribedChains(memo_bs, limit)
        for blocks, cut, salt, tail_len in prompts:
            length = max(1, len(blocks) * bt - min(cut, bt - 1))
            prompt = block_token_ids(blocks, bt, length)
            tail = tuple(range(7, 7 + tail_len))
            extra = (salt, None)
            want = packed_chain((*prompt, *tail), memo_bs, extra)
            assert memo.packed(prompt, extra, tail) == want
            chain = memo.chain(prompt, extra)
            plain = block_chain(prompt, memo_bs, extra)
            assert (chain.keys, chain.chunks) == (plain.keys, plain.chunks)
    with pytest.raises(ValueError, match="limit"):
        DescribedChains(16, 0)


def test_a_described_prompts_head_lists_its_first_ids() -> None:
    """`BlockTokenIds.head(k)` (the vllm-v1 admission's first chunk of a described prompt)
    holds the prompt's first k ids and is itself described; a length outside 1..len is
    refused."""
    from kvbench.workloads.trace import BlockTokenIds, block_token_ids

    prompt = block_token_ids([5, 2, 9], 4, 10)
    listed = tuple(prompt)
    for k in range(1, 11):
        head = prompt.head(k)
        assert type(head) is BlockTokenIds and len(head) == k
        assert tuple(head) == listed[:k] == prompt[:k]
        assert head.described() == ((5, 2, 9)[: -(-k // 4)], 4)
    for bad in (0, 11, -1, 2.0, True):
        with pytest.raises(ValueError, match="head length"):
            prompt.head(bad)  # type: ignore[arg-type]
