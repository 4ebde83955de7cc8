"""fp8 K/V of the layer-group cache (`paged.layer_groups`): one `KVQuant` per layer group.

Each group's layers are layers of their own in the model, so each group has its own K and
V scales per layer (and KV head), with `PagedKVCache`'s rules (`workloads.kv_quant`):
static scales, one spec for every group (a number, `[num_kv_heads]` or `[layers_per_group,
num_kv_heads]`, finite and > 0), or dynamic ones (no scales given), which each group sets
from its own first write (a self-attention group's first append, a cross-attention
group's first admission) and never changes after. Writes quantize through the kernels'
`write_kv` with the group's scales of each layer, so a group stores the bytes a
`PagedKVCache` of one group's geometry stores for the same writes; copies and swaps move
the bytes; reads dequantize in the kernels. Scales are prepared (inputs checked: finite,
a float dtype of `kv_quant.INPUT_DTYPES`) before an operation changes anything and
committed only once it succeeded, so a failed append or admission sets no scale.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.kernels.validation import SUPPORTED_DTYPES
from kvbench.reference.contract import KVPair
from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError, ShapeError
from kvbench.workloads.kv_quant import INPUT_DTYPES, KVQuant, PendingScales, ScaleSpec

#: Prepared scales of one write, per group index (`GroupQuant.prepare`).
Pending = dict[int, PendingScales]


class GroupQuant:
    """The fp8 format and the per-group `KVQuant`s of a layer-group cache."""

    def __init__(
        self,
        dtype: torch.dtype,
        num_groups: int,
        layers: int,
        heads: int,
        k_scale: ScaleSpec | None,
        v_scale: ScaleSpec | None,
        granularity: str,
    ) -> None:
        self.format = fp8.fp8_format(dtype)
        self.groups = [
            KVQuant(
                self.format.name,
                layers,
                heads,
                k_scale="dynamic" if k_scale is None else k_scale,
                v_scale="dynamic" if v_scale is None else v_scale,
                granularity=granularity,
            )
            for _ in range(num_groups)
        ]

    def check_dtype(self, k: torch.Tensor, v: torch.Tensor, what: str) -> None:
        """New K and V: one float dtype of `INPUT_DTYPES` (quantized on write)."""
        if k.dtype not in INPUT_DTYPES or v.dtype != k.dtype:
            raise ShapeError(
                f"{what}: K {k.dtype} / V {v.dtype}; an {self.format.name} cache takes K and V "
                f"of one dtype of {[str(d).removeprefix('torch.') for d in INPUT_DTYPES]}"
            )

    def prepare(self, groups: Sequence[int], kv: Sequence[KVPair]) -> Pending:
        """The scales each group's write of `kv[i]` (into `groups[i]`) uses; raises
        (NonFiniteError) before anything changes. Writes of no tokens need none."""
        return {
            g: self.groups[g].prepare(k, v)
            for g, (k, v) in zip(groups, kv, strict=True)
            if k.shape[1]
        }

    def commit(self, pending: Pending) -> None:
        """Fix the dynamic scales a write that succeeded set."""
        for g, p in pending.items():
            self.groups[g].commit(p)

    def scales(self, group: int) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V scales of `group`, float32 [layers, num_kv_heads] (ConfigError while
        dynamic scales wait for the group's first write)."""
        return self.groups[group].scales()

    def layer_kw(self, group: int, layer: int, device: torch.device) -> dict[str, torch.Tensor]:
        """The `k_scale` / `v_scale` arguments of a kernel call on (group, layer)."""
        k, v = self.scales(group)
        return {"k_scale": k[layer].to(device), "v_scale": v[layer].to(device)}

    def snapshot(self) -> tuple[object, ...]:
        """Every group's scales as plain values (None: dynamic, not set yet)."""
        return tuple(
            tuple(t.tolist() for t in q.scales()) if q.is_set else None for q in self.groups
        )


def group_quant(
    dtype: torch.dtype,
    num_groups: int,
    layers: int,
    heads: int,
    k_scale: ScaleSpec | None = None,
    v_scale: ScaleSpec | None = None,
    granularity: str = "tensor",
) -> GroupQuant | None:
    """The fp8 state a layer-group cache of `dtype` needs (None for 16/32-bit storage).
    ConfigError, naming the value, for a dtype the cache cannot store, scales given for
    a dtype that is not fp8, or bad scales (`KVQuant`'s checks)."""
    if fp8.is_fp8(dtype):
        return GroupQuant(dtype, num_groups, layers, heads, k_scale, v_scale, granularity)
    if dtype not in SUPPORTED_DTYPES:
        names = [str(d).removeprefix("torch.") for d in (*SUPPORTED_DTYPES, *fp8_dtypes())]
        raise ConfigError(
            f"dtype {str(dtype).removeprefix('torch.')} cannot be stored by the layer-group "
            f"cache (supported: {', '.join(names)})"
        )
    if k_scale is not None or v_scale is not None:
        raise ConfigError(
            f"k_scale/v_scale are given but the KV dtype {str(dtype).removeprefix('torch.')} "
            "is not fp8"
        )
    return None


def fp8_dtypes() -> list[torch.dtype]:
    """The fp8 storage dtypes (`workloads.fp8.FORMATS`)."""
    return [f.dtype for f in fp8.FORMATS.values()]
