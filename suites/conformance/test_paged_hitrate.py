"""Prefix-cache hit rate against capacity (paged.hitrate, paged.eviction,
workloads.prefix_oracle): the real PagedKVCache replay against an independent LRU model
of block identities, the Belady bound against an exhaustive search, the ceiling, and the
LFU eviction queue."""

from __future__ import annotations

import functools
import itertools

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.eviction import LFUQueue
from kvbench.paged.hitrate import TINY, replay
from kvbench.paged.prefix_cache import PrefixCache
from kvbench.workloads import prefix_oracle as po
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.sharing import generate
from kvbench.workloads.shipped import shipped_trace
from kvbench.workloads.trace import Trace, TraceRequest


@functools.lru_cache(maxsize=1)
def _mooncake_head() -> Trace:
    return Trace(shipped_trace("mooncake-conversation").requests[:150])


@pytest.mark.parametrize("block_size", [512, 16])
@pytest.mark.parametrize("capacity", [10_000, 200_000, 1_000_000, 10**9])
def test_the_real_cache_matches_the_lru_model_on_the_mooncake_trace(
    block_size: int, capacity: int
) -> None:
    trace = _mooncake_head()
    acc = po.block_accesses(trace, block_size)
    got = replay(trace, capacity, block_size, pool_limit=acc.footprint_blocks())
    assert got.hit_tokens == po.lru_model_hit_tokens(acc, capacity)
    ceiling = po.ceiling_hit_tokens(acc)
    assert got.hit_tokens <= po.belady_hit_tokens(acc, capacity) <= ceiling
    if capacity // block_size >= acc.footprint_blocks():
        assert got.hit_tokens == ceiling and got.evictions == 0


def _generated(seed: int, sharing: str) -> Trace:
    return generate(
        "uniform" if sharing == "none" else "sharegpt",
        40,
        seed=seed,
        sharing=sharing,
        system_tokens=96,
        tenants=3,
        turns=3,
    )


@settings(max_examples=12, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    sharing=st.sampled_from(["system-prompt", "multi-turn"]),
    block_size=st.sampled_from([4, 16]),
    capacity=st.integers(64, 20_000),
)
def test_replays_agree_with_the_models_and_the_bounds_hold(
    seed: int, sharing: str, block_size: int, capacity: int
) -> None:
    trace = _generated(seed, sharing)
    acc = po.block_accesses(trace, block_size)
    lru = replay(trace, capacity, block_size, "lru")
    lfu = replay(trace, capacity, block_size, "lfu")
    assert lru.hit_tokens == po.lru_model_hit_tokens(acc, capacity)
    best = po.belady_hit_tokens(acc, capacity)
    ceiling = po.ceiling_hit_tokens(acc)
    assert max(lru.hit_tokens, lfu.hit_tokens) <= best <= ceiling
    assert lru.prompt_tokens == acc.prompt_tokens == sum(r.prompt_len for r in trace.requests)


def _exhaustive_best(prompts: list[tuple[int, ...]], cap: int) -> int:
    """The most hit tokens any keep-set choice reaches (block size 1, identities = the
    prefixes), by trying every subset the capacity allows at every request."""
    best_at: dict[frozenset, int] = {frozenset(): 0}
    for prompt in prompts:
        use = prompt[:cap]
        keys = [use[: j + 1] for j in range(len(use))]
        nxt: dict[frozenset, int] = {}
        for cached, score in best_at.items():
            run = 0
            while run < len(use) - 1 and keys[run] in cached:
                run += 1
            others = sorted(cached - set(keys[:run]))
            room = cap - len(use)
            for r in range(min(room, len(others)) + 1):
                for kept in itertools.combinations(others, r):
                    state = frozenset(kept) | frozenset(keys)
                    if nxt.get(state, -1) < score + run:
                        nxt[state] = score + run
        best_at = nxt
    return max(best_at.values())


