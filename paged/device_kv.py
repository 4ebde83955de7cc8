"""The device's K and V pools of a `PagedKVCache` and the kernel calls that touch them.

A part of the cache (`paged.cache`): two tensors [num_layers, num_blocks, block_size,
num_kv_heads, head_dim] on the cache's device, or none in memory-only mode (then every
write and copy is a no-op and reading the KV is a ConfigError). All KV movement goes
through `kernels.ops` (write_kv, copy_blocks, swap_blocks; decode attention with
paged_decode_attention) with the cache's forced backend, if any; block ids come from the block pool, which this part never changes.

Invariant (asserted by `check`): both tensors or neither; when present, both have the
pool's shape, dtype and device.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import torch

from kvbench.kernels import ops
from kvbench.paged.block_table import block_table_tensor, slot_mapping
from kvbench.reference.validation import allocate_zeros, validate_attend_query
from kvbench.workloads.errors import ConfigError, ShapeError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.kv_quant import KVQuant


class DeviceKV:
    """K and V block pools on one device (or none: memory-only)."""

    def __init__(
        self,
        geometry: KVGeometry,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        *,
        store_kv: bool,
        backend: str | None,
    ) -> None:
        self.geometry = geometry
        self.num_layers = geometry.num_layers
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.dtype = dtype
        self.device = device
        #: The kernels' backend forced by the cache ("torch", "triton") or None (ops picks).
        self.backend = backend
        #: One block's shape: [block_size, num_kv_heads, head_dim].
        self.block_shape = (block_size, geometry.num_kv_heads, geometry.head_dim)
        self.k: torch.Tensor | None = None
        self.v: torch.Tensor | None = None
        if store_kv:
            shape = (geometry.num_layers, num_blocks, *self.block_shape)
            self.k = allocate_zeros(shape, dtype, device, "the key pool")
            self.v = allocate_zeros(shape, dtype, device, "the value pool")

    def storage(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) pools; ConfigError for a memory-only cache."""
        if self.k is None or self.v is None:
            raise ConfigError("this cache is memory-only (store_kv=False): it holds no KV")
        return self.k, self.v

    def write(
        self,
        blocks: Sequence[int],
        start: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        pending: Any = None,
    ) -> None:
        """Write n tokens' K and V [num_layers, n, kv_heads, head_dim] at positions
        start .. start + n - 1 of the block table `blocks`. `pending`: fp8 pools only, the
        prepared scales (`workloads.kv_quant`) the kernels quantize each layer with."""
        if self.k is None or self.v is None:
            return
        n = keys.shape[1]
        slots = slot_mapping(blocks, self.block_size, start, n).to(self.device)
        keys = keys.to(self.device).contiguous()
        values = values.to(self.device).contiguous()
        kb: dict[str, Any] = {"backend": self.backend}
        for layer in range(self.num_layers):
            if pending is not None:  # fp8: the kernels quantize with this layer's scales
                kb["k_scale"], kb["v_scale"] = pending.layer(layer, self.device)
            ops.write_kv(self.k[layer], self.v[layer], keys[layer], values[layer], slots, **kb)

    def copy_block(self, src: int, dst: int) -> None:
        """Copy block `src` into block `dst` in every layer (copy-on-write)."""
        if self.k is None or self.v is None:
            return
        pair = torch.tensor([[src, dst]], dtype=torch.int64, device=self.device)
        for layer in range(self.num_layers):
            ops.copy_blocks(self.k[layer], self.v[layer], pair, backend=self.backend)

    def gather(self, blocks: Sequence[int], seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Copies of the K and V of positions 0 .. seq_len - 1 of a block table,
        [num_layers, seq_len, kv_heads, head_dim]."""
        k, v = self.storage()
        slots = slot_mapping(blocks, self.block_size, 0, seq_len).to(self.device)
        flat = (k.shape[0], self.num_blocks * self.block_size, *k.shape[3:])
        return k.view(flat)[:, slots].contiguous(), v.view(flat)[:, slots].contiguous()

    def attend(
        self,
        request_ids: Sequence[Hashable],
        tables: Sequence[Sequence[int]],
        seq_lens: Sequence[int],
        query: torch.Tensor,
        layer: int,
        scale: float | None,
        kv_quant: KVQuant | None,
    ) -> torch.Tensor:
        """Decode attention of query[b] ([batch, num_q_heads, head_dim]) over the
        `seq_lens[b]` tokens of block table `tables[b]` in one layer, through
        `kernels.ops.paged_decode_attention`; fp8 pools dequantize with `kv_quant`'s
        scales of the layer. ConfigError (memory-only, bad layer) or ShapeError (bad
        query, a request without tokens) before anything runs."""
        g = self.geometry
        k, v = self.storage()
        validate_attend_query(query, len(tables), g, layer)
        for rid, length in zip(request_ids, seq_lens, strict=True):
            if length == 0:
                raise ShapeError(f"request {rid!r} has no cached tokens to attend over")
        if not tables:
            return query.clone()
        rows, lens = block_table_tensor(tables, seq_lens, self.block_size)
        scale = 1.0 / math.sqrt(g.head_dim) if scale is None else float(scale)
        k_scale = v_scale = None
        if kv_quant is not None:  # fp8: the kernels dequantize with the layer's scales
            ks, vs = kv_quant.scales()
            k_scale, v_scale = ks[layer].to(self.device), vs[layer].to(self.device)
        return ops.paged_decode_attention(
            query.to(self.device), k[layer], v[layer], rows.to(self.device),
            lens.to(self.device), scale, backend=self.backend, max_seq_len=max(seq_lens),
            k_scale=k_scale, v_scale=v_scale,
        )  # fmt: skip

    def snapshot(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Copies of both pools (None in memory-only mode)."""
        return (
            None if self.k is None else self.k.clone(),
            None if self.v is None else self.v.clone(),
        )

    def check(self) -> None:
        """Assert the invariant of the module docstring."""
        assert (self.k is None) == (self.v is None), "one of K and V is missing"
        for t in (self.k, self.v):
            if t is not None:
                want = (self.num_layers, self.num_blocks, *self.block_shape)
                assert tuple(t.shape) == want, f"KV pool shape {tuple(t.shape)} != {want}"
                assert t.dtype == self.dtype and t.device == self.device


def copy_between(
    src: tuple[torch.Tensor, torch.Tensor],
    dst: tuple[torch.Tensor, torch.Tensor],
    pairs: Sequence[tuple[int, int]],
    backend: str | None,
) -> None:
    """Copy blocks (src block, dst block) of stacked [num_layers, blocks, ...] K and V
    pools from `src` to `dst` (device <-> CPU swap space), layer by layer."""
    mapping = torch.tensor(list(pairs), dtype=torch.int64)
    for layer in range(src[0].shape[0]):
        for a, b in zip(src, dst, strict=True):
            ops.swap_blocks(a[layer], b[layer], mapping, backend=backend)
