"""vLLM's fp8 KV path as a peer: its Triton KV write (`triton_reshape_and_cache_flash`
with `kv_cache_dtype="fp8_e4m3"` / `"fp8_e5m2"`) and its Triton `unified_attention` in
per-tensor fp8 mode (`KVQuantMode.FP8_PER_TENSOR`, `k_descale` / `v_descale`), launched
as vLLM's Triton backend (`v1/attention/backends/triton_attn.py`) launches them, under
`TRITON_INTERPRET=1` on a CPU.

What vLLM 0.32 does, read from its source and checked by suites/conformance/
test_peers_vllm_fp8.py (the disagreements with kvbench's rule, `workloads.fp8`):

* Write: `tl.store(cache, key / k_scale)`, the implicit float32 -> fp8 cast of the store.
  Compiled for sm_90 that is `div.full.f32` (an approximate division, up to 2 ulp) then
  `cvt.rn.satfinite.e4m3x2.f32` (round to nearest even, saturating finite values *and
  inf* to +-max, NaN to NaN). kvbench multiplies by `float32(1 / scale)` and refuses
  NaN / inf. So the bytes agree exactly when the scale is a power of two; otherwise they
  differ where `x / s` and `x * (1 / s)` round to float32 values on the two sides of an
  fp8 rounding boundary (the scale convention), and an inf input is stored as +-max by
  vLLM where kvbench raises.
* e5m2: the backend views every fp8 cache as `current_platform.fp8_dtype()`
  (`torch.float8_e4m3fn` on CUDA), in the write and in attention alike, so a cache
  declared `fp8_e5m2` holds e4m3 bytes: self-consistent inside vLLM, but not the e5m2
  format kvbench (and a reader of the declared dtype) stores.
* Scales: one scalar per tensor (`tl.load(k_scale)`: the first element); kvbench's
  per-KV-head scales have no counterpart in this mode (vLLM's per-token-head modes are
  dynamic per token, a different contract), so per-head scales are `unsupported`.
* Attention: K and V tiles are dequantized as `(float32(q) * scale).to(query dtype)`
  before the dot, as kvbench's Triton decode does (rounded to the query dtype).

The interpreter (Triton 3.9) converts float32 -> fp8 by truncating bit fields (wrong
rounding, no saturation, NaN / inf made finite), which says nothing about vLLM:
`interpreter_fp8_as_sm90()` replaces the interpreter's fp8 conversions with the sm_90
instruction's semantics (correctly rounded, satfinite) for the duration, so what is
compared is vLLM's kernel arithmetic. Its division stays the interpreter's (numpy,
correctly rounded), not `div.full.f32`: on a GPU a few more boundary cases may differ.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch

from kvbench.suites.peers.base import PeerUnavailableError
from kvbench.suites.peers.vllm_triton import (
    VLLMTritonUnified,
    _device_capability_answered,
    load_vllm_triton,
)
from kvbench.workloads import fp8

#: vLLM's kv_cache_dtype name for each kvbench fp8 storage dtype.
KV_CACHE_DTYPE: dict[torch.dtype, str] = {
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
}
#: The fp8 dtype vLLM's Triton backend views every fp8 cache as on CUDA (OCP e4m3).
VLLM_FP8_DTYPE = torch.float8_e4m3fn


def _tl_fp8(tl: Any) -> dict[Any, torch.dtype]:
    return {tl.float8e4nv: torch.float8_e4m3fn, tl.float8e5: torch.float8_e5m2}


def sm90_fp8_bits(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """float32 `x` -> fp8 bytes as sm_89+'s `cvt.rn.satfinite` computes them: round to
    nearest even; a finite value or inf beyond +-max becomes +-max; NaN stays NaN (0x7F)."""
    fmt = fp8.fp8_format(dtype)
    x32 = x.to(torch.float32)
    q = x32.nan_to_num(nan=0.0, posinf=fmt.max, neginf=-fmt.max).clamp(-fmt.max, fmt.max)
    bits = q.to(dtype).view(torch.uint8)
    return torch.where(torch.isnan(x32), torch.full_like(bits, fp8.NAN_BITS), bits)


@contextlib.contextmanager
def interpreter_fp8_as_sm90() -> Iterator[None]:
    """Make the Triton interpreter convert to and from fp8 (e4m3fn, e5m2) as sm_90 does:
    float -> fp8 by `sm90_fp8_bits`, fp8 -> float exactly (NaN and inf kept). Restored
    afterwards."""
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    handle_cls = interpreter.TensorHandle
    saved = builder.create_fp_to_fp
    fp8_types = _tl_fp8(tl)

    def as_f32(handle: Any) -> torch.Tensor:
        data = np.ascontiguousarray(handle.data)
        scalar = handle.dtype.scalar
        if scalar == tl.bfloat16:
            return torch.from_numpy((data.astype(np.uint32) << 16).view(np.float32))
        if scalar in fp8_types:
            return torch.from_numpy(data.view(np.uint8)).view(fp8_types[scalar]).float()
        return torch.from_numpy(data.astype(np.float32))

    def create_fp_to_fp(self: Any, src: Any, dst_type: Any, rounding_mode: Any) -> Any:
        src_ty, dst_ty = src.dtype.scalar, dst_type.scalar
        if dst_ty in fp8_types:
            bits = sm90_fp8_bits(as_f32(src), fp8_types[dst_ty]).numpy()
            return handle_cls(bits.reshape(np.shape(src.data)), dst_ty)
        if src_ty in fp8_types and dst_ty in (tl.float32, tl.float16):
            wide = as_f32(src).numpy().astype(np.float32 if dst_ty == tl.float32 else np.float16)
            return handle_cls(wide.reshape(np.shape(src.data)), dst_ty)
        return saved(self, src, dst_type, rounding_mode)

    builder.create_fp_to_fp = create_fp_to_fp
    try:
        yield
    finally:
        builder.create_fp_to_fp = saved


class _Sm90Platform:
    """vLLM's current platform, answering as an sm_90 GPU for the capability checks of
    the fp8 launchers (SM89+ for native fp8); everything else delegated."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def has_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        want = capability if isinstance(capability, int) else capability[0] * 10 + capability[1]
        return want <= 90

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


