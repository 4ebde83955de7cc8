"""fp8 KV semantics: formats, scales, quantize and dequantize, in one place.

It lives in `workloads/` because both caches need it and `reference/` may import only
`workloads/` (the layer rule of docs/layout.md); the kernels' torch versions use it too,
and the Triton and C++ kernels implement the same rules, which the conformance suite
checks bit for bit.

The rules (every backend follows them exactly):

* Formats: `fp8_e4m3` is `torch.float8_e4m3fn` (finite max 448, no inf, NaN 0x7F/0xFF);
  `fp8_e5m2` is `torch.float8_e5m2` (finite max 57344, has inf and NaN).
* Scales: one float32 scale per (layer, KV head) for K and one for V, shape
  `[num_layers, num_kv_heads]`; a per-tensor scale is the same value in every head of a
  layer. A scale is a normal float32 (`MIN_SCALE` .. `MAX_SCALE`: finite, > 0, and its
  reciprocal finite; a static 1e-320 or 1e39 would become 0 or inf in float32).
* Quantize: `q = fp8_rne(clamp(float32(x) * float32(1 / scale), -max, max))`: the
  reciprocal is rounded to float32 once on the host, the product is an exactly rounded
  float32 multiply (a division is not: a GPU's fast division is not correctly rounded),
  then round-to-nearest-even to the format. Overflow saturates to +-max (never inf or
  NaN).
* Dequantize: `float32(q) * scale` in float32 (the kernels then round to the query dtype);
  the float64 oracle uses `float64(q) * float64(scale)`.
* Non-finite input (NaN, +-inf) is refused by `check_finite` with an error naming the
  value and its position; the caches and the kernel ops (when they check indices) call it
  before writing anything. Where the check is skipped (`check_indices=False` in the
  kernel ops), a non-finite element is stored as NaN (0x7F) in both formats: never as a
  finite value.
* Dynamic scales: a cache built with `scale="dynamic"` sets each layer's K and V scales
  from the first write into that layer, `amax(|x|) / max` (per tensor: over every head of
  that write; per head: over that head), at least `MIN_SCALE` (inputs below 5e-36 would
  give a subnormal scale), or 1.0 where that amax is 0, and never changes
  them afterwards; later values above `max * scale` saturate.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvbench.workloads.errors import ConfigError, ShapeError


class NonFiniteError(ShapeError):
    """A value to be quantized is NaN or infinite (fp8 storage refuses it)."""


@dataclass(frozen=True)
class Fp8Format:
    """One fp8 storage format.

    Attributes:
        name: kvbench dtype name (`fp8_e4m3`, `fp8_e5m2`).
        dtype: the torch dtype of the stored bytes.
        max: largest finite value (saturation bound).
        mantissa_bits: explicit mantissa bits (3 or 2).
        min_exponent: exponent of the smallest normal value (-6 or -14).
    """

    name: str
    dtype: torch.dtype
    max: float
    mantissa_bits: int
    min_exponent: int


#: The fp8 formats kvbench stores, by kvbench dtype name.
FORMATS: dict[str, Fp8Format] = {
    "fp8_e4m3": Fp8Format("fp8_e4m3", torch.float8_e4m3fn, 448.0, 3, -6),
    "fp8_e5m2": Fp8Format("fp8_e5m2", torch.float8_e5m2, 57344.0, 2, -14),
}
#: The byte stored for a non-finite element when the finite check is skipped (NaN in both).
NAN_BITS = 0x7F
#: The smallest and largest scale: float32's smallest normal (a subnormal scale's
#: reciprocal overflows float32) and its largest finite value.
MIN_SCALE = float(torch.finfo(torch.float32).tiny)
MAX_SCALE = float(torch.finfo(torch.float32).max)
#: Scale granularities a cache accepts.
GRANULARITIES: tuple[str, ...] = ("tensor", "head")


def is_fp8(dtype: torch.dtype) -> bool:
    """Whether `dtype` is one of the fp8 storage dtypes."""
    return any(f.dtype == dtype for f in FORMATS.values())


def fp8_format(dtype: torch.dtype | str) -> Fp8Format:
    """The format of a torch fp8 dtype or a kvbench fp8 dtype name (aliases accepted)."""
    if isinstance(dtype, torch.dtype):
        for f in FORMATS.values():
            if f.dtype == dtype:
                return f
        raise ConfigError(f"dtype {dtype} is not an fp8 format; known: {', '.join(FORMATS)}")
    from kvbench.workloads.geometry import canonical_dtype

    name = canonical_dtype(dtype)
    if name not in FORMATS:
        raise ConfigError(f"dtype {dtype!r} is not an fp8 format; known: {', '.join(FORMATS)}")
    return FORMATS[name]


def check_finite(x: torch.Tensor, what: str) -> None:
    """Raise NonFiniteError naming the first NaN or inf element of `x` and its index."""
    bad = ~torch.isfinite(x)
    if bool(bad.any()):
        idx = tuple(int(i) for i in torch.nonzero(bad)[0])
        raise NonFiniteError(
            f"{what} holds {float(x[idx])} at index {idx}; fp8 KV storage refuses NaN and inf"
        )


def check_scales(
    scales: torch.Tensor, num_kv_heads: int, what: str, read_values: bool = True
) -> torch.Tensor:
    """A kernel's per-KV-head scales: float32 `[num_kv_heads]`, and (with `read_values`,
    a host read) finite and > 0. Returns them contiguous."""
    if not isinstance(scales, torch.Tensor):
        raise ShapeError(f"{what} must be a torch.Tensor, got {type(scales).__name__}")
    if scales.dtype != torch.float32 or tuple(scales.shape) != (num_kv_heads,):
        raise ShapeError(
            f"{what} must be float32 [{num_kv_heads}] (one scale per KV head), got "
            f"{scales.dtype} {tuple(scales.shape)}"
        )
    if not read_values:
        return scales.contiguous()
    host = scales.detach().to("cpu")
    bad = ~(torch.isfinite(host) & (host > 0))
    if bool(bad.any()):
        i = int(torch.nonzero(bad)[0])
        raise ConfigError(f"{what}[{i}] = {float(host[i])} must be finite and > 0")
    return scales.contiguous()


def reciprocal(scales: torch.Tensor) -> torch.Tensor:
    """float32(1 / scale), computed in float64 and rounded once: what quantize multiplies by."""
    return (1.0 / scales.to(torch.float64)).to(torch.float32)


def quantize(x: torch.Tensor, scales: torch.Tensor, fmt: Fp8Format) -> torch.Tensor:
    """Quantize `x` `[..., num_kv_heads, head_dim]` with per-head `scales` `[num_kv_heads]`
    (float32) to `fmt`, by the module's rule. Non-finite elements become NaN (callers that
    must refuse them call `check_finite` first)."""
    inv = reciprocal(scales).to(x.device).unsqueeze(-1)
    y = (x.to(torch.float32) * inv).clamp(-fmt.max, fmt.max)
    q = y.to(fmt.dtype)
    finite = torch.isfinite(x)
    if not bool(finite.all()):
        nan = torch.full_like(q.view(torch.uint8), NAN_BITS).view(fmt.dtype)
        q = torch.where(finite, q, nan)
    return q


def dequantize(
    q: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """`float32(q) * scale` per KV head (`q` `[..., num_kv_heads, head_dim]`), then `dtype`.
    With `dtype=torch.float64` the product is exact (the oracle's dequantization)."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    s = scales.to(device=q.device, dtype=wide).unsqueeze(-1)
    return (q.to(wide) * s).to(dtype)


def dynamic_scale(x: torch.Tensor, fmt: Fp8Format, granularity: str) -> torch.Tensor:
    """The dynamic-scale rule: `amax(|x|) / fmt.max` (1.0 where the amax is 0) over the
    whole of `x` (`granularity="tensor"`, repeated per head) or per KV head (`"head"`);
    `x` is `[..., num_kv_heads, head_dim]`. Returns float32 `[num_kv_heads]`."""
    check_granularity(granularity)
    heads = x.shape[-2]
    per_head = x.detach().abs().to(torch.float64).transpose(0, -2).reshape(heads, -1)
    amax = per_head.amax(dim=1) if per_head.shape[1] else torch.zeros(heads, dtype=torch.float64)
    if granularity == "tensor":
        amax = amax.max().expand(heads)
    scale = torch.where(amax > 0, (amax / fmt.max).clamp(min=MIN_SCALE), torch.ones_like(amax))
    return scale.to(torch.float32).cpu()


def check_granularity(granularity: str) -> str:
    """Raise ConfigError unless `granularity` is one of `GRANULARITIES`."""
    if granularity not in GRANULARITIES:
        raise ConfigError(f"scale granularity {granularity!r} is not one of {GRANULARITIES}")
    return granularity


def static_scales(
    value: float | Sequence[float] | torch.Tensor, num_layers: int, num_kv_heads: int, what: str
) -> torch.Tensor:
    """Static scales given at construction, as float32 `[num_layers, num_kv_heads]`: a
    number (one per-tensor scale), `[num_kv_heads]` (per head, every layer) or
    `[num_layers, num_kv_heads]`. Each must be finite and > 0."""
    try:
        t = torch.as_tensor(value, dtype=torch.float64)
    except (TypeError, ValueError, RuntimeError) as exc:
        raise ConfigError(f"{what}={value!r} is not a number or a list of numbers: {exc}") from None
    shape = tuple(t.shape)
    if shape not in ((), (num_kv_heads,), (num_layers, num_kv_heads)):
        raise ConfigError(
            f"{what} has shape {shape}; expected a number, [{num_kv_heads}] or "
            f"[{num_layers}, {num_kv_heads}]"
        )
    flat = t.reshape(-1)
    as32 = flat.to(torch.float32).tolist()
    for i, (s, s32) in enumerate(zip(flat.tolist(), as32, strict=True)):
        if not (math.isfinite(s) and s > 0):
            raise ConfigError(f"{what} holds {s} (element {i}); a scale must be finite and > 0")
        if not (math.isfinite(s32) and s32 >= MIN_SCALE):  # 1e-320 -> 0, 1e39 -> inf
            raise ConfigError(
                f"{what} holds {s} (element {i}), {s32} as a float32 scale; a scale must be a "
                f"normal float32, {MIN_SCALE:.4g} .. {MAX_SCALE:.4g} (its reciprocal finite)"
            )
    return t.expand(num_layers, num_kv_heads).to(torch.float32).contiguous()
