"""The launch plan of one paged attention call: every fact a backend needs to say whether
it can run the call, derived once, after validation, and never changed.

`kernels.ops` validates its arguments (`kernels.validation`), then builds a `LaunchPlan`
here; each backend answers `supports(plan)` (`kernels.backends` chooses among them) and
the chosen one launches from the plan's numbers (its `span` sizes a decode's launch),
so no backend derives them again.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kvbench.kernels import window_rule
from kvbench.kernels.validation import AttentionDims
from kvbench.workloads import fp8
from kvbench.workloads.kv_spec import KernelWindow

#: The operations a plan describes.
OPS: tuple[str, ...] = ("decode", "prefill")
#: How the fp8 scales the kernels read are laid out: one float32 per KV head for K and
#: one for V (a per-tensor scale reaches the kernels as that value repeated per head).
PER_KV_HEAD = "per_kv_head"


@dataclass(frozen=True)
class LaunchPlan:
    """What one attention call asks of a kernel (immutable).

    Attributes:
        op: "decode" (one query token per sequence) or "prefill" (a ragged run of them).
        device: the tensors' device type ("cpu", "cuda", "meta", ...).
        query_dtype, kv_dtype: the query's and the caches' dtypes.
        kv_format: the fp8 format name (`workloads.fp8.FORMATS`) of an fp8 cache, else None.
        scales: how fp8 scales are laid out (`PER_KV_HEAD`), None for a 16/32-bit cache.
        window: the sliding window (tokens), a `KVCacheSpec` for another kind that bounds
            what a query reads (its rule's `kernel_window`), None for full attention.
        block_size, head_dim, num_q_heads, num_kv_heads: the geometry.
        max_seq_len, max_q_len: the launch's bounds (tokens) as validation derived them.
        span: tokens a launch reads per sequence at most, from its first block on
            (`window_rule.span`; sizes a decode's partitions and gather).
        dims: the validated geometry the launchers take.
    """

    op: str
    device: str
    query_dtype: torch.dtype
    kv_dtype: torch.dtype
    kv_format: str | None
    scales: str | None
    window: KernelWindow
    block_size: int
    head_dim: int
    num_q_heads: int
    num_kv_heads: int
    max_seq_len: int
    max_q_len: int
    span: int
    dims: AttentionDims = field(repr=False, compare=False)

    @property
    def is_fp8(self) -> bool:
        """Whether the caches hold fp8 bytes (read with `scales`)."""
        return self.kv_format is not None

    def first_block(self, lens: torch.Tensor, q_lens: int | torch.Tensor = 1) -> torch.Tensor:
        """Each sequence's first block read (`window_rule.first_block`), for lengths
        `lens` with `q_lens` new tokens (decode: 1)."""
        return window_rule.first_block(lens, self.window, self.block_size, q_lens)

    def describe(self) -> str:
        """The plan in one line, for messages and bench rows."""
        kv = str(self.kv_dtype).removeprefix("torch.")
        if self.kv_format is not None:
            kv += f" ({self.kv_format}, {self.scales} scales)"
        window = (
            "full attention"
            if self.window is None
            else f"window {self.window}"
            if isinstance(self.window, int)
            else self.window.describe()
        )
        return (
            f"{self.op} on {self.device}, query {str(self.query_dtype).removeprefix('torch.')}, "
            f"KV {kv}, {window}, block size {self.block_size}, head dim {self.head_dim}, "
            f"{self.num_q_heads}/{self.num_kv_heads} query/KV heads, span {self.span} tokens"
        )


def build(
    op: str,
    query: torch.Tensor,
    k_cache: torch.Tensor,
    dims: AttentionDims,
    *,
    window: KernelWindow,
) -> LaunchPlan:
    """The plan of a validated call (`dims` from `validation.check_decode` /
    `check_prefill`, `window` checked there too); reads no tensor values."""
    if op not in OPS:
        raise ValueError(f"op={op!r}: expected one of {OPS}")
    cd = dims.cache
    kv_format = fp8.fp8_format(k_cache.dtype).name if fp8.is_fp8(k_cache.dtype) else None
    return LaunchPlan(
        op=op,
        device=query.device.type,
        query_dtype=query.dtype,
        kv_dtype=k_cache.dtype,
        kv_format=kv_format,
        scales=PER_KV_HEAD if kv_format is not None else None,
        window=window,
        block_size=cd.block_size,
        head_dim=cd.head_dim,
        num_q_heads=dims.num_q_heads,
        num_kv_heads=cd.num_kv_heads,
        max_seq_len=dims.max_seq_len,
        max_q_len=dims.max_q_len,
        span=window_rule.span(dims.max_seq_len, cd.block_size, window, max(1, dims.max_q_len)),
        dims=dims,
    )
