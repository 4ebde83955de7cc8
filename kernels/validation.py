"""Input checks shared by the torch and Triton versions of every kernel op.

Both versions call the same check before doing anything, so a bad argument fails the same
way on either backend, before any launch and before any tensor is written: an op that
raises has changed nothing. Every message names the bad value.

What is checked: ranks and shapes, dtypes (float32, float16, bfloat16 for K/V/Q; fp8 caches too, see
`kernels.fp8_ops`), devices,
contiguity (the caches are addressed as flat pools), head counts that divide, and index
values (slots, block ids, block-table entries, sequence lengths) within the pool and the
table. Checking index values reads them on the host, which synchronizes a CUDA stream;
callers on a hot path that have already validated their indices pass
`check_indices=False` to the ops.

With `check_indices=False` nothing here reads a tensor's values on the host: the checks
look at shapes, dtypes, devices and strides only, and the attention ops take the maxima
they size their grids by (`max_seq_len`, `max_q_len`) from the caller, who knows them
without reading device memory (from host-side bookkeeping, computed once outside any
timed region). When the caller gives none, a bound from the shapes is used instead
(the block table's capacity, the total query count): still correct, since the kernels
skip partitions and query tiles past each sequence's own lengths, only less tight.
With `check_indices=True` the maxima given are checked against the lengths themselves.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError, ShapeError
from kvbench.workloads.geometry import require_positive
from kvbench.workloads.kv_rules import rule_for_window
from kvbench.workloads.kv_spec import KernelWindow

#: dtypes the kernels accept for queries, keys, values and caches.
SUPPORTED_DTYPES: tuple[torch.dtype, ...] = (torch.float32, torch.float16, torch.bfloat16)
#: dtypes a K/V cache (pool) may have: the above, or fp8 (`workloads.fp8`), which the ops
#: quantize on write and dequantize on read with the per-KV-head scales they are given.
CACHE_DTYPES: tuple[torch.dtype, ...] = (
    *SUPPORTED_DTYPES,
    *(f.dtype for f in fp8.FORMATS.values()),
)
#: dtypes accepted for slot mappings, block ids and block tables.
INDEX_DTYPES: tuple[torch.dtype, ...] = (torch.int32, torch.int64)
#: backends an op can be asked for (`backend=`): "torch" is the torch side (the C++ CPU
#: kernel where it runs, else gather + SDPA), the others one backend each
#: (`kernels.backends`).
BACKENDS: tuple[str, ...] = ("torch", "triton", "cpu_paged", "torch_gather")


class IndexRangeError(ShapeError):
    """An index value (slot, block id, table entry, sequence length) lies outside the
    pool or table it addresses."""


@dataclass(frozen=True)
class CacheDims:
    """The geometry of one layer's paged K (or V) cache
    `[num_blocks, block_size, num_kv_heads, head_dim]`."""

    num_blocks: int
    block_size: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class AttentionDims:
    """Geometry of a paged attention call, derived once by the checks.

    `max_seq_len` is the longest KV length in the batch (tokens) and `max_q_len` the
    longest run of new query tokens (1 for decode).
    """

    cache: CacheDims
    batch: int
    num_q_heads: int
    group: int
    max_seq_len: int
    max_q_len: int


def check_backend(backend: str | None) -> None:
    """Raise ConfigError unless `backend` is None (automatic) or a known backend name."""
    if backend is not None and backend not in BACKENDS:
        raise ConfigError(f"backend={backend!r} is not one of {BACKENDS} (or None for automatic)")


def _check_float(
    name: str, t: torch.Tensor, allowed: tuple[torch.dtype, ...] = SUPPORTED_DTYPES
) -> None:
    if not isinstance(t, torch.Tensor):
        raise ShapeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in allowed:
        raise ShapeError(f"{name} has dtype {t.dtype}; supported: {allowed}")


def _check_index(name: str, t: torch.Tensor, ndim: int, device: torch.device) -> None:
    if not isinstance(t, torch.Tensor):
        raise ShapeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in INDEX_DTYPES:
        raise ShapeError(f"{name} has dtype {t.dtype}; expected one of {INDEX_DTYPES}")
    if t.dim() != ndim:
        raise ShapeError(f"{name} must have {ndim} dimension(s), got shape {tuple(t.shape)}")
    if t.device != device:
        raise ShapeError(f"{name} is on {t.device} but the cache is on {device}")


def check_cache_pair(k_cache: torch.Tensor, v_cache: torch.Tensor) -> CacheDims:
    """Check one layer's K and V caches and return their geometry.

    Both must be contiguous `[num_blocks, block_size, num_kv_heads, head_dim]` tensors of
    one supported dtype on one device (the kernels address them as flat pools).
    """
    _check_float("k_cache", k_cache, CACHE_DTYPES)
    _check_float("v_cache", v_cache, CACHE_DTYPES)
    if k_cache.dim() != 4:
        raise ShapeError(
            "k_cache must be [num_blocks, block_size, num_kv_heads, head_dim], "
            f"got shape {tuple(k_cache.shape)}"
        )
    if v_cache.shape != k_cache.shape:
        raise ShapeError(
            f"v_cache shape {tuple(v_cache.shape)} differs from k_cache {tuple(k_cache.shape)}"
        )
    if v_cache.dtype != k_cache.dtype:
        raise ShapeError(f"v_cache dtype {v_cache.dtype} differs from k_cache {k_cache.dtype}")
    if v_cache.device != k_cache.device:
        raise ShapeError(f"v_cache is on {v_cache.device} but k_cache on {k_cache.device}")
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        if not t.is_contiguous():
            raise ShapeError(f"{name} must be contiguous; got strides {t.stride()}")
    if any(s == 0 for s in k_cache.shape):
        raise ShapeError(f"k_cache has an empty dimension: shape {tuple(k_cache.shape)}")
    return CacheDims(*k_cache.shape)


def _check_rows(name: str, t: torch.Tensor, dims: CacheDims, device: torch.device) -> None:
    """A [n, num_kv_heads, head_dim] tensor whose per-token rows are contiguous."""
    _check_float(name, t)
    if t.dim() != 3 or t.shape[1:] != (dims.num_kv_heads, dims.head_dim):
        raise ShapeError(
            f"{name} must be [num_tokens, {dims.num_kv_heads}, {dims.head_dim}], "
            f"got shape {tuple(t.shape)}"
        )
    if t.device != device:
        raise ShapeError(f"{name} is on {t.device} but the cache is on {device}")
    if t.shape[0] > 0 and (t.stride(2) != 1 or t.stride(1) != dims.head_dim):
        raise ShapeError(
            f"{name} must have contiguous [num_kv_heads, head_dim] rows "
            f"(strides (*, {dims.head_dim}, 1)); got strides {t.stride()}"
        )


def check_write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    check_indices: bool = True,
) -> CacheDims:
    """Check a write of `num_tokens` new keys/values at `slot_mapping` (-1 = skip).

    Slots must lie in [-1, num_blocks * block_size) and the non-negative ones must be
    distinct (two writes to one slot would make the result depend on the order).
    """
    dims = check_cache_pair(k_cache, v_cache)
    _check_rows("key", key, dims, k_cache.device)
    _check_rows("value", value, dims, k_cache.device)
    if value.shape != key.shape:
        raise ShapeError(f"value shape {tuple(value.shape)} differs from key {tuple(key.shape)}")
    if fp8.is_fp8(k_cache.dtype):  # quantized on write: any supported input dtype
        if value.dtype != key.dtype:
            raise ShapeError(f"value dtype {value.dtype} differs from key {key.dtype}")
    elif key.dtype != k_cache.dtype or value.dtype != k_cache.dtype:
        raise ShapeError(
            f"key/value dtypes ({key.dtype}, {value.dtype}) must equal the cache dtype "
            f"{k_cache.dtype}"
        )
    _check_index("slot_mapping", slot_mapping, 1, k_cache.device)
    if slot_mapping.shape[0] != key.shape[0]:
        raise ShapeError(
            f"slot_mapping has {slot_mapping.shape[0]} entries for {key.shape[0]} tokens"
        )
    if check_indices and slot_mapping.numel():
        capacity = dims.num_blocks * dims.block_size
        slots = slot_mapping.detach().to("cpu", torch.int64)
        bad = slots[(slots < -1) | (slots >= capacity)]
        if bad.numel():
            raise IndexRangeError(
                f"slot_mapping holds slot {int(bad[0])} outside [-1, {capacity}) "
                f"(num_blocks={dims.num_blocks} x block_size={dims.block_size})"
            )
        used = slots[slots >= 0]
        uniq, counts = torch.unique(used, return_counts=True)
        if (counts > 1).any():
            raise IndexRangeError(
                f"slot_mapping writes slot {int(uniq[counts > 1][0])} more than once"
            )
    return dims


def as_block_pairs(
    pairs: torch.Tensor | Sequence[tuple[int, int]], name: str, device: torch.device | None
) -> torch.Tensor:
    """Normalize (src, dst) block pairs to an int64 `[n, 2]` tensor on `device` (a tensor
    stays where it is when `device` is None; a sequence becomes a CPU tensor)."""
    if isinstance(pairs, torch.Tensor):
        if pairs.dtype not in INDEX_DTYPES:
            raise ShapeError(f"{name} has dtype {pairs.dtype}; expected one of {INDEX_DTYPES}")
        t = pairs
    else:
        try:
            t = torch.tensor([(int(s), int(d)) for s, d in pairs], dtype=torch.int64)
        except (TypeError, ValueError) as exc:
            raise ShapeError(f"{name} must be (src, dst) pairs of block ids: {exc}") from None
        t = t.reshape(-1, 2)
    if t.dim() != 2 or t.shape[1] != 2:
        raise ShapeError(f"{name} must be [n, 2] (src, dst) pairs, got shape {tuple(t.shape)}")
    if device is None:
        return t.to(dtype=torch.int64)
    return t.to(device=device, dtype=torch.int64)


def _check_ids(name: str, ids: torch.Tensor, limit: int, what: str) -> None:
    if ids.numel():
        host = ids.detach().to("cpu")
        bad = host[(host < 0) | (host >= limit)]
        if bad.numel():
            raise IndexRangeError(f"{name} holds block {int(bad[0])} outside [0, {limit}) {what}")


def check_copy_blocks(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pairs: torch.Tensor | Sequence[tuple[int, int]],
    check_indices: bool = True,
) -> tuple[CacheDims, torch.Tensor]:
    """Check copy-on-write block copies within one layer's caches.

    Returns the geometry and the pairs as int64 `[n, 2]` on the cache device. Destinations
    must be distinct and must not also be sources, so the copies are order-independent.
    """
    dims = check_cache_pair(k_cache, v_cache)
    t = as_block_pairs(pairs, "pairs", k_cache.device)
    if check_indices and t.numel():
        host = t.detach().to("cpu")
        _check_ids("pairs", host, dims.num_blocks, f"(num_blocks={dims.num_blocks})")
        dst = host[:, 1]
        uniq, counts = torch.unique(dst, return_counts=True)
        if (counts > 1).any():
            raise IndexRangeError(
                f"pairs copy into block {int(uniq[counts > 1][0])} more than once"
            )
        both = set(host[:, 0].tolist()) & set(dst.tolist())
        if both:
            raise IndexRangeError(
                f"block {min(both)} is both a source and a destination of copy_blocks"
            )
    return dims, t


def check_swap_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    mapping: torch.Tensor | Sequence[tuple[int, int]],
    check_indices: bool = True,
) -> torch.Tensor:
    """Check a gather/scatter of whole blocks from pool `src` into pool `dst`.

    Pools are `[num_blocks, ...]` tensors with equal trailing shapes and dtypes (they may
    be on different devices and have different block counts). Returns the mapping as an
    int64 `[n, 2]` tensor of (src_block, dst_block), on the device it came on (a sequence
    of pairs: the CPU); destinations must be distinct.
    """
    _check_float("src", src, CACHE_DTYPES)
    _check_float("dst", dst, CACHE_DTYPES)
    if src.dim() < 2 or dst.dim() != src.dim() or src.shape[1:] != dst.shape[1:]:
        raise ShapeError(
            f"src {tuple(src.shape)} and dst {tuple(dst.shape)} must be [num_blocks, ...] "
            "pools with the same block shape"
        )
    if src.dtype != dst.dtype:
        raise ShapeError(f"src dtype {src.dtype} differs from dst dtype {dst.dtype}")
    for name, t in (("src", src), ("dst", dst)):
        if not t.is_contiguous():
            raise ShapeError(f"{name} must be contiguous; got strides {t.stride()}")
    t = as_block_pairs(mapping, "mapping", None)
    if check_indices and t.numel():
        host = t.detach().to("cpu")
        _check_ids("mapping[:, 0]", host[:, 0], src.shape[0], f"(src has {src.shape[0]} blocks)")
        _check_ids("mapping[:, 1]", host[:, 1], dst.shape[0], f"(dst has {dst.shape[0]} blocks)")
        uniq, counts = torch.unique(host[:, 1], return_counts=True)
        if (counts > 1).any():
            raise IndexRangeError(
                f"mapping writes dst block {int(uniq[counts > 1][0])} more than once"
            )
        if src.data_ptr() == dst.data_ptr():
            both = set(host[:, 0].tolist()) & set(host[:, 1].tolist())
            if both:
                raise IndexRangeError(
                    f"block {min(both)} is both a source and a destination in one pool"
                )
    return t


def _check_query(query: torch.Tensor, dims: CacheDims, k_cache: torch.Tensor) -> int:
    _check_float("query", query)
    if query.dim() != 3:
        raise ShapeError(f"query must be 3-D [*, num_q_heads, head_dim], got {tuple(query.shape)}")
    if query.shape[2] != dims.head_dim:
        raise ShapeError(f"query head_dim {query.shape[2]} differs from the cache {dims.head_dim}")
    if query.dtype != k_cache.dtype and not fp8.is_fp8(k_cache.dtype):
        raise ShapeError(f"query dtype {query.dtype} differs from the cache dtype {k_cache.dtype}")
    if query.device != k_cache.device:
        raise ShapeError(f"query is on {query.device} but the cache is on {k_cache.device}")
    if query.stride(2) != 1:
        raise ShapeError(f"query must have a contiguous last dimension; strides {query.stride()}")
    hq = query.shape[1]
    if hq == 0 or hq % dims.num_kv_heads:
        raise ShapeError(
            f"num_q_heads={hq} is not a positive multiple of num_kv_heads={dims.num_kv_heads}"
        )
    return hq // dims.num_kv_heads


def check_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale to use: 1/sqrt(head_dim) when None; must be finite and > 0."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    s = float(scale)
    if not math.isfinite(s) or s <= 0:
        raise ConfigError(f"scale={scale!r} must be a finite positive number")
    return s


def _check_bound(name: str, value: int | None) -> int | None:
    """A caller's maximum (`max_seq_len`, `max_q_len`): None or an int >= 1."""
    return None if value is None else require_positive(name, value)


