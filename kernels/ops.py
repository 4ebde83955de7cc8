"""The kernel ops as callers use them: validate once, then dispatch to Triton or torch.

Attention (`paged_decode_attention`, `paged_prefill_attention`): validation builds one
immutable launch plan (`kernels.launch_plan`: dtypes, fp8 format and scales, window,
span, block size, head dim, device, decode or prefill); each backend (Triton, the C++ CPU
kernel `cpu_paged`, the torch gather + SDPA path `torch_gather`) says whether it supports
the plan and, if not, why; `kernels.backends.choose` takes the first of a stated
preference order that does:
    * `backend=None`: CUDA, or a CPU with TRITON_INTERPRET=1 (read at call time): Triton,
      then the C++ kernel, then gather + SDPA; otherwise the C++ kernel, then gather +
      SDPA (the C++ kernel needs CPU tensors, blocks of at most
      `cpu_paged.MAX_BLOCK_SIZE` tokens and a build: `cpu_paged.status()`)
    * `backend="torch"`: the torch side, the C++ kernel first, then gather + SDPA
    * `backend="triton"` / `"cpu_paged"` / `"torch_gather"`: that backend only; one that
      cannot run the plan raises ConfigError listing what every backend says
`KVBENCH_CPU_KERNEL=torch` (or `=cpu_paged`) is a request for the torch side. Nothing
falls back silently: `decode_launch` / `prefill_launch` return the choice and the reason
(the backends skipped and why), and the kernel sweeps write them into their rows.
Triton on CPU tensors always means the interpreter.

Layouts (one attention layer):
    k_cache, v_cache   [num_blocks, block_size, num_kv_heads, head_dim], contiguous;
                       token slot s lives at block s // block_size, offset s % block_size.
    block_tables       int32 [batch, max_blocks]; entries past a sequence's length are
                       ignored (may be padding such as -1).
    seq_lens           int32 [batch]: KV tokens per sequence, >= 1.
Query head h reads KV head h // (num_q_heads // num_kv_heads) (GQA/MQA).

Every op raises a `workloads.errors` exception naming the bad value, before writing
anything, when its input is wrong (see `kernels.validation`).

fp8 caches (`torch.float8_e4m3fn`, `torch.float8_e5m2`): `write_kv` and the attention ops
take `k_scale` / `v_scale` (float32 `[num_kv_heads]`; `kernels.fp8_ops`); writes quantize
by the `workloads.fp8` rule (NaN/inf refused when `check_indices`, else stored as NaN),
reads dequantize to the query dtype in registers (Triton) or after the gather (torch), or
to float32 in registers (the C++ CPU kernels);
copies and swaps move the bytes. The plan routes fp8 exactly as 16/32-bit K/V, window or
not: every backend reads fp8 (the C++ fp8 decode and prefill, `cpu_paged.decode_fp8` /
`prefill_fp8`, wherever the 16/32-bit ones run).

Host reads: with `check_indices=False` no op reads a tensor's values on the host, so a
call on CUDA tensors only enqueues work (no stream synchronization). The attention ops
then size their launch by `max_seq_len` / `max_q_len` as the caller gives them (it knows
them from its own bookkeeping; compute them once, outside any timed region), or by a
bound from the shapes when it gives none.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvbench.kernels import backends, cpu_paged, fp8_ops, launch_plan, torch_ops
from kvbench.kernels import validation as val
from kvbench.workloads import fp8
from kvbench.workloads.kv_spec import KernelWindow

__all__ = [
    "choose_backend",
    "copy_blocks",
    "decode_launch",
    "paged_decode_attention",
    "paged_prefill_attention",
    "prefill_launch",
    "swap_blocks",
    "write_kv",
]


def choose_backend(device: torch.device, backend: str | None = None) -> str:
    """The backend the data-movement ops (`write_kv`, `copy_blocks`, `swap_blocks`) use on
    tensors of `device`: "triton" or "torch" (their torch versions: they have no C++
    version, so every request but "triton" runs those). ConfigError on an unknown
    request. The attention ops choose by launch plan instead (`decode_launch`)."""
    val.check_backend(backend)
    if backend is not None:
        return "triton" if backend == "triton" else "torch"
    if device.type == "cuda" or (device.type == "cpu" and backends.interpreting()):
        return "triton"
    return "torch"


def _triton():  # imported lazily: triton is slow to import and absent on some hosts
    from kvbench.kernels import triton_ops

    return triton_ops


def write_kv(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    backend: str | None = None,
    check_indices: bool = True,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write the K/V of `num_tokens` new tokens into one layer's paged caches.

    Args:
        k_cache, v_cache: [num_blocks, block_size, num_kv_heads, head_dim], written in place.
        key, value: [num_tokens, num_kv_heads, head_dim], same dtype as the caches (rows
            contiguous; the token stride is free, e.g. a slice of a fused QKV tensor).
        slot_mapping: int32/int64 [num_tokens]; token i goes to flat slot
            `slot_mapping[i]`; -1 marks padding and is skipped. Slots must be distinct.
        k_scale, v_scale: fp8 caches only (then required): float32 [num_kv_heads]; key and
            value (any supported float dtype) are quantized with them.
    """
    dims = val.check_write_kv(k_cache, v_cache, key, value, slot_mapping, check_indices)
    scales = fp8_ops.check_kv_scales(k_cache, k_scale, v_scale, dims.num_kv_heads, check_indices)
    if scales is not None:
        if check_indices:
            fp8.check_finite(key, "key")
            fp8.check_finite(value, "value")
        if choose_backend(k_cache.device, backend) == "triton":
            inv = fp8_ops.inverse(scales)
            _triton().write_kv_fp8(k_cache, v_cache, key, value, slot_mapping, dims, inv)
        else:
            fp8_ops.write_kv(k_cache, v_cache, key, value, slot_mapping, dims, scales)
        return
    if choose_backend(k_cache.device, backend) == "triton":
        _triton().write_kv(k_cache, v_cache, key, value, slot_mapping, dims)
    else:
        torch_ops.write_kv(k_cache, v_cache, key, value, slot_mapping, dims)


