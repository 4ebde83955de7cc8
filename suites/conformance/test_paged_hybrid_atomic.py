"""The layer-group caches under every group order, with failures: reproductions of
issue 36 (1-4) pinned as tests.

1. The capacity answer (`blocks_needed_to_append`) and `append` agree whatever the order
   of the groups (a full-attention group listed before the windows that free its room).
2. A failed append changes nothing (an allocation failure injected after the windows
   released their blocks is rolled back), and `check()` compares every group's length.
3. Right after a prefix hit that keeps less than the newest token's window (window mod
   block == 1), `gather` and `attend` both refuse with IndexRangeError; one append later
   both read what the reference reads.
4. A dtype the layer-group cache cannot store (fp8) is refused at construction.

The serving cache of layer groups (`paged.spec_serving`) had the same group-order defect
and is pinned here too.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels.validation import IndexRangeError
from kvbench.paged.layer_groups import LayerGroupsPagedCache
from kvbench.paged.spec_serving import LayerGroupServingCache
from kvbench.reference import oracle
from kvbench.reference.layer_groups import LayerGroupsReferenceCache
from kvbench.workloads.errors import CapacityError, ConfigError
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec

S = KVCacheSpec
FULL, W3 = S.full(), S.sliding_window(3)
#: Group orders of one full group and two windows of 3 (issue 36, reproduction 1).
ORDERS = {
    "full first": [FULL, W3, W3],
    "windows first": [W3, W3, FULL],
    "windows around the full group": [W3, FULL, W3],
}


def _model(specs: list[KVCacheSpec], heads: int = 1, dim: int = 4) -> ModelKVSpec:
    return ModelKVSpec("m", tuple(LayerGroup(s, 1, heads, dim, "float32") for s in specs))


def _kv(n: int, heads: int = 1, dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    k = torch.randn((1, n, heads, dim))
    return k, -k


@pytest.mark.parametrize("order", list(ORDERS))
def test_capacity_answer_and_append_agree_in_every_group_order(order: str) -> None:
    """9 blocks of 2, 6 tokens: every block in use; the next token takes one block per
    group and the two windows free two each, so the answer is -1 and the append fits
    (it was refused with the full group first: it allocated before any window freed)."""
    cache = LayerGroupsPagedCache(_model(ORDERS[order]), num_blocks=9, block_size=2)
    cache.admit("r")
    cache.append("r", [_kv(6)] * 3)
    assert cache.num_free_blocks == 0
    need = cache.blocks_needed_to_append("r", 1)
    assert need == -1
    cache.append("r", [_kv(1)] * 3)
    cache.check()
    assert cache.num_free_blocks == -need


@pytest.mark.parametrize("order", list(ORDERS))
def test_serving_cache_grows_in_every_group_order(order: str) -> None:
    """The memory-only serving cache of the same model: a decode token after a 6-token
    prompt fits in every order (it was refused with the full group first)."""
    cache = LayerGroupServingCache(_model(ORDERS[order]), num_blocks=9, block_size=2)
    cache.admit("r", list(range(6)))
    cache.append_tokens("r", 6)
    assert cache.num_free_blocks == 0
    cache.append_tokens("r", 1)
    cache.check()
    assert cache.num_free_blocks == 1  # 3 taken, 4 released


def test_failed_append_changes_nothing_and_check_compares_group_lengths() -> None:
    """Issue 36, reproduction 2 (window 3, full, window 5; 11 blocks of 3; appends of 5,
    5, 3): the third append fits once every window releases first; an allocation that
    fails after the releases is rolled back; and `check()` catches groups whose lengths
    differ."""
    model = _model([S.sliding_window(3), FULL, S.sliding_window(5)])
    cache = LayerGroupsPagedCache(model, num_blocks=11, block_size=3)
    cache.admit("r")
    cache.append("r", [_kv(5)] * 3)
    cache.append("r", [_kv(5)] * 3)
    before = cache.snapshot()

    def refuse(n: int) -> list[int]:
        raise CapacityError(f"injected: no {n} blocks")

    pool_allocate = cache.pool.allocate_many
    cache.pool.allocate_many = refuse  # type: ignore[method-assign]
    with pytest.raises(CapacityError, match="injected"):
        cache.append("r", [_kv(3)] * 3)
    cache.pool.allocate_many = pool_allocate  # type: ignore[method-assign]
    assert cache.snapshot() == before
    cache.check()
    cache.append("r", [_kv(3)] * 3)
    cache.check()
    assert [cache._requests["r"][g].seq_len for g in range(3)] == [13, 13, 13]
    cache._requests["r"][0].seq_len += 3  # one group ahead (what the defect left)
    cache._requests["r"][0].blocks.append(cache._requests["r"][0].blocks[-1])
    with pytest.raises(AssertionError, match="length"):
        cache.check()


def test_refused_append_in_a_full_pool_changes_nothing() -> None:
    """An append that does not fit (the windows free less than it takes) is refused
    before anything changes, and the answer said so."""
    model = _model([S.sliding_window(3), FULL, S.sliding_window(5)])
    cache = LayerGroupsPagedCache(model, num_blocks=11, block_size=3)
    cache.admit("r")
    cache.append("r", [_kv(5)] * 3)
    cache.append("r", [_kv(5)] * 3)
    before = cache.snapshot()
    assert cache.blocks_needed_to_append("r", 6) > cache.num_free_blocks
    with pytest.raises(CapacityError):
        cache.append("r", [_kv(6)] * 3)
    assert cache.snapshot() == before


def test_gather_and_attend_refuse_the_same_positions_after_a_prefix_hit() -> None:
    """Issue 36, reproduction 3: two window-4 groups (4 mod 3 == 1), blocks of 3; B hits
    18 tokens of A's prompt and holds only block 5 (positions 15-17: what its next token
    reads). Its newest token's window (14-17) reaches the released block 4: gather and
    attend both raise IndexRangeError (gather read it as a negative slot); one append
    later both read what the reference reads."""
    heads, dim = 2, 8
    model = _model([S.sliding_window(4), S.sliding_window(4)], heads, dim)
    cache = LayerGroupsPagedCache(model, num_blocks=40, block_size=3, enable_prefix_caching=True)
    prompt = list(range(100, 130))
    full = [_kv(30, heads, dim) for _ in range(2)]
    cache.admit("A", prompt=prompt)
    cache.append("A", full)
    hit = cache.admit("B", prompt=[*prompt[:20], 7])
    assert hit == 18 and cache.block_table("B", 0) == [-1] * 5 + [5]
    query = torch.randn((1, heads, dim))
    for group in range(2):
        with pytest.raises(IndexRangeError, match="released"):
            cache.gather("B", group)
        with pytest.raises(IndexRangeError, match="released"):
            cache.attend(["B"], query, group, 0, backend="torch")
    ref = LayerGroupsReferenceCache(model)
    ref.admit("B")
    ref.append("B", [(k[:, :18], v[:, :18]) for k, v in full])
    new = [_kv(1, heads, dim) for _ in range(2)]
    cache.append("B", new)
    ref.append("B", new)
    for group in range(2):
        pk, pv = cache.gather("B", group)
        rk, rv = ref.gather("B", group)
        assert torch.equal(pk, rk) and torch.equal(pv, rv)
        out = cache.attend(["B"], query, group, 0, backend="torch")
        expect = ref.attend(["B"], query, group, 0)
        assert oracle.relative_error(out, expect) <= oracle.tolerance(torch.float32)
    cache.check()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.int8])
def test_dtypes_the_layer_group_cache_cannot_store_are_refused(dtype: torch.dtype) -> None:
    """Issue 36, reproduction 4: an fp8 layer-group cache used to be built, then fail
    its first append late with two blocks leaked; now construction names the dtype."""
    with pytest.raises(ConfigError, match=str(dtype).removeprefix("torch.")):
        LayerGroupsPagedCache(_model([FULL]), num_blocks=8, block_size=2, dtype=dtype)
