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

This is the one-group case of `paged.layer_groups.LayerGroupsPagedCache`, with the
single-group signatures (append takes one K/V pair).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from kvbench.paged.layer_groups import NULL_BLOCK, LayerGroupsPagedCache
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec

__all__ = ["NULL_BLOCK", "SlidingWindowPagedCache"]


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
        g = geometry
        group = LayerGroup(
            KVCacheSpec.sliding_window(window), g.num_layers, g.num_kv_heads, g.head_dim, g.dtype
        )
        model = ModelKVSpec("sliding-window", (group,))
        self.groups = LayerGroupsPagedCache(model, num_blocks, block_size, dtype, device)
        self.window = window
        self.pool = self.groups.pool

    def admit(self, request_id: Hashable) -> None:
        """Register an empty request (no prefix caching under a window)."""
        self.groups.admit(request_id)

    def append(self, request_id: Hashable, key: torch.Tensor, value: torch.Tensor) -> None:
        """Append n tokens' K and V ([num_layers, n, heads, dim]) after releasing the
        blocks that left the window; CapacityError changes nothing."""
        self.groups.append(request_id, [(key, value)])

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        self.groups.fork(parent_id, child_id)

    def free(self, request_id: Hashable) -> None:
        self.groups.free(request_id)

    def seq_len(self, request_id: Hashable) -> int:
        return self.groups.seq_len(request_id)

    def request_ids(self) -> list[Hashable]:
        return self.groups.request_ids()

    def block_table(self, request_id: Hashable) -> list[int]:
        """The request's table; NULL_BLOCK where a block left the window."""
        return self.groups.block_table(request_id, 0)

    def held_blocks(self, request_id: Hashable) -> list[int]:
        return self.groups.held_blocks(request_id, 0)

    def kept_from(self, request_id: Hashable) -> int:
        return self.groups.kept_from(request_id, 0)

    @property
    def num_free_blocks(self) -> int:
        return self.groups.num_free_blocks

    def blocks_needed_to_append(self, request_id: Hashable, n: int) -> int:
        return self.groups.blocks_needed_to_append(request_id, n)

    def gather_window(self, request_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of positions max(0, seq_len - window) .. seq_len - 1."""
        return self.groups.gather(request_id, 0)

    def attend(
        self, request_ids: Sequence[Hashable], query: torch.Tensor, layer: int, **kw: object
    ) -> torch.Tensor:
        return self.groups.attend(request_ids, query, 0, layer, **kw)

    def snapshot(self) -> tuple[object, ...]:
        return self.groups.snapshot()

    def check(self) -> None:
        self.groups.check()
