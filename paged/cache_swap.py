"""Swap of `PagedKVCache` requests to and from its CPU swap space.

A mixin over the attributes `PagedKVCache` sets, so that `paged.cache` keeps to admission,
growth, fork and free. Semantics (bit-for-bit round trips, shared blocks kept shared by the
group swaps, admission-like swap-in that respects the watermark, atomic failures) are in
`paged.cache`'s docstring."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.kernels import ops
from kvbench.paged.block_table import RequestState
from kvbench.reference.contract import RequestId
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    RequestStateError,
)


class PagedSwap:
    """swap_out / swap_in and their group forms over `PagedKVCache`'s pools."""

    def swap_out(self, request_id: RequestId) -> None:
        """Copy all the request's blocks to CPU swap space and release them on the device."""
        self.swap_out_group([request_id])

    def swap_in(self, request_id: RequestId) -> None:
        """Bring a swapped-out request back into fresh device blocks, bit for bit.

        Admission-like: needs free - blocks >= watermark blocks (CapacityError otherwise).
        """
        self.swap_in_group([request_id])

    def _group(self, request_ids: Sequence[RequestId], swapped: bool) -> list[RequestState]:
        """The states of a swap group: distinct ids, all resident (or all swapped)."""
        ids = list(request_ids)
        if not ids:
            raise ConfigError("a swap group needs at least one request id")
        try:
            repeated = len(set(ids)) != len(ids)
        except TypeError:
            raise ConfigError(f"request ids {ids!r} are not all hashable") from None
        if repeated:
            raise ConfigError(f"a swap group names a request twice: {ids!r}")
        if not swapped:
            return [self._resident(r, "swap out") for r in ids]
        reqs = [self._get(r) for r in ids]
        for r, req in zip(ids, reqs, strict=True):
            if not req.swapped:
                raise RequestStateError(f"cannot swap in request {r!r}: it is not swapped")
        return reqs

    def _copy_blocks_between(
        self,
        src: tuple[torch.Tensor, torch.Tensor],
        dst: tuple[torch.Tensor, torch.Tensor],
        pairs: Sequence[tuple[int, int]],
    ) -> None:
        mapping = torch.tensor(list(pairs), dtype=torch.int64)
        for layer in range(self._geometry.num_layers):
            for a, b in zip(src, dst, strict=True):
                ops.swap_blocks(a[layer], b[layer], mapping, backend=self.kernel_backend)

    def swap_out_group(self, request_ids: Sequence[RequestId]) -> None:
        """Swap out several resident requests together, keeping what they share shared:
        every distinct device block of theirs is copied once into one CPU block that
        carries one reference per table entry. All or nothing: CapacityError (swap space
        too small for the distinct blocks) or a bad id changes nothing."""
        reqs = self._group(request_ids, swapped=False)
        distinct = list(dict.fromkeys(b for req in reqs for b in req.blocks))
        names = ", ".join(repr(r.request_id) for r in reqs)
        cpu = self.swap.allocate_many(len(distinct), f"request(s) {names} ")
        to_cpu = dict(zip(distinct, cpu, strict=True))
        if self._k is not None and self._v is not None:
            assert self.swap.k is not None and self.swap.v is not None
            self._copy_blocks_between(
                (self._k, self._v), (self.swap.k, self.swap.v), list(to_cpu.items())
            )
        taken = set()
        for req in reqs:
            table = [to_cpu[b] for b in req.blocks]
            for c in table:
                if c in taken:
                    self.swap.incref(c)
                taken.add(c)
            self.pool.release(req.blocks)
            req.blocks = table
            req.swapped = True
            self.swap_outs += 1

    def swap_in_group(self, request_ids: Sequence[RequestId]) -> None:
        """Bring several swapped requests back together, bit for bit, restoring the
        sharing among them: one device block per distinct CPU block. Admission-like:
        needs free - distinct blocks >= watermark blocks. All or nothing: CapacityError
        or a bad id changes nothing."""
        reqs = self._group(request_ids, swapped=True)
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
        if self._k is not None and self._v is not None:
            assert self.swap.k is not None and self.swap.v is not None
            self._copy_blocks_between(
                (self.swap.k, self.swap.v), (self._k, self._v), list(to_gpu.items())
            )
        bs, taken = self.block_size, set()
        for req in reqs:
            table = [to_gpu[c] for c in req.blocks]
            for i, b in enumerate(table):
                if b in taken:
                    self.pool.incref(b)
                else:  # sharers of a block agree on its fill: a write would have copied it
                    self.pool.set_fill(b, min(bs, max(0, req.seq_len - i * bs)))
                    taken.add(b)
            self.swap.release(req.blocks)
            req.blocks = table
            req.swapped = False
            if self.prefix is not None and req.tokens is not None:
                for i, key in enumerate(req.keys):
                    parent = req.keys[i - 1] if i else None
                    chunk = req.tokens[i * bs : (i + 1) * bs]
                    self.prefix.insert(table[i], key, parent, chunk, req.extra)  # type: ignore[arg-type]
            self.swap_ins += 1

    # ------------------------------------------------------------------ read
