"""The capacity sweep's replay in arrays (`paged.compact_replay`) decides exactly what the
real memory-only `PagedKVCache` decides: `replay_many(compact=True)` against
`replay_many(compact=False)` (the real cache, request by request), every result (hit
tokens, evictions, pool) equal, for every eviction policy, on a slice of the Mooncake
trace and on synthetic traces of shared, salted, cut prompts on pools small enough to
evict every request. Traces it does not take (prompts listed, blocks of two sizes) fall
back to the real cache."""

from __future__ import annotations

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged.compact_replay import described_identities, replay_compact
from kvbench.paged.eviction import POLICIES
from kvbench.paged.hitrate import ReplayConfig, replay_many
from kvbench.workloads import prefix_oracle as po
from kvbench.workloads.shipped import shipped_trace
from kvbench.workloads.trace import Trace, TraceRequest


@functools.lru_cache(maxsize=1)
def _mooncake_slice() -> Trace:
    return Trace(shipped_trace("mooncake-conversation").requests[:150])


@pytest.mark.parametrize("block_size", [512, 16])
def test_the_compact_replay_equals_the_real_cache_on_the_mooncake_trace(block_size: int) -> None:
    trace = _mooncake_slice()
    limit = po.block_accesses(trace, block_size).footprint_blocks()
    caps = [c for c in (2_048, 20_000, 200_000, 1_000_000) if c // block_size < limit]
    configs = [ReplayConfig(cap, policy) for cap in caps for policy in POLICIES]
    fast = replay_many(trace, configs, block_size, pool_limit=limit)
    real = replay_many(trace, configs, block_size, pool_limit=limit, compact=False)
    assert fast == real
    assert any(r.evictions for r in real)


def _trace(prompts: list[tuple[list[int], int, str | None]], bt: int) -> Trace:
    reqs = []
    for i, (blocks, cut, salt) in enumerate(prompts):
        length = max(1, len(blocks) * bt - min(cut, bt - 1))
        reqs.append(
            TraceRequest(
                i, float(i), length, 1, salt=salt, prompt_blocks=tuple(blocks),
                prompt_block_tokens=bt,
            )
        )  # fmt: skip
    return Trace(tuple(reqs))


@settings(max_examples=40, deadline=None)
@given(
    block_size=st.sampled_from([2, 4]),
    per=st.sampled_from([1, 2, 3]),
    pools=st.lists(st.integers(1, 24), min_size=1, max_size=3),
    prompts=st.lists(
        st.tuples(
            st.lists(st.integers(0, 4), min_size=1, max_size=5),  # block ids: shared often
            st.integers(0, 12),  # tokens cut from the last described block
            st.sampled_from([None, None, "t"]),  # salt
        ),
        min_size=1,
        max_size=30,
    ),
)
def test_the_compact_replay_equals_the_real_cache_on_synthetic_traces(
    block_size: int, per: int, pools: list[int], prompts: list[tuple[list[int], int, str | None]]
) -> None:
    trace = _trace(prompts, block_size * per)
    configs = [ReplayConfig(p * block_size, policy) for p in pools for policy in POLICIES]
    footprint = po.block_accesses(trace, block_size).footprint_blocks()
    for limit in (None, footprint):  # the pool as asked, and as `hit_rates` bounds it
        fast = replay_many(trace, configs, block_size, pool_limit=limit)
        real = replay_many(trace, configs, block_size, pool_limit=limit, compact=False)
        assert fast == real


def test_traces_the_compact_replay_does_not_take_fall_back_to_the_real_cache() -> None:
    listed = Trace((TraceRequest(0, 0.0, 8, 1, prompt=tuple(range(8))),))
    assert described_identities(listed, 4) is None
    two = Trace(
        (
            TraceRequest(0, 0.0, 8, 1, prompt_blocks=(1,), prompt_block_tokens=8),
            TraceRequest(1, 1.0, 8, 1, prompt_blocks=(2, 3), prompt_block_tokens=4),
        )
    )
    assert described_identities(two, 4) is None  # equal ids: block 1 of 8 = blocks 2, 3 of 4
    assert described_identities(_trace([([1], 0, None)], 6), 4) is None  # 4 does not divide 6
    assert replay_compact(two, [(16, "lru")], 4, None) is None
    configs = [ReplayConfig(16, "lru")]
    assert replay_many(two, configs, 4) == replay_many(two, configs, 4, compact=False)
    assert replay_many(two, configs, 4)[0].hit_tokens == 4  # the real cache shares them


def repeated_trace(trace: Trace, times: int) -> Trace:
    """`trace` `times` times over, copy j with every block id shifted past the copies
    before it and its arrivals after theirs: a trace `times` times as large that shares
    within each copy exactly as the original does (the 10x replay of issue 39)."""
    ids = [b for r in trace.requests for b in (r.prompt_blocks or ())]
    shift = max(ids, default=0) + 1
    span = (trace.requests[-1].arrival if trace.requests else 0.0) + 1.0
    reqs = []
    for j in range(times):
        for r in trace.requests:
            blocks = tuple(b + j * shift for b in r.prompt_blocks) if r.prompt_blocks else None
            reqs.append(
                TraceRequest(
                    f"{j}-{r.id}", r.arrival + j * span, r.prompt_len, r.output_len,
                    salt=r.salt, prompt_blocks=blocks, prompt_block_tokens=r.prompt_block_tokens,
                )
            )  # fmt: skip
    return Trace(tuple(reqs))


def test_a_repeated_trace_replays_each_copy_as_the_original() -> None:
    """Copies share nothing: a pool too small to keep a copy across the next gets
    `times` x the original's hits."""
    trace = _trace([([0, 1], 0, None), ([0, 1, 2], 3, None), ([0, 4], 0, "t")], 4)
    twice = repeated_trace(trace, 2)
    assert len(twice) == 6
    one = replay_many(trace, [ReplayConfig(16, "lru")], 2)[0]
    two = replay_many(twice, [ReplayConfig(16, "lru")], 2)[0]
    assert (two.hit_tokens, two.prompt_tokens) == (2 * one.hit_tokens, 2 * one.prompt_tokens)


@pytest.mark.slow
@pytest.mark.parametrize("block_size", [512, 16])
def test_the_whole_mooncake_trace_replays_alike_in_arrays_and_in_the_real_cache(
    block_size: int,
) -> None:
    """The guard on the whole trace (minutes and ~6 GB at block 16: `slow`, not in CI):
    the grid's bounded capacities, every policy, both paths equal."""
    from kvbench.suites.bench.sweeps.trace_capacity import CAPACITIES

    trace = shipped_trace("mooncake-conversation")
    limit = po.block_accesses(trace, block_size).footprint_blocks()
    caps = [c for c in CAPACITIES if c // block_size < limit]
    for policy in POLICIES:
        configs = [ReplayConfig(c, policy) for c in caps]
        fast = replay_many(trace, configs, block_size, pool_limit=limit)
        assert fast == replay_many(trace, configs, block_size, pool_limit=limit, compact=False)
