"""The float64 attention oracle: the plainest attention that is obviously right.

Every kernel and both caches are judged against these functions. They compute in float64
on whatever device the inputs are on, materialize the full score matrix, and make no
attempt at speed.

Head mapping (GQA/MQA): query head h reads KV head h // (num_q_heads // num_kv_heads),
the layout used by Llama-family models and every serving engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TypedDict

import torch

from kvbench.workloads.errors import ShapeError
from kvbench.workloads.kv_spec import KVCacheSpec, check_chunk, check_window


def _check_heads(q_heads: int, k: torch.Tensor, v: torch.Tensor, what: str) -> int:
    if k.dim() != 3 or v.shape != k.shape:
        raise ShapeError(
            f"{what}: k and v must both be [seq_len, num_kv_heads, head_dim], "
            f"got k {tuple(k.shape)} and v {tuple(v.shape)}"
        )
    kv_heads = k.shape[1]
    if kv_heads == 0 or q_heads % kv_heads:
        raise ShapeError(
            f"{what}: num_q_heads={q_heads} is not a multiple of num_kv_heads={kv_heads}"
        )
    return q_heads // kv_heads


def default_scale(head_dim: int) -> float:
    """The usual softmax scale, 1 / sqrt(head_dim)."""
    return 1.0 / math.sqrt(head_dim)


def extend_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
    offset: int = 0,
) -> torch.Tensor:
    """Causal attention of the last n queries of one sequence over its whole KV.

    Args:
        q: [n, num_q_heads, head_dim], the queries of positions L-n .. L-1.
        k, v: [L, num_kv_heads, head_dim], keys and values of positions 0 .. L-1.
        scale: softmax scale; 1/sqrt(head_dim) when None.
        window: sliding window (Mistral, HF `sliding_window`): the query at position p
            sees only keys p - window + 1 .. p, its own token included. None: full.
        chunk: chunked local attention (Llama 4, HF `attention_chunk_size`): the query
            at position p sees only the keys of its own chunk of `chunk` tokens up to p
            (key k with k // chunk == p // chunk). None: no chunking.
        offset: the sequence position of k[0] (>= 0), for a KV that starts past the
            sequence's start (a cache's gather): masks that depend on where a position
            lies (chunks) read the true positions; causal and windowed masks are the same.

    Returns:
        [n, num_q_heads, head_dim] float64. Query i sees keys 0 .. L-n+i inclusive
        (from L-n+i-window+1 with a window, within its chunk with a chunk).
    """
    check_window(window)
    check_chunk(chunk)
    if q.dim() != 3:
        raise ShapeError(f"q must be [n, num_q_heads, head_dim], got {tuple(q.shape)}")
    n, q_heads, head_dim = q.shape
    group = _check_heads(q_heads, k, v, "extend_attention")
    seq_len = k.shape[0]
    if k.shape[2] != head_dim:
        raise ShapeError(f"head_dim of q ({head_dim}) and k ({k.shape[2]}) differ")
    if n > seq_len or n == 0:
        raise ShapeError(f"query count {n} must be in [1, seq_len={seq_len}]")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ShapeError(f"offset must be an integer >= 0, got {offset!r}")
    scale = default_scale(head_dim) if scale is None else scale
    q64 = q.to(torch.float64).transpose(0, 1)  # [Hq, n, D]
    k64 = k.to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, L, D]
    v64 = v.to(torch.float64).repeat_interleave(group, dim=1).transpose(0, 1)
    scores = torch.matmul(q64, k64.transpose(1, 2)) * scale  # [Hq, n, L]
    query_pos = torch.arange(offset + seq_len - n, offset + seq_len, device=q.device).unsqueeze(1)
    key_pos = torch.arange(offset, offset + seq_len, device=q.device).unsqueeze(0)
    hidden = key_pos > query_pos
    if window is not None:
        hidden = hidden | (key_pos <= query_pos - window)
    if chunk is not None:
        hidden = hidden | (key_pos // chunk != query_pos // chunk)
    scores = scores.masked_fill(hidden, float("-inf"))
    out = torch.matmul(torch.softmax(scores, dim=-1), v64)  # [Hq, n, D]
    return out.transpose(0, 1).contiguous()


class Mask(TypedDict):
    """The mask keywords of `extend_attention` and `decode_attention`."""

    window: int | None
    chunk: int | None


def spec_mask(spec: KVCacheSpec) -> Mask:
    """The mask keywords of this module's functions for a layer's `spec` (`window`,
    `chunk`), read from the spec's own fields and never from its kind's rule
    (`workloads.kv_rules`), so a wrong rule cannot hide behind the oracle. A kind whose
    mask differs adds its keyword to `extend_attention` and here."""
    return Mask(window=spec.window, chunk=spec.chunk)


def first_key(position: int, *, window: int | None = None, chunk: int | None = None) -> int:
    """The first key position `extend_attention`'s mask leaves visible to the query at
    `position` (every key from there to `position` is visible): what a reference cache
    slices for its newest token."""
    first = 0
    if window is not None:
        first = max(first, position - window + 1)
    if chunk is not None:
        first = max(first, position // chunk * chunk)
    return first


def decode_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    scale: float | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """Attention of one query (the newest token) over a sequence's whole KV.

    Args:
        q: [num_q_heads, head_dim].
        k, v: [L, num_kv_heads, head_dim], L >= 1.
        window: as for extend_attention: keys max(0, L - window) .. L - 1 only.
        chunk: as for extend_attention: keys of the newest token's chunk only.

    Returns:
        [num_q_heads, head_dim] float64.
    """
    if q.dim() != 2:
        raise ShapeError(f"q must be [num_q_heads, head_dim], got {tuple(q.shape)}")
    if k.dim() != 3 or k.shape[0] == 0:
        raise ShapeError(f"k must be [L>=1, num_kv_heads, head_dim], got {tuple(k.shape)}")
    return extend_attention(q.unsqueeze(0), k, v, scale, window=window, chunk=chunk)[0]


def batched_decode_attention(
    q: torch.Tensor,
    keys: Sequence[torch.Tensor],
    values: Sequence[torch.Tensor],
    scale: float | None = None,
    *,
    window: int | None = None,
    chunk: int | None = None,
) -> torch.Tensor:
    """decode_attention for a batch of sequences of different lengths.

    Args:
        q: [batch, num_q_heads, head_dim].
        keys, values: one [L_i, num_kv_heads, head_dim] tensor per sequence.
        window: sliding window of every sequence (None: full attention).
        chunk: attention chunk of every sequence (None: no chunking).

    Returns:
        [batch, num_q_heads, head_dim] float64.
    """
    if q.dim() != 3 or len(keys) != q.shape[0] or len(values) != q.shape[0]:
        raise ShapeError(
            f"q must be [batch, num_q_heads, head_dim] with one K and V per row; got q "
            f"{tuple(q.shape)}, {len(keys)} keys, {len(values)} values"
        )
    outs = [
        decode_attention(q[i], keys[i], values[i], scale, window=window, chunk=chunk)
        for i in range(q.shape[0])
    ]
    return torch.stack(outs) if outs else q.new_zeros(q.shape, dtype=torch.float64)


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64, the single accuracy measure kvbench uses.

    NaN anywhere in `out` (an unwritten, poisoned element) gives NaN, which fails every
    tolerance comparison.
    """
    if out.shape != ref.shape:
        raise ShapeError(f"shapes differ: out {tuple(out.shape)} vs ref {tuple(ref.shape)}")
    diff = out.to(torch.float64) - ref.to(torch.float64)
    denom = torch.linalg.vector_norm(ref.to(torch.float64))
    if denom == 0:
        return float(torch.linalg.vector_norm(diff))
    return float(torch.linalg.vector_norm(diff) / denom)


#: Tolerances on relative_error per Q/K/V dtype (float32 accumulation everywhere).
TOLERANCE: dict[torch.dtype, float] = {
    torch.float64: 1e-12,
    torch.float32: 1e-5,
    torch.float16: 2e-3,
    torch.bfloat16: 1.6e-2,
}


def tolerance(dtype: torch.dtype) -> float:
    """Relative-error tolerance for results computed from inputs of `dtype`."""
    try:
        return TOLERANCE[dtype]
    except KeyError:
        raise ShapeError(f"no tolerance defined for dtype {dtype}") from None
