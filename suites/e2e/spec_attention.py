"""Layer-group attention engines of the e2e runner (`spec_runner`): where each model
layer's K/V is read from, through a `reference.contract.LayerGroupsKVCache`.

Every engine finds a layer's group and storage index in a `spec_forward.LayerMap` and
applies that group's spec: a sliding-window group attends to the last `window` positions
(the kernels' `window=`, the oracle's `window=`), a full group to all, a cross-attention
group to the request's whole encoder output with no mask.

    GroupNativeAttention  the paged kernels over a LayerGroupsPagedCache's own pool and
                          its per-group block tables (released entries -1 included): the
                          new tokens written with `write_kv` into a copy of the pool
                          (plus scratch blocks), then `paged_prefill_attention` (or
                          `paged_decode_attention` when every request has one new token);
                          cross-attention as one decode row per query over the request's
                          cross table (seq_len = encoder length), non-causal by design.
    GroupOracleAttention  float64 (`reference.oracle`) over what `cache.gather(id, group)`
                          returns (the window, all, or the encoder output) plus the new
                          tokens: any LayerGroupsKVCache, the reference one included.
    GroupCacheAttention   the read pass: the newest token of each request (already
                          appended) through `cache.attend` (paged: the kernels) or, for a
                          cache whose `attend` takes no scale (the reference), the float64
                          oracle over its `gather`.
"""

from __future__ import annotations

import torch

from kvbench.reference import oracle
from kvbench.suites.e2e.llama_forward import PackedBatch, _NativePlan, native_plan
from kvbench.suites.e2e.spec_forward import LayerMap
from kvbench.workloads.errors import ConfigError, ShapeError
from kvbench.workloads.kv_rules import rule_for
from kvbench.workloads.kv_spec import KernelWindow


def _window(cache, group: int) -> KernelWindow:
    """The kernels' `window` argument of a group, as its kind's rule says (a sliding
    window's tokens, None for full attention, the spec itself for another kind)."""
    return rule_for(cache.model.groups[group].spec).kernel_window


class GroupNativeAttention:
    """The paged kernels reading a LayerGroupsPagedCache's pool (module docstring)."""

    needs_prefix = False  # reads the cache's pool itself

    def __init__(
        self,
        cache,
        layers: LayerMap,
        scale: float,
        backend: str | None = "torch",
        check_indices: bool = True,
    ) -> None:
        for name in ("block_table", "k", "v", "block_size"):
            if not hasattr(cache, name):
                raise ConfigError(
                    f"native layer-group attention needs cache.{name}; "
                    f"{type(cache).__name__} has none"
                )
        self.cache = cache
        self.layers = layers
        self.scale = scale
        self.backend = backend
        self.check_indices = check_indices
        # The plans of the batch being run, per group (held by reference).
        self._plans: tuple[PackedBatch, dict[int, _NativePlan]] | None = None

    def _plan(self, batch: PackedBatch, group: int, device: torch.device) -> _NativePlan:
        if self._plans is None or self._plans[0] is not batch:
            self._plans = (batch, {})
        plans = self._plans[1]
        if group not in plans:
            tables = [self.cache.block_table(rid, group) for rid in batch.request_ids]
            pool = int(self.cache.k.shape[1])
            plans[group] = native_plan(batch, tables, int(self.cache.block_size), pool).to(device)
        return plans[group]

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        from kvbench.kernels import ops

        group, j = self.layers.self_slots[layer]
        plan = self._plan(batch, group, q.device)
        pools = []
        for real in (self.cache.k[j], self.cache.v[j]):
            extra = real.new_zeros((plan.num_scratch, *real.shape[1:]))
            pool = torch.cat([real, extra]).to(q.dtype)
            for src, dst in plan.private_copies:
                pool[dst] = pool[src]
            pools.append(pool)
        k_cache, v_cache = pools
        checks, window = self.check_indices, _window(self.cache, group)
        ops.write_kv(k_cache, v_cache, k, v, plan.slots, backend=self.backend, check_indices=checks)
        if all(n == 1 for n in batch.lengths):
            return ops.paged_decode_attention(
                q, k_cache, v_cache, plan.tables, plan.seq_lens, self.scale,
                backend=self.backend, check_indices=checks, max_seq_len=plan.max_seq_len,
                window=window,
            )  # fmt: skip
        return ops.paged_prefill_attention(
            q, k_cache, v_cache, plan.tables, plan.cu_seqlens, plan.seq_lens, self.scale,
            backend=self.backend, check_indices=checks, max_seq_len=plan.max_seq_len,
            max_q_len=plan.max_q_len, window=window,
        )  # fmt: skip

    def cross(self, batch: PackedBatch, layer: int, q: torch.Tensor) -> torch.Tensor:
        from kvbench.kernels import ops

        group, j = self.layers.cross_slots[layer]
        enc_len = self.cache.model.groups[group].spec.encoder_len
        rows = []
        for rid, n in zip(batch.request_ids, batch.lengths, strict=True):
            rows += [self.cache.block_table(rid, group)] * n
        tables = torch.tensor(rows, dtype=torch.int32).to(q.device)
        lens = torch.full((len(rows),), enc_len, dtype=torch.int32).to(q.device)
        return ops.paged_decode_attention(
            q, self.cache.k[j], self.cache.v[j], tables, lens, self.scale, backend=self.backend,
            check_indices=self.check_indices, max_seq_len=enc_len,
        )  # fmt: skip


