"""PagedKVCache example tests that pin exact behaviour: which blocks a prefix hit reuses,
that the last prompt token is recomputed, salt and adapter isolation, copy-on-write iff the
shared last block is partial, eviction order, watermark admission, bit-identical swap,
memory-only mode, and the stats it reports."""

from __future__ import annotations

import pytest
import torch

from kvbench.paged.cache import PagedKVCache
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.contract import KVCache
from kvbench.reference.oracle import batched_decode_attention, relative_error, tolerance
from kvbench.suites.conformance.paged_model import bitwise_equal, kv_for
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    RequestStateError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry

G = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32", num_q_heads=4)
F32 = torch.float32


def make(num_blocks: int = 16, block_size: int = 4, **kw: object) -> PagedKVCache:
    return PagedKVCache(G, num_blocks, block_size, **kw)  # type: ignore[arg-type]


def fill(cache: PagedKVCache, rid: object, prompt: list[int], salt: str | None = None) -> int:
    """Admit and append the whole prompt with model KV; return the cached token count."""
    cached = cache.admit(rid, prompt, salt=salt)
    k, v = kv_for(G, F32, prompt, salt, cached, len(prompt))
    cache.append(rid, k, v)
    return cached


def test_implements_the_contract() -> None:
    assert isinstance(make(), KVCache)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_blocks": 0}, "num_blocks"),
        ({"num_blocks": -3}, "num_blocks"),
        ({"block_size": 0}, "block_size"),
        ({"watermark": 1.0}, "watermark"),
        ({"watermark": -0.1}, "watermark"),
        ({"num_cpu_blocks": -1}, "num_cpu_blocks"),
        ({"max_seq_len": 0}, "max_seq_len"),
        ({"kernel_backend": "cuda-magic"}, "cuda-magic"),
    ],
)
def test_bad_configuration_names_the_value(kwargs: dict, match: str) -> None:
    args = {"num_blocks": 8, "block_size": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
        make(**args)


def test_prefix_hit_reuses_the_same_physical_blocks_and_their_kv() -> None:
    cache = make()
    prompt = list(range(14))  # 3 full blocks of 4 + 2
    assert fill(cache, "a", prompt) == 0
    table_a = cache.block_table("a")
    assert fill(cache, "b", [*prompt[:12], 99]) == 12
    assert cache.block_table("b")[:3] == table_a[:3]
    assert cache.block_table("b")[3] not in table_a
    ka, _ = cache.gather("a")
    kb, _ = cache.gather("b")
    assert bitwise_equal(ka[:, :12], kb[:, :12])
    p = cache.prefix_stats()
    assert (p.lookups, p.queried_tokens, p.hit_blocks, p.hit_tokens) == (2, 27, 3, 12)
    assert p.hit_rate == pytest.approx(12 / 27)
    cache.check()


def test_the_last_prompt_token_is_always_recomputed() -> None:
    cache = make()
    fill(cache, "a", list(range(8)))  # exactly two full blocks
    assert cache.admit("b", list(range(8))) == 4  # not 8: the last token is computed again
    assert cache.admit("c", list(range(5))) == 4
    assert cache.admit("d", list(range(4))) == 0  # one block: nothing may be reused
    cache.check()


def test_a_freed_requests_blocks_stay_findable_until_evicted() -> None:
    cache = make(num_blocks=4)
    fill(cache, "a", list(range(9)))  # 3 blocks: two full (cached) + one partial
    cache.free("a")
    assert cache.prefix_stats().evictable_blocks == 2
    assert cache.admit("b", list(range(9))) == 8
    cache.check()


@pytest.mark.parametrize(("salt_a", "salt_b"), [("x", "y"), (None, "x"), ("x", None)])
def test_different_salts_never_share(salt_a: str | None, salt_b: str | None) -> None:
    cache = make()
    fill(cache, "a", list(range(9)), salt=salt_a)
    assert cache.admit("b", list(range(9)), salt=salt_b) == 0
    assert not set(cache.block_table("a")) & set(cache.block_table("b"))
    assert cache.admit("c", list(range(9)), salt=salt_a) == 8


def test_different_adapters_never_share() -> None:
    cache = make()
    cache.admit("a", list(range(9)), adapter_id="lora-1")
    cache.append("a", *kv_for(G, F32, list(range(9)), None, 0, 9))
    assert cache.admit("b", list(range(9)), adapter_id="lora-2") == 0
    assert cache.admit("c", list(range(9))) == 0
    assert cache.admit("d", list(range(9)), adapter_id="lora-1") == 8


def test_blocks_with_unknown_token_ids_are_never_shared() -> None:
    cache = make()
    fill(cache, "a", [1, 2])
    k, v = kv_for(G, F32, [1, 2, 3, 4, 5, 6], None, 2, 6)
    cache.append("a", k, v)  # generated tokens without ids: their blocks are unkeyed
    assert cache.prefix_stats().cached_blocks == 0
    assert cache.admit("b", [1, 2, 3, 4, 5]) == 0


def test_generated_blocks_with_ids_are_shared() -> None:
    cache = make()
    fill(cache, "a", [1, 2])
    k, v = kv_for(G, F32, [1, 2, 3, 4, 5, 6], None, 2, 6)
    cache.append("a", k, v, token_ids=[3, 4, 5, 6])
    assert cache.admit("b", [1, 2, 3, 4, 5]) == 4


def test_a_hash_collision_never_serves_wrong_kv() -> None:
    cache = make(key_fn=lambda parent, tokens, extra: b"always the same key")
    fill(cache, "a", list(range(9)))
    assert fill(cache, "b", [7, 7, 7, 7, 7]) == 0  # same key, other tokens: a miss
    expect_k, _ = kv_for(G, F32, [7, 7, 7, 7, 7], None, 0, 5)
    assert bitwise_equal(cache.gather("b")[0], expect_k)
    cache.check()


@pytest.mark.parametrize(("length", "copies"), [(6, 1), (8, 0), (5, 1), (4, 0)])
def test_copy_on_write_happens_iff_the_shared_last_block_is_partial(
    length: int, copies: int
) -> None:
    cache = make()
    prompt = list(range(length))
    fill(cache, "p", prompt)
    cache.fork("p", "c")
    assert cache.block_table("c") == cache.block_table("p")
    assert cache.stats().shared_blocks == -(-length // 4)
    before_parent = cache.gather("p")
    k, v = kv_for(G, F32, [*prompt, 42], None, length, length + 1)
    cache.append("c", k, v, token_ids=[42])
    assert cache.stats().cow_copies == copies
    pt, ct = cache.block_table("p"), cache.block_table("c")
    full = length // 4
    assert ct[:full] == pt[:full]  # full blocks stay shared
    if copies:
        assert ct[full] != pt[full]  # the partial block was copied before the write
        assert len(ct) == len(pt)
    else:
        assert len(ct) == len(pt) + 1  # a fresh block, no copy
    # the parent is untouched; the child has the parent's tokens plus its own
    assert all(bitwise_equal(a, b) for a, b in zip(before_parent, cache.gather("p"), strict=True))
    expect = kv_for(G, F32, [*prompt, 42], None, 0, length + 1)
    assert all(bitwise_equal(a, b) for a, b in zip(expect, cache.gather("c"), strict=True))
    cache.check()


def test_writing_into_a_block_no_longer_shared_does_not_copy() -> None:
    cache = make()
    fill(cache, "p", [1, 2, 3, 4, 5, 6])
    cache.fork("p", "c")
    cache.append("c", *kv_for(G, F32, [1, 2, 3, 4, 5, 6, 7], None, 6, 7), token_ids=[7])
    cache.append("p", *kv_for(G, F32, [1, 2, 3, 4, 5, 6, 8], None, 6, 7), token_ids=[8])
    assert cache.stats().cow_copies == 1  # the parent now owns its partial block alone


def test_fork_in_the_middle_of_a_prompt_gives_the_child_its_own_reservation() -> None:
    cache = make()
    prompt = list(range(10))
    cache.admit("p", prompt)
    cache.append("p", *kv_for(G, F32, prompt, None, 0, 5))
    cache.fork("p", "c")
    pt, ct = cache.block_table("p"), cache.block_table("c")
    assert ct[:2] == pt[:2] and ct[2] != pt[2]
    cache.append("c", *kv_for(G, F32, prompt, None, 5, 10))
    assert cache.stats().cow_copies == 1
    cache.check()


def test_eviction_takes_the_least_recently_freed_deepest_blocks_first() -> None:
    cache = make(num_blocks=6)
    fill(cache, "a", list(range(9)))  # blocks 0, 1 full (cached), 2 partial
    fill(cache, "b", list(range(100, 109)))  # blocks 3, 4 full (cached), 5 partial
    cache.free("a")
    cache.free("b")
    assert cache.pool.lru_order() == [1, 0, 4, 3]
    assert cache.pool.free_stack()[-2:] == [2, 5]
    # a 4-block prompt takes the two free blocks first, then evicts a's tail, then a's head
    cache.admit("c", list(range(200, 216)))
    assert cache.block_table("c") == [5, 2, 1, 0]
    assert cache.prefix_stats().evictions == 2
    assert cache.pool.lru_order() == [4, 3]  # b's prefix survived
    assert cache.admit("d", list(range(100, 105))) == 4
    cache.check()


def test_watermark_refuses_new_requests_but_lets_running_ones_grow() -> None:
    cache = make(num_blocks=10, watermark=0.2)  # keeps 2 blocks at admission
    assert cache.watermark_blocks == 2
    fill(cache, "a", list(range(20)))  # 5 blocks, 5 free
    assert cache.can_admit(list(range(100, 112)))  # 3 blocks: 5 - 3 = 2 >= 2
    with pytest.raises(CapacityError, match="watermark keeps 2"):
        cache.admit("b", list(range(100, 113)))  # 4 blocks: 5 - 4 = 1 < 2
    fill(cache, "b", list(range(100, 112)))
    assert cache.num_free_blocks == 2
    tokens = list(range(20))
    for i in range(8):  # a grows into the watermark, block by block
        tokens.append(i)
        cache.append("a", *kv_for(G, F32, tokens, None, len(tokens) - 1, len(tokens)))
    assert cache.num_free_blocks == 0
    assert cache.blocks_needed_to_grow("a", 1) == 1 and not cache.can_grow("a", 1)
    cache.check()


def test_swap_out_and_in_restores_bit_identical_kv_in_other_blocks() -> None:
    cache = make(num_blocks=8, num_cpu_blocks=4)
    prompt = list(range(10))
    fill(cache, "a", prompt)
    before = cache.gather("a")
    table = cache.block_table("a")
    cache.swap_out("a")
    assert cache.is_swapped("a") and cache.stats().swapped_blocks == 3
    fill(cache, "x", list(range(50, 58)))  # reuses the device blocks a released
    cache.swap_in("a")
    assert cache.block_table("a") != table
    after = cache.gather("a")
    assert all(bitwise_equal(x, y) for x, y in zip(before, after, strict=True))
    assert cache.stats().swapped_blocks == 0
    cache.check()


def _forked_family(cache: PagedKVCache) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """'a' with a 10-token prompt (2 full blocks + a partial one) forked into 'b' and 'c';
    'b' then appends a token (copy-on-write of the partial block). Returns each one's KV."""
    prompt = list(range(10))
    fill(cache, "a", prompt)
    cache.fork("a", "b")
    cache.fork("a", "c")
    cache.append("b", *kv_for(G, F32, [*prompt, 77], None, 10, 11))
    return {r: cache.gather(r) for r in ("a", "b", "c")}


def test_group_swap_keeps_sharing_and_kv() -> None:
    """Swapped together, a forked family copies each shared block once (5 distinct
    blocks, not 3 + 3 + 3), comes back holding as many device blocks with the same
    sharing, bit for bit, and copy-on-write still protects the shared partial block."""
    cache = make(num_blocks=12, num_cpu_blocks=5)
    _forked_family(cache)
    used = cache.stats().used_blocks
    refs = [cache.pool.ref[b] for b in cache.block_table("a")]
    assert used == 4 and refs == [3, 3, 2]
    cache.swap_out("a")  # one at a time, each copies all 3 of its blocks
    with pytest.raises(CapacityError, match="needs 3 CPU blocks, 2 of 5 free"):
        cache.swap_out("b")
    cache.swap_in("a")
    cache.check()
    cache = make(num_blocks=12, num_cpu_blocks=5)
    before = _forked_family(cache)
    cache.swap_out_group(["a", "b", "c"])
    assert cache.stats().swapped_blocks == 4 and cache.stats().used_blocks == 0
    cache.check()
    fill(cache, "x", list(range(50, 58)))  # reuses the released device blocks
    cache.swap_in_group(["a", "b", "c"])
    assert cache.stats().used_blocks == 4 + 2 and cache.stats().swapped_blocks == 0
    assert [cache.pool.ref[b] for b in cache.block_table("a")] == [3, 3, 2]
    for r, kv in before.items():
        assert all(bitwise_equal(x, y) for x, y in zip(kv, cache.gather(r), strict=True))
    cache.append("c", *kv_for(G, F32, [*range(10), 5], None, 10, 11))  # copy-on-write
    assert cache.block_table("c")[2] != cache.block_table("a")[2]
    assert all(bitwise_equal(x, y) for x, y in zip(before["a"], cache.gather("a"), strict=True))
    cache.check()


@pytest.mark.parametrize(
    ("ids", "error", "match"),
    [
        ([], ConfigError, "at least one"),
        (["a", "a"], ConfigError, "twice"),
        (["a", "zz"], UnknownRequestError, "zz"),
        (["a", "sw"], RequestStateError, "swapped"),
    ],
)
def test_bad_group_swap_out_changes_nothing(ids, error, match) -> None:
    from kvbench.paged.snapshots import snapshots_equal

    cache = make(num_blocks=16, num_cpu_blocks=8)
    _forked_family(cache)
    fill(cache, "sw", [1, 2, 3])
    cache.swap_out("sw")
    snap = cache.snapshot()
    with pytest.raises(error, match=match):
        cache.swap_out_group(ids)
    assert snapshots_equal(snap, cache.snapshot())


def test_group_swap_is_all_or_nothing_on_capacity() -> None:
    from kvbench.paged.snapshots import snapshots_equal

    cache = make(num_blocks=12, num_cpu_blocks=3)  # the family has 4 distinct blocks
    _forked_family(cache)
    snap = cache.snapshot()
    with pytest.raises(CapacityError, match="needs 4 CPU blocks"):
        cache.swap_out_group(["a", "b", "c"])
    assert snapshots_equal(snap, cache.snapshot())
    cache = make(num_blocks=10, num_cpu_blocks=8, watermark=0.0)
    _forked_family(cache)
    cache.swap_out_group(["a", "b", "c"])
    fill(cache, "x", list(range(50, 74)))  # 6 of 10 blocks: 4 left, the family needs 4
    fill(cache, "y", [9])  # now 3 left
    snap = cache.snapshot()
    with pytest.raises(CapacityError, match="needs 4 blocks, 3 free"):
        cache.swap_in_group(["a", "b", "c"])
    assert snapshots_equal(snap, cache.snapshot())
    with pytest.raises(RequestStateError, match="not swapped"):
        cache.swap_in_group(["a", "x"])
    assert snapshots_equal(snap, cache.snapshot())


def test_memory_only_mode_keeps_identical_bookkeeping() -> None:
    full, lean = make(num_blocks=12, num_cpu_blocks=8), make(num_blocks=12, num_cpu_blocks=8)
    lean = PagedKVCache(G, 12, 4, num_cpu_blocks=8, store_kv=False)
    for cache in (full, lean):
        assert cache.admit("a", list(range(10))) == 0
    full.append("a", *kv_for(G, F32, list(range(10)), None, 0, 10))
    lean.append_tokens("a", 10)
    for cache in (full, lean):
        assert cache.admit("b", list(range(9))) == 8
        cache.fork("a", "c")
        cache.swap_out("b")
    full.append("c", *kv_for(G, F32, [*range(10), 3], None, 10, 11), token_ids=[3])
    lean.append_tokens("c", 1, [3])
    for cache in (full, lean):
        cache.swap_in("b")
        cache.free("a")
        cache.check()
    assert full.stats() == lean.stats()
    assert full.prefix_stats() == lean.prefix_stats()
    for rid in ("b", "c"):
        assert full.block_table(rid) == lean.block_table(rid)
    with pytest.raises(ConfigError, match="memory-only"):
        lean.gather("c")
    with pytest.raises(ConfigError, match="append_tokens"):
        full.append_tokens("c", 1)


def test_memory_only_without_prefix_caching_uses_prompt_lengths_alone() -> None:
    cache = PagedKVCache(G, 100, 16, store_kv=False, enable_prefix_caching=False)
    cache.admit(0, range(500))  # a range is a cheap stand-in for 500 token ids
    assert cache.blocks_needed_to_grow(0, 500) == 0
    cache.append_tokens(0, 500)
    assert cache.blocks_needed_to_grow(0, 12) == 0 and cache.blocks_needed_to_grow(0, 13) == 1
    assert cache.blocks_needed_to_admit(range(33)) == 3
    s = cache.stats()
    assert (s.live_slots, s.used_blocks, s.internal_fragmentation_slots) == (500, 32, 12)


def test_stats_account_every_slot() -> None:
    cache = make(num_blocks=10)
    cache.admit("a", list(range(10)))  # 3 blocks reserved for the prompt
    s = cache.stats()
    assert (s.live_slots, s.reservation_slots, s.internal_fragmentation_slots) == (0, 10, 2)
    cache.append("a", *kv_for(G, F32, list(range(10)), None, 0, 6))
    s = cache.stats()
    assert (s.live_slots, s.reservation_slots, s.internal_fragmentation_slots) == (6, 4, 2)
    cache.append("a", *kv_for(G, F32, list(range(10)), None, 6, 10))
    cache.fork("a", "b")
    s = cache.stats()
    assert (s.live_slots, s.reservation_slots, s.internal_fragmentation_slots) == (10, 0, 2)
    assert (s.logical_tokens, s.used_blocks, s.shared_blocks, s.free_blocks) == (20, 3, 3, 7)
    assert s.free_slots + s.reserved_slots == s.capacity_slots == 40
    assert s.external_fragmentation_slots == 0
    assert s.bytes_per_slot == G.bytes_per_token


def test_attend_matches_the_float64_oracle_with_gqa() -> None:
    cache = make()
    prompts = {"a": list(range(11)), "b": [5, 6, 7], "c": list(range(30, 46))}
    for rid, prompt in prompts.items():
        fill(cache, rid, prompt)
    query = torch.randn(3, 4, 8, generator=torch.Generator().manual_seed(0))
    for layer in range(2):
        out = cache.attend(list(prompts), query, layer)
        keys = [cache.gather(r)[0][layer] for r in prompts]
        values = [cache.gather(r)[1][layer] for r in prompts]
        ref = batched_decode_attention(query, keys, values)
        assert relative_error(out, ref) <= tolerance(F32)


def test_block_tables_tensor_has_the_kernel_layout() -> None:
    cache = make()
    fill(cache, "a", list(range(9)))
    fill(cache, "b", [1])
    tables, lens = cache.block_tables(["a", "b"])
    assert tables.dtype == torch.int32 and lens.dtype == torch.int32
    assert tables.shape == (2, 3)
    assert tables[0].tolist() == cache.block_table("a")
    assert tables[1, 0].item() == cache.block_table("b")[0]
    assert lens.tolist() == [9, 1]


def test_matches_the_contiguous_reference_on_a_fixed_script() -> None:
    paged, ref = make(), ContiguousKVCache(G, 256, 64)
    prompt = list(range(7))
    for cache in (paged, ref):
        cache.admit(1, prompt)
        cache.append(1, *kv_for(G, F32, prompt, None, 0, 7))
        cache.fork(1, 2)
        cache.append(2, *kv_for(G, F32, [*prompt, 9], None, 7, 8), token_ids=[9])
    for rid in (1, 2):
        assert all(
            bitwise_equal(x, y) for x, y in zip(paged.gather(rid), ref.gather(rid), strict=True)
        )
        assert paged.token_ids(rid) == ref.token_ids(rid)


def test_attend_ignores_garbage_past_the_sequence_end() -> None:
    cache = make()
    fill(cache, "a", [1, 2, 3, 4, 5])  # block 1 holds 1 token and 3 unwritten slots
    block = cache.block_table("a")[1]
    for layer in range(2):
        cache.key_cache(layer)[block, 1:] = float("nan")
        cache.value_cache(layer)[block, 1:] = float("nan")
    query = torch.randn(1, 4, 8)
    out = cache.attend(["a"], query)
    k, v = cache.gather("a")
    ref = batched_decode_attention(query, [k[0]], [v[0]])
    assert relative_error(out, ref) <= tolerance(F32)
