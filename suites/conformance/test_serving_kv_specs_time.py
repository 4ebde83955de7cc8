"""The time model prices windowed, hybrid and encoder-decoder attention per layer
(`paged.serving.attention_layout`): a windowed layer's query reads min(c + 1, window)
tokens of KV, a cross-attention layer's the encoder length, a full layer's c + 1.

Oracles: a float64 brute force that walks every decoder, every prefill query and every
layer group (no closed forms, no aggregates) and prices the step from the device profile;
the engine's token mode (every step priced from its own decoders) against event mode
(quiet stretches priced in closed form from per-window aggregates); the engine's
invariants (`check`, including the per-window aggregates) after every step.
"""

from __future__ import annotations

import dataclasses

import pytest

from kvbench.paged.serving.attention_layout import AttentionLayout, LayoutGroup
from kvbench.paged.serving.engine import Engine
from kvbench.paged.serving.time_model import SchedulerConfig, TimeModel
from kvbench.paged.spec_serving import LayerGroupServingCache
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec, ModelKVSpec, group_layers
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.sharing import generate
from kvbench.workloads.spec_capacity import as_full_attention
from kvbench.workloads.trace import Trace

FULL, CROSS = KVCacheSpec.full(), KVCacheSpec.cross_attention(40)
HEADS, DIM = 8, 128  # per-layer KV large enough that picosecond rounding is negligible


def window(w: int) -> KVCacheSpec:
    return KVCacheSpec.sliding_window(w)


MODELS: dict[str, ModelKVSpec] = {
    "sliding_window": group_layers("mistral-like", [window(100)] * 4, HEADS, DIM),
    "sliding_window_short": group_layers("window-3", [window(3)] * 2, HEADS, DIM),
    "hybrid": group_layers("gemma-2-like", [window(100), FULL] * 2, HEADS, DIM),
    "hybrid_two_windows": group_layers("two", [window(37), window(200), FULL], HEADS, DIM),
    "cross_attention": group_layers("whisper-like", [FULL, CROSS] * 2, HEADS, DIM),
    # Llama 4: three chunked-local layers to one full (NoPE) layer; chunks of 2 blocks
    "chunked_local": group_layers(
        "llama4-like", [KVCacheSpec.chunked_local(32)] * 3 + [FULL], HEADS, DIM
    ),
}
PARAMS = 2e7  # small weights: the KV reads decide the step time


def _time_model(model: ModelKVSpec, layout: bool = True) -> TimeModel:
    geometry = KVGeometry(model.num_layers, HEADS, DIM, "float16")
    return TimeModel(
        get_profile("a100-80gb"), geometry, int(2 * PARAMS), PARAMS, 16,
        layout=AttentionLayout.from_spec(model) if layout else None,
    )  # fmt: skip