#: A few short prompts over three tokens, any capacity up to 5 blocks.
_SHORT_CASES = st.tuples(
    st.lists(
        st.lists(st.integers(0, 2), min_size=1, max_size=4).map(tuple), min_size=1, max_size=6
    ),
    st.integers(1, 5),
)
#: Many prompts of 1-3 tokens over two tokens at 2-4 blocks: prompts repeat, extend and cut
#: each other, so a block is often next used where it cannot hit (a prompt's last token,
#: or past the capacity) before it is used where it can: the case 34ddd88 fixed. About 3%
#: of these draws tell that fix from its predecessor (measured: with the fix reverted,
#: 10 of 10 seeded runs of 150 such draws failed, 20 of 30 of 40; 1 in 10 of the short
#: cases' 150 draws did).
_LONG_CASES = st.tuples(
    st.lists(
        st.lists(st.integers(0, 1), min_size=1, max_size=3).map(tuple), min_size=8, max_size=20
    ),
    st.integers(2, 4),
)


@settings(max_examples=300, deadline=None)
@given(case=st.one_of(_SHORT_CASES, _LONG_CASES))
@example(case=([(1, 0), (0, 0), (1,), (1, 0, 0)], 3))  # 2 hit tokens, not 1 (34ddd88)
def test_the_belady_bound_is_the_exhaustive_optimum(case: tuple[list, int]) -> None:
    prompts, cap = case
    trace = Trace(tuple(TraceRequest(i, 0.0, len(p), 1, p) for i, p in enumerate(prompts)))
    acc = po.block_accesses(trace, 1)
    assert po.belady_hit_tokens(acc, cap) == _exhaustive_best(prompts, cap)
    assert replay(trace, cap, 1).hit_tokens == po.lru_model_hit_tokens(acc, cap)


def test_lfu_evicts_the_fewest_used_then_the_least_recently_released() -> None:
    q = LFUQueue()
    for block in (1, 2, 3):
        q[block] = None  # each used once
    del q[1]
    q[1] = None  # block 1 used twice now
    q[4] = None
    assert list(q) == [2, 3, 4, 1]
    assert [q.popitem(last=False)[0] for _ in range(4)] == [2, 3, 4, 1]
    with pytest.raises(KeyError):
        q.popitem(last=False)
    q[1] = None  # evicted blocks start again from one use
    q[5] = None
    del q[5]
    q[5] = None
    assert list(q) == [1, 5] and len(q) == 2 and 5 in q


def test_a_pool_under_lfu_keeps_its_invariants() -> None:
    prefix = PrefixCache()
    pool = BlockPool(4, 2, prefix, "lfu")
    blocks = pool.allocate_many(4)
    for i, b in enumerate(blocks):
        prefix.insert(b, bytes([i]) * 32, None, (i, i), (None, None))
    pool.release(blocks)
    pool.incref(blocks[0])  # a hit on block 0: used twice once released
    pool.release([blocks[0]])
    pool.check()
    victim = pool.allocate()
    assert victim == blocks[3]  # once-used, released first (tail first)
    pool.check()


def test_lru_stays_the_default_and_unknown_policies_are_refused() -> None:
    cache = PagedKVCache(TINY, 8, 4, store_kv=False)
    assert cache.pool.eviction == "lru"
    with pytest.raises(ConfigError, match="'fifo'"):
        PagedKVCache(TINY, 8, 4, store_kv=False, eviction_policy="fifo")
    with pytest.raises(ConfigError, match="holds no block"):
        replay(_mooncake_head(), 100, 512)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["release", "revive", "evict"]), st.integers(0, 11)),
        max_size=120,
    )
)
def test_the_lfu_queue_evicts_as_a_plain_minimum_over_uses_then_release_order(
    ops: list[tuple[str, int]],
) -> None:
    """LFUQueue (one-int heap keys, lazy deletion, rebuilds) against the definition
    written out: each block's uses and release order in a dict, eviction = the minimum
    of (uses, order); the same block popped, the same order listed, after every call."""
    from kvbench.paged.eviction import LFUQueue

    queue = LFUQueue()
    live: dict[int, tuple[int, int]] = {}
    uses: dict[int, int] = {}
    order = 0
    for kind, block in ops:
        if kind == "release" and block not in live:
            queue[block] = None
            uses[block] = uses.get(block, 0) + 1
            order += 1
            live[block] = (uses[block], order)
        elif kind == "revive" and block in live:
            del queue[block]
            del live[block]
        elif kind == "evict":
            if not live:
                with pytest.raises(KeyError):
                    queue.popitem(last=False)
                continue
            want = min(live, key=live.__getitem__)
            assert queue.popitem(last=False) == (want, None)
            del live[want]
            del uses[want]
        assert list(queue) == sorted(live, key=live.__getitem__)
        assert len(queue) == len(live)


