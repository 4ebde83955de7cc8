"""Swap (preemption by swapping) in `paged.spec_serving.LayerGroupServingCache`: a group
of requests moves to swap space and back with every layer group at once, its sharing
and fills kept.

Oracles: the request's state before the swap (tables up to renaming of page ids: the
same NULL entries, the same pattern of sharing among the group, the same fills); the
engine's token mode against event mode; the planner (`blocks_in_step`) at every step of a
run that swaps; snapshots around failed operations (nothing changed).
"""

from __future__ import annotations

import pytest

from kvbench.paged.serving.attention_layout import AttentionLayout
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.paged.spec_requests import NULL_BLOCK
from kvbench.paged.spec_serving import LayerGroupServingCache, spec_serving_cache
from kvbench.workloads.errors import CapacityError, ConfigError, RequestStateError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec, ModelKVSpec, group_layers
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.sharing import generate
from kvbench.workloads.spec_capacity import blocks_in_step

FULL, CROSS = KVCacheSpec.full(), KVCacheSpec.cross_attention(40)


def window(w: int) -> KVCacheSpec:
    return KVCacheSpec.sliding_window(w)


MODELS: dict[str, ModelKVSpec] = {
    "sliding_window": group_layers("mistral-like", [window(100)] * 4, 2, 8),
    "hybrid": group_layers("gemma-2-like", [window(100), FULL] * 2, 2, 8),
    "hybrid_two_windows": group_layers("two-windows", [window(37), window(200), FULL], 2, 8),
    "cross_attention": group_layers("whisper-like", [FULL, CROSS] * 2, 2, 8),
}


def _shape(cache: LayerGroupServingCache, ids: list[str]) -> list[object]:
    """The group's pages up to renaming: per request its tables and cross pages with each
    page replaced by the index of its first appearance in the group, and each page's
    fill, and its total pages held."""
    names: dict[int, int] = {}
    pool = cache.cpu if cache._requests[ids[0]].swapped else cache.pool
    assert pool is not None
    out: list[object] = []
    for rid in ids:
        req = cache._requests[rid]
        for table in [*req.tables, req.cross]:
            out.append(
                [
                    None if b == NULL_BLOCK else (names.setdefault(b, len(names)), pool.fill[b])
                    for b in table
                ]
            )
        out.append((req.seq_len, req.held, cache.pages_held(rid)))
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_sliding_window_hybrid_cross_attention_swap_keeps_tables_sharing_and_fills(
    name: str,
) -> None:
    model = MODELS[name]
    cache = LayerGroupServingCache(model, 200, 16, num_cpu_blocks=100)
    cache.admit("a", list(range(150)))
    cache.append_tokens("a", 150)  # the prompt
    cache.append_tokens("a", 37)  # 37 decode steps: windows released pages; a partial block
    cache.fork("a", "b")  # b shares every page of a
    cache.append_tokens("b", 5)  # copy-on-write of the shared last block
    cache.admit("c", list(range(20)))
    cache.append_tokens("c", 20)
    before = _shape(cache, ["a", "b"])
    device_free, live = cache.num_free_blocks, cache.occupancy().live_slots
    held = cache.blocks_held(["a", "b"])
    cache.swap_out_group(["a", "b"])
    cache.check()
    assert cache.num_free_blocks == device_free + held  # shared pages copied once
    assert cache.cpu is not None and cache.cpu.num_used == held
    assert cache.blocks_held(["a", "b"]) == held
    assert _shape(cache, ["a", "b"]) == before
    assert cache.occupancy().live_slots == live - cache.cpu.live_slots
    with pytest.raises(RequestStateError, match="swapped out"):
        cache.append_tokens("a", 1)
    with pytest.raises(RequestStateError, match="swapped out"):
        cache.fork("b", "d")
    cache.swap_in_group(["a", "b"])
    cache.check()
    assert _shape(cache, ["a", "b"]) == before
    assert cache.num_free_blocks == device_free and cache.cpu.num_used == 0
    assert cache.occupancy().live_slots == live
    cache.append_tokens("a", 40)  # 40 decode steps after the swap: the last one's pages
    assert cache.seq_len("a") == 227
    planned = sum(blocks_in_step(g.spec, 226, 1, 16) for g in model.groups)
    assert cache.pages_held("a") == planned
    for rid in ("a", "b", "c"):
        cache.free(rid)
    cache.check()
    assert cache.pool.num_free == 200 and cache.cpu.num_free == 100


