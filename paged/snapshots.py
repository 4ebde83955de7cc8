"""Comparing two `PagedKVCache.snapshot()` results (atomicity tests: a failed operation
must leave the whole state, tensors bit for bit, as it was)."""

from __future__ import annotations

import torch


def snapshots_equal(a: dict[str, object], b: dict[str, object]) -> bool:
    """Whether two `PagedKVCache.snapshot()` results are identical (tensors bitwise)."""
    if a.keys() != b.keys():
        return False
    for name in a:
        x, y = a[name], b[name]
        if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype:
                return False
            # bitwise: compare raw bytes so NaNs and -0.0 count as themselves
            if not torch.equal(x.view(torch.uint8), y.view(torch.uint8)):
                return False
        elif x != y:
            return False
    return True