@settings(max_examples=200, deadline=None)
@given(
    ops=st.lists(
        st.tuples(st.sampled_from(["release", "revive", "evict"]), st.integers(0, 11)),
        max_size=120,
    )
)
def test_the_slru_queue_evicts_as_its_definition_written_out(ops: list[tuple[str, int]]) -> None:
    """SLRUQueue (two OrderedDicts and a set) against segmented LRU written out with
    plain lists: a block's first release since it was cached appends it to probation, a
    later one to protected; then protected's oldest move to probation's end while
    protected holds more than 4/5 of both; eviction takes probation's oldest, else
    protected's, and forgets the block; the same block popped, the same order listed,
    after every call."""
    from kvbench.paged.eviction import SLRUQueue

    queue = SLRUQueue()
    probation: list[int] = []
    protected: list[int] = []
    seen: set[int] = set()
    for kind, block in ops:
        live = probation + protected
        if kind == "release" and block not in live:
            queue[block] = None
            if block in seen:
                protected.append(block)
                while len(protected) > (len(probation) + len(protected)) * 4 // 5:
                    probation.append(protected.pop(0))
            else:
                seen.add(block)
                probation.append(block)
        elif kind == "revive" and block in live:
            del queue[block]
            (probation if block in probation else protected).remove(block)
        elif kind == "evict":
            if not live:
                with pytest.raises(KeyError):
                    queue.popitem(last=False)
                continue
            want = (probation or protected).pop(0)
            assert queue.popitem(last=False) == (want, None)
            seen.discard(want)
        assert list(queue) == probation + protected
        assert len(queue) == len(probation) + len(protected)
        assert all(b in queue for b in probation + protected)


def test_slru_keeps_a_hit_block_past_once_used_ones_and_runs_in_the_cache() -> None:
    """The example behind the policy: a block hit once survives blocks released after it
    but used once (LRU would evict it first); the pool under SLRU keeps its invariants
    and the replay names it."""
    from kvbench.paged.eviction import SLRUQueue

    q = SLRUQueue()
    for block in (1, 2, 3, 4, 5):
        q[block] = None
    del q[1]
    q[1] = None  # hit, then released again: protected
    q[6] = None
    assert list(q) == [2, 3, 4, 5, 6, 1]
    assert [q.popitem(last=False)[0] for _ in range(6)] == [2, 3, 4, 5, 6, 1]
    with pytest.raises(KeyError):
        q.popitem(last=False)
    q[1] = None  # evicted: its history is gone, probation again
    q[7] = None
    assert list(q) == [1, 7]
    for policy, second in (("slru", 3), ("lru", 0)):
        prefix = PrefixCache()
        pool = BlockPool(4, 2, prefix, policy)
        blocks = pool.allocate_many(4)
        for i, b in enumerate(blocks):
            prefix.insert(b, bytes([i]) * 32, None, (i, i), (None, None))
        pool.release(blocks[:2])  # queue: 1, 0 (tail first)
        pool.incref(blocks[0])  # a hit on block 0, released again
        pool.release([blocks[0]])
        pool.release(blocks[2:])  # once used, released after block 0: 3, 2
        pool.check()
        # SLRU keeps the hit block past the once-used ones; LRU evicts it second
        assert [pool.allocate(), pool.allocate()] == [blocks[1], blocks[second]], policy
        pool.check()
    result = replay(_mooncake_head(), 200_000, 512, "slru")
    assert result.policy == "slru" and result.hit_tokens > 0
