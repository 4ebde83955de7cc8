"""The reference for a sliding-window layer group: every token kept, the window read.

`WindowReferenceCache` is the obviously-right side of the sliding-window differential:
it stores each request's whole K and V contiguously (nothing is ever released) and
answers what the window holds by slicing its last `window` tokens, so it cannot get the
paged cache's release rule wrong in the same way. Attention is the float64 oracle with
the window mask.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from kvbench.reference import oracle
from kvbench.workloads.errors import DuplicateRequestError, ShapeError, UnknownRequestError
from kvbench.workloads.geometry import KVGeometry, require_positive


class WindowReferenceCache:
    """Contiguous K/V per request ([num_layers, seq_len, num_kv_heads, head_dim]) of a
    layer group whose queries see the last `window` tokens (their own included)."""

    def __init__(
        self, geometry: KVGeometry, window: int, dtype: torch.dtype = torch.float32
    ) -> None:
        self.geometry = geometry
        self.window = require_positive("window", window)
        self.dtype = dtype
        self._kv: dict[Hashable, tuple[torch.Tensor, torch.Tensor]] = {}

    def _empty(self) -> torch.Tensor:
        g = self.geometry
        return torch.empty((g.num_layers, 0, g.num_kv_heads, g.head_dim), dtype=self.dtype)

    def _get(self, request_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        if request_id not in self._kv:
            raise UnknownRequestError(f"unknown request {request_id!r}")
        return self._kv[request_id]

    def admit(self, request_id: Hashable) -> None:
        """Register an empty request."""
        if request_id in self._kv:
            raise DuplicateRequestError(f"request {request_id!r} is already admitted")
        self._kv[request_id] = (self._empty(), self._empty())

    def append(self, request_id: Hashable, key: torch.Tensor, value: torch.Tensor) -> None:
        """Append n tokens' K and V ([num_layers, n, num_kv_heads, head_dim])."""
        k, v = self._get(request_id)
        if key.shape != value.shape or key.dim() != 4 or key.shape[0] != k.shape[0]:
            raise ShapeError(f"key {tuple(key.shape)} / value {tuple(value.shape)} do not fit")
        self._kv[request_id] = (torch.cat([k, key], 1), torch.cat([v, value], 1))

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child gets a copy of everything the parent holds."""
        k, v = self._get(parent_id)
        if child_id in self._kv:
            raise DuplicateRequestError(f"request {child_id!r} is already admitted")
        self._kv[child_id] = (k.clone(), v.clone())

    def free(self, request_id: Hashable) -> None:
        self._get(request_id)
        del self._kv[request_id]

    def seq_len(self, request_id: Hashable) -> int:
        return self._get(request_id)[0].shape[1]

    def request_ids(self) -> list[Hashable]:
        return list(self._kv)

    def gather_window(self, request_id: Hashable) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of the positions the newest token attends to: the last `window`."""
        k, v = self._get(request_id)
        start = max(0, k.shape[1] - self.window)
        return k[:, start:], v[:, start:]

    def attend(
        self, request_ids: Sequence[Hashable], query: torch.Tensor, layer: int
    ) -> torch.Tensor:
        """float64 decode attention of query[b] ([batch, num_q_heads, head_dim]) over
        request b's window in `layer`."""
        keys = [self._get(r)[0][layer] for r in request_ids]
        values = [self._get(r)[1][layer] for r in request_ids]
        return oracle.batched_decode_attention(query, keys, values, window=self.window)
