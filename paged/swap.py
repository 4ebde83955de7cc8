"""Swap space: a CPU block pool that holds the blocks of swapped-out requests.

It has the GPU pool's block shape, one K and one V tensor per layer stacked as
[num_layers, num_cpu_blocks, block_size, num_kv_heads, head_dim] (page-locked when the
cache lives on a CUDA device, so the host-link copies are DMA straight to and from these
rows; plain memory for a CPU cache), or no tensors in memory-only mode.

CPU blocks are reference counted like device blocks: requests swapped out together (a
beam group, a request and its parallel samples) keep sharing the blocks they shared on
the device, so each shared block is copied and held once, as vLLM's block manager did
for a swapped sequence group.

Invariant (asserted by `check`): every CPU block is either on the free stack with
reference count 0, or referenced by exactly `ref[block]` entries of the swapped
requests' block tables; the caller passes those tables in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from kvbench.workloads.errors import CapacityError, ConfigError


class SwapSpace:
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

    def snapshot(self) -> tuple:
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
