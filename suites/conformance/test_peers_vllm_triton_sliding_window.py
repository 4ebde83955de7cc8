"""vLLM's Triton unified attention with its sliding window (window_size (w - 1, 0)) as a
peer of kvbench's windowed Triton decode, under `TRITON_INTERPRET=1`, small shapes.

Both read the same pool (`test_kernels_sliding_window._windowed_pool`): shuffled blocks,
the blocks wholly before each sequence's window replaced in its table by a block of NaN
and the pre-window slots of its first window block NaN, so a kernel that reads outside
the window (rather than skipping it) returns NaN. Both are held to the float64 oracle with
the window mask and to each other. Skipped where vLLM's Triton kernels are unavailable.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.kernels import ops
from kvbench.reference import oracle
from kvbench.suites.conformance.test_kernels_sliding_window import _windowed_pool
from kvbench.suites.peers import vllm_triton
from kvbench.suites.peers.base import PeerUnavailableError

#: (block size, window, lengths): below a block, not a multiple, longer than the sequence
CASES = [(16, 3, [1, 2, 17, 40]), (16, 37, [36, 38, 100]), (8, 100, [5, 60]), (4, 1, [1, 9])]


@pytest.mark.parametrize(("bs", "window", "lens"), CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_sliding_window_vllm_unified_matches_kvbench_decode(
    bs: int, window: int, lens: list[int], dtype: torch.dtype
) -> None:
    try:
        peer = vllm_triton.VLLMTritonUnified()
    except PeerUnavailableError as exc:
        pytest.skip(f"vLLM's Triton kernels unavailable: {exc}")
    hkv, group, d = 2, 2, 32
    gen = torch.Generator().manual_seed(window)
    kc, vc, tables, tlens, keys, values = _windowed_pool(lens, window, hkv, d, bs, dtype, gen)
    q = torch.randn((len(lens), hkv * group, d), generator=gen).to(dtype)
    ref = oracle.batched_decode_attention(q, keys, values, window=window)
    ours = torch.full_like(q, float("nan"))
    ops.paged_decode_attention(q, kc, vc, tables, tlens, out=ours, backend="triton", window=window)
    fn = peer.decode_fn((kc, vc), q, tables, tlens, 1.0 / math.sqrt(d), window=window)
    theirs = fn()
    tol = oracle.tolerance(dtype)
    assert oracle.relative_error(ours, ref) <= tol
    assert oracle.relative_error(theirs, ref) <= tol, ("vLLM", window, bs, lens)
    assert oracle.relative_error(theirs, ours.to(torch.float64)) <= 2 * tol
