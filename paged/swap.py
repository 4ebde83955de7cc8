"""Swap space: a CPU block pool that holds the blocks of swapped-out requests, and the
swap of requests between it and the device (`SwapSpace`, a part of `PagedKVCache`).

The CPU pool (`CpuBlockPool`) has the GPU pool's block shape, one K and one V tensor per layer stacked as
[num_layers, num_cpu_blocks, block_size, num_kv_heads, head_dim] (page-locked when the
cache lives on a CUDA device, so the host-link copies are DMA straight to and from these
rows; plain memory for a CPU cache), or no tensors in memory-only mode.

CPU blocks are reference counted like device blocks: requests swapped out together (a
beam group, a request and its parallel samples) keep sharing the blocks they shared on
the device, so each shared block is copied and held once, as vLLM's block manager did
for a swapped sequence group.

Invariant (asserted by `CpuBlockPool.check`): every CPU block is either on the free stack
with reference count 0, or referenced by exactly `ref[block]` entries of the swapped
requests' block tables; the caller passes those tables in.

`SwapSpace` moves whole requests: swap-out copies every distinct device block of a group
once into a CPU block and releases the device blocks; swap-in (admission-like: it keeps
the watermark) copies them back into fresh device blocks bit for bit, restores the
sharing among the group and re-indexes their keyed blocks in the prefix cache. Both are
all or nothing: a failure raises before anything changes.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.block_table import RequestState
from kvbench.paged.device_kv import DeviceKV, copy_between
from kvbench.paged.prefix_cache import PrefixCache
from kvbench.workloads.errors import CapacityError, ConfigError


class CpuBlockPool:
    """CPU blocks for swapped-out requests (see module docstring)."""

    def __init__(
        self,
        num_blocks: int,
        block_shape: tuple[int, ...] | None,
        num_layers: int,
        dtype: torch.dtype,
        pin_memory: bool = False,
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ConfigError(f"num_cpu_blocks must be an integer >= 0, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.ref: list[int] = [0] * num_blocks
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        self.pinned = bool(pin_memory and block_shape is not None and num_blocks)
        if block_shape is not None and num_blocks:
            shape = (num_layers, num_blocks, *block_shape)
            self.k = torch.zeros(shape, dtype=dtype, pin_memory=self.pinned)
            self.v = torch.zeros(shape, dtype=dtype, pin_memory=self.pinned)

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def allocate_many(self, n: int, what: str = "") -> list[int]:
        """Take `n` CPU blocks, all or none."""
        if n > len(self._free):
            raise CapacityError(
                f"swap space full: {what}needs {n} CPU blocks, {len(self._free)} of "
                f"{self.num_blocks} free"
            )
        blocks = [self._free.pop() for _ in range(n)]
        for b in blocks:
            self.ref[b] = 1
        return blocks

    def incref(self, block: int) -> None:
        """One more block-table entry refers to a held CPU block."""
        if self.ref[block] <= 0:
            raise ConfigError(f"CPU block {block} is free; allocate it instead of sharing it")
        self.ref[block] += 1

    def release(self, blocks: Sequence[int]) -> None:
        """Drop one reference to each of a table's CPU blocks, tail first; a block at zero
        goes back on the free stack."""
        ref, free = self.ref, self._free
        for b in reversed(blocks):
            if ref[b] <= 0:
                raise ConfigError(f"CPU block {b} has no reference to drop")
            ref[b] -= 1
            if ref[b] == 0:
                free.append(b)

    def snapshot(self) -> tuple[list[int], list[int]]:
        return (list(self._free), list(self.ref))

    def check(self, owned: Iterable[Sequence[int]]) -> None:
        """Assert the invariant of the module docstring over the swapped tables `owned`."""
        free = set(self._free)
        assert len(free) == len(self._free), "a CPU block is free twice"
        counts = [0] * self.num_blocks
        for blocks in owned:
            for b in blocks:
                assert b not in free, f"CPU block {b} is free and held"
                counts[b] += 1
        assert counts == self.ref, "CPU block reference counts disagree with the tables"
        for b in range(self.num_blocks):
            assert (b in free) == (counts[b] == 0), f"CPU block {b} leaked"


class SwapSpace:
    """Swap of request groups between the device pool and a CPU block pool.

    Owns the CPU pool (`cpu`) and the swap counters; works on the cache's device pool,
    device KV and prefix cache, which it is given (it never looks requests up: the cache
    hands it validated states)."""

    def __init__(
        self,
        cpu: CpuBlockPool,
        pool: BlockPool,
        kv: DeviceKV,
        prefix: PrefixCache | None,
        watermark_blocks: int,
    ) -> None:
        self.cpu = cpu
        self.pool = pool
        self.kv = kv
        self.prefix = prefix
        #: Device blocks a swap-in leaves free (the cache's admission watermark).
        self.watermark_blocks = watermark_blocks
        #: Requests swapped out / in so far (a group of n counts n).
        self.swap_outs = 0
        self.swap_ins = 0

    @property
    def num_blocks(self) -> int:
        """CPU blocks (0: the cache cannot swap)."""
        return self.cpu.num_blocks

    @property
    def num_used(self) -> int:
        """CPU blocks held by swapped requests now."""
        return self.cpu.num_used

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a freed swapped request's CPU blocks."""
        self.cpu.release(blocks)

    def swap_out(self, reqs: Sequence[RequestState]) -> None:
        """Swap out resident requests together, keeping what they share shared: every
        distinct device block of theirs is copied once into one CPU block that carries one
        reference per table entry. CapacityError (swap space too small) changes nothing."""
        distinct = list(dict.fromkeys(b for req in reqs for b in req.blocks))
        names = ", ".join(repr(r.request_id) for r in reqs)
        cpu = self.cpu.allocate_many(len(distinct), f"request(s) {names} ")
        to_cpu = dict(zip(distinct, cpu, strict=True))
        if self.kv.k is not None and self.kv.v is not None:
            assert self.cpu.k is not None and self.cpu.v is not None
            copy_between(
                (self.kv.k, self.kv.v), (self.cpu.k, self.cpu.v), list(to_cpu.items()),
                self.kv.backend,
            )  # fmt: skip
        taken = set()
        for req in reqs:
            table = [to_cpu[b] for b in req.blocks]
            for c in table:
                if c in taken:
                    self.cpu.incref(c)
                taken.add(c)
            self.pool.release(req.blocks)
            req.blocks = table
            req.swapped = True
            self.swap_outs += 1

    def swap_in(self, reqs: Sequence[RequestState]) -> None:
        """Bring swapped requests back together, bit for bit, restoring the sharing among
        them: one device block per distinct CPU block. Admission-like: needs free -
        distinct blocks >= watermark blocks; CapacityError otherwise, nothing changed."""
        distinct = list(dict.fromkeys(c for req in reqs for c in req.blocks))
        need, free = len(distinct), self.pool.num_free
        if free - need < self.watermark_blocks:
            names = ", ".join(repr(r.request_id) for r in reqs)
            raise CapacityError(
                f"cannot swap in request(s) {names}: needs {need} blocks, {free} free, "
                f"watermark keeps {self.watermark_blocks}"
            )
        gpu = self.pool.allocate_many(need)
        to_gpu = dict(zip(distinct, gpu, strict=True))
        if self.kv.k is not None and self.kv.v is not None:
            assert self.cpu.k is not None and self.cpu.v is not None
            copy_between(
                (self.cpu.k, self.cpu.v), (self.kv.k, self.kv.v), list(to_gpu.items()),
                self.kv.backend,
            )  # fmt: skip
        bs, taken = self.pool.block_size, set()
        for req in reqs:
            table = [to_gpu[c] for c in req.blocks]
            for i, b in enumerate(table):
                if b in taken:
                    self.pool.incref(b)
                else:  # sharers of a block agree on its fill: a write would have copied it
                    self.pool.set_fill(b, min(bs, max(0, req.seq_len - i * bs)))
                    taken.add(b)
            self.cpu.release(req.blocks)
            req.blocks = table
            req.swapped = False
            if self.prefix is not None and req.tokens is not None:
                req.materialize_head()  # the ids by position
                for i, key in enumerate(req.keys):
                    parent = req.keys[i - 1] if i else None
                    chunk = req.tokens[i * bs : (i + 1) * bs]
                    self.prefix.insert(table[i], key, parent, chunk, req.extra)  # type: ignore[arg-type]
            self.swap_ins += 1

    def snapshot(self) -> tuple[object, ...]:
        """The CPU pool's bookkeeping and the counters (its KV: `cpu.k`, `cpu.v`)."""
        return (self.cpu.snapshot(), self.swap_outs, self.swap_ins)

    def check(self, swapped_tables: Iterable[Sequence[int]]) -> None:
        """The CPU pool's invariant over the swapped requests' tables."""
        self.cpu.check(swapped_tables)
