"""fp8 K/V caches in the kernel ops: the scale arguments, the byte views, the torch write.

An fp8 cache (`torch.float8_e4m3fn` or `torch.float8_e5m2`) holds K/V quantized with one
float32 scale per KV head for K and one for V (`workloads.fp8` states the rule). The ops
take them as `k_scale` / `v_scale`, float32 `[num_kv_heads]` on the cache's device
(a per-tensor scale is the same value repeated): `write_kv` quantizes, the attention ops
dequantize what they read, `copy_blocks` and `swap_blocks` move the bytes unchanged.
Scales given for a 16/32-bit cache, or missing for an fp8 one, are refused.
"""

from __future__ import annotations

import torch

from kvbench.kernels import torch_ops
from kvbench.kernels.validation import CacheDims
from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError, ShapeError

#: float32 scales for K and V, each [num_kv_heads].
KVScales = tuple[torch.Tensor, torch.Tensor]


def check_kv_scales(
    k_cache: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    num_kv_heads: int,
    check_values: bool = True,
) -> KVScales | None:
    """The checked (K, V) scales of an fp8 cache, or None for a 16/32-bit cache.

    Raises ConfigError when scales are missing for fp8 or given for another dtype, and
    ShapeError / ConfigError (naming the value) for a wrong shape, dtype, device or (with
    `check_values`, a host read: the ops pass their `check_indices`) a scale that is not
    finite and > 0."""
    if not fp8.is_fp8(k_cache.dtype):
        if k_scale is not None or v_scale is not None:
            raise ConfigError(
                f"k_scale/v_scale are given but the cache dtype {k_cache.dtype} is not fp8"
            )
        return None
    if k_scale is None or v_scale is None:
        raise ConfigError(
            f"an {k_cache.dtype} cache needs k_scale and v_scale (float32 [{num_kv_heads}])"
        )
    out = []
    for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
        s = fp8.check_scales(s, num_kv_heads, name, check_values)
        if s.device != k_cache.device:
            raise ShapeError(f"{name} is on {s.device} but the cache is on {k_cache.device}")
        out.append(s)
    return out[0], out[1]


def as_bits(t: torch.Tensor) -> torch.Tensor:
    """An fp8 tensor as its bytes (uint8 view, for bit-exact copies torch cannot index
    in fp8); any other tensor unchanged."""
    return t.view(torch.uint8) if fp8.is_fp8(t.dtype) else t


def inverse(scales: KVScales) -> KVScales:
    """float32(1 / scale) of K and V: what the quantizing writes multiply by."""
    return fp8.reciprocal(scales[0]), fp8.reciprocal(scales[1])


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    dims: CacheDims,
    scales: KVScales,
) -> None:
    """Torch version of the quantizing write: `fp8.quantize`, then the bytes placed by
    `torch_ops.write_kv`."""
    fmt = fp8.fp8_format(k_cache.dtype)
    kq = fp8.quantize(key, scales[0], fmt).view(torch.uint8)
    vq = fp8.quantize(value, scales[1], fmt).view(torch.uint8)
    torch_ops.write_kv(as_bits(k_cache), as_bits(v_cache), kq, vq, slot_mapping, dims)
