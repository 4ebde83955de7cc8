"""Launchers of the Triton kernels: same signatures as `kernels.torch_ops`.

CUDA tensors run the compiled kernels, CPU tensors the interpreted ones. Callers go
through `kernels.ops`, which has validated the input; the launchers only pick the
configuration (`kernels.configs`), normalize index dtypes (tables, lengths and cu_seqlens
to int32, slots and block ids to int64, so the compiled variants stay few) and size the
grids.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from kvbench.kernels import configs
from kvbench.kernels.triton_kernels import INTERPRETED, JIT
from kvbench.kernels.validation import AttentionDims, CacheDims
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_rules import rule_for_window
from kvbench.workloads.kv_spec import KernelWindow

LOG2E = 1.0 / math.log(2.0)


_NESTED: dict[object, InterpretedFunction] = {}


@contextmanager
def _interpret_nested_jit() -> Iterator[None]:
    """Let interpreted kernels call triton.language's own jitted helpers (tl.zeros,
    tl.max, ...). Those are `JITFunction`s unless TRITON_INTERPRET=1 was set before
    triton was imported; while an interpreted kernel runs, a call to one runs it
    interpreted, which is what the interpreter mode itself does."""
    original = JITFunction.__call__

    def call(self: JITFunction, *args: object, **kwargs: object) -> object:
        interp = _NESTED.get(self.fn)
        if interp is None:
            interp = _NESTED[self.fn] = InterpretedFunction(self.fn)
        return interp(*args, **kwargs)

    JITFunction.__call__ = call  # type: ignore[method-assign]
    try:
        yield
    finally:
        JITFunction.__call__ = original  # type: ignore[method-assign]


def _launch(cfg: configs.KernelConfig, grid: tuple[int, ...], device: torch.device, *args):
    if any(g == 0 for g in grid):
        return
    if device.type == "cpu":
        constexprs = dict(cfg.constexprs)
        if "DOT_F32" in constexprs and cfg.dtype == torch.bfloat16:
            constexprs["DOT_F32"] = True  # the interpreter's tl.dot mishandles bfloat16
        with _interpret_nested_jit():
            INTERPRETED[cfg.kernel][grid](*args, **constexprs)
    else:
        JIT[cfg.kernel][grid](*args, **cfg.constexprs, **cfg.launch_options())


def _copy_rows(
    src: torch.Tensor,
    dst: torch.Tensor,
    src_rows: torch.Tensor | None,
    dst_rows: torch.Tensor,
    row_len: int,
    src_row_stride: int,
    dst_row_stride: int,
) -> None:
    """Copy rows of `row_len` elements; `src_rows=None` means row i -> dst_rows[i]."""
    size = src.element_size()
    cfg = configs.copy_config(size, src_rows is None)
    as_int = cfg.dtype
    grid = (dst_rows.shape[0], -(-row_len // configs.COPY_BLOCK))
    _launch(
        cfg,
        grid,
        dst.device,
        src.view(as_int),
        dst.view(as_int),
        dst_rows if src_rows is None else src_rows,
        dst_rows,
        row_len,
        src_row_stride,
        dst_row_stride,
    )


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    dims: CacheDims,
) -> None:
    """Token row i of key/value -> cache slot `slot_mapping[i]` (skipping -1)."""
    slots = slot_mapping.to(torch.int64)
    row = dims.num_kv_heads * dims.head_dim
    for src, cache in ((key, k_cache), (value, v_cache)):
        _copy_rows(src, cache, None, slots, row, src.stride(0), row)


def write_kv_fp8(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    dims: CacheDims,
    inv_scales: tuple[torch.Tensor, torch.Tensor],
) -> None:
    """Token row i of key/value, quantized with its heads' float32 1/scale
    (`workloads.fp8` rule), -> fp8 cache slot `slot_mapping[i]` (skipping -1)."""
    slots = slot_mapping.to(torch.int64)
    row = dims.num_kv_heads * dims.head_dim
    cfg = configs.quantize_config(key.dtype, k_cache.dtype)
    grid = (slots.shape[0], -(-row // configs.COPY_BLOCK))
    for src, cache, inv in ((key, k_cache, inv_scales[0]), (value, v_cache, inv_scales[1])):
        args = (src, cache.view(torch.uint8), slots, inv, row, dims.head_dim, src.stride(0), row)
        _launch(cfg, grid, cache.device, *args)


def copy_blocks(k_cache: torch.Tensor, v_cache: torch.Tensor, pairs: torch.Tensor) -> None:
    """Block `pairs[i, 0]` -> block `pairs[i, 1]` in both caches."""
    src, dst = pairs[:, 0].contiguous(), pairs[:, 1].contiguous()
    for cache in (k_cache, v_cache):
        row = cache[0].numel()
        _copy_rows(cache, cache, src, dst, row, row, row)


def swap_blocks(src: torch.Tensor, dst: torch.Tensor, mapping: torch.Tensor) -> None:
    """`src[mapping[i, 0]]` -> `dst[mapping[i, 1]]`; both pools on one device."""
    row = src[0].numel()
    _copy_rows(src, dst, mapping[:, 0].contiguous(), mapping[:, 1].contiguous(), row, row, row)


def _kv_operands(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The scale and cache arguments of an attention launch: fp8 caches as bytes with
    their scales; otherwise the caches as they are and a float32 placeholder for the
    (unused) scales, so the compiled signature is the same."""
    if kv_scales is None:
        ones = torch.ones(1, dtype=torch.float32, device=query.device)
        return ones, ones, k_cache, v_cache
    return kv_scales[0], kv_scales[1], k_cache.view(torch.uint8), v_cache.view(torch.uint8)


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    out: torch.Tensor,
    dims: AttentionDims,
    partition_size: int | None = None,
    kv_scales: tuple[torch.Tensor, torch.Tensor] | None = None,
    *,
    window: KernelWindow = None,
    span: int | None = None,
) -> torch.Tensor:
    """Split-KV paged decode: one partition (single pass) when every sequence fits in
    `partition_size` tokens, else per-partition partials merged by log-sum-exp. fp8
    caches: `kv_scales` (float32 [num_kv_heads] for K and V) dequantize each tile. With a
    sliding `window`, the windowed variants read each sequence from the first block its
    window touches: at most window + block_size - 1 tokens, which sizes the partitions.
    `span`: the launch plan's tokens per sequence (the kind rule's `read_span` when None)."""
    part = configs.DEFAULT_PARTITION if partition_size is None else int(partition_size)
    if part < 1:
        raise ConfigError(f"partition_size={partition_size} must be >= 1")
    cd = dims.cache
    batch, hq, d = query.shape
    if batch == 0:
        return out
    rule = rule_for_window(window)
    if span is None:
        span = rule.read_span(dims.max_seq_len, cd.block_size)
    n_parts = max(1, -(-span // part))
    single = n_parts == 1
    reach, variant = rule.device_reach, rule.device_variant  # the kind's device parameters
    cfg = configs.decode_config(query.dtype, d, dims.group, single, k_cache.dtype, **variant)
    qh = cfg.int_constexpr("QH")
    n_chunks = -(-dims.group // qh)
    tables = block_tables.to(torch.int32)
    lens = seq_lens.to(torch.int32)
    if single:
        # unused by the SINGLE variant; float32 so the compiled signature is the same
        part_out = part_max = part_sum = torch.empty(1, dtype=torch.float32, device=query.device)
    else:
        f32, dev = torch.float32, query.device
        part_out = torch.empty((batch, hq, n_parts, d), dtype=f32, device=dev)
        part_max = torch.empty((batch, hq, n_parts), dtype=f32, device=dev)
        part_sum = torch.empty((batch, hq, n_parts), dtype=f32, device=dev)
    k_scale, v_scale, k_cache, v_cache = _kv_operands(query, k_cache, v_cache, kv_scales)
    _launch(
        cfg,
        (batch, cd.num_kv_heads * n_chunks, n_parts),
        query.device,
        query,
        k_cache,
        v_cache,
        tables,
        lens,
        out,
        part_out,
        part_max,
        part_sum,
        scale * LOG2E,
        hq,
        dims.group,
        n_chunks,
        d,
        cd.block_size,
        part,
        n_parts,
        query.stride(0),
        query.stride(1),
        tables.stride(0),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_scale,
        v_scale,
        reach,
    )
    if not single:
        rcfg = configs.reduce_config(query.dtype, d, **variant)
        _launch(
            rcfg,
            (batch, hq),
            query.device,
            out,
            part_out,
            part_max,
            part_sum,
            lens,
            hq,
            d,
            part,
            n_parts,
            out.stride(0),
            out.stride(1),
            reach,
            cd.block_size,
        )
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
    """Causal paged prefill/extend; see `kernels.ops.paged_prefill_attention`. fp8
    caches: `kv_scales` (float32 [num_kv_heads] for K and V) dequantize each tile, as in
    decode. `window`: a kind that bounds what a query reads (a sliding window, or a
    `KVCacheSpec`), blocks before the first key read never loaded."""
    cd = dims.cache
    if dims.batch == 0 or query.shape[0] == 0:
        return out
    d = query.shape[2]
    # the tile by query count: 16 rows for short extends, up to 64 for long prefills
    rule = rule_for_window(window)
    reach = rule.device_reach  # the kind's device parameters
    cfg = configs.prefill_config(
        query.dtype, d, dims.max_q_len * dims.group, k_cache.dtype, **rule.device_variant
    )
    k_scale, v_scale, k_cache, v_cache = _kv_operands(query, k_cache, v_cache, kv_scales)
    block_m = cfg.int_constexpr("BLOCK_M")
    heads_per_prog = min(dims.group, block_m)
    tokens_per_prog = block_m // heads_per_prog
    n_chunks = -(-dims.group // heads_per_prog)
    q_tiles = -(-dims.max_q_len // tokens_per_prog)
    tables = block_tables.to(torch.int32)
    _launch(
        cfg,
        (dims.batch, cd.num_kv_heads * n_chunks, q_tiles),
        query.device,
        query,
        k_cache,
        v_cache,
        tables,
        cu_seqlens_q.to(torch.int32),
        seq_lens.to(torch.int32),
        out,
        scale * LOG2E,
        dims.group,
        heads_per_prog,
        tokens_per_prog,
        n_chunks,
        d,
        cd.block_size,
        query.stride(0),
        query.stride(1),
        tables.stride(0),
        out.stride(0),
        out.stride(1),
        k_cache.stride(0),
        k_cache.stride(1),
        k_cache.stride(2),
        k_scale,
        v_scale,
        reach,
    )
    return out
