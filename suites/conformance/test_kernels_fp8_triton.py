"""The Triton fp8 read path reads every byte pattern exactly, under the interpreter.

Every one of the 256 byte patterns is read through decode with one visible token, where
attention returns V itself: each output element must be `float32(fp8 value) *
float32(scale)` rounded to the query dtype, bit for bit, with NaN (and e5m2's inf) read
as NaN (inf), never as a finite value.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import ops
from kvbench.suites.conformance.test_kernels_fp8 import FP8, FP8_IDS

Q_DTYPES = (torch.float16, torch.bfloat16)


def _all_bytes_pool(kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: K small and finite, V's two heads x 128 dims holding the
    256 byte patterns (head 0: 0x00-0x7F, head 1: 0x80-0xFF)."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(1, 1, 2, 128)
    k = torch.full_like(v, 0x30)  # a small positive finite value in both formats
    return k.view(kv_dtype), v.view(kv_dtype)


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("q_dtype", Q_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["decode"])
def test_fp8_triton_reads_every_byte_exactly(
    kv_dtype: torch.dtype, q_dtype: torch.dtype, op: str
) -> None:
    kc, vc = _all_bytes_pool(kv_dtype)
    ks = torch.tensor([0.75, 0.75])
    vs = torch.tensor([0.3, 1.7])  # not powers of two: the product is rounded
    tables = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    q = torch.randn(1, 2, 128, generator=torch.Generator().manual_seed(0)).to(q_dtype)
    kw = {"backend": "triton", "k_scale": ks, "v_scale": vs}
    if op == "decode":
        out = ops.paged_decode_attention(q, kc, vc, tables, lens, **kw)
    else:
        cu = torch.tensor([0, 1], dtype=torch.int32)
        out = ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, **kw)
    product = vc.to(torch.float32)[0, 0] * vs[:, None]  # float32, one rounding
    want = product.to(q_dtype)
    got = out[0]
    assert int(torch.isnan(want).sum()) == (2 if kv_dtype == torch.float8_e4m3fn else 6)
    assert torch.equal(torch.isnan(got), torch.isnan(want))
    ok = got.eq(want)
    if q_dtype == torch.bfloat16 and got.device.type == "cpu":
        # Triton 3.9's interpreter casts float32 -> bfloat16 by truncation (compiled
        # kernels round to nearest): accept the product truncated, and nothing else
        truncated = (product.view(torch.int32) & -65536).view(torch.float32).to(q_dtype)
        ok |= got.eq(truncated)
    assert bool(ok[~torch.isnan(want)].all()), (got[~ok], want[~ok])
