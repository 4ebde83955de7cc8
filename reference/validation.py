"""Input checks every KV cache implementation shares, so that both caches reject the
same bad input with the same message."""

from __future__ import annotations

import torch

from workloads.errors import ShapeError
from workloads.geometry import KVGeometry


def validate_kv_append(
    geometry: KVGeometry, dtype: torch.dtype, keys: torch.Tensor, values: torch.Tensor
) -> int:
    """Check K and V of new tokens are [num_layers, n >= 1, num_kv_heads, head_dim] tensors
    of the cache's dtype with equal shapes; return n. Raises ShapeError naming the problem."""
    for name, t in (("keys", keys), ("values", values)):
        if not isinstance(t, torch.Tensor):
            raise ShapeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        expected_tail = (geometry.num_kv_heads, geometry.head_dim)
        if t.dim() != 4 or t.shape[0] != geometry.num_layers or tuple(t.shape[2:]) != expected_tail:
            raise ShapeError(
                f"{name} must be [num_layers={geometry.num_layers}, n, num_kv_heads="
                f"{geometry.num_kv_heads}, head_dim={geometry.head_dim}], got {tuple(t.shape)}"
            )
        if t.dtype != dtype:
            raise ShapeError(f"{name} dtype {t.dtype} does not match the cache's {dtype}")
    if keys.shape != values.shape:
        raise ShapeError(f"keys {tuple(keys.shape)} and values {tuple(values.shape)} differ")
    if keys.shape[1] == 0:
        raise ShapeError("cannot append 0 tokens")
    return int(keys.shape[1])
