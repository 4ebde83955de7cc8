"""Swaps are priced at the block size of the cache they move (issue 38 item 5).

The cache decides: `simulate(trace, cache)` and `simulate(trace, spec)` build their time
model at the cache's block size, and a time model built for another block size prices
a swapping cache's swaps at the cache's (`TimeModel.for_cache`, in the engine). The
oracle here is independent of the time model: the bytes of one block of the geometry
(2 x layers x KV heads x head dim x dtype bytes x block size) over the device's host
link, computed in this file. `simulate(trace, cache)` once priced every cache's swaps at
16 tokens; at 32 that is half the bytes, which these tests refuse.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.simulation import simulate, time_model_for
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.trace import Trace, TraceRequest

GEOM = KVGeometry(2, 2, 8, "float16", 4)
MODEL = "opt-13b"
PROFILE = "a100-80gb"


def _spec(block_size: int) -> CacheSpec:
    """A paged cache of 24 blocks with swap space: the trace below preempts by swapping."""
    return CacheSpec(
        model=MODEL, kv_budget="1GB", block_size=block_size, geometry=GEOM, num_blocks=24
    )


def _trace() -> Trace:
    rng = random.Random(5)
    return Trace(
        tuple(
            TraceRequest(f"r{i}", 0.01 * i, rng.randint(40, 120), rng.randint(40, 160))
            for i in range(12)
        )
    )


def _oracle_ps(blocks: int, block_size: int) -> int:
    """Picoseconds to copy `blocks` blocks one way over the host link (one rank)."""
    g = GEOM
    block_bytes = 2 * g.num_layers * g.num_kv_heads * g.head_dim * 2 * block_size  # float16
    return round(blocks * block_bytes * 1e12 / get_profile(PROFILE).host_link_bandwidth)


@pytest.mark.parametrize("given", ["cache", "spec"])
def test_swaps_are_priced_at_the_cache_block_size(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """A cache of 32-token blocks that swaps: every swap the engine prices costs the bytes
    of 32-token blocks (not 16), whether `simulate` gets the cache or its spec."""
    priced: list[tuple[int, int, int]] = []
    swap_ps = TimeModel.swap_ps

    def recording(self: TimeModel, blocks: int) -> int:
        ps = swap_ps(self, blocks)
        priced.append((blocks, ps, self.block_size))
        return ps

    monkeypatch.setattr(TimeModel, "swap_ps", recording)
    spec = _spec(32)
    target = spec.build() if given == "cache" else spec
    cfg = SchedulerConfig(preemption="swap")
    result = simulate(_trace(), target, config=cfg, model=MODEL, profile=PROFILE)
    assert result.swaps > 0, "the case must swap"
    swapped = [(blocks, ps) for blocks, ps, _ in priced if blocks > 0]
    assert swapped, "the engine priced no swap"
    for blocks, ps in swapped:
        assert ps == _oracle_ps(blocks, 32), (blocks, ps)
        assert ps != _oracle_ps(blocks, DEFAULT_BLOCK_SIZE)
    assert {bs for _, _, bs in priced} == {32}


@pytest.mark.parametrize("given", ["cache", "spec", "engine"])
def test_a_time_model_of_another_block_size_follows_the_cache(
    monkeypatch: pytest.MonkeyPatch, given: str
) -> None:
    """A time model built for 16-token blocks, given to simulate or Engine with a cache
    of 32 that swaps: the swaps are priced at 32 (the cache decides), and the run is the
    run with the cache's own time model, step for step."""
    priced: list[int] = []
    swap_ps = TimeModel.swap_ps

    def recording(self: TimeModel, blocks: int) -> int:
        priced.append(self.block_size)
        return swap_ps(self, blocks)

    monkeypatch.setattr(TimeModel, "swap_ps", recording)
    spec = _spec(32)
    at_16 = time_model_for(replace(spec, block_size=16), PROFILE)
    cfg = SchedulerConfig(preemption="swap")
    if given == "engine":
        got = Engine(spec.build(), cfg, at_16).run(_trace())
    else:
        target = spec.build() if given == "cache" else spec
        got = simulate(_trace(), target, config=cfg, time_model=at_16)
    assert got.swaps > 0 and set(priced) == {32}
    own = simulate(_trace(), spec, config=cfg, time_model=time_model_for(spec, PROFILE))
    assert [r.times() for r in got.records] == [r.times() for r in own.records]
    assert got.modeled_seconds == own.modeled_seconds


def test_for_cache() -> None:
    """A cache without swap space or without blocks never asks for a swap price: the
    model is kept as it is; pages of a layer group cannot be re-priced: refused."""
    at_16 = time_model_for(_spec(16), PROFILE)
    assert at_16.for_cache(32, can_swap=False) is at_16
    assert at_16.for_cache(0, can_swap=True) is at_16
    assert at_16.for_cache(16, can_swap=True) is at_16
    at_32 = at_16.for_cache(32, can_swap=True)
    assert at_32 == replace(at_16, block_size=32)
    assert at_32.swap_ps(3) == _oracle_ps(3, 32) == 2 * at_16.swap_ps(3)
    pages = replace(at_16, swap_block_bytes=at_16.geometry.bytes_per_block(16) // 2)
    with pytest.raises(ConfigError, match=r"swap_block_bytes=.*16-token.*hold 32 tokens"):
        pages.for_cache(32, can_swap=True)
