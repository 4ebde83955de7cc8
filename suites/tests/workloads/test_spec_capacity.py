"""KV cache specs and their capacity planner: hand-computed figures, the three spec
presets, and a hypothesis property that the planner's peak equals the blocks a simulated
sequence holds under the sliding-window release rule (`workloads.spec_capacity`)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec, group_layers
from kvbench.workloads.spec_capacity import (
    blocks_in_step,
    plan_spec_capacity,
    request_peak_blocks,
    window_block_bound,
)
from kvbench.workloads.spec_presets import get_spec_preset

GiB = 1 << 30


def _one(spec: KVCacheSpec, layers: int = 2) -> ModelKVSpec:
    return ModelKVSpec("t", (LayerGroup(spec, layers, 2, 8),))


@pytest.mark.parametrize(
    ("window", "block", "seq_len", "expected", "why"),
    [
        (5, 4, 100, 2, "5 tokens never touch 3 blocks of 4 (that needs 6)"),
        (6, 4, 100, 3, "positions 3..8 touch blocks 0, 1, 2"),
        (4, 4, 100, 2, "positions 1..4 touch blocks 0 and 1"),
        (8, 4, 100, 3, "positions 1..8 touch blocks 0, 1, 2: ceil(8/4) + 1"),
        (2, 16, 100, 2, "window below a block: positions 15, 16 straddle two blocks"),
        (1, 16, 100, 1, "a window of one token holds one block"),
        (4096, 16, 100, 7, "window longer than the sequence: ceil(100/16)"),
        (4096, 16, 32768, 257, "Mistral-7B: ceil(4096/16) + 1"),
        (6, 4, 6, 2, "sequence as long as the window: positions 0..5"),
        (6, 4, 7, 2, "positions 1..6 touch blocks 0, 1 only; 3..8 is never reached"),
        (6, 4, 9, 3, "positions 3..8 reached at length 9"),
    ],
)
def test_sliding_window_peak_blocks_by_hand(
    window: int, block: int, seq_len: int, expected: int, why: str
) -> None:
    assert request_peak_blocks(_one(KVCacheSpec.sliding_window(window)), seq_len, block) == (
        expected
    ), why


def test_chunked_steps_hold_window_minus_one_plus_the_chunk() -> None:
    """Steps of 4 tokens at block 4, window 8: the step at n=8 keeps positions 1..11
    (blocks 0-2), at n=12 positions 5..15 (blocks 1-3): 3 blocks, never 4."""
    assert request_peak_blocks(_one(KVCacheSpec.sliding_window(8)), 64, 4, step_tokens=4) == 3
    # steps of 3 keep 10 positions: n=15 keeps 8..17 (blocks 2-4), but n=18 keeps 11..20,
    # which touches blocks 2, 3, 4 and 5
    assert request_peak_blocks(_one(KVCacheSpec.sliding_window(8)), 64, 4, step_tokens=3) == 4
    assert request_peak_blocks(_one(KVCacheSpec.sliding_window(8)), 18, 4, step_tokens=3) == 3


def test_cross_attention_is_sized_by_the_encoder_and_never_grows() -> None:
    model = _one(KVCacheSpec.cross_attention(1500))
    assert {request_peak_blocks(model, n, 16) for n in (1, 17, 448, 10_000)} == {94}
    assert blocks_in_step(KVCacheSpec.cross_attention(1500), 0, 1, 16) == 94


def test_full_attention_holds_every_block() -> None:
    assert request_peak_blocks(_one(KVCacheSpec.full()), 1000, 16) == 63  # ceil(1000/16)


def test_mistral_7b_plan_by_hand() -> None:
    """Page: 16 tokens x 32 layers x 2 x 8 heads x 128 x 2 bytes = 2 MiB; 16 GiB holds
    8192 pages; a 32768-token request holds 257 (window) instead of 2048 (full)."""
    plan = plan_spec_capacity(get_spec_preset("mistral-7b"), 16 * GiB, 16, 1000, 32768)
    assert plan.page_bytes == 2 * 1024 * 1024
    assert plan.pages == 8192
    assert not plan.hybrid
    assert plan.pages_per_request_at_avg == 63
    assert plan.pages_per_request_at_max == 257
    assert plan.requests_at_max == 8192 // 257 == 31
    assert plan.pages_per_request_at_max_full == 2048
    assert plan.requests_at_max_full == 4
    assert plan.saved_fraction_at_max == pytest.approx(1 - 257 / 2048)


def test_gemma_2_plan_by_hand() -> None:
    """21 local + 21 global layers: two groups of 21 layers; page 16 x 21 x 2 x 8 x 256 x
    2 B = 2,752,512 B. At 32768 tokens: 257 local + 2048 global pages = 2305."""
    model = get_spec_preset("gemma-2-9b")
    assert [(g.spec, g.num_layers) for g in model.groups] == [
        (KVCacheSpec.sliding_window(4096), 21),
        (KVCacheSpec.full(), 21),
    ]
    assert model.groups[0].layer_ids == tuple(range(0, 42, 2))
    plan = plan_spec_capacity(model, 16 * GiB, 16, 1000, 32768)
    assert plan.hybrid
    assert plan.page_bytes == 16 * 21 * 2 * 8 * 256 * 2 == 2_752_512
    assert plan.pages == 16 * GiB // 2_752_512 == 6241
    assert [g.blocks_at_max for g in plan.groups] == [257, 2048]
    assert plan.pages_per_request_at_max == 2305
    assert plan.pages_per_request_at_max_full == 4096
    assert (plan.requests_at_max, plan.requests_at_max_full) == (2, 1)


def test_encoder_decoder_plan_by_hand() -> None:
    """Whisper large-v3: 32 self-attention + 32 cross-attention layers of 20 x 64; the
    cross group holds ceil(1500/16) = 94 pages whatever the decoder length."""
    plan = plan_spec_capacity(get_spec_preset("whisper-large-v3"), 16 * GiB, 16, 100, 448)
    assert plan.page_bytes == 16 * 32 * 2 * 20 * 64 * 2 == 2_621_440
    assert [g.blocks_at_avg for g in plan.groups] == [7, 94]
    assert [g.blocks_at_max for g in plan.groups] == [28, 94]
    assert plan.pages_per_request_at_max == 122
    assert plan.saved_fraction_at_max == 0.0  # no window to save with


def _simulate_peak(model: ModelKVSpec, seq_len: int, block: int, step: int) -> int:
    """Grow one sequence step by step with explicit sets of logical blocks per group:
    free the blocks wholly before the first position the step's first query reads,
    allocate the blocks its new tokens land in, and check that what is held is exactly
    the blocks the step's queries read (nothing outside the window, nothing missing)."""
    held: list[set[int]] = [set() for _ in model.groups]
    peak = 0
    for computed in range(0, seq_len, step):
        new = min(step, seq_len - computed)
        for g, blocks in zip(model.groups, held, strict=True):
            spec = g.spec
            if spec.encoder_len is not None:  # cross-attention: allocated once at admission
                blocks |= set(range(-(-spec.encoder_len // block)))
                continue
            first = 0 if spec.window is None else max(0, computed - spec.window + 1)
            if spec.chunk is not None:  # Llama 4: the query's own chunk
                first = computed // spec.chunk * spec.chunk
            blocks -= {b for b in blocks if (b + 1) * block <= first}
            blocks |= {p // block for p in range(computed, computed + new)}
            read = {p // block for p in range(first, computed + new)}
            assert blocks == read, (computed, spec)
        peak = max(peak, sum(len(b) for b in held))
    return peak


specs = st.one_of(
    st.builds(KVCacheSpec.sliding_window, st.integers(1, 80)),
    st.just(KVCacheSpec.full()),
    st.builds(KVCacheSpec.cross_attention, st.integers(1, 80)),
    st.builds(KVCacheSpec.chunked_local, st.integers(1, 5)),  # in blocks: see below
)


@settings(max_examples=300, deadline=None)
@given(
    layer_specs=st.lists(specs, min_size=1, max_size=4),
    seq_len=st.integers(1, 300),
    block=st.integers(1, 20),
    step=st.integers(1, 40),
)
def test_planned_blocks_equal_the_blocks_a_simulated_sequence_holds(
    layer_specs: list[KVCacheSpec], seq_len: int, block: int, step: int
) -> None:
    layer_specs = [  # a drawn chunk counts blocks (whole-block chunks, check_block_size)
        KVCacheSpec.chunked_local(s.chunk * block) if s.chunk is not None else s
        for s in layer_specs
    ]
    model = group_layers("h", layer_specs, 2, 8)
    assert request_peak_blocks(model, seq_len, block, step) == _simulate_peak(
        model, seq_len, block, step
    )


@settings(max_examples=200, deadline=None)
@given(window=st.integers(1, 500), block=st.integers(1, 64), seq_len=st.integers(1, 2000))
def test_a_decoding_window_never_exceeds_its_bound(window: int, block: int, seq_len: int) -> None:
    peak = request_peak_blocks(_one(KVCacheSpec.sliding_window(window)), seq_len, block)
    assert peak <= window_block_bound(window, block)


def test_groups_split_into_equal_sizes_by_gcd() -> None:
    local, full = KVCacheSpec.sliding_window(64), KVCacheSpec.full()
    model = group_layers("g3", [local] * 5 + [full] + [local] * 5 + [full] * 4, 2, 8)
    assert sorted((g.spec.describe(), g.num_layers) for g in model.groups) == sorted(
        [("sliding window 64", 5)] * 2 + [("full attention", 5)]
    )


@pytest.mark.parametrize(
    ("make", "names"),
    [
        (lambda: KVCacheSpec.sliding_window(0), "window"),
        (lambda: KVCacheSpec.cross_attention(-3), "encoder_len"),
        (lambda: KVCacheSpec("full_attention", window=8), "window=8"),
        (lambda: KVCacheSpec("chunked_attention"), "chunk must be an integer >= 1, got None"),
        (lambda: KVCacheSpec("mamba"), "mamba"),
        (lambda: KVCacheSpec.chunked_local(0), "chunk must be an integer >= 1, got 0"),
        (lambda: KVCacheSpec.chunked_local(2.5), "got 2.5"),  # type: ignore[arg-type]
        (lambda: KVCacheSpec("full_attention", chunk=8), "chunk=8 given"),
        (
            lambda: request_peak_blocks(_one(KVCacheSpec.chunked_local(24)), 100, 16),
            "chunk=24 is not a multiple of block_size=16",
        ),
        (
            lambda: ModelKVSpec(
                "m",
                (
                    LayerGroup(KVCacheSpec.full(), 2, 2, 8),
                    LayerGroup(KVCacheSpec.sliding_window(4), 3, 2, 8),
                ),
            ),
            "one page size",
        ),
        (lambda: plan_spec_capacity(_one(KVCacheSpec.full()), GiB, 16, 900, 800), "avg_len=900"),
        (lambda: plan_spec_capacity(_one(KVCacheSpec.full()), GiB, 16, step_tokens=0), "step"),
    ],
)
def test_bad_specs_are_refused_by_name(make, names: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises((ConfigError, ValueError), match=names):
        make()
