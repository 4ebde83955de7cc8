"""ContiguousKVCache: reservation policies, fragmentation accounting, atomic failures."""

from __future__ import annotations

import copy

import pytest
import torch

from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.reference.contract import KVCache
from kvbench.reference.oracle import decode_attention
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry

GEOMETRY = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32", num_q_heads=4)


def kv(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    shape = (GEOMETRY.num_layers, n, GEOMETRY.num_kv_heads, GEOMETRY.head_dim)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def snapshot(cache: ContiguousKVCache) -> dict:
    assert cache._k is not None and cache._v is not None  # a cache that stores tensors
    return {
        "requests": copy.deepcopy(cache._requests),
        "ranges": list(cache._ranges),
        "k": cache._k.clone(),
        "v": cache._v.clone(),
        "stats": cache.stats(),
    }


def assert_unchanged(cache: ContiguousKVCache, before: dict) -> None:
    after = snapshot(cache)
    assert after["requests"] == before["requests"]
    assert after["ranges"] == before["ranges"]
    assert torch.equal(after["k"], before["k"]) and torch.equal(after["v"], before["v"])
    assert after["stats"] == before["stats"]


def test_implements_the_contract() -> None:
    assert isinstance(ContiguousKVCache(GEOMETRY, 64, 16), KVCache)


def test_max_policy_reserves_max_len_and_accounts_waste() -> None:
    cache = ContiguousKVCache(GEOMETRY, 64, 16, "max")
    assert cache.admit("a", [1, 2, 3, 4], output_len=6) == 0
    stats = cache.stats()
    assert stats.reserved_slots == 16
    assert (stats.live_slots, stats.reservation_slots, stats.internal_fragmentation_slots) == (
        0,
        10,
        6,
    )
    cache.append("a", *kv(4))
    stats = cache.stats()
    assert (stats.live_slots, stats.reservation_slots, stats.internal_fragmentation_slots) == (
        4,
        6,
        6,
    )
    assert stats.free_slots == 48
    assert stats.utilization == pytest.approx(4 / 16)


def test_gather_returns_what_was_appended_across_appends() -> None:
    cache = ContiguousKVCache(GEOMETRY, 64, 16)
    cache.admit(7, [5, 6, 7])
    k1, v1 = kv(3, 1)
    k2, v2 = kv(2, 2)
    cache.append(7, k1, v1)
    cache.append(7, k2, v2, token_ids=[9, 9])
    k, v = cache.gather(7)
    assert torch.equal(k, torch.cat([k1, k2], 1)) and torch.equal(v, torch.cat([v1, v2], 1))
    assert cache.token_ids(7) == [5, 6, 7, 9, 9]
    assert cache.seq_len(7) == 5


def test_pow2_grows_by_relocation_and_keeps_data() -> None:
    cache = ContiguousKVCache(GEOMETRY, 32, 32, "pow2")
    cache.admit("a", [1, 2, 3])  # reserves 4 at [0, 4)
    cache.admit("b", [1])  # reserves 1 at [4, 5)
    ka, va = kv(3, 3)
    cache.append("a", ka, va)
    kb, vb = kv(2, 4)
    cache.append("a", kb, vb)  # 5 tokens: moves to an 8-slot range after b
    assert cache._requests["a"].reserved == 8
    assert cache._requests["a"].start == 5
    k, v = cache.gather("a")
    assert torch.equal(k, torch.cat([ka, kb], 1)) and torch.equal(v, torch.cat([va, vb], 1))


def test_oracle_policy_needs_output_len() -> None:
    cache = ContiguousKVCache(GEOMETRY, 32, 32, "oracle")
    with pytest.raises(ConfigError, match="output_len"):
        cache.admit("a", [1, 2])
    cache.admit("a", [1, 2], output_len=5)
    assert cache.stats().reserved_slots == 7


@pytest.mark.parametrize("policy", ["max", "pow2", "oracle"])
def test_next_growth_is_where_an_append_first_relocates(policy: str) -> None:
    """next_growth is checked against what append does: walking one token at a time,
    the reservation changes exactly at the lengths next_growth named (an oracle hint
    that fell short included: the hint below is 2 tokens short), and never for max."""
    cache = ContiguousKVCache(GEOMETRY, 64, 24, policy, store_kv=False)
    cache.admit("a", [1, 2, 3], output_len=4)  # 3 + 4 reserved; 3 + 6 will come
    for length in range(9):
        point = cache.next_growth("a", length)
        before = cache.reservation("a")
        cache.append_tokens("a", 1)
        grew = cache.reservation("a") != before
        assert point >= length
        assert grew == (point == length), (policy, length, point, before)


def test_a_chunk_admitted_with_everything_to_come_reserves_it_all() -> None:
    """The admit hint counts the tokens after the admitted ones (contract.admit): a
    first chunk of 4 of a 7-token prompt with 3 to generate reserves all 10 under oracle."""
    cache = ContiguousKVCache(GEOMETRY, 64, 24, "oracle", store_kv=False)
    cache.admit("a", [0] * 4, output_len=3 + 3)
    assert cache.reservation("a")[1] == 10


def test_external_fragmentation_refuses_admission_with_enough_free_slots() -> None:
    cache = ContiguousKVCache(GEOMETRY, 40, 16, "max")
    for rid in ("a", "b"):
        cache.admit(rid, [1])
    cache.free("a")  # free: [0, 16) and [32, 40): 24 slots, largest gap 16
    cache.admit("c", [1])  # takes [0, 16)
    stats = cache.stats()
    assert stats.free_slots == 8
    assert stats.external_fragmentation_slots == 8
    with pytest.raises(CapacityError, match="8 free in total"):
        cache.admit("d", [1])


def test_fork_copies_and_diverges() -> None:
    cache = ContiguousKVCache(GEOMETRY, 64, 16)
    cache.admit("p", [1, 2])
    cache.append("p", *kv(2, 5))
    cache.fork("p", "c")
    cache.append("c", *kv(1, 6))
    assert cache.seq_len("p") == 2 and cache.seq_len("c") == 3
    kp, _ = cache.gather("p")
    kc, _ = cache.gather("c")
    assert torch.equal(kc[:, :2], kp)


def test_attend_matches_oracle_on_gathered_kv() -> None:
    cache = ContiguousKVCache(GEOMETRY, 64, 16)
    for i, n in enumerate((3, 9)):
        cache.admit(i, list(range(n)))
        cache.append(i, *kv(n, 10 + i))
    q = torch.randn(2, 4, 8, generator=torch.Generator().manual_seed(3))
    out = cache.attend([0, 1], q, layer=1)
    for i in range(2):
        k, v = cache.gather(i)
        assert torch.allclose(out[i], decode_attention(q[i], k[1], v[1]).float(), atol=1e-6)


def test_free_releases_everything() -> None:
    cache = ContiguousKVCache(GEOMETRY, 64, 16)
    cache.admit("a", [1])
    cache.free("a")
    stats = cache.stats()
    assert stats.free_slots == 64 and stats.num_requests == 0 and cache.request_ids() == []


def test_memory_only_mode_keeps_the_same_books() -> None:
    full = ContiguousKVCache(GEOMETRY, 64, 16, "pow2")
    light = ContiguousKVCache(GEOMETRY, 64, 16, "pow2", store_kv=False)
    for cache in (full, light):
        cache.admit("a", [1, 2, 3])
        cache.append("a", *kv(5))
    assert full.stats() == light.stats()
    with pytest.raises(ConfigError, match="memory-only"):
        light.gather("a")


def _failing_operations(cache: ContiguousKVCache):
    good_k, good_v = kv(2)
    return [
        (lambda: cache.admit("a", [1]), DuplicateRequestError, "'a'"),
        (lambda: cache.admit("z", []), ConfigError, "empty"),
        (lambda: cache.admit("z", [1] * 17), ConfigError, "17 tokens"),
        (lambda: cache.admit("z", [1, -4]), ConfigError, "-4"),
        (lambda: cache.admit("z", [1]), CapacityError, "'z'"),
        (lambda: cache.append("nope", good_k, good_v), UnknownRequestError, "'nope'"),
        (lambda: cache.append("a", good_k[:1], good_v[:1]), ShapeError, "num_layers=2"),
        (lambda: cache.append("a", good_k.double(), good_v.double()), ShapeError, "float64"),
        (lambda: cache.append("a", good_k, good_v[:, :1]), ShapeError, "differ"),
        (lambda: cache.append("a", good_k, good_v, token_ids=[1]), ShapeError, "token_ids"),
        (lambda: cache.append("a", *kv(15)), CapacityError, "max_seq_len=16"),
        (lambda: cache.fork("nope", "c"), UnknownRequestError, "'nope'"),
        (lambda: cache.fork("a", "b"), DuplicateRequestError, "'b'"),
        (lambda: cache.fork("a", "c"), CapacityError, "'c'"),
        (lambda: cache.free("nope"), UnknownRequestError, "'nope'"),
        (
            lambda: cache.seq_len(["unhashable"]),  # type: ignore[arg-type]  # deliberately bad input
            UnknownRequestError,
            "unhashable",
        ),
        (lambda: cache.attend(["a"], torch.randn(1, 3, 8)), ShapeError, r"\[1, 4, 8\]"),
        (lambda: cache.attend(["a"], torch.randn(1, 4, 8), layer=5), ConfigError, "layer 5"),
    ]


@pytest.mark.parametrize("index", range(18))
def test_failed_operations_change_nothing(index: int) -> None:
    cache = ContiguousKVCache(GEOMETRY, 32, 16, "max")
    cache.admit("a", [1, 2])
    cache.append("a", *kv(2, 1))
    cache.admit("b", [3])
    cache.append("b", *kv(1, 2))
    operations = _failing_operations(cache)
    assert len(operations) == 18
    call, error, names = operations[index]
    before = snapshot(cache)
    with pytest.raises(error, match=names):
        call()
    assert_unchanged(cache, before)


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        ({"capacity_tokens": 0, "max_seq_len": 4}, "capacity_tokens"),
        ({"capacity_tokens": 8, "max_seq_len": -1}, "max_seq_len"),
        ({"capacity_tokens": 8, "max_seq_len": 4, "policy": "best"}, "best"),
    ],
)
def test_bad_construction(kwargs: dict, names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        ContiguousKVCache(GEOMETRY, **kwargs)
