"""The reference for one sliding-window layer group: every token kept, the window read.

The one-group case of `reference.layer_groups.LayerGroupsReferenceCache` with the
single-group signatures, the obviously-right side of the sliding-window differential
(`paged.sliding_window`): it keeps each request's whole K and V and slices the last
`window` tokens, so it cannot get the paged cache's release rule wrong in the same way.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from kvbench.reference.layer_groups import LayerGroupsReferenceCache
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec


class WindowReferenceCache:
    """Contiguous K/V per request of a layer group whose queries see the last `window`
    tokens (their own included)."""

    def __init__(
        self, geometry: KVGeometry, window: int, dtype: torch.dtype = torch.float32
    ) -> None:
        g = geometry
        group = LayerGroup(
            KVCacheSpec.sliding_window(window), g.num_layers, g.num_kv_heads, g.head_dim, g.dtype
        )
        self.groups = LayerGroupsReferenceCache(ModelKVSpec("sliding-window", (group,)), dtype)
        self.window = window

    def admit(self, request_id: Hashable) -> None:
        self.groups.admit(request_id)

    def append(self, request_id: Hashable, key: torch.Tensor, value: torch.Tensor) -> None:
        self.groups.append(request_id, [(key, value)])

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        self.groups.fork(parent_id, child_id)

    def free(self, request_id: Hashable) -> None:
        self.groups.free(request_id)

    def seq_len(self, request_id: Hashable) -> int:
        return self.groups.seq_len(request_id)

    def request_ids(self) -> list[Hashable]:
        return self.groups.request_ids()

    def gather_window(self, request_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the positions the newest token attends to: the last `window`."""
        return self.groups.gather(request_id, 0)

    def attend(
        self, request_ids: Sequence[Hashable], query: torch.Tensor, layer: int
    ) -> torch.Tensor:
        """float64 decode attention over each request's window in `layer`."""
        return self.groups.attend(request_ids, query, 0, layer)
