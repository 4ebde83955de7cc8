"""The paged sliding-window cache (`paged.sliding_window`) against the reference that
keeps every token (`reference.sliding_window`), driven by one hypothesis state machine.

After every step: the window each request's newest token reads is identical in both;
the paged cache holds exactly the blocks the release rule of `workloads.spec_capacity`
plans (no block referenced outside its window, none missing inside it), reference counts
equal the tables that hold each block, and the pool's accounting holds. A failed
operation (the pool cannot supply the blocks) changes nothing in either cache. Windowed
attention through the kernels matches the reference's float64 oracle.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvbench.paged.sliding_window import NULL_BLOCK, SlidingWindowPagedCache
from kvbench.reference import oracle
from kvbench.reference.sliding_window import WindowReferenceCache
from kvbench.workloads.errors import CapacityError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec
from kvbench.workloads.spec_capacity import blocks_in_step, window_block_bound

GEOMETRY = KVGeometry(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32", num_q_heads=2)


class SlidingWindowMachine(RuleBasedStateMachine):
    requests = Bundle("requests")

    @initialize(
        window=st.integers(1, 20),
        block_size=st.sampled_from([1, 2, 4, 8]),
        num_blocks=st.integers(4, 24),
    )
    def setup(self, window: int, block_size: int, num_blocks: int) -> None:
        self.paged = SlidingWindowPagedCache(GEOMETRY, window, num_blocks, block_size)
        self.ref = WindowReferenceCache(GEOMETRY, window)
        self.window, self.bs = window, block_size
        self.last_step: dict[object, tuple[int, int]] = {}  # request -> (computed, new)
        self.next_id = 0
        self.gen = torch.Generator().manual_seed(0)

    @rule(target=requests)
    def admit(self) -> int:
        rid = self.next_id
        self.next_id += 1
        self.paged.admit(rid)
        self.ref.admit(rid)
        self.last_step[rid] = (0, 0)
        return rid

    @rule(rid=requests, n=st.integers(1, 10))
    def append(self, rid: int, n: int) -> None:
        if rid not in self.last_step:
            return
        g = GEOMETRY
        k = torch.randn((g.num_layers, n, g.num_kv_heads, g.head_dim), generator=self.gen)
        v = torch.randn(k.shape, generator=self.gen)
        before = self.paged.snapshot()
        need = self.paged.blocks_needed_to_append(rid, n)
        try:
            self.paged.append(rid, k, v)
        except CapacityError:
            assert need > self.paged.num_free_blocks
            assert self.paged.snapshot() == before, "a refused append changed the cache"
            return
        self.ref.append(rid, k, v)
        self.last_step[rid] = (self.ref.seq_len(rid) - n, n)

    @rule(parent=requests, target=requests)
    def fork(self, parent: int) -> int:
        if parent not in self.last_step:
            return parent  # a freed id: nothing to fork (hypothesis may redraw it)
        child = self.next_id
        self.next_id += 1
        self.paged.fork(parent, child)
        self.ref.fork(parent, child)
        self.last_step[child] = self.last_step[parent]
        return child

    @rule(rid=consumes(requests))
    def free(self, rid: int) -> None:
        if rid not in self.last_step:
            return
        self.paged.free(rid)
        self.ref.free(rid)
        del self.last_step[rid]

    @precondition(lambda self: any(self.ref.seq_len(r) for r in self.ref.request_ids()))
    @rule(data=st.data())
    def attend(self, data: st.DataObject) -> None:
        live = [r for r in self.ref.request_ids() if self.ref.seq_len(r)]
        rids = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=3, unique=True))
        layer = data.draw(st.integers(0, GEOMETRY.num_layers - 1))
        q = torch.randn((len(rids), GEOMETRY.num_q_heads, GEOMETRY.head_dim), generator=self.gen)
        out = self.paged.attend(rids, q, layer, backend="torch")
        ref = self.ref.attend(rids, q, layer)
        assert oracle.relative_error(out, ref) <= oracle.tolerance(torch.float32)

    @invariant()
    def same_windows(self) -> None:
        if not hasattr(self, "paged"):
            return
        assert sorted(self.paged.request_ids()) == sorted(self.ref.request_ids())
        for rid in self.ref.request_ids():
            assert self.paged.seq_len(rid) == self.ref.seq_len(rid)
            pk, pv = self.paged.gather_window(rid)
            rk, rv = self.ref.gather_window(rid)
            assert torch.equal(pk, rk) and torch.equal(pv, rv), rid

    @invariant()
    def held_blocks_follow_the_planned_rule(self) -> None:
        """What each request holds is what `spec_capacity.blocks_in_step` plans for its
        last append, never more than ceil(window / block) + 1 after a one-token step, and
        no table entry outside the window points at a block."""
        if not hasattr(self, "paged"):
            return
        self.paged.check()
        spec = KVCacheSpec.sliding_window(self.window)
        for rid, (computed, new) in self.last_step.items():
            held = self.paged.held_blocks(rid)
            assert len(held) == blocks_in_step(spec, computed, new, self.bs), rid
            if new == 1:
                assert len(held) <= window_block_bound(self.window, self.bs)
            table = self.paged.block_table(rid)
            first = max(0, computed - self.window + 1)
            for j, b in enumerate(table):
                assert (b == NULL_BLOCK) == ((j + 1) * self.bs <= first), (rid, j, b)


SlidingWindowMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None
)
test_sliding_window_paged_vs_reference = SlidingWindowMachine.TestCase


def test_sliding_window_releases_blocks_while_decoding() -> None:
    """Window 8, blocks of 4: decoding 40 tokens one by one, the request holds at most
    ceil(8/4) + 1 = 3 blocks, and the pool gets the others back as it goes."""
    cache = SlidingWindowPagedCache(GEOMETRY, window=8, num_blocks=4, block_size=4)
    cache.admit("r")
    held = []
    for _ in range(40):
        kv = torch.randn((2, 1, 1, 8))
        cache.append("r", kv, kv)
        held.append(len(cache.held_blocks("r")))
        cache.check()
    assert max(held) == 3 and cache.seq_len("r") == 40
    assert cache.block_table("r")[:7] == [NULL_BLOCK] * 7  # positions 0..27 left the window
    # a full-attention cache would have needed 10 blocks; this pool has 4
    with pytest.raises(CapacityError):
        other = SlidingWindowPagedCache(GEOMETRY, window=64, num_blocks=4, block_size=4)
        other.admit("r")
        for _ in range(40):
            kv = torch.randn((2, 1, 1, 8))
            other.append("r", kv, kv)


def test_sliding_window_fork_shares_then_copies_on_write() -> None:
    cache = SlidingWindowPagedCache(GEOMETRY, window=6, num_blocks=8, block_size=4)
    cache.admit("a")
    kv = torch.randn((2, 6, 1, 8))
    cache.append("a", kv, kv)
    cache.fork("a", "b")
    assert cache.block_table("a") == cache.block_table("b")
    one = torch.randn((2, 1, 1, 8))
    cache.append("b", one, one)  # writes into the shared partial block 1: copied first
    assert cache.block_table("a")[1] != cache.block_table("b")[1]
    assert cache.block_table("a")[0] == cache.block_table("b")[0]
    cache.check()
    ka, _ = cache.gather_window("a")
    assert torch.equal(ka, kv[:, :6])
