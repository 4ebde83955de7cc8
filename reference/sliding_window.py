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
from kvbench.reference.one_group import OneGroupView, window_model
from kvbench.workloads.geometry import KVGeometry


class WindowReferenceCache(OneGroupView[LayerGroupsReferenceCache]):
    """Contiguous K/V per request of a layer group whose queries see the last `window`
    tokens (their own included)."""

    def __init__(
        self, geometry: KVGeometry, window: int, dtype: torch.dtype = torch.float32
    ) -> None:
        self.groups = LayerGroupsReferenceCache(window_model(geometry, window), dtype)
        self.window = window

    def attend(
        self, request_ids: Sequence[Hashable], query: torch.Tensor, layer: int
    ) -> torch.Tensor:
        """float64 decode attention over each request's window in `layer`."""
        return self.groups.attend(request_ids, query, 0, layer)
