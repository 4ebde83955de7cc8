"""The serving engine over windowed, hybrid and encoder-decoder models
(`paged.spec_serving.LayerGroupServingCache`).

Oracles: the engine over `PagedKVCache` (a one-group full-attention model must decide
identically, step by step); `workloads.spec_capacity.blocks_in_step` (every request holds,
at every step, exactly the pages the planner gives for the tokens that step computed);
the engine's token mode (event mode skips steps and defers appends, and must decide
exactly as a token-by-token run even though windows free blocks between block
boundaries); the cache's own `check()` after every step.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.time_model import SchedulerConfig, SimulationResult
from kvbench.paged.spec_requests import NULL_BLOCK
from kvbench.paged.spec_serving import LayerGroupServingCache
from kvbench.workloads.errors import CapacityError, ConfigError, UnknownRequestError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec, ModelKVSpec, group_layers
from kvbench.workloads.sharing import generate
from kvbench.workloads.spec_capacity import as_full_attention, blocks_in_step
from kvbench.workloads.trace import Trace, TraceRequest

FULL, CROSS = KVCacheSpec.full(), KVCacheSpec.cross_attention(40)


def window(w: int) -> KVCacheSpec:
    return KVCacheSpec.sliding_window(w)


MODELS: dict[str, ModelKVSpec] = {
    "sliding_window": group_layers("mistral-like", [window(100)] * 4, 2, 8),
    "sliding_window_short": group_layers("window-3", [window(3)] * 2, 2, 8),
    "hybrid": group_layers("gemma-2-like", [window(100), FULL] * 2, 2, 8),
    "hybrid_two_windows": group_layers("two-windows", [window(37), window(200), FULL], 2, 8),
    "cross_attention": group_layers("whisper-like", [FULL, CROSS] * 2, 2, 8),
    # Llama 4: chunked-local layers (chunks of 2 blocks) beside a full (NoPE) one
    "chunked_local": group_layers(
        "llama4-like", [KVCacheSpec.chunked_local(32)] * 3 + [FULL], 2, 8
    ),
}


def _run(
    model: ModelKVSpec,
    trace: Trace,
    mode: str,
    blocks: int = 600,
    hook: object = None,
    **cfg: object,
) -> tuple[SimulationResult, LayerGroupServingCache]:
    config = SchedulerConfig(mode=mode, preemption="recompute", **cfg)  # type: ignore[arg-type]
    cache = LayerGroupServingCache(
        model, blocks, 16, max_seq_len=4096, watermark=0.01,
        prefill_chunk=config.max_batched_tokens,
    )  # fmt: skip
    engine = Engine(cache, config, checked=hook is None, step_hook=hook)  # type: ignore[arg-type]
    return engine.run(trace), cache


def _rows(result: SimulationResult) -> list[tuple]:
    return [dataclasses.astuple(r) for r in result.timeline]


@pytest.mark.parametrize("mode", ["event", "token"])
@pytest.mark.parametrize("sharing", ["none", "parallel"])
def test_full_attention_spec_cache_decides_as_paged_cache(mode: str, sharing: str) -> None:
    """One full-attention group: the same timeline, records and totals as PagedKVCache
    (no prefix caching, no swap) on a trace that preempts."""
    trace = generate("sharegpt", 120, seed=3, sharing=sharing, n=2)
    cfg = SchedulerConfig(mode=mode, preemption="recompute")
    model = group_layers("llama-like", [FULL] * 4, 2, 8)
    spec = Engine(LayerGroupServingCache(model, 300, 16, watermark=0.01), cfg).run(trace)
    g = KVGeometry(4, 2, 8, "float16")
    paged = PagedKVCache(g, 300, 16, watermark=0.01, enable_prefix_caching=False, store_kv=False)
    ref = Engine(paged, cfg).run(trace)
    assert ref.preemptions > 0
    assert _rows(spec) == _rows(ref)
    assert spec.decisions() == ref.decisions()
    assert (spec.utilization, spec.steps, spec.peak_concurrency) == (
        ref.utilization,
        ref.steps,
        ref.peak_concurrency,
    )


@pytest.mark.parametrize(
    "name",
    [
        "sliding_window",
        "sliding_window_short",
        "hybrid",
        "hybrid_two_windows",
        "cross_attention",
        "chunked_local",
    ],
)
@pytest.mark.parametrize("sharing", ["none", "parallel", "beam"])
def test_sliding_window_hybrid_cross_attention_event_mode_decides_as_token_mode(
    name: str, sharing: str
) -> None:
    """Event mode (deferred appends, skipped steps) decides exactly as token stepping,
    with preemption, forks (n samples, beams) and windows freeing blocks mid-block; the
    engine's and the cache's invariants hold after every step."""
    trace = generate("sharegpt", 80, seed=5, sharing=sharing, n=3, beam_width=3)
    blocks = 700 if sharing == "beam" else 40 if name == "sliding_window_short" else 200
    cfg = {"max_batched_tokens": 256, "max_num_seqs": 64}  # chunked prefill, preemption
    event, cache = _run(MODELS[name], trace, "event", blocks=blocks, **cfg)
    token, _ = _run(MODELS[name], trace, "token", blocks=blocks, **cfg)
    assert event.preemptions > 0 or sharing == "beam"
    assert event.decisions() == token.decisions()
    assert (event.utilization, event.steps, event.peak_concurrency) == (
        token.utilization,
        token.steps,
        token.peak_concurrency,
    )
    assert cache.pool.num_free == cache.num_blocks and cache.outstanding == 0


@pytest.mark.parametrize("name", list(MODELS))
def test_sliding_window_hybrid_cross_attention_pages_match_planner_every_step(name: str) -> None:
    """At every step each request that decoded holds exactly the pages
    `blocks_in_step` plans for its token, and each prefill chunk exactly those of its
    chunk (chunked prefill: a small token budget); the cache's invariants hold."""
    model = MODELS[name]
    trace = generate("sharegpt", 60, seed=7)
    seen = {"decode": 0, "chunk": 0}
    box: dict[str, LayerGroupServingCache] = {}

    def planned(computed: int, new: int) -> int:
        return sum(blocks_in_step(g.spec, computed, new, 16) for g in model.groups)

    def hook(step: int, decoded: list, chunks: list, model_ps: int) -> None:
        cache = box["cache"]
        cache.check()
        for sid, c in decoded:
            assert cache.pages_held(sid) == planned(c, 1), (step, sid, c)
            seen["decode"] += 1
        for sid, start, n in chunks:
            if cache.seq_len(sid) == start + n:  # not preempted later in the step
                assert cache.pages_held(sid) == planned(start, n), (step, sid, start, n)
                seen["chunk"] += 1
        return None

    config = SchedulerConfig(
        mode="token", preemption="recompute", max_batched_tokens=256, max_num_seqs=64
    )
    blocks = 40 if name == "sliding_window_short" else 200  # small enough to preempt
    cache = LayerGroupServingCache(
        model, blocks, 16, max_seq_len=4096, watermark=0.01, prefill_chunk=256
    )
    box["cache"] = cache
    result = Engine(cache, config, step_hook=hook).run(trace)
    assert seen["decode"] > 1000 and seen["chunk"] > 60
    assert result.preemptions > 0


