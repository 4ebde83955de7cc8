"""Torch versions of the kernel ops: same signatures and checks as the Triton kernels.

They are what runs on a CPU without `TRITON_INTERPRET=1`, and the second opinion the
conformance suite compares the Triton kernels with. Callers should go through
`kernels.ops`, which validates and dispatches; these functions assume validated input.

The decode path is kept lean because the CPU benchmark measures it against SDPA on
contiguous KV: one vectorized gather of the blocks in use into a reused per-thread
workspace, then one SDPA call in which the query heads of a GQA group are the query rows,
so each KV head is read once per group.
"""

from __future__ import annotations

import threading

import torch
import torch.nn.functional as F

from kvbench.kernels.launch_plan import LaunchPlan
from kvbench.kernels.validation import AttentionDims, CacheDims
from kvbench.workloads.kv_rules import KindRule, rule_for_window
from kvbench.workloads.kv_spec import KernelWindow


def supports(plan: LaunchPlan) -> str | None:
    """The gather + SDPA reference path runs every plan validation accepts, on any device
    (torch does the work): always None."""
    del plan
    return None


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    dims: CacheDims,
) -> None:
    """Write `key[i]`, `value[i]` at flat slot `slot_mapping[i]` (skip slot -1)."""
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].to(torch.int64)
    rows = (-1, dims.num_kv_heads, dims.head_dim)
    k_cache.view(rows).index_copy_(0, slots, key[keep])
    v_cache.view(rows).index_copy_(0, slots, value[keep])


def copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, pairs: torch.Tensor) -> None:
    """Copy block `pairs[i, 0]` onto block `pairs[i, 1]` in both caches (copy-on-write)."""
    if pairs.numel() == 0:
        return
    src, dst = pairs[:, 0], pairs[:, 1]
    for cache in (k_cache, v_cache):
        cache.index_copy_(0, dst, cache.index_select(0, src))


def _crosses_host(src: torch.Tensor, dst: torch.Tensor) -> bool:
    """Whether a swap moves data between devices (a host link copy)."""
    return src.device != dst.device


def _host_sync(src: torch.Tensor, dst: torch.Tensor) -> None:
    """Wait for the copies queued between `src` and `dst` on the CUDA side's current
    stream, so the host may use (or reuse) either pool; nothing to wait for on a CPU."""
    for t in (src, dst):
        if t.device.type == "cuda":
            torch.cuda.current_stream(t.device).synchronize()
            return


def _runs(pairs: list[list[int]]) -> list[tuple[int, int, int]]:
    """(src_start, dst_start, count) of the maximal runs of pairs that advance source and
    destination block together, so each run is one contiguous copy."""
    runs: list[tuple[int, int, int]] = []
    for s, d in sorted(pairs):
        if runs and runs[-1][0] + runs[-1][2] == s and runs[-1][1] + runs[-1][2] == d:
            runs[-1] = (runs[-1][0], runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, d, 1))
    return runs


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
    """Copy `src[mapping[i, 0]]` into `dst[mapping[i, 1]]`, moving data across devices.

    Within one device: one gather and one scatter. Across the host link each run of
    consecutive blocks is one copy straight between the two pools (device to host lands
    in the destination's own rows; host to device reads the source's own rows, so a
    pinned pool gives asynchronous DMA and no pageable staging), and the call returns
    only after the CUDA stream has finished them: the host may then read the swapped-out
    blocks or reuse the swapped-in ones. A mapping on a CUDA device is read on the host
    here (swap is not a timed hot path; pass a CPU mapping).
    """
    if mapping.numel() == 0:
        return
    if not _crosses_host(src, dst):
        blocks = src.index_select(0, mapping[:, 0].to(src.device))
        dst.index_copy_(0, mapping[:, 1].to(dst.device), blocks)
        return
    for s, d, n in _runs(mapping.tolist()):
        dst[d : d + n].copy_(src[s : s + n], non_blocking=True)
    _host_sync(src, dst)


class _Workspace(threading.local):
    """Per-thread scratch buffers for the gathered K/V, reused across calls.

    A fresh multi-megabyte tensor per call costs page faults that take several times
    longer than the copy itself on a CPU; reusing the buffer leaves the gather at memcpy
    speed. Results never alias the workspace (SDPA writes a new tensor).
    """

    def __init__(self) -> None:
        self.buffers: dict[tuple[torch.device, torch.dtype, int], torch.Tensor] = {}

    def get(self, slot: int, like: torch.Tensor, numel: int) -> torch.Tensor:
        key = (like.device, like.dtype, slot)
        buf = self.buffers.get(key)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=like.dtype, device=like.device)
            self.buffers[key] = buf
        return buf[:numel]


