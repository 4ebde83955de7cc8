"""The gather + SDPA fp8 prefill (`kernels.torch_ops`), called directly.

On a CPU where the C++ kernel builds, `ops.paged_prefill_attention(..., backend="torch")`
sends fp8 prefill without a window to the C++ fp8 prefill (`kernels.ops`), so the torch
version runs only with `KVBENCH_CPU_KERNEL=torch`, without a compiler, or with a window;
test_fp8_prefill_torch_matches_float64_over_dequantized_kv, despite its name, cannot
catch a defect in it (the mutation check's first choice of test for an inverted scale).
This pins it: per-head scales 4x apart, with and without a window, against the float64
extend oracle over the dequantized K/V."""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.kernels import torch_ops
from kvbench.kernels.validation import check_prefill
from kvbench.reference import oracle
from kvbench.workloads import fp8


@pytest.mark.parametrize("kv_dtype", [torch.float8_e4m3fn, torch.float8_e5m2], ids=["e4m3", "e5m2"])
@pytest.mark.parametrize("window", [None, 5])
def test_fp8_gather_prefill_dequantizes_with_each_heads_scale(
    kv_dtype: torch.dtype, window: int | None
) -> None:
    gen = torch.Generator().manual_seed(11)
    bs, h, group, d = 4, 2, 2, 16
    lens, q_lens = [9, 6], [3, 6]
    fmt = fp8.fp8_format(kv_dtype)
    spread = torch.tensor([1.0, 4.0]).view(1, h, 1)  # heads 4x apart: a wrong scale shows
    keys = [torch.randn(n, h, d, generator=gen) * spread for n in lens]
    values = [torch.randn(n, h, d, generator=gen) * spread for n in lens]
    ks = fp8.dynamic_scale(torch.cat(keys), fmt, "head")
    vs = fp8.dynamic_scale(torch.cat(values), fmt, "head")
    need = [-(-n // bs) for n in lens]
    kc = torch.zeros((sum(need), bs, h, d), dtype=kv_dtype)
    vc = torch.zeros_like(kc)
    tables = torch.zeros((len(lens), max(need)), dtype=torch.int32)
    first = 0
    for b, n in enumerate(lens):
        blocks = torch.arange(first, first + need[b])
        tables[b, : need[b]] = blocks.to(torch.int32)
        first += need[b]
        slots = (blocks.repeat_interleave(bs) * bs + torch.arange(bs).repeat(need[b]))[:n]
        kc.view(-1, h, d)[slots] = fp8.quantize(keys[b], ks, fmt)
        vc.view(-1, h, d)[slots] = fp8.quantize(values[b], vs, fmt)
    cu = torch.tensor([0, q_lens[0], sum(q_lens)], dtype=torch.int32)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    q = torch.randn(sum(q_lens), h * group, d, generator=gen)
    out = torch.full_like(q, float("nan"))
    dims = check_prefill(q, kc, vc, tables, cu, seq_lens, out, window=window)
    torch_ops.paged_prefill_attention(
        q, kc, vc, tables, cu, seq_lens, 1.0 / math.sqrt(d), out, dims, (ks, vs), window=window
    )
    for b, n in enumerate(q_lens):
        kq = fp8.dequantize(fp8.quantize(keys[b], ks, fmt), ks, torch.float64)
        vq = fp8.dequantize(fp8.quantize(values[b], vs, fmt), vs, torch.float64)
        rows = slice(int(cu[b]), int(cu[b]) + n)
        ref = oracle.extend_attention(q[rows].double(), kq, vq, window=window)
        assert oracle.relative_error(out[rows], ref) <= oracle.tolerance(torch.float32), (b, window)