@contextlib.contextmanager
def _sm90_answered(module: Any) -> Iterator[None]:
    saved = module.current_platform
    module.current_platform = _Sm90Platform(saved)
    try:
        with _device_capability_answered():
            yield
    finally:
        module.current_platform = saved


def per_tensor_scale(scales: torch.Tensor, what: str) -> torch.Tensor:
    """kvbench's per-KV-head scales [num_kv_heads] as vLLM's one float32 scale; ValueError
    naming the values when they differ across heads (vLLM's fp8 mode has one)."""
    if not bool((scales == scales[:1]).all()):
        raise ValueError(
            f"{what}={scales.tolist()} differs across KV heads; vLLM's per-tensor fp8 mode "
            "reads one scale"
        )
    return scales[:1].to(torch.float32).reshape(()).clone()


def write_fp8(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor,
    v_scale: torch.Tensor,
    kv_cache_dtype: str | None = None,
) -> None:
    """vLLM's `triton_reshape_and_cache_flash` with an fp8 kv_cache_dtype (by default the
    name of the pools' own dtype) into kvbench-layout fp8 pools, per-tensor scales."""
    v = load_vllm_triton()
    name = kv_cache_dtype or KV_CACHE_DTYPE[k_cache.dtype]
    ks, vs = per_tensor_scale(k_scale, "k_scale"), per_tensor_scale(v_scale, "v_scale")
    with _sm90_answered(v.reshape):
        v.reshape.triton_reshape_and_cache_flash(
            key, value, k_cache, v_cache, slot_mapping.to(torch.int64), name, ks, vs
        )


class VLLMTritonUnifiedFp8(VLLMTritonUnified):
    """`unified_attention` over an fp8 cache with per-tensor scales, as vLLM's Triton
    backend launches it (the cache viewed as `VLLM_FP8_DTYPE`, `k_descale` / `v_descale`
    expanded to [num_seqs, num_kv_heads], `kv_quant_mode=FP8_PER_TENSOR`)."""

    name = "vllm-triton-unified-fp8"

    def __init__(self) -> None:
        super().__init__()
        try:
            from vllm.v1.kv_cache_interface import KVQuantMode
        except ImportError as exc:  # pragma: no cover - vLLM without fp8 modes
            raise PeerUnavailableError(f"this vLLM has no KVQuantMode ({exc})") from exc
        self._mode = KVQuantMode.FP8_PER_TENSOR

    def unsupported_scales(self, k_scale: torch.Tensor, v_scale: torch.Tensor) -> str | None:
        """None when vLLM's per-tensor mode can read these scales, else why not."""
        for what, s in (("k_scale", k_scale), ("v_scale", v_scale)):
            try:
                per_tensor_scale(s, what)
            except ValueError as exc:
                return str(exc)
        return None

    def fp8_decode_fn(
        self,
        cache: tuple[torch.Tensor, torch.Tensor],
        query: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        k_scale: torch.Tensor,
        v_scale: torch.Tensor,
        scale: float | None = None,
    ) -> Callable[[], torch.Tensor]:
        """Decode (one query per sequence) over the fp8 pools `cache`; `scale` defaults
        to 1 / sqrt(head_dim)."""
        k_cache, v_cache = (t.view(VLLM_FP8_DTYPE) for t in cache)
        batch = query.shape[0]
        hkv = k_cache.shape[2]
        ks = per_tensor_scale(k_scale, "k_scale").expand(batch, hkv)
        vs = per_tensor_scale(v_scale, "v_scale").expand(batch, hkv)
        cu = torch.arange(batch + 1, dtype=torch.int32)
        lens = seq_lens.to(torch.int32).contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        extra = {"seq_threshold_3D": 128 // hkv}
        extra |= self._segments(batch, query.shape[1], query.shape[2], query.device)
        out = torch.full_like(query, float("nan"))
        softmax_scale = scale if scale is not None else 1.0 / math.sqrt(query.shape[-1])
        unified = self._v.unified
        mode = self._mode

        def run() -> torch.Tensor:
            unified.unified_attention(
                query, k_cache, v_cache, out, cu, 1, lens, int(lens.max()), softmax_scale,
                True, (-1, -1), tables, 0, None, ks, vs, kv_quant_mode=mode, **extra,
            )  # fmt: skip
            return out

        return run
