"""Swap of the layer-group cache (`paged.layer_groups`): preemption that keeps the KV.

A group of requests moves to the cache's CPU block pool and back, every layer group at
once: each distinct device block they hold (in any group, shared among them or not) is
copied (its bytes, whatever the dtype: fp8 blocks come back bit for bit) and held once on
the CPU, released entries stay `NULL_BLOCK`, and swap-in gives them fresh device blocks
with the same sharing. A mixin of `LayerGroupsPagedCache`, which owns the state named
below; every refused swap changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import torch

from kvbench.paged.block_pool import BlockPool
from kvbench.paged.group_table import NULL_BLOCK, GroupTable
from kvbench.paged.swap import CpuBlockPool
from kvbench.workloads.errors import CapacityError, RequestStateError


class GroupSwap:
    """`swap_out` / `swap_in` of a layer-group cache (module docstring)."""

    pool: BlockPool
    cpu: CpuBlockPool
    k: torch.Tensor
    v: torch.Tensor
    _requests: dict[Hashable, list[GroupTable]]
    #: Swapped-out requests (their tables hold CPU blocks) -> fill of each CPU block.
    _swapped: set[Hashable]
    _cpu_fill: dict[int, int]

    def _get(self, request_id: Hashable, *, resident: bool = True) -> list[GroupTable]:
        raise NotImplementedError  # the cache's

    def _check_swap(self, request_ids: Sequence[Hashable], swapped: bool) -> list[int]:
        """Validate a swap group; its distinct held blocks, in first-seen order."""
        if len(set(request_ids)) != len(request_ids):
            raise RequestStateError(f"swap of repeated request ids {list(request_ids)!r}")
        distinct: dict[int, None] = {}
        for r in request_ids:
            tables = self._get(r, resident=False)
            if (r in self._swapped) != swapped:
                state = "already swapped out" if not swapped else "not swapped out"
                raise RequestStateError(f"request {r!r} is {state}")
            for t in tables:
                distinct.update((b, None) for b in t.blocks if b != NULL_BLOCK)
        return list(distinct)

    def _move(self, request_ids: Sequence[Hashable], mapping: dict[int, int]) -> None:
        """Point the requests' tables at the mapped blocks (NULL_BLOCK stays)."""
        for r in request_ids:
            for t in self._requests[r]:
                t.blocks = [b if b == NULL_BLOCK else mapping[b] for b in t.blocks]

    def swap_out(self, request_ids: Sequence[Hashable]) -> None:
        """Move the requests' blocks of every group to the CPU pool (each distinct block
        once) and release them on the device; CapacityError, nothing changed, when the
        CPU pool lacks room."""
        blocks = self._check_swap(request_ids, swapped=False)
        cpu = self.cpu.allocate_many(len(blocks), f"swapping out {list(request_ids)!r} ")
        mapping = dict(zip(blocks, cpu, strict=True))
        if blocks:
            assert self.cpu.k is not None and self.cpu.v is not None
            src = torch.tensor(blocks, dtype=torch.int64, device=self.k.device)
            dst = torch.tensor(cpu, dtype=torch.int64)
            self.cpu.k[:, dst] = self.k[:, src].cpu()
            self.cpu.v[:, dst] = self.v[:, src].cpu()
        for b, c in mapping.items():
            self._cpu_fill[c] = self.pool.fill[b]
        for r in request_ids:
            for t in self._requests[r]:
                self.pool.release([b for b in t.blocks if b != NULL_BLOCK])
        self._share(request_ids, mapping, self.cpu.incref)
        self._move(request_ids, mapping)
        self._swapped.update(request_ids)

    def _share(
        self,
        request_ids: Sequence[Hashable],
        mapping: dict[int, int],
        incref: Callable[[int], None],
    ) -> None:
        """Add the references beyond the first that the group's tables make to each
        newly allocated (mapped-to) block, so reference counts equal table entries."""
        seen: set[int] = set()
        for r in request_ids:
            for t in self._requests[r]:
                for b in t.blocks:
                    if b == NULL_BLOCK:
                        continue
                    if b in seen:
                        incref(mapping[b])
                    seen.add(b)

    def swap_in(self, request_ids: Sequence[Hashable]) -> None:
        """Bring swapped requests back into fresh device blocks, every group, keeping
        their sharing; CapacityError, nothing changed, when the pool lacks room."""
        blocks = self._check_swap(request_ids, swapped=True)
        if len(blocks) > self.pool.num_free:
            raise CapacityError(
                f"swapping in {list(request_ids)!r} needs {len(blocks)} blocks; "
                f"{self.pool.num_free} free"
            )
        dev = self.pool.allocate_many(len(blocks))
        mapping = dict(zip(blocks, dev, strict=True))
        if blocks:
            assert self.cpu.k is not None and self.cpu.v is not None
            src = torch.tensor(blocks, dtype=torch.int64)
            dst = torch.tensor(dev, dtype=torch.int64, device=self.k.device)
            self.k[:, dst] = self.cpu.k[:, src].to(self.k.device)
            self.v[:, dst] = self.cpu.v[:, src].to(self.k.device)
        for c, b in mapping.items():
            self.pool.set_fill(b, self._cpu_fill[c])
        self._share(request_ids, mapping, self.pool.incref)
        for r in request_ids:
            for t in self._requests[r]:
                self.cpu.release([b for b in t.blocks if b != NULL_BLOCK])
        self._move(request_ids, mapping)
        self._swapped.difference_update(request_ids)
        self._forget_free_cpu_fills()

    def _forget_free_cpu_fills(self) -> None:
        for c in [c for c in self._cpu_fill if self.cpu.ref[c] == 0]:
            del self._cpu_fill[c]
