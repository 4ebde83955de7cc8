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
the requests that still hold it. Prefix caching under a window is the layer-group
cache's (`enable_prefix_caching`, rule in `workloads.spec_prefix`); this one-group
adapter admits empty requests. Every failed operation changes nothing.

This is the one-group case of `paged.layer_groups.LayerGroupsPagedCache`, with the
single-group signatures (append takes one K/V pair).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from kvbench.paged.layer_groups import NULL_BLOCK, LayerGroupsPagedCache
from kvbench.reference.one_group import OneGroupView, window_model
from kvbench.workloads.geometry import KVGeometry

__all__ = ["NULL_BLOCK", "SlidingWindowPagedCache"]


class SlidingWindowPagedCache(OneGroupView[LayerGroupsPagedCache]):
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
        model = window_model(geometry, window)
        self.groups = LayerGroupsPagedCache(model, num_blocks, block_size, dtype, device)
        self.window = window
        self.pool = self.groups.pool

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

    def attend(
        self, request_ids: Sequence[Hashable], query: torch.Tensor, layer: int, **kw: object
    ) -> torch.Tensor:
        return self.groups.attend(request_ids, query, 0, layer, **kw)

    def snapshot(self) -> tuple[object, ...]:
        return self.groups.snapshot()

    def check(self) -> None:
        self.groups.check()