def _check_tables(
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    dims: CacheDims,
    device: torch.device,
    check_indices: bool,
    max_seq_len: int | None = None,
    window: KernelWindow = None,
    q_lens: torch.Tensor | None = None,
) -> int:
    """Check block tables and KV lengths; return the longest length (tokens) to size the
    launch by: `max_seq_len` when given (capped at the tables' capacity), else the true
    maximum when indices are checked, else the capacity (no host read). With a sliding
    `window`, entries of blocks wholly before a sequence's window are not read and not
    checked (a cache that released them may hold -1 there): the window of its first
    query, at position L - q_len (`q_lens`, int64 on the host; 1 per sequence when None,
    decode)."""
    _check_index("block_tables", block_tables, 2, device)
    _check_index("seq_lens", seq_lens, 1, device)
    if seq_lens.shape[0] != block_tables.shape[0]:
        raise ShapeError(
            f"seq_lens has {seq_lens.shape[0]} entries for {block_tables.shape[0]} block tables"
        )
    bound = _check_bound("max_seq_len", max_seq_len)
    if block_tables.shape[0] == 0:
        return 0
    capacity = block_tables.shape[1] * dims.block_size
    if not check_indices:
        return capacity if bound is None else min(bound, capacity)
    lens = seq_lens.detach().to("cpu", torch.int64)
    bad = lens[(lens < 1) | (lens > capacity)]
    if bad.numel():
        raise IndexRangeError(
            f"seq_lens holds {int(bad[0])}, outside [1, {capacity}] "
            f"(max_blocks={block_tables.shape[1]} x block_size={dims.block_size})"
        )
    used = (lens + dims.block_size - 1) // dims.block_size  # blocks each row uses
    cols = torch.arange(block_tables.shape[1]).unsqueeze(0)
    table = block_tables.detach().to("cpu", torch.int64)
    live = cols < used.unsqueeze(1)
    rule = rule_for_window(window)
    if rule.bounded:
        first_query = lens - (1 if q_lens is None else q_lens)
        # the first block the first query reads
        first = rule.first_kept_many(first_query) // dims.block_size
        live &= cols >= first.unsqueeze(1)
    entries = table[live]
    bad = entries[(entries < 0) | (entries >= dims.num_blocks)]
    if bad.numel():
        raise IndexRangeError(
            f"block_tables holds block {int(bad[0])} outside [0, {dims.num_blocks}) "
            "within a sequence's length"
        )
    longest = int(lens.max())
    if bound is None:
        return longest
    if longest > bound:
        raise IndexRangeError(f"seq_lens holds {longest}, above max_seq_len={bound}")
    return min(bound, capacity)


