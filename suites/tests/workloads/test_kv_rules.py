"""The attention-kind table (`workloads.kv_rules`): every kind has exactly one rule, and
each rule's answers equal a brute-force definition written from what a query reads.

The brute force knows only `_reads(spec, p)`, the positions a query at p attends to
(written out from HF / vLLM's definitions, not from the rules), and counts blocks by
enumerating positions; hypothesis (the project's profile) draws kinds, windows, block
sizes and positions over small ranges.
"""

from __future__ import annotations

import inspect

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvbench.workloads import kv_rules
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_rules import RULES, KindRule, capped_sum, rule_for, rule_for_window
from kvbench.workloads.kv_spec import AttentionKind, KVCacheSpec

SPECS = st.one_of(
    st.just(KVCacheSpec.full()),
    st.integers(1, 40).map(KVCacheSpec.sliding_window),
    st.integers(1, 40).map(KVCacheSpec.chunked_local),
    st.integers(1, 40).map(KVCacheSpec.cross_attention),
)
SELF_SPECS = st.one_of(
    st.just(KVCacheSpec.full()),
    st.integers(1, 40).map(KVCacheSpec.sliding_window),
    st.integers(1, 40).map(KVCacheSpec.chunked_local),
)
BLOCKS = st.integers(1, 9)
POSITIONS = st.integers(0, 90)