_WORKSPACE = _Workspace()


def _gather(cache: torch.Tensor, tables: torch.Tensor, slot: int | None = None) -> torch.Tensor:
    """[B, n_blocks] block ids -> [B, Hkv, n_blocks * block_size, D] (one copy, into the
    workspace `slot` when given)."""
    b, n = tables.shape
    _, bs, h, d = cache.shape
    idx = tables.reshape(-1)
    if slot is None:
        flat = cache.index_select(0, idx)
    else:
        buf = _WORKSPACE.get(slot, cache, b * n * bs * h * d)
        flat = torch.index_select(cache, 0, idx, out=buf.view(b * n, bs, h, d))
    return flat.view(b, n * bs, h, d).transpose(1, 2)


def _dequantize_heads(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Gathered fp8 K or V `[B, Hkv, L, D]` -> `float32(x) * scale[h]`, then `dtype`."""
    return (x.to(torch.float32) * scale.view(1, -1, 1, 1)).to(dtype)


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    window: KernelWindow = None,
    span: int | None = None,
) -> torch.Tensor:
    """Decode attention of `query[b]` over the first `seq_lens[b]` tokens of its blocks
    (their last `window` tokens when given; see `window_tables`).

    Writes `out` ([B, Hq, D], query dtype) and returns it. fp8 caches: the gathered bytes
    are dequantized with `kv_scales` (`float32(byte) * scale`, then the query dtype).
    `span`: the launch plan's tokens per windowed sequence (the kind rule's `read_span` when None).
    """
    cd = dims.cache
    batch, hq, d = query.shape
    if batch == 0:
        return out
    rule = rule_for_window(window)
    if rule.bounded:
        if span is None:
            span = rule.read_span(dims.max_seq_len, cd.block_size)
        return _windowed_decode(query, k_cache, v_cache, block_tables, seq_lens, scale, out,
                                dims, rule, span, kv_scales)  # fmt: skip
    n_blocks = -(-dims.max_seq_len // cd.block_size)
    tables = block_tables[:, :n_blocks].to(torch.int64)
    if dims.max_seq_len != int(seq_lens.min()):  # entries past a length may be padding
        used = (seq_lens.to(torch.int64) + cd.block_size - 1) // cd.block_size
        cols = torch.arange(n_blocks, device=tables.device)
        tables = torch.where(cols < used.unsqueeze(1), tables, 0)
    k = _gather(k_cache, tables, slot=0)  # [B, Hkv, L, D]
    v = _gather(v_cache, tables, slot=1)
    if kv_scales is not None:
        k = _dequantize_heads(k, kv_scales[0], query.dtype)
        v = _dequantize_heads(v, kv_scales[1], query.dtype)
    q = query.reshape(batch, cd.num_kv_heads, dims.group, d)  # group heads as query rows
    length = n_blocks * cd.block_size
    mask = None
    if not bool((seq_lens == length).all()):
        pos = torch.arange(length, device=query.device)
        mask = (pos.unsqueeze(0) < seq_lens.unsqueeze(1)).view(batch, 1, 1, length)
        # Slots past a length hold whatever the pool held (engines allocate with
        # torch.empty): zero them, since a masked NaN would still poison SDPA (0 * NaN).
        invalid = ~mask.view(batch, 1, length, 1)
        k = k.masked_fill(invalid, 0)
        v = v.masked_fill(invalid, 0)
    res = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    out.copy_(res.reshape(batch, hq, d))
    return out


def window_tables(
    block_tables: torch.Tensor, seq_lens: torch.Tensor, block_size: int, rule: KindRule, span: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Each sequence's table from the first block its newest query reads under `rule`
    (so blocks wholly before the window are never gathered), with the matching lengths
    and the first position to read in the shifted coordinates (< block_size: the partial
    block).

    Sequence b of length L reads positions k = rule.first_kept(L - 1) .. L - 1 (a window
    W: max(0, L - W)). Its first block is f = k // block_size; shifted, it has
    L' = L - f * block_size tokens and reads from k - f * block_size (not the rule at
    L' - 1: a chunk's start does not move with the shift). `span` bounds
    every L' (tokens; the launch size, `rule.read_span`).
    """
    lens = seq_lens.to(torch.int64)
    first = rule.first_kept_many(lens - 1) // block_size
    n_blocks = -(-span // block_size)
    cols = first.unsqueeze(1) + torch.arange(n_blocks, device=block_tables.device)
    cols = cols.clamp(max=block_tables.shape[1] - 1)
    tables = block_tables.to(torch.int64).gather(1, cols)
    shifted = lens - first * block_size
    return tables, shifted, rule.first_kept_many(lens - 1) - first * block_size


def _windowed_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    rule: KindRule,
    span: int,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> torch.Tensor:
    """Sliding-window decode: gather only the blocks from the first one the window
    touches (`span` tokens at most), mask the part of that block before the window and
    the slots past the end. fp8 caches: the gathered bytes are dequantized with
    `kv_scales` before masking."""
    cd = dims.cache
    batch, hq, d = query.shape
    tables, lens, lo = window_tables(block_tables, seq_lens, cd.block_size, rule, span)
    used = (lens + cd.block_size - 1) // cd.block_size
    cols = torch.arange(tables.shape[1], device=tables.device)
    tables = torch.where(cols < used.unsqueeze(1), tables, 0)  # padding past a length
    k = _gather(k_cache, tables, slot=0)  # [B, Hkv, n_blocks * block_size, D]
    v = _gather(v_cache, tables, slot=1)
    if kv_scales is not None:
        k = _dequantize_heads(k, kv_scales[0], query.dtype)
        v = _dequantize_heads(v, kv_scales[1], query.dtype)
    pos = torch.arange(k.shape[2], device=query.device)
    keep = (pos.unsqueeze(0) >= lo.unsqueeze(1)) & (pos.unsqueeze(0) < lens.unsqueeze(1))
    invalid = ~keep.view(batch, 1, -1, 1)  # zeroed: a masked NaN would poison SDPA
    k = k.masked_fill(invalid, 0)
    v = v.masked_fill(invalid, 0)
    q = query.reshape(batch, cd.num_kv_heads, dims.group, d)
    res = F.scaled_dot_product_attention(q, k, v, attn_mask=keep.view(batch, 1, 1, -1), scale=scale)
    out.copy_(res.reshape(batch, hq, d))
    return out


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    window: KernelWindow = None,
) -> torch.Tensor:
    """Causal attention of each sequence's new tokens over its cached prefix and itself.
    fp8 caches: dequantized after the gather with `kv_scales`, as in decode.

    Sequence b owns query rows `cu_seqlens_q[b] : cu_seqlens_q[b+1]` (n tokens), which sit
    at positions `seq_lens[b] - n ... seq_lens[b] - 1`; row i sees keys 0 .. seq_lens[b] - n + i
    (from seq_lens[b] - n + i - window + 1 with a sliding `window`: the gather starts at
    the block of the first row's first key, and that block's earlier slots are zeroed,
    since a masked NaN would still poison SDPA). One gather and one SDPA call per sequence.
    """
    cd = dims.cache
    cu = cu_seqlens_q.tolist()
    lens = seq_lens.tolist()
    rule = rule_for_window(window)
    for b in range(dims.batch):
        start, end, length = cu[b], cu[b + 1], lens[b]
        n = end - start
        n_blocks = -(-length // cd.block_size)
        lo = rule.first_kept(length - n)  # the first row's first key
        first = lo // cd.block_size
        table = block_tables[b : b + 1, first:n_blocks].to(torch.int64)
        span = length - first * cd.block_size
        k = _gather(k_cache, table)[:, :, :span]  # [1, Hkv, span, D]
        v = _gather(v_cache, table)[:, :, :span]
        if kv_scales is not None:
            k = _dequantize_heads(k, kv_scales[0], query.dtype)
            v = _dequantize_heads(v, kv_scales[1], query.dtype)
        q = query[start:end].transpose(0, 1).unsqueeze(0)  # [1, Hq, n, D]
        qpos = torch.arange(length - n, length, device=query.device).unsqueeze(1)
        kpos = torch.arange(first * cd.block_size, length, device=query.device).unsqueeze(0)
        mask = kpos <= qpos  # [n, span]
        if rule.bounded:
            mask &= kpos >= rule.first_kept_many(qpos)
            before = (kpos < lo).view(1, 1, -1, 1)
            k = k.masked_fill(before, 0)
            v = v.masked_fill(before, 0)
        res = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, scale=scale, enable_gqa=dims.group > 1
        )
        out[start:end] = res[0].transpose(0, 1)
    return out
