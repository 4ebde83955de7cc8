"""A paged sliding-window layer group: blocks that leave the window are released.

Release rule (the one `workloads.spec_capacity` plans with): before an append writes the
tokens at positions n .. n + c - 1, every block wholly before position n - window + 1
(the first position the first new token's query reads) is released and its table entry
becomes `NULL_BLOCK` (-1), as vLLM's sliding-window manager puts its null block there.
So after the append the request holds exactly the blocks touched by positions
max(0, n - window + 1) .. n + c - 1, which contain everything the decode query of its
newest token reads (positions n + c - window .. n + c - 1), and decoding one token at a
time it never holds more than ceil(window / block_size) + 1 blocks.

Sharing: `fork` shares every held block (reference counts); the first write into a shared
partial last block copies it first (copy-on-write). A released shared block stays with
the requests that still hold it. No prefix caching under a window here (a hit would need
the blocks of the window the new request's first query reads, which released blocks no
longer hold; not modeled yet). Every failed operation changes nothing.

Storage per layer: K and V `[num_blocks, block_size, num_kv_heads, head_dim]`; attention
goes through `kernels.ops.paged_decode_attention(window=...)`, which never reads a
released entry.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import torch

from kvbench.kernels import ops
from kvbench.paged.block_pool import BlockPool
from kvbench.workloads.capacity import blocks_for_tokens
from kvbench.workloads.errors import (
    CapacityError,
    DuplicateRequestError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry, require_positive
from kvbench.workloads.kv_spec import KVCacheSpec
from kvbench.workloads.spec_capacity import first_kept_position

#: Table entry of a released block (vLLM's null block); kernels never read it.
NULL_BLOCK = -1


@dataclass
class _WindowRequest:
    blocks: list[int] = field(default_factory=list)  # logical block -> physical, or NULL_BLOCK
    seq_len: int = 0
    kept_from: int = 0  # first position still held (the last append's first query reads)


class SlidingWindowPagedCache:
    """Paged KV of one layer group whose queries see the last `window` tokens."""

    def __init__(
        self,
        geometry: KVGeometry,
        window: int,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
    ) -> None:
        self.geometry = geometry
        self.spec = KVCacheSpec.sliding_window(require_positive("window", window))
        self.window = window
        self.block_size = require_positive("block_size", block_size)
        self.pool = BlockPool(num_blocks, block_size)
        g = geometry
        shape = (g.num_layers, num_blocks, block_size, g.num_kv_heads, g.head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self._requests: dict[Hashable, _WindowRequest] = {}

    # ------------------------------------------------------------------ queries
    def _get(self, request_id: Hashable) -> _WindowRequest:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request {request_id!r}") from None

    def seq_len(self, request_id: Hashable) -> int:
        return self._get(request_id).seq_len

    def request_ids(self) -> list[Hashable]:
        return list(self._requests)

    def block_table(self, request_id: Hashable) -> list[int]:
        """The request's table; NULL_BLOCK where a block left the window."""
        return list(self._get(request_id).blocks)

    def held_blocks(self, request_id: Hashable) -> list[int]:
        """Logical indices of the blocks the request still holds."""
        return [j for j, b in enumerate(self._get(request_id).blocks) if b != NULL_BLOCK]

    def kept_from(self, request_id: Hashable) -> int:
        """First position the request still holds (see the module docstring)."""
        return self._get(request_id).kept_from

    @property
    def num_free_blocks(self) -> int:
        return self.pool.num_free

    def blocks_needed_to_append(self, request_id: Hashable, n: int) -> int:
        """Net blocks an append of `n` tokens takes from the pool: new blocks plus a
        copy-on-write copy, minus the blocks the window releases back to it."""
        req = self._get(request_id)
        release, cow, new = self._plan(req, n)
        freed = sum(1 for j in release if self.pool.ref[req.blocks[j]] == 1)
        return new + int(cow) - freed

    # ------------------------------------------------------------------ mutation
    def admit(self, request_id: Hashable) -> None:
        """Register an empty request (no prefix caching under a window)."""
        if request_id in self._requests:
            raise DuplicateRequestError(f"request {request_id!r} is already admitted")
        self._requests[request_id] = _WindowRequest()

    def _plan(self, req: _WindowRequest, n: int) -> tuple[list[int], bool, int]:
        """(logical blocks to release, copy-on-write of the last block?, new blocks)."""
        keep = first_kept_position(self.spec, req.seq_len)
        bs = self.block_size
        release = [j for j, b in enumerate(req.blocks) if b != NULL_BLOCK and (j + 1) * bs <= keep]
        partial = req.seq_len % bs != 0
        cow = partial and n > 0 and self.pool.ref[req.blocks[-1]] > 1
        new = blocks_for_tokens(req.seq_len + n, bs) - len(req.blocks)
        return release, cow, new

    def append(self, request_id: Hashable, key: torch.Tensor, value: torch.Tensor) -> None:
        """Append n tokens' K and V ([num_layers, n, num_kv_heads, head_dim]) after
        releasing the blocks that left the window. CapacityError, changing nothing, when
        the pool cannot supply the blocks."""
        req = self._get(request_id)
        g = self.geometry
        want = (g.num_layers, key.shape[1] if key.dim() == 4 else -1, g.num_kv_heads, g.head_dim)
        if key.dim() != 4 or tuple(key.shape) != want or value.shape != key.shape:
            raise ShapeError(
                f"key {tuple(key.shape)} / value {tuple(value.shape)}: expected {want}"
            )
        if key.dtype != self.k.dtype or value.dtype != self.k.dtype:
            raise ShapeError(f"K/V dtype {key.dtype} differs from the cache's {self.k.dtype}")
        n = key.shape[1]
        release, cow, new = self._plan(req, n)
        freed = sum(1 for j in release if self.pool.ref[req.blocks[j]] == 1)
        if new + int(cow) > self.pool.num_free + freed:
            raise CapacityError(
                f"request {request_id!r} needs {new + int(cow)} blocks to append {n} tokens; "
                f"{self.pool.num_free} free and {freed} leaving its window"
            )
        for j in release:
            self.pool.decref(req.blocks[j])
            req.blocks[j] = NULL_BLOCK
        req.kept_from = first_kept_position(self.spec, req.seq_len)
        if n == 0:
            return
        if cow:
            self._copy_last_block(req)
        req.blocks += self.pool.allocate_many(new)
        slots = self._slots(req.blocks, req.seq_len, n)
        for layer in range(g.num_layers):
            ops.write_kv(self.k[layer], self.v[layer], key[layer], value[layer], slots)
        self.pool.fill_span(req.blocks, req.seq_len, req.seq_len + n)
        req.seq_len += n

    def _slots(self, blocks: Sequence[int], start: int, n: int) -> torch.Tensor:
        pos = torch.arange(start, start + n, dtype=torch.int64)
        table = torch.tensor(blocks, dtype=torch.int64)
        return (table[pos // self.block_size] * self.block_size + pos % self.block_size).to(
            self.k.device
        )

    def _copy_last_block(self, req: _WindowRequest) -> None:
        old = req.blocks[-1]
        new = self.pool.allocate()
        pairs = torch.tensor([[old, new]], dtype=torch.int64, device=self.k.device)
        for layer in range(self.geometry.num_layers):
            ops.copy_blocks(self.k[layer], self.v[layer], pairs)
        self.pool.set_fill(new, req.seq_len % self.block_size)
        self.pool.decref(old)
        req.blocks[-1] = new

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child shares every block the parent holds (copy-on-write later)."""
        parent = self._get(parent_id)
        if child_id in self._requests:
            raise DuplicateRequestError(f"request {child_id!r} is already admitted")
        for b in parent.blocks:
            if b != NULL_BLOCK:
                self.pool.incref(b)
        self._requests[child_id] = _WindowRequest(
            list(parent.blocks), parent.seq_len, parent.kept_from
        )

    def free(self, request_id: Hashable) -> None:
        """Release every block the request holds."""
        req = self._get(request_id)
        self.pool.release([b for b in req.blocks if b != NULL_BLOCK])
        del self._requests[request_id]

    # ------------------------------------------------------------------ reads
    def gather_window(self, request_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V ([num_layers, n, heads, dim]) of the positions the newest token
        attends to: max(0, seq_len - window) .. seq_len - 1."""
        req = self._get(request_id)
        start = max(0, req.seq_len - self.window)
        slots = self._slots(req.blocks, start, req.seq_len - start)
        g = self.geometry
        flat = (g.num_layers, -1, g.num_kv_heads, g.head_dim)
        return self.k.view(flat)[:, slots], self.v.view(flat)[:, slots]

    def attend(
        self, request_ids: Sequence[Hashable], query: torch.Tensor, layer: int, **kw: object
    ) -> torch.Tensor:
        """Windowed decode attention of query[b] over request b's KV in `layer`, through
        `kernels.ops` (keyword arguments go to it, e.g. backend)."""
        reqs = [self._get(r) for r in request_ids]
        if any(r.seq_len == 0 for r in reqs):
            raise ShapeError("attend needs every request to hold at least one token")
        width = max(len(r.blocks) for r in reqs)
        tables = torch.full((len(reqs), width), NULL_BLOCK, dtype=torch.int32)
        for i, r in enumerate(reqs):
            tables[i, : len(r.blocks)] = torch.tensor(r.blocks, dtype=torch.int32)
        lens = torch.tensor([r.seq_len for r in reqs], dtype=torch.int32)
        dev = self.k.device
        return ops.paged_decode_attention(
            query, self.k[layer], self.v[layer], tables.to(dev), lens.to(dev),
            window=self.window, **kw,  # type: ignore[arg-type]
        )  # fmt: skip

    # ------------------------------------------------------------------ checks
    def snapshot(self) -> tuple:
        """All bookkeeping as plain values (atomicity tests)."""
        reqs = {r: (list(q.blocks), q.seq_len, q.kept_from) for r, q in self._requests.items()}
        return self.pool.snapshot(), reqs

    def check(self) -> None:
        """Assert the invariants: the pool's own; each held block's reference count equals
        the tables that hold it; no table holds a block wholly outside its window
        (before `kept_from`) or past its length, and none lacks one inside."""
        self.pool.check()
        holders: dict[int, int] = {}
        bs = self.block_size
        for rid, req in self._requests.items():
            assert len(req.blocks) == blocks_for_tokens(req.seq_len, bs), rid
            for j, b in enumerate(req.blocks):
                inside = (j + 1) * bs > req.kept_from
                assert (b != NULL_BLOCK) == inside, (rid, j, b, req.kept_from)
                if b != NULL_BLOCK:
                    holders[b] = holders.get(b, 0) + 1
        for b, count in enumerate(self.pool.ref):
            assert count == holders.get(b, 0), (b, count, holders.get(b, 0))
