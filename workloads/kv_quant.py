"""The fp8 storage state of one KV cache: its format and its K and V scales per layer.

Both caches (`reference.ContiguousKVCache`, `paged.PagedKVCache`) hold one `KVQuant` when
their geometry's dtype is fp8, and call it the same way, so that they store the same bytes:

    pending = quant.prepare(keys, values)   # checks; the scales this write uses
    ... the cache checks capacity and writes `pending.quantize(...)` (or passes
        `pending.layer(l)` to the kernels' quantizing write) ...
    quant.commit(pending)                   # dynamic scales become fixed

`prepare` raises (NaN/inf input, wrong dtype) before anything changes, and a cache that
fails later simply does not commit, so a failed append changes no scale either. The rules
(quantize, saturation, the dynamic-scale rule) are `workloads.fp8`'s.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError, ShapeError
from kvbench.workloads.geometry import KVGeometry

#: A static scale: one number (per tensor), [num_kv_heads] or [num_layers, num_kv_heads].
ScaleSpec = float | Sequence[float] | torch.Tensor
#: Input dtypes an fp8 cache accepts for new keys and values.
INPUT_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)


@dataclass(frozen=True)
class PendingScales:
    """The K and V scales (float32 [num_layers, num_kv_heads], CPU) one write uses, and
    whether they are new (dynamic scales set by this, the first, write)."""

    k: torch.Tensor
    v: torch.Tensor
    new: bool

    def layer(self, layer: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer `layer`'s K and V scales, float32 [num_kv_heads] on `device`."""
        return self.k[layer].to(device), self.v[layer].to(device)


class KVQuant:
    """fp8 K/V storage: the format and the per-layer, per-KV-head scales of K and of V.

    Args:
        dtype: the fp8 dtype name (`fp8_e4m3`, `fp8_e5m2`, or an alias).
        num_layers, num_kv_heads: the cache geometry.
        k_scale, v_scale: "dynamic" (set from the first write, never changed after) or a
            static `ScaleSpec` (finite, > 0).
        granularity: "tensor" (one scale per layer) or "head" (one per layer and KV
            head); for static scales it only checks that a per-tensor spec is a number.
    """

    def __init__(
        self,
        dtype: str,
        num_layers: int,
        num_kv_heads: int,
        *,
        k_scale: ScaleSpec | str = "dynamic",
        v_scale: ScaleSpec | str = "dynamic",
        granularity: str = "tensor",
    ) -> None:
        self.format = fp8.fp8_format(dtype)
        self.granularity = fp8.check_granularity(granularity)
        self.num_layers = num_layers
        self.num_kv_heads = num_kv_heads
        dynamic = [isinstance(s, str) for s in (k_scale, v_scale)]
        for name, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            if isinstance(s, str) and s != "dynamic":
                raise ConfigError(f"{name}={s!r} must be 'dynamic' or a number / list of numbers")
        if dynamic[0] != dynamic[1]:
            raise ConfigError("k_scale and v_scale must both be 'dynamic' or both static")
        self.dynamic = dynamic[0]
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None
        if not self.dynamic:
            self._k = fp8.static_scales(k_scale, num_layers, num_kv_heads, "k_scale")  # type: ignore[arg-type]
            self._v = fp8.static_scales(v_scale, num_layers, num_kv_heads, "v_scale")  # type: ignore[arg-type]
            if granularity == "tensor":
                for name, t in (("k_scale", self._k), ("v_scale", self._v)):
                    if not bool((t == t[:, :1]).all()):
                        raise ConfigError(f"{name} differs across heads but granularity='tensor'")

    @property
    def is_set(self) -> bool:
        """Whether the scales are known (static, or dynamic after the first write)."""
        return self._k is not None

    def scales(self) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V scales, float32 [num_layers, num_kv_heads] (copies); ConfigError while
        dynamic scales wait for the first write."""
        if self._k is None or self._v is None:
            raise ConfigError("the fp8 scales are dynamic and nothing has been written yet")
        return self._k.clone(), self._v.clone()

    def prepare(self, keys: torch.Tensor, values: torch.Tensor) -> PendingScales:
        """Check new keys and values ([num_layers, n, num_kv_heads, head_dim], a float dtype
        of `INPUT_DTYPES`, finite) and return the scales their write uses. Changes nothing."""
        for name, t in (("keys", keys), ("values", values)):
            if t.dtype not in INPUT_DTYPES:
                raise ShapeError(
                    f"{name} dtype {t.dtype}: an {self.format.name} cache takes {INPUT_DTYPES}"
                )
            fp8.check_finite(t, name)
        if self._k is not None and self._v is not None:
            return PendingScales(self._k, self._v, new=False)
        k = torch.stack(
            [
                fp8.dynamic_scale(keys[i], self.format, self.granularity)
                for i in range(keys.shape[0])
            ]
        )
        v = torch.stack(
            [
                fp8.dynamic_scale(values[i], self.format, self.granularity)
                for i in range(values.shape[0])
            ]
        )
        return PendingScales(k, v, new=True)

    def commit(self, pending: PendingScales) -> None:
        """Fix dynamic scales set by a write that succeeded (no-op otherwise)."""
        if pending.new and self._k is None:
            self._k, self._v = pending.k.clone(), pending.v.clone()

    def quantize(
        self, keys: torch.Tensor, values: torch.Tensor, pending: PendingScales
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """keys, values [num_layers, n, H, D] -> their fp8 values with `pending`'s scales."""
        kq = torch.stack(
            [fp8.quantize(keys[i], pending.k[i], self.format) for i in range(keys.shape[0])]
        )
        vq = torch.stack(
            [fp8.quantize(values[i], pending.v[i], self.format) for i in range(values.shape[0])]
        )
        return kq, vq

    def dequantize(
        self, layer: int, k: torch.Tensor, v: torch.Tensor, dtype: torch.dtype = torch.float64
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Stored fp8 K, V `[..., num_kv_heads, head_dim]` of `layer` -> `dtype` values
        (float64: exact, the oracle's dequantization)."""
        ks, vs = self.scales()
        return fp8.dequantize(k, ks[layer], dtype), fp8.dequantize(v, vs[layer], dtype)


def make_kv_quant(
    geometry: KVGeometry,
    k_scale: ScaleSpec | str | None = None,
    v_scale: ScaleSpec | str | None = None,
    granularity: str = "tensor",
) -> KVQuant | None:
    """The fp8 storage state a cache of `geometry` needs: a `KVQuant` when its dtype is
    fp8 (scales None mean "dynamic"), None otherwise, where giving scales is a ConfigError."""
    if geometry.dtype not in fp8.FORMATS:
        if k_scale is not None or v_scale is not None:
            raise ConfigError(
                f"k_scale/v_scale are given but the KV dtype {geometry.dtype!r} is not fp8"
            )
        return None
    return KVQuant(
        geometry.dtype,
        geometry.num_layers,
        geometry.num_kv_heads,
        k_scale="dynamic" if k_scale is None else k_scale,
        v_scale="dynamic" if v_scale is None else v_scale,
        granularity=granularity,
    )


def append_dtype(quant: KVQuant | None, cache_dtype: torch.dtype, keys: object) -> torch.dtype:
    """The dtype new keys and values must have: the cache's, or for an fp8 cache the keys'
    own (`KVQuant.prepare` then checks it is one of `INPUT_DTYPES`)."""
    if quant is None or not isinstance(keys, torch.Tensor):
        return cache_dtype
    return keys.dtype