def test_hybrid_swap_failures_change_nothing() -> None:
    model = MODELS["hybrid"]
    cache = LayerGroupServingCache(model, 40, 16, num_cpu_blocks=6, prefill_chunk=32)
    cache.admit("a", list(range(100)))  # 7 + 7 pages
    cache.append_tokens("a", 100)
    cache.admit("p", list(range(40)))  # prompt not complete yet
    before = cache.snapshot()
    with pytest.raises(CapacityError, match="swap space"):
        cache.swap_out_group(["a"])  # 14 pages, 6 of swap space
    with pytest.raises(RequestStateError, match="prompt is complete"):
        cache.swap_out_group(["p"])
    with pytest.raises(RequestStateError, match="resident"):
        cache.swap_in_group(["a"])
    with pytest.raises(ConfigError, match="repeat"):
        cache.swap_out_group(["a", "a"])
    assert cache.snapshot() == before
    small = LayerGroupServingCache(model, 16, 16, num_cpu_blocks=16)
    small.admit("a", list(range(48)))
    small.append_tokens("a", 48)  # 6 pages
    small.swap_out_group(["a"])
    small.admit("b", list(range(64)))
    small.append_tokens("b", 64)  # 8 pages: 8 free, 6 needed, watermark 0 ...
    small.admit("c", list(range(16)))
    small.append_tokens("c", 16)  # ... 2 pages more: 6 free
    small.admit("d", list(range(1)))
    small.append_tokens("d", 1)  # 2 pages: 4 free < 6
    before = small.snapshot()
    with pytest.raises(CapacityError, match="cannot swap in"):
        small.swap_in_group(["a"])
    assert small.snapshot() == before
    no_space = LayerGroupServingCache(model, 40, 16)
    no_space.admit("a", [1])
    no_space.append_tokens("a", 1)
    with pytest.raises(CapacityError, match="no swap space"):
        no_space.swap_out_group(["a"])
    assert not no_space.serving_traits().can_swap and small.serving_traits().can_swap
    with pytest.raises(ConfigError, match="num_cpu_blocks"):
        LayerGroupServingCache(model, 40, 16, num_cpu_blocks=-1)
    with pytest.raises(ConfigError, match="swap_bytes"):
        spec_serving_cache(model, 2**20, 16, swap_bytes=-1)


def _time_model(model: ModelKVSpec) -> TimeModel:
    geometry = KVGeometry(model.num_layers, 2, 8, "float16")
    return TimeModel(
        get_profile("a100-80gb"), geometry, int(2e7), 1e7, 16,
        layout=AttentionLayout.from_spec(model), swap_block_bytes=model.page_bytes(16),
    )  # fmt: skip


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("sharing", ["none", "parallel"])
def test_sliding_window_hybrid_cross_attention_engine_swaps_event_as_token(
    name: str, sharing: str
) -> None:
    """The engine preempts by swapping (every group at once): event mode decides and
    times exactly as token mode, invariants hold after every step, every page returns."""
    model = MODELS[name]
    trace = generate("sharegpt", 80, seed=5, sharing=sharing, n=3)
    runs = []
    for mode in ("event", "token"):
        cfg = SchedulerConfig(mode=mode, preemption="swap", max_batched_tokens=256,
                              max_num_seqs=64)  # fmt: skip
        cache = LayerGroupServingCache(model, 200, 16, max_seq_len=4096, watermark=0.01,
                                       prefill_chunk=256, num_cpu_blocks=400)  # fmt: skip
        runs.append((Engine(cache, cfg, _time_model(model), checked=True).run(trace), cache))
    (event, cache), (token, _) = runs
    assert event.swaps > 0
    assert event.decisions() == token.decisions()
    assert event.modeled_seconds == token.modeled_seconds
    assert cache.pool.num_free == cache.num_blocks and cache.cpu is not None
    assert cache.cpu.num_free == 400


def test_swap_priced_by_the_page_not_a_block_of_every_layer() -> None:
    model = MODELS["hybrid"]  # two groups of 2 layers: a page is half a 4-layer block
    tm = _time_model(model)
    whole = TimeModel(tm.profile, tm.geometry, tm.weight_bytes, tm.params, 16)
    assert tm.swap_ps(100) * 2 == pytest.approx(whole.swap_ps(100), abs=2)