class GroupOracleAttention:
    """float64 attention over `cache.gather` plus the new tokens (module docstring)."""

    needs_prefix = False  # gathers per group itself

    def __init__(self, cache, layers: LayerMap, scale: float) -> None:
        self.cache = cache
        self.layers = layers
        self.scale = scale

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        group, j = self.layers.self_slots[layer]
        mask = oracle.spec_mask(self.cache.model.groups[group].spec)  # the oracle's own
        out = torch.empty_like(q)
        for rid, c, s, n in zip(
            batch.request_ids, batch.cached, batch.starts, batch.lengths, strict=True
        ):
            kk, vv = k[s : s + n], v[s : s + n]
            if c:
                pk, pv = self.cache.gather(rid, group)
                kk = torch.cat([pk[j].to(k.device, k.dtype), kk])
                vv = torch.cat([pv[j].to(v.device, v.dtype), vv])
            # the gathered prefix may start past position 0: the oracle masks true positions
            offset = c - (kk.shape[0] - n)
            res = oracle.extend_attention(q[s : s + n], kk, vv, self.scale, offset=offset, **mask)
            out[s : s + n] = res.to(q.dtype)
        return out

    def cross(self, batch: PackedBatch, layer: int, q: torch.Tensor) -> torch.Tensor:
        group, j = self.layers.cross_slots[layer]
        out = torch.empty_like(q)
        for rid, s, n in zip(batch.request_ids, batch.starts, batch.lengths, strict=True):
            ek, ev = self.cache.gather(rid, group)
            ks, vs = [ek[j].to(q.device)] * n, [ev[j].to(q.device)] * n
            res = oracle.batched_decode_attention(q[s : s + n], ks, vs, self.scale)
            out[s : s + n] = res.to(q.dtype)
        return out


class GroupCacheAttention:
    """Decode attention of each request's newest token through the cache under test."""

    needs_prefix = False

    def __init__(
        self, cache, layers: LayerMap, scale: float, backend: str | None = "torch"
    ) -> None:
        self.cache = cache
        self.layers = layers
        self.scale = scale
        self.backend = backend
        self._paged = hasattr(cache, "block_table")

    def _attend(self, batch: PackedBatch, group: int, j: int, q: torch.Tensor) -> torch.Tensor:
        if any(n != 1 for n in batch.lengths):
            raise ShapeError(f"cache attention takes one token per request, got {batch.lengths}")
        ids = batch.request_ids
        if self._paged:
            return self.cache.attend(ids, q, group, j, scale=self.scale, backend=self.backend)
        kvs = [self.cache.gather(r, group) for r in ids]
        ks = [kv[0][j].to(q.device) for kv in kvs]
        vs = [kv[1][j].to(q.device) for kv in kvs]
        return oracle.batched_decode_attention(q, ks, vs, self.scale).to(q.dtype)

    def __call__(
        self, batch: PackedBatch, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        group, j = self.layers.self_slots[layer]
        return self._attend(batch, group, j, q)

    def cross(self, batch: PackedBatch, layer: int, q: torch.Tensor) -> torch.Tensor:
        group, j = self.layers.cross_slots[layer]
        return self._attend(batch, group, j, q)