def _long_trace(n: int, prompt: int, output: int) -> Trace:
    return Trace(tuple(TraceRequest(f"r{i}", 0.0, prompt, output) for i in range(n)))


@pytest.mark.parametrize("name", ["sliding_window", "hybrid"])
def test_sliding_window_hybrid_admit_more_long_requests_than_full_attention(name: str) -> None:
    """Long requests in one pool: the windowed model runs more of them at once than the
    same model with full attention, in fewer steps, without more preemptions."""
    model = MODELS[name]
    trace = _long_trace(40, 1500, 600)
    windowed, _ = _run(model, trace, "event", blocks=1200)
    full, _ = _run(as_full_attention(model), trace, "event", blocks=1200)
    assert windowed.peak_concurrency > full.peak_concurrency
    assert windowed.steps < full.steps
    assert windowed.preemptions <= full.preemptions
    if name == "sliding_window":  # 4 windowed groups of <= 9 pages vs 4 x 132 pages each
        assert windowed.peak_concurrency >= 2 * full.peak_concurrency


# ---------------------------------------------------------------------- the cache itself
def test_sliding_window_cache_releases_by_the_rule() -> None:
    """Window 5, block 4: the prefill reserves, decode releases blocks wholly before
    the newest query's first position; a fork shares and copies the partial block."""
    model = group_layers("w5", [window(5)], 1, 4)
    cache = LayerGroupServingCache(model, 10, 4, prefill_chunk=4)
    cache.admit("a", list(range(10)))
    # prefill reservation: min(3 prompt blocks, span min(10, 5 - 1 + 4) = 8 -> 3 blocks)
    assert cache.num_free_blocks == 10 - 3
    cache.append_tokens("a", 4)  # positions 0..3 (query 0 keeps all)
    cache.append_tokens("a", 4)  # positions 4..7 (query 4 reads from 0)
    assert cache.block_tables("a") == [[0, 1]]
    cache.append_tokens("a", 2)  # positions 8, 9 (query 8 reads from 4: block 0 goes)
    assert cache.block_tables("a")[0][0] == NULL_BLOCK and cache.pages_held("a") == 2
    assert cache.num_free_blocks == 8  # the prompt is complete: the reservation is gone
    assert cache.next_growth("a", 10) == 12  # query 12 reads from 8: block 1 goes
    cache.append_tokens("a", 1)  # position 10, query reads from 6
    assert cache.pages_held("a") == 2
    cache.fork("a", "b")
    # positions 11, 12 as two decode steps: copy-on-write of block 2, a new block 3,
    # and block 1 (still shared with a) leaves b's window
    cache.append_tokens("b", 2)
    assert cache.pages_held("b") == 2 and cache.block_tables("b")[0][1] == NULL_BLOCK
    table_a, table_b = cache.block_tables("a")[0], cache.block_tables("b")[0]
    assert table_a[0] == NULL_BLOCK and NULL_BLOCK not in table_a[1:]  # a keeps block 1
    assert table_b[2] != table_a[2]  # b copied the shared partial block before writing
    assert cache.num_free_blocks == 10 - 4
    cache.check()
    cache.free("a")
    cache.free("b")
    assert cache.num_free_blocks == 10
    cache.check()


