"""Mapping between kvbench dtype names and torch dtypes."""

from __future__ import annotations

import torch

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import canonical_dtype

_TORCH = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "fp8_e4m3": getattr(torch, "float8_e4m3fn", None),
    "fp8_e5m2": getattr(torch, "float8_e5m2", None),
}


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype for a kvbench dtype name (or alias such as 'bf16')."""
    dtype = _TORCH[canonical_dtype(name)]
    if dtype is None:
        raise ConfigError(f"dtype {name!r} is not supported by this torch build")
    return dtype


def dtype_name(dtype: torch.dtype) -> str:
    """The kvbench dtype name of a torch dtype."""
    for name, candidate in _TORCH.items():
        if candidate == dtype:
            return name
    raise ConfigError(f"unsupported torch dtype {dtype}")