def copy_blocks(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    pairs: torch.Tensor | Sequence[tuple[int, int]],
    *,
    backend: str | None = None,
    check_indices: bool = True,
) -> None:
    """Copy whole blocks within one layer's K and V caches (copy-on-write).

    Args:
        pairs: (src_block, dst_block) pairs, an int tensor [n, 2] or a sequence of tuples.
            Destinations are distinct and are not sources.
    """
    _, t = val.check_copy_blocks(k_cache, v_cache, pairs, check_indices)
    k_cache, v_cache = fp8_ops.as_bits(k_cache), fp8_ops.as_bits(v_cache)  # fp8: bytes
    if choose_backend(k_cache.device, backend) == "triton":
        _triton().copy_blocks(k_cache, v_cache, t)
    else:
        torch_ops.copy_blocks(k_cache, v_cache, t)


def swap_blocks(
    src: torch.Tensor,
    dst: torch.Tensor,
    mapping: torch.Tensor | Sequence[tuple[int, int]],
    *,
    backend: str | None = None,
    check_indices: bool = True,
) -> None:
    """Copy blocks `src[m[i, 0]]` into `dst[m[i, 1]]` between two pools (swap out / in).

    Args:
        src, dst: contiguous [num_blocks, ...] pools with equal block shapes and dtypes;
            they may be on different devices (then the torch version moves the data).
        mapping: (src_block, dst_block) pairs, int tensor [n, 2] or sequence of tuples.
    """
    t = val.check_swap_blocks(src, dst, mapping, check_indices)
    src, dst = fp8_ops.as_bits(src), fp8_ops.as_bits(dst)  # fp8: bytes
    chosen = choose_backend(src.device, backend)
    if chosen == "triton" and src.device == dst.device:
        _triton().swap_blocks(src, dst, t if t.device == src.device else t.to(src.device))
    else:
        torch_ops.swap_blocks(src, dst, t)