def test_cross_attention_pages_taken_at_admission_and_freed_with_request() -> None:
    model = MODELS["cross_attention"]  # two groups of 2 layers: full + cross (encoder 40)
    cache = LayerGroupServingCache(model, 20, 16)
    cache.admit("a", [1, 2, 3])
    assert cache.pages_held("a") == 3  # ceil(40 / 16) encoder pages, written at admission
    assert cache.occupancy().live_slots == 40
    cache.append_tokens("a", 3)
    assert cache.pages_held("a") == 4
    cache.fork("a", "b")
    assert cache.blocks_held(["a", "b"]) == 4  # the encoder pages are shared
    cache.free("a")
    cache.free("b")
    assert cache.pool.num_free == 20
    cache.check()


def test_spec_serving_cache_failed_operations_change_nothing() -> None:
    model = MODELS["hybrid"]
    cache = LayerGroupServingCache(model, 16, 16, prefill_chunk=32)
    cache.admit("a", list(range(40)))  # reservation: full 3 + window min(3, 4) = 6 pages
    before = cache.snapshot()
    with pytest.raises(CapacityError, match="cannot admit request 'b'"):
        cache.admit("b", list(range(100)))  # 7 + 7 pages, 10 free
    with pytest.raises(CapacityError, match="max_seq_len"):
        cache.append_tokens("a", 10_000)
    with pytest.raises(UnknownRequestError, match="'zz'"):
        cache.append_tokens("zz", 1)
    with pytest.raises(ConfigError, match="n must be"):
        cache.append_tokens("a", 0)
    assert cache.snapshot() == before
    cache.append_tokens("a", 40)
    cache.admit("b", list(range(60)))
    cache.append_tokens("b", 48)  # b holds 6 of its 8 reserved pages: 2 free for others
    before = cache.snapshot()
    with pytest.raises(CapacityError, match="cannot append"):
        cache.append_tokens("a", 40)  # decode 40 tokens: 2 new pages per group
    assert cache.snapshot() == before
    cache.check()


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"block_size": -1}, "block_size"),
        ({"watermark": 1.0}, "watermark"),
        ({"prefill_chunk": 0}, "prefill_chunk"),
        ({"max_seq_len": 0}, "max_seq_len"),
        ({"block_size": 64}, "chunk=32 is not a multiple of block_size=64"),
    ],
)
def test_spec_serving_cache_refuses_bad_config(kwargs: dict, match: str) -> None:
    args = {"num_blocks": 10, "block_size": 16, **kwargs}
    model = MODELS["chunked_local" if "chunk" in match else "hybrid"]
    with pytest.raises(ConfigError, match=match):
        LayerGroupServingCache(model, **args)  # type: ignore[arg-type]
