"""Swap across the host link is right on a GPU, checked on a CPU.

On CUDA a `non_blocking=True` copy returns before the data has landed: a device-to-host
copy into pinned memory is garbage to the host until the stream is synchronized. Here
`AsyncCopies` makes every non-blocking copy behave that way on a CPU (the destination
holds NaN until the swap code synchronizes), and the swap path that runs between two
devices is forced on two CPU pools. A swap that reads its copy on the host before
synchronizing, as a gather into a fresh pinned tensor followed by a host scatter would,
brings NaN back on swap-in and fails the bit-identical round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from kvbench.kernels import ops, torch_ops
from kvbench.paged.cache import PagedKVCache
from kvbench.workloads.geometry import KVGeometry

_T = torch.Tensor


class AsyncCopies(TorchFunctionMode):
    """Non-blocking copies land only at `flush()`; until then their destination is NaN.

    The source is read when the copy is queued (a stream copy reads its source in
    stream order, before later work on that stream)."""

    def __init__(self) -> None:
        super().__init__()
        self.pending: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.queued = 0

    def __torch_function__(
        self,
        func: Callable[..., Any],
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        kwargs = dict(kwargs or {})
        if func is _T.copy_ and kwargs.pop("non_blocking", False):
            dst, src = args[0], args[1]  # (the mode is off inside its own handler)
            self.pending.append((dst, src.detach().clone()))
            dst.fill_(float("nan"))
            self.queued += 1
            return dst
        if func is _T.to and kwargs.pop("non_blocking", False):
            real = func(*args, **kwargs)
            landed = torch.full_like(real, float("nan"))
            self.pending.append((landed, real.detach().clone()))
            self.queued += 1
            return landed
        return func(*args, **kwargs)

    def flush(self, *_: object) -> None:
        for dst, src in self.pending:
            dst.copy_(src)  # blocking: passes through the mode
        self.pending.clear()


@pytest.fixture
def link(monkeypatch: pytest.MonkeyPatch):
    """Asynchronous copies, the between-devices swap path forced on CPU pools, and the
    swap's synchronization point wired to land the queued copies."""
    mode = AsyncCopies()
    monkeypatch.setattr(torch_ops, "_crosses_host", lambda src, dst: True, raising=False)
    monkeypatch.setattr(torch_ops, "_host_sync", mode.flush, raising=False)
    with mode:
        yield mode


def test_swap_blocks_round_trip_with_async_copies(link: AsyncCopies) -> None:
    gen = torch.Generator().manual_seed(0)
    device_pool = torch.randn(10, 4, 2, 8, generator=gen)
    host_pool = torch.zeros(6, 4, 2, 8)
    original = device_pool.clone()
    out = [(7, 0), (8, 1), (9, 2), (2, 5), (4, 3)]  # a run of three, then scattered
    ops.swap_blocks(device_pool, host_pool, out, backend="torch")
    assert not link.pending, "swap-out returned before its copies landed"
    for s, d in out:
        assert torch.equal(host_pool[d], original[s])
    device_pool.fill_(-1.0)  # the freed device blocks are reused
    back = [(0, 1), (1, 2), (2, 3), (5, 8), (3, 0)]
    ops.swap_blocks(host_pool, device_pool, back, backend="torch")
    assert not link.pending
    for (s_out, d_out), (s_in, d_in) in zip(out, back, strict=True):
        assert d_out == s_in
        assert torch.equal(device_pool[d_in], original[s_out])
    assert link.queued > 0, "no copy went through the asynchronous path"


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_cache_swap_round_trip_with_async_copies(link: AsyncCopies, dtype: str) -> None:
    """PagedKVCache.swap_out / swap_in through the host link return the request's KV bit
    for bit, with the device blocks it held overwritten in between."""
    geo = KVGeometry(2, 2, 8, dtype, 4)
    cache = PagedKVCache(geo, 8, 4, num_cpu_blocks=8, kernel_backend="torch")
    gen = torch.Generator().manual_seed(1)
    kv = torch.randn(2, 2, 13, 2, 8, generator=gen).to(cache.key_cache(0).dtype)
    cache.admit("a", list(range(13)))
    cache.append("a", kv[0], kv[1])
    before = cache.gather("a")
    cache.swap_out("a")
    cache.admit("filler", list(range(100, 116)))  # takes the freed device blocks
    cache.append("filler", -kv[0].repeat(1, 2, 1, 1)[:, :16], kv[1].repeat(1, 2, 1, 1)[:, :16])
    cache.free("filler")
    cache.swap_in("a")
    after = cache.gather("a")
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
    assert link.queued > 0


def test_swap_pool_is_pinned_only_for_a_cuda_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU cache never pins its swap pool, even where CUDA exists."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    cache = PagedKVCache(KVGeometry(1, 1, 8, "float32"), 4, 4, num_cpu_blocks=2)
    assert cache.swap.cpu.pinned is False


@pytest.mark.gpu
def test_cuda_cache_swap_pool_is_pinned_and_round_trips() -> None:
    geo = KVGeometry(2, 2, 64, "float16", 4)
    cache = PagedKVCache(geo, 8, 16, num_cpu_blocks=8, device="cuda")
    assert cache.swap.cpu.pinned and cache.swap.cpu.k is not None and cache.swap.cpu.k.is_pinned()
    kv = torch.randn(2, 2, 40, 2, 64, device="cuda", dtype=torch.float16)
    cache.admit("a", list(range(40)))
    cache.append("a", kv[0], kv[1])
    before = cache.gather("a")
    cache.swap_out("a")
    cache.swap_in("a")
    after = cache.gather("a")
    assert torch.equal(after[0], before[0]) and torch.equal(after[1], before[1])