def paged_decode_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    partition_size: int | None = None,
    check_indices: bool = True,
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    window: KernelWindow = None,
) -> torch.Tensor:
    """Attention of one new query token per sequence over its paged KV.

    Args:
        query: [batch, num_q_heads, head_dim].
        block_tables: int32 [batch, max_blocks]; seq_lens: int32 [batch], 1 <= L <=
            max_blocks * block_size.
        scale: softmax scale, 1/sqrt(head_dim) when None.
        out: optional [batch, num_q_heads, head_dim] output (query dtype) to write.
        partition_size: Triton only: tokens per KV partition of the split-KV kernel (a
            power of two >= 16); None picks the default. Ignored by torch.
        check_indices: read the index values on the host and check them (a CUDA stream
            sync); False reads nothing on the host.
        max_seq_len: an upper bound of `seq_lens` (tokens), known to the caller without
            reading device memory; checked when `check_indices`. None: the true maximum
            when checking, else the tables' capacity.
        k_scale, v_scale: fp8 caches only (then required): float32 [num_kv_heads]; each
            K/V element read is `float32(byte) * scale`, rounded to the query dtype.
        window: sliding window (HF / vLLM `sliding_window`): the query, at position
            L - 1 of a sequence of L tokens, attends to positions max(0, L - window) ..
            L - 1 only. Every backend starts at the first block the window touches (blocks
            wholly before it are never read, and their table entries may be anything, e.g.
            -1 where a cache released them) and masks the part of that block before the
            window. None (default): full attention, unchanged. With fp8 K/V every path
            (Triton, the C++ CPU fp8 decode, gather + SDPA) dequantizes and windows
            together.

    Returns:
        [batch, num_q_heads, head_dim] in the query dtype (`out` when given).
    """
    launch, s, kv_scales = _prepare_decode(
        query, k_cache, v_cache, block_tables, seq_lens, scale, out, backend, check_indices,
        max_seq_len, k_scale, v_scale, window,
    )  # fmt: skip
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    plan = launch.plan
    args = (query, k_cache, v_cache, block_tables, seq_lens, s, out, plan.dims)
    if launch.backend == backends.TRITON:
        return _triton().paged_decode_attention(
            *args, partition_size, kv_scales, window=plan.window, span=plan.span
        )
    if launch.backend == backends.CPU_PAGED:
        if kv_scales is not None:
            return cpu_paged.decode_fp8(*args, kv_scales, window=plan.window)
        return cpu_paged.decode(*args, window=plan.window, span=plan.span)
    return torch_ops.paged_decode_attention(*args, kv_scales, window=plan.window, span=plan.span)


def decode_launch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    backend: str | None = None,
    check_indices: bool = True,
    max_seq_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    window: KernelWindow = None,
) -> backends.Launch:
    """What `paged_decode_attention` with these arguments would run, and why (its plan,
    backend and reason), after the same checks, without running it: what the kernel
    sweeps write into their rows."""
    return _prepare_decode(
        query, k_cache, v_cache, block_tables, seq_lens, None, None, backend, check_indices,
        max_seq_len, k_scale, v_scale, window,
    )[0]  # fmt: skip


def _prepare_decode(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None,
    out: torch.Tensor | None,
    backend: str | None,
    check_indices: bool,
    max_seq_len: int | None,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    window: KernelWindow,
) -> tuple[backends.Launch, float, fp8_ops.KVScales | None]:
    """Validate a decode call and choose its backend: (launch, softmax scale, fp8 scales)."""
    val.check_backend(backend)
    dims = val.check_decode(
        query, k_cache, v_cache, block_tables, seq_lens, out, check_indices, max_seq_len,
        window=window,
    )  # fmt: skip
    s = val.check_scale(scale, dims.cache.head_dim)
    kv_scales = fp8_ops.check_kv_scales(
        k_cache, k_scale, v_scale, dims.cache.num_kv_heads, check_indices
    )
    plan = launch_plan.build("decode", query, k_cache, dims, window=window)
    return backends.choose(plan, backend), s, kv_scales