def check_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor | None = None,
    check_indices: bool = True,
    max_seq_len: int | None = None,
    *,
    window: KernelWindow = None,
) -> AttentionDims:
    """Check a paged decode attention call: query `[batch, num_q_heads, head_dim]`, one
    token per sequence over `seq_lens[b]` cached tokens listed by `block_tables[b]`.
    `max_seq_len` bounds every `seq_lens[b]` (see the module docstring); `window` is None,
    an int >= 1 (a sliding window) or a self-attention `KVCacheSpec` (another kind,
    read as its rule says; ConfigError otherwise)."""
    rule_for_window(window)  # ConfigError naming a bad window
    dims = check_cache_pair(k_cache, v_cache)
    group = _check_query(query, dims, k_cache)
    if block_tables.dim() == 2 and query.shape[0] != block_tables.shape[0]:
        raise ShapeError(
            f"query batch {query.shape[0]} differs from block_tables rows {block_tables.shape[0]}"
        )
    max_len = _check_tables(
        block_tables, seq_lens, dims, k_cache.device, check_indices, max_seq_len, window
    )
    _check_out(out, query)
    return AttentionDims(dims, query.shape[0], query.shape[1], group, max_len, 1)


def check_prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    out: torch.Tensor | None = None,
    check_indices: bool = True,
    max_seq_len: int | None = None,
    max_q_len: int | None = None,
    *,
    window: KernelWindow = None,
) -> AttentionDims:
    """Check a paged prefill/extend call: ragged query `[total_q, num_q_heads, head_dim]`
    split by `cu_seqlens_q` (`[batch + 1]`, starting at 0, non-decreasing, ending at
    total_q); sequence b has `q_len_b = cu[b+1] - cu[b]` new tokens, 1 <= q_len_b <=
    seq_lens[b], whose K/V are already written at the end of its `seq_lens[b]` tokens.
    `max_seq_len` and `max_q_len` bound every `seq_lens[b]` and `q_len_b` (see the module
    docstring). `window` (None, an int >= 1 or a spec, as for decode): table entries of
    blocks wholly before the first new token's first key are not checked, as for decode."""
    rule_for_window(window)  # ConfigError naming a bad window
    dims = check_cache_pair(k_cache, v_cache)
    group = _check_query(query, dims, k_cache)
    _check_index("cu_seqlens_q", cu_seqlens_q, 1, k_cache.device)
    batch = block_tables.shape[0] if block_tables.dim() == 2 else -1
    if cu_seqlens_q.shape[0] != batch + 1:
        raise ShapeError(
            f"cu_seqlens_q has {cu_seqlens_q.shape[0]} entries; expected batch + 1 = {batch + 1}"
        )
    total_q = query.shape[0]
    window_q_lens = None
    if window is not None and check_indices and batch >= 0:
        # the first query's window decides which table entries are read: cu first
        window_q_lens = _prefill_q_lens(cu_seqlens_q, total_q)
    max_len = _check_tables(
        block_tables, seq_lens, dims, k_cache.device, check_indices, max_seq_len, window,
        window_q_lens,
    )  # fmt: skip
    q_bound = _check_bound("max_q_len", max_q_len)
    _check_out(out, query)
    if not check_indices:
        bound = min(total_q, max_len) if q_bound is None else min(q_bound, total_q, max_len)
        return AttentionDims(dims, batch, query.shape[1], group, max_len, bound)
    q_lens = _prefill_q_lens(cu_seqlens_q, total_q)
    lens = seq_lens.detach().to("cpu", torch.int64)
    bad = torch.nonzero((q_lens < 1) | (q_lens > lens)).flatten()
    if bad.numel():
        b = int(bad[0])
        raise IndexRangeError(
            f"sequence {b} has {int(q_lens[b])} query tokens; must be in [1, seq_len={int(lens[b])}]"
        )
    max_q = int(q_lens.max()) if q_lens.numel() else 0
    if q_bound is not None:
        if max_q > q_bound:
            raise IndexRangeError(
                f"cu_seqlens_q holds {max_q} query tokens, above max_q_len={q_bound}"
            )
        max_q = min(q_bound, total_q)
    return AttentionDims(dims, batch, query.shape[1], group, max_len, max_q)


def _prefill_q_lens(cu_seqlens_q: torch.Tensor, total_q: int) -> torch.Tensor:
    """New tokens per sequence (int64, on the host) from `cu_seqlens_q`, which must run
    from 0 to `total_q`."""
    cu = cu_seqlens_q.detach().to("cpu", torch.int64)
    if cu[0] != 0 or cu[-1] != total_q:
        raise IndexRangeError(
            f"cu_seqlens_q must run from 0 to total_q={total_q}, got {cu[0]}..{cu[-1]}"
        )
    return cu[1:] - cu[:-1]


def _check_out(out: torch.Tensor | None, query: torch.Tensor) -> None:
    if out is None:
        return
    if out.shape != query.shape or out.dtype != query.dtype or out.device != query.device:
        raise ShapeError(
            f"out must match query ({tuple(query.shape)}, {query.dtype}, {query.device}); got "
            f"({tuple(out.shape)}, {out.dtype}, {out.device})"
        )
    if not out.is_contiguous():
        raise ShapeError(f"out must be contiguous; got strides {out.stride()}")