def _oracle_s(tm: TimeModel, model: ModelKVSpec, decoders: list[int], chunks: list) -> float:
    """Seconds of one step, by brute force (module docstring): `decoders` their KV
    lengths c before the step's token, `chunks` (context, length) pairs."""
    g, prof = tm.geometry, tm.profile
    bw, peak = prof.effective_hbm_bandwidth, prof.effective_peak_flops
    layer_bytes = g.bytes_per_token / g.num_layers
    layer_flops = 4.0 * (g.num_q_heads or g.num_kv_heads) * g.head_dim  # QK^T + PV
    read = pairs = 0.0
    for group in model.groups:
        s, n_layers = group.spec, group.num_layers
        for c in decoders:  # the query at position c reads ...
            if s.encoder_len is not None:
                keys = s.encoder_len
            elif s.chunk is not None:  # priced at its upper bound (ChunkedLocalRule)
                keys = min(c + 1, s.chunk)
            else:
                keys = len([k for k in range(c + 1) if s.window is None or c - k < s.window])
            read += n_layers * keys
            pairs += n_layers * keys
        for ctx, n in chunks:
            touched: set[int] = set()
            for p in range(ctx, ctx + n):
                if s.encoder_len is not None:
                    pairs += n_layers * s.encoder_len
                    continue
                seen = [k for k in range(p + 1) if s.window is None or p - k < s.window]
                if s.chunk is not None:  # the query's own chunk
                    seen = [k for k in seen if k // s.chunk == p // s.chunk]
                touched.update(seen)
                pairs += n_layers * len(seen)
            read += n_layers * (s.encoder_len if s.encoder_len is not None else len(touched))
    tokens = len(decoders) + sum(n for _, n in chunks)
    mem = tm.weight_bytes / bw + read * layer_bytes / bw
    comp = 2.0 * tm.params * tokens / peak + pairs * layer_flops / peak
    fixed = prof.step_overhead_s + 4 * g.num_layers * prof.efficiency.kernel_floor_s
    return fixed + max(mem, comp)


def _trace(n: int, gap_s: float, seed: int = 3) -> Trace:
    base = generate("sharegpt", n, seed=seed)
    reqs = tuple(
        dataclasses.replace(r, arrival=i * gap_s, prompt_len=min(r.prompt_len, 300),
                            output_len=min(r.output_len, 260))
        for i, r in enumerate(base.requests)
    )  # fmt: skip
    return Trace(reqs, base.meta)


def _engine(model: ModelKVSpec, tm: TimeModel, mode: str, blocks: int, hook=None) -> Engine:  # type: ignore[no-untyped-def]
    config = SchedulerConfig(mode=mode, preemption="recompute", max_batched_tokens=256,
                             max_num_seqs=64)  # fmt: skip
    cache = LayerGroupServingCache(
        model, blocks, 16, max_seq_len=4096, watermark=0.01,
        prefill_chunk=config.max_batched_tokens,
    )  # fmt: skip
    return Engine(cache, config, tm, checked=hook is None, step_hook=hook)


@pytest.mark.parametrize("name", list(MODELS))
def test_sliding_window_hybrid_cross_attention_step_price_matches_brute_force(name: str) -> None:
    """Every step of a token-mode run is priced as the brute force prices its decoders'
    and chunks' reads (within picosecond rounding)."""
    model = MODELS[name]
    tm = _time_model(model)
    seen: list[tuple[float, float]] = []

    def hook(t, ran, chunks, model_ps):  # type: ignore[no-untyped-def]
        oracle = _oracle_s(tm, model, [c for _, c in ran], [(c, n) for _, c, n in chunks])
        seen.append((model_ps / 1e12, oracle))
        return None

    result = _engine(model, tm, "token", 4000, hook).run(_trace(30, 0.002))
    assert result.preemptions == 0  # the hook sees every decoder
    assert len(seen) == result.steps
    for got, want in seen:
        if want:
            assert got == pytest.approx(want, rel=1e-3)


@pytest.mark.parametrize("name", list(MODELS))
def test_sliding_window_hybrid_cross_attention_event_mode_times_as_token_mode(name: str) -> None:
    """Quiet stretches priced in closed form from the per-window aggregates equal the
    token-by-token prices to the picosecond, with arrivals, chunked prefill and
    preemption; invariants checked after every step."""
    model = MODELS[name]
    tm = _time_model(model)
    blocks = 40 if name == "sliding_window_short" else 150
    trace = _trace(60, 0.0005)
    event = _engine(model, tm, "event", blocks).run(trace)
    token = _engine(model, tm, "token", blocks).run(trace)
    assert event.preemptions > 0 or name == "sliding_window_short"
    assert event.decisions() == token.decisions()
    assert sorted(r.times() for r in event.records) == sorted(r.times() for r in token.records)
    assert event.modeled_seconds == token.modeled_seconds


def test_sliding_window_decode_priced_by_the_window_not_the_context() -> None:
    """A decode step past the window costs what a step at the window costs; full
    attention keeps growing; below the window both agree."""
    model = MODELS["sliding_window"]  # window 100 on all 4 layers
    w, f = _time_model(model), _time_model(as_full_attention(model))
    assert w.step_ps(8, 8 * 50, (), [0]) == f.step_ps(8, 8 * 50)
    at_window = w.step_ps(8, 8 * 100, (), [0])
    past = w.step_ps(8, 8 * 3000, (), [8 * 2900])
    assert past == at_window < f.step_ps(8, 8 * 3000)
    # the full-attention layout prices as the time model without a layout (every layer
    # reading the whole context), up to per-layer rounding
    plain = _time_model(as_full_attention(model), layout=False)
    assert f.step_ps(8, 8 * 3000) == pytest.approx(plain.step_ps(8, 8 * 3000), rel=1e-4)


def test_cross_attention_decode_priced_by_the_encoder_length() -> None:
    model = MODELS["cross_attention"]  # 2 full layers + 2 cross layers over 40 tokens
    tm = _time_model(model)
    short, long = tm.step_ps(1, 10), tm.step_ps(1, 5000)
    only_full = TimeModel(tm.profile, tm.geometry, tm.weight_bytes, tm.params, 16,
                          layout=AttentionLayout((LayoutGroup(4),)))  # fmt: skip
    # growth with context comes from the 2 full layers only: half the all-full slope
    assert (long - short) == pytest.approx((only_full.step_ps(1, 5000) - only_full.step_ps(1, 10)) / 2, rel=1e-3)  # fmt: skip


def test_windowed_model_serves_a_long_trace_faster_than_full_attention() -> None:
    model = MODELS["sliding_window"]
    full = as_full_attention(model)
    trace = _trace(40, 0.0)
    fast = _engine(model, _time_model(model), "event", 4000).run(trace)
    slow = _engine(full, _time_model(full), "event", 4000).run(trace)
    assert fast.decisions() == slow.decisions()  # memory is ample: same schedule
    assert fast.modeled_seconds < slow.modeled_seconds


def test_layout_refuses_bad_values() -> None:
    with pytest.raises(ConfigError, match="layers"):
        TimeModel(get_profile("a100-80gb"), KVGeometry(4, HEADS, DIM, "float16"), 1, 1.0,
                  layout=AttentionLayout((LayoutGroup(3),)))  # fmt: skip
    with pytest.raises(ConfigError, match="window"):
        LayoutGroup(2, window=0)
    with pytest.raises(ConfigError, match="self-attention"):
        AttentionLayout((LayoutGroup(2, encoder_len=8),))
    # one page size (2 layers x 8 heads x 128 = 4 layers x 8 heads x 64), two shapes
    mixed = ModelKVSpec("mixed", (*MODELS["hybrid"].groups[:1],
                                  *group_layers("x", [FULL] * 4, HEADS, 64).groups))  # fmt: skip
    with pytest.raises(ConfigError, match="shapes"):
        AttentionLayout.from_spec(mixed)


def test_sliding_window_step_without_excess_prices_one_decoder_exactly() -> None:
    """Callers without the decoders' contexts (the latency floor, decode_ps) get the
    excess of equal contexts: exact for one decoder."""
    tm = _time_model(MODELS["hybrid_two_windows"])  # windows 37 and 200
    for c1 in (1, 37, 38, 150, 500):
        assert tm.decode_ps(c1) == tm.step_ps(1, c1, (), [max(0, c1 - 37), max(0, c1 - 200)])


@pytest.mark.parametrize("sharing", ["parallel", "beam"])
def test_sliding_window_hybrid_forks_and_beams_time_event_as_token(sharing: str) -> None:
    """n-sample forks and beam groups (which advance their lines outside the decode
    phase) keep the per-window aggregates right: event mode times as token mode, with
    the invariants checked after every step."""
    model = MODELS["hybrid_two_windows"]  # windows 37 and 200 and a full layer
    tm = _time_model(model)
    base = generate("sharegpt", 30, seed=9, sharing=sharing, n=3, beam_width=3)
    reqs = tuple(
        dataclasses.replace(r, arrival=i * 0.001, prompt_len=min(r.prompt_len, 200),
                            output_len=min(r.output_len, 120))
        for i, r in enumerate(base.requests)
    )  # fmt: skip
    trace = Trace(reqs, base.meta)
    event = _engine(model, tm, "event", 700).run(trace)
    token = _engine(model, tm, "token", 700).run(trace)
    assert event.decisions() == token.decisions()
    assert event.modeled_seconds == token.modeled_seconds