def _reads(spec: KVCacheSpec, p: int) -> set[int]:
    """Positions a query at p attends to (cross-attention: the encoder's positions)."""
    if spec.kind is AttentionKind.CROSS:
        assert spec.encoder_len is not None
        return set(range(spec.encoder_len))
    if spec.kind is AttentionKind.SLIDING_WINDOW:
        assert spec.window is not None
        return {k for k in range(p + 1) if p - k < spec.window}
    if spec.kind is AttentionKind.CHUNKED_LOCAL:
        assert spec.chunk is not None  # Llama 4: same chunk, causal
        return {k for k in range(p + 1) if k // spec.chunk == p // spec.chunk}
    return set(range(p + 1))


def _blocks(positions: set[int] | range, block_size: int) -> set[int]:
    return {k // block_size for k in positions}


# ---------------------------------------------------------------------- the table
def test_every_kind_has_exactly_one_rule() -> None:
    """One rule class per AttentionKind, each answering for its own key; every rule
    class the module defines is in the table once (a new kind cannot be half added)."""
    assert set(RULES) == set(AttentionKind)
    for kind, cls in RULES.items():
        assert cls.kind is kind, (kind, cls)
    assert len(set(RULES.values())) == len(RULES)
    defined = {
        obj
        for obj in vars(kv_rules).values()
        if inspect.isclass(obj) and issubclass(obj, KindRule) and not inspect.isabstract(obj)
    }
    assert defined == set(RULES.values())


@given(SPECS)
def test_rule_for_binds_the_spec(spec: KVCacheSpec) -> None:
    rule = rule_for(spec)
    assert type(rule) is RULES[spec.kind]
    assert rule.spec == spec
    assert rule_for(spec) is rule  # looked up once per spec


def test_a_rule_refuses_another_kinds_spec() -> None:
    with pytest.raises(TypeError, match="sliding_attention"):
        RULES[AttentionKind.SLIDING_WINDOW](KVCacheSpec.full())


@given(SELF_SPECS)
def test_kernel_window_round_trips(spec: KVCacheSpec) -> None:
    """The kernels' `window` argument names the same rule the spec does."""
    rule = rule_for(spec)
    assert rule_for_window(rule.kernel_window).spec == spec
    assert rule.bounded == (rule.kernel_window is not None)


def test_rule_for_window_refuses_a_cross_attention_spec() -> None:
    with pytest.raises(ConfigError, match="self-attention"):
        rule_for_window(KVCacheSpec.cross_attention(5))


@pytest.mark.parametrize("bad", [0, -3, True, 2.5, "8"])
def test_rule_for_window_names_a_bad_window(bad: object) -> None:
    with pytest.raises(ConfigError, match="window"):
        rule_for_window(bad)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- positions
@given(SPECS, st.integers(-1, 90))
def test_first_kept_is_the_first_position_read(spec: KVCacheSpec, p: int) -> None:
    rule = rule_for(spec)
    expected = min(_reads(spec, p), default=0) if p >= 0 else 0
    assert rule.first_kept(p) == expected
    many = rule.first_kept_many(torch.arange(-1, p + 1))
    assert many.tolist() == [rule.first_kept(q) for q in range(-1, p + 1)]


@given(SPECS, POSITIONS, st.integers(1, 12))
def test_reads_and_chunk_counts(spec: KVCacheSpec, ctx: int, n: int) -> None:
    rule = rule_for(spec)
    queries = range(ctx, ctx + n)
    assert rule.reads(ctx) == len(_reads(spec, ctx))
    assert rule.chunk_reads(ctx, n) == len(set().union(*(_reads(spec, q) for q in queries)))
    assert rule.chunk_pairs(ctx, n) == sum(len(_reads(spec, q)) for q in queries)


@given(SPECS, st.lists(st.integers(0, 60), max_size=6))
def test_decode_reads_and_slope(spec: KVCacheSpec, contexts: list[int]) -> None:
    """Decoders at contexts c (their query at position c): the aggregate the time model
    passes (kv_read, excess over reach, decoders past reach) gives their summed reads."""
    rule = rule_for(spec)
    d = len(contexts)
    kv_read = sum(c + 1 for c in contexts)
    reach = rule.reach
    excess = sum(max(0, c + 1 - reach) for c in contexts) if reach is not None else 0
    above = sum(1 for c in contexts if reach is not None and c + 1 >= reach)
    now = sum(len(_reads(spec, c)) for c in contexts)
    later = sum(len(_reads(spec, c + 1)) for c in contexts)
    if spec.kind is AttentionKind.CHUNKED_LOCAL:
        # priced as min(c + 1, C): an upper bound of the exact reads
        bound = sum(min(c + 1, reach) for c in contexts)  # type: ignore[type-var]
        assert rule.decode_reads(d, kv_read, excess) == bound >= now
        return
    assert rule.decode_reads(d, kv_read, excess) == now
    assert rule.decode_slope(d, above) == later - now


@given(st.integers(0, 40), st.integers(-1, 40), st.one_of(st.none(), st.integers(1, 30)))
def test_capped_sum(a: int, b: int, cap: int | None) -> None:
    assert capped_sum(a, b, cap) == sum(q if cap is None else min(q, cap) for q in range(a, b + 1))


# ---------------------------------------------------------------------- blocks
@given(SPECS, POSITIONS, st.integers(0, 12), BLOCKS)
def test_blocks_in_step(spec: KVCacheSpec, computed: int, new: int, bs: int) -> None:
    """A step computing positions c .. c + n - 1 holds the blocks of first_kept(c) ..
    c + n - 1 (cross: the encoder's blocks), none before the first token."""
    rule = rule_for(spec)
    if spec.kind is AttentionKind.CROSS:
        expected = len(_blocks(_reads(spec, 0), bs))
    elif computed + new == 0:
        expected = 0
    elif new == 0:
        return  # not a step (the planner never asks)
    else:
        expected = len(_blocks(range(min(_reads(spec, computed)), computed + new), bs))
    assert rule.blocks_in_step(computed, new, bs) == expected


@given(SPECS, POSITIONS, st.integers(0, 12), BLOCKS, st.integers(0, 3))
def test_blocks_to_grow(spec: KVCacheSpec, seq_len: int, n: int, bs: int, extra: int) -> None:
    """New blocks = blocks of positions 0 .. seq_len + n - 1 beyond the table (a table
    may already be longer, e.g. a fork's prompt reservation); cross never grows."""
    rule = rule_for(spec)
    table = len(_blocks(range(seq_len), bs)) + extra
    if spec.kind is AttentionKind.CROSS:
        expected = 0
    else:
        expected = max(0, len(_blocks(range(seq_len + n), bs)) - table)
    assert rule.blocks_to_grow(table, seq_len, n, bs) == expected


@given(SPECS, st.integers(0, 12), BLOCKS)
def test_release_point(spec: KVCacheSpec, block: int, bs: int) -> None:
    """The first query position that reads nothing of `block` (None: every query does)."""
    rule = rule_for(spec)
    horizon = (block + 1) * bs + 45
    first = next(
        (q for q in range(horizon) if q >= (block + 1) * bs and not _blocks(_reads(spec, q), bs)
         & {block}),
        None,
    )  # fmt: skip
    if not rule.bounded:
        first = None  # full attention and the encoder's blocks are read by every query
    assert rule.release_point(block, bs) == first


@given(SPECS, st.integers(0, 12), BLOCKS)
def test_hit_blocks_by_vllms_rule(spec: KVCacheSpec, hit: int, bs: int) -> None:
    """A hit of m blocks needs the blocks the first computed token (position m x bs)
    reads below it, plus the hit's last block (chunked local: not that one, vLLM's
    ChunkedLocalAttentionManager counts blocks before the chunk as computed);
    cross-attention is never cached."""
    rule = rule_for(spec)
    got = rule.hit_blocks(hit, bs)
    if spec.kind is AttentionKind.CROSS or hit == 0:
        assert list(got) == []
        return
    c = hit * bs
    last = set() if spec.kind is AttentionKind.CHUNKED_LOCAL else {hit - 1}
    need = _blocks({k for k in _reads(spec, c) if k < c}, bs) | last
    assert set(got) == need and list(got) == sorted(need)


@given(SPECS, st.integers(1, 60), st.integers(1, 20), BLOCKS)
def test_prefill_pages_bound_every_chunk(spec: KVCacheSpec, plen: int, chunk: int, bs: int) -> None:
    """No prefill chunk of at most `chunk` tokens, anywhere in the prompt, holds more
    than the reservation; the reservation is reached once the prompt leaves room for
    the worst block alignment (and always under full attention)."""
    rule = rule_for(spec)
    pages = rule.prefill_pages(plen, chunk, bs)
    if spec.kind is AttentionKind.CROSS:
        assert pages == 0
        return
    prompt_blocks = len(_blocks(range(plen), bs))
    worst = max(
        len(_blocks(range(min(_reads(spec, a)), a + n), bs))
        for a in range(plen)
        for n in range(1, min(chunk, plen - a) + 1)
    )
    assert worst <= pages <= prompt_blocks
    window = spec.window
    if window is None or plen >= window + chunk + bs - 2:
        assert pages == worst


@given(SPECS, st.integers(1, 80), BLOCKS)
def test_read_span(spec: KVCacheSpec, max_len: int, bs: int) -> None:
    """Tokens from a sequence's first read block to its end, the most over lengths up
    to max_len (the decode launch size)."""
    rule = rule_for(spec)
    expected = max_len  # cross-attention: the whole encoder output
    if spec.kind is not AttentionKind.CROSS:
        expected = max(
            length - min(_reads(spec, length - 1)) // bs * bs for length in range(1, max_len + 1)
        )
    assert rule.read_span(max_len, bs) == expected


@given(SPECS, st.integers(1, 8))
def test_phase_ends_is_the_last_step_reading_from_zero(spec: KVCacheSpec, step: int) -> None:
    rule = rule_for(spec)
    for e in rule.phase_ends(step):
        assert min(_reads(spec, e * step)) == 0
        assert min(_reads(spec, (e + 1) * step)) > 0
    if spec.kind is not AttentionKind.SLIDING_WINDOW:
        assert rule.phase_ends(step) == ()


@given(SPECS)
def test_as_full_widens_bounded_kinds_only(spec: KVCacheSpec) -> None:
    widened = rule_for(spec).as_full()
    if rule_for(spec).bounded:
        assert widened == KVCacheSpec.full()
    else:
        assert widened == spec


@given(SELF_SPECS, st.integers(1, 8), BLOCKS, st.integers(0, 40))
def test_period_repeats_the_held_count(spec: KVCacheSpec, step: int, bs: int, k: int) -> None:
    """Past the phase ends, the blocks a step holds repeat every `period` steps (the
    capacity planner's search relies on it); chunked local with whole-block chunks."""
    if spec.chunk is not None and spec.chunk % bs:
        return  # pages are planned only for whole-block chunks (KVCacheSpec.check_block_size)
    rule = rule_for(spec)
    if not rule.bounded:
        return  # full attention only grows
    k += max(rule.phase_ends(step), default=-1) + 1
    period = rule.period(step, bs)
    held = [rule.blocks_in_step(j * step, step, bs) for j in (k, k + period)]
    assert held[0] == held[1]


@pytest.mark.parametrize("chunk, bs", [(8, 3), (5, 16), (12, 8)])
def test_a_chunk_not_a_whole_number_of_blocks_is_refused(chunk: int, bs: int) -> None:
    with pytest.raises(ConfigError, match=f"chunk={chunk} is not a multiple of block_size={bs}"):
        KVCacheSpec.chunked_local(chunk).check_block_size(bs)
    KVCacheSpec.chunked_local(chunk * bs).check_block_size(bs)
