"""The paged sliding-window cache against the reference that keeps every token: the
state machine of `test_paged_hybrid` (identical windows after every step, exactly the
blocks `workloads.spec_capacity`'s release rule plans, so no block referenced outside its
window; reference counts, pool accounting, refused appends change nothing; windowed
attention through the kernels against the float64 oracle) on models of one sliding-window
group, plus the single-group wrappers `paged.sliding_window.SlidingWindowPagedCache` and
`reference.sliding_window.WindowReferenceCache`.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st

from kvbench.paged.sliding_window import NULL_BLOCK, SlidingWindowPagedCache
from kvbench.reference import oracle
from kvbench.reference.sliding_window import WindowReferenceCache
from kvbench.suites.conformance.test_paged_hybrid import LayerGroupsMachine
from kvbench.workloads.errors import CapacityError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec

GEOMETRY = KVGeometry(num_layers=2, num_kv_heads=1, head_dim=8, dtype="float32", num_q_heads=2)


class SlidingWindowMachine(LayerGroupsMachine):
    MODELS = st.builds(lambda w: [KVCacheSpec.sliding_window(w)], st.integers(1, 20))


SlidingWindowMachine.TestCase.settings = settings(stateful_step_count=30, deadline=None)
test_sliding_window_paged_vs_reference = SlidingWindowMachine.TestCase


def test_sliding_window_releases_blocks_while_decoding() -> None:
    """Window 8, blocks of 4: decoding 40 tokens one by one, the request holds at most
    ceil(8/4) + 1 = 3 blocks, and the pool gets the others back as it goes; a window of
    64 (no release within 40 tokens) needs 10 blocks, which this pool of 4 refuses."""
    cache = SlidingWindowPagedCache(GEOMETRY, window=8, num_blocks=4, block_size=4)
    ref = WindowReferenceCache(GEOMETRY, window=8)
    cache.admit("r")
    ref.admit("r")
    held = []
    for _ in range(40):
        kv = torch.randn((2, 1, 1, 8))
        cache.append("r", kv, kv)
        ref.append("r", kv, kv)
        held.append(len(cache.held_blocks("r")))
        cache.check()
    assert max(held) == 3 and cache.seq_len("r") == 40
    assert cache.block_table("r")[:7] == [NULL_BLOCK] * 7  # positions 0..27 left the window
    assert torch.equal(cache.gather_window("r")[0], ref.gather_window("r")[0])
    q = torch.randn((1, 2, 8))
    out = cache.attend(["r"], q, 1, backend="torch")
    assert oracle.relative_error(out, ref.attend(["r"], q, 1)) <= 1e-5
    other = SlidingWindowPagedCache(GEOMETRY, window=64, num_blocks=4, block_size=4)
    other.admit("r")
    with pytest.raises(CapacityError):
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