def paged_prefill_attention(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None = None,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    check_indices: bool = True,
    max_seq_len: int | None = None,
    max_q_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    window: KernelWindow = None,
) -> torch.Tensor:
    """Causal attention of a ragged batch of new tokens over cached prefixes and themselves.

    The new tokens' K/V must already be in the caches (call `write_kv` first), as in
    vLLM and FlashInfer: sequence b's `n_b = cu_seqlens_q[b+1] - cu_seqlens_q[b]` query
    rows are its last `n_b` positions of `seq_lens[b]`, and row i sees keys
    `0 .. seq_lens[b] - n_b + i`.

    Args:
        query: [total_q, num_q_heads, head_dim].
        cu_seqlens_q: int32 [batch + 1], cumulative query counts starting at 0.
        seq_lens: int32 [batch], total KV length (cached prefix + new tokens).
        check_indices, max_seq_len: as for `paged_decode_attention`.
        max_q_len: an upper bound of the new tokens per sequence, likewise (None: the true
            maximum when checking, else min(total_q, max_seq_len)).
        k_scale, v_scale: fp8 caches only, as for `paged_decode_attention` (Triton and
            torch; on a CPU the C++ fp8 prefill `cpu_paged.prefill_fp8` where it builds,
            with or without a window).
        window: sliding window: row i, at position p = seq_lens[b] - n_b + i, sees keys
            max(0, p - window + 1) .. p only. Blocks wholly before the first new token's
            window are never read (their table entries may be -1). None (default): full
            causal attention, unchanged. Every path: Triton, the C++ CPU kernel (16-bit
            and fp32 K/V, and the C++ fp8 prefill) and gather + SDPA.

    Returns:
        [total_q, num_q_heads, head_dim] in the query dtype (`out` when given).
    """
    launch, s, kv_scales = _prepare_prefill(
        query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, out, backend,
        check_indices, max_seq_len, max_q_len, k_scale, v_scale, window,
    )  # fmt: skip
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    plan = launch.plan
    args = (query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, s, out, plan.dims)
    if launch.backend == backends.TRITON:
        return _triton().paged_prefill_attention(*args, kv_scales, window=plan.window)
    if launch.backend == backends.CPU_PAGED:
        if kv_scales is not None:
            return cpu_paged.prefill_fp8(*args, kv_scales, window=plan.window)
        return cpu_paged.prefill(*args, window=plan.window)
    return torch_ops.paged_prefill_attention(*args, kv_scales, window=plan.window)


def prefill_launch(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    *,
    backend: str | None = None,
    check_indices: bool = True,
    max_seq_len: int | None = None,
    max_q_len: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    window: KernelWindow = None,
) -> backends.Launch:
    """What `paged_prefill_attention` with these arguments would run, and why, after the
    same checks, without running it (as `decode_launch`)."""
    return _prepare_prefill(
        query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, None, None, backend,
        check_indices, max_seq_len, max_q_len, k_scale, v_scale, window,
    )[0]  # fmt: skip


def _prepare_prefill(
    query: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float | None,
    out: torch.Tensor | None,
    backend: str | None,
    check_indices: bool,
    max_seq_len: int | None,
    max_q_len: int | None,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    window: KernelWindow,
) -> tuple[backends.Launch, float, fp8_ops.KVScales | None]:
    """Validate a prefill call and choose its backend: (launch, softmax scale, fp8 scales)."""
    val.check_backend(backend)
    dims = val.check_prefill(
        query, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, out, check_indices,
        max_seq_len, max_q_len, window=window,
    )  # fmt: skip
    s = val.check_scale(scale, dims.cache.head_dim)
    kv_scales = fp8_ops.check_kv_scales(
        k_cache, k_scale, v_scale, dims.cache.num_kv_heads, check_indices
    )
    plan = launch_plan.build("prefill", query, k_cache, dims, window=window)
    return backends.choose(plan, backend), s, kv_scales
