"""Single-group signatures over a layer-groups cache: the part the paged and the
reference sliding-window adapters share (`paged.sliding_window`,
`reference.sliding_window`).

A one-group cache takes one K/V pair per append instead of a list per group, and reads
the group's view as `gather_window`; everything else is forwarded to the wrapped
`contract.LayerGroupsKVCache` (`groups`), group 0.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Generic, TypeVar

import torch

from kvbench.reference.contract import LayerGroupsKVCache
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_spec import KVCacheSpec, LayerGroup, ModelKVSpec

C = TypeVar("C", bound=LayerGroupsKVCache)


def window_model(geometry: KVGeometry, window: int) -> ModelKVSpec:
    """A model of one sliding-window group of `geometry`'s shape."""
    g = geometry
    spec = KVCacheSpec.sliding_window(window)
    group = LayerGroup(spec, g.num_layers, g.num_kv_heads, g.head_dim, g.dtype)
    return ModelKVSpec("sliding-window", (group,))


class OneGroupView(Generic[C]):
    """Forwards the one-group operations to `self.groups` (set by the subclass)."""

    groups: C

    def admit(self, request_id: Hashable) -> None:
        """Register an empty request."""
        self.groups.admit(request_id)

    def append(self, request_id: Hashable, key: torch.Tensor, value: torch.Tensor) -> None:
        """Append n tokens' K and V ([num_layers, n, heads, dim]); a refusal changes nothing."""
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
