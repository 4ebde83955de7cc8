"""Workloads: KV geometry and capacity math, model presets, length distributions,
traces and sweep grids. The lowest layer: it imports nothing else of kvbench."""

from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    KVBenchError,
    RequestStateError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import DTYPE_BYTES, KVGeometry, parse_bytes
from kvbench.workloads.presets import PRESETS, ModelPreset, get_preset

__all__ = [
    "DTYPE_BYTES",
    "PRESETS",
    "CapacityError",
    "ConfigError",
    "DuplicateRequestError",
    "KVBenchError",
    "KVGeometry",
    "ModelPreset",
    "RequestStateError",
    "ShapeError",
    "UnknownRequestError",
    "get_preset",
    "parse_bytes",
]
