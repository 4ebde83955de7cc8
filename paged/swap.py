"""Swap space: a CPU block pool that holds the blocks of swapped-out requests.

It has the GPU pool's block shape, one K and one V tensor per layer stacked as
[num_layers, num_cpu_blocks, block_size, num_kv_heads, head_dim] (pinned when CUDA is
available, so copies can overlap), or no tensors in memory-only mode. Blocks are never
shared here: a swapped-out request owns its CPU blocks outright.

Invariant (asserted by `check`): every CPU block is on the free stack or owned by exactly
one swapped request; the caller passes the owned lists in.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch

from workloads.errors import CapacityError, ConfigError


class SwapSpace:
    """CPU blocks for swapped-out requests (see module docstring)."""

    def __init__(
        self,
        num_blocks: int,
        block_shape: tuple[int, ...] | None,
        num_layers: int,
        dtype: torch.dtype,
    ) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 0:
            raise ConfigError(f"num_cpu_blocks must be an integer >= 0, got {num_blocks!r}")
        self.num_blocks = num_blocks
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        if block_shape is not None and num_blocks:
            pin = torch.cuda.is_available()
            shape = (num_layers, num_blocks, *block_shape)
            self.k = torch.zeros(shape, dtype=dtype, pin_memory=pin)
            self.v = torch.zeros(shape, dtype=dtype, pin_memory=pin)

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
        return [self._free.pop() for _ in range(n)]

    def release(self, blocks: Sequence[int]) -> None:
        self._free.extend(reversed(blocks))

    def snapshot(self) -> tuple:
        return (list(self._free),)

    def check(self, owned: Iterable[Sequence[int]]) -> None:
        """Assert free + owned blocks partition the CPU pool."""
        seen = set(self._free)
        assert len(seen) == len(self._free), "a CPU block is free twice"
        for blocks in owned:
            for b in blocks:
                assert b not in seen, f"CPU block {b} is in two places"
                seen.add(b)
        assert seen == set(range(self.num_blocks)), "CPU blocks leaked"
