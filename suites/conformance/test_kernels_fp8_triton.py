"""Triton prefill/extend over fp8 K/V, and the fp8 read path's exactness, under the
interpreter.

Oracles: float64 attention over the float64-dequantized K/V (fp8 value x scale: the
kernel's semantics; it converts the fp8 values to the query dtype exactly and applies the
scales in float32, so within that dtype's tolerance, head spreads up to 256 included) and,
for the
accuracy cost, float64 attention over the unquantized K/V (bounded loosely by
`COST_BOUND`, the figure attached to the test report as `fp8_cost`). Pools are random bytes
(NaN patterns included) wherever nothing was written, so a stray read fails. Shapes are
small: the interpreter runs every program in Python.

The exactness test reads every one of the 256 byte patterns through decode and prefill
with one visible token, where attention returns V itself: each output element must be
`float32(fp8 value) * float32(scale)` rounded to the query dtype, bit for bit, with NaN
(and e5m2's inf) read as NaN (inf), never as a finite value.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvbench.kernels import ops
from kvbench.reference import oracle
from kvbench.suites.conformance.fp8_launch import Fp8Launch
from kvbench.suites.conformance.test_kernels_fp8 import (
    COST_BOUND,
    FP8,
    FP8_IDS,
    _fp8_batch,
)
from kvbench.workloads import fp8

Q_DTYPES = (torch.float16, torch.bfloat16)
T = torch.Tensor


def _dequantized(t: torch.Tensor, scale: torch.Tensor, kv_dtype: torch.dtype) -> torch.Tensor:
    fmt = fp8.fp8_format(kv_dtype)
    return fp8.dequantize(fp8.quantize(t, scale, fmt), scale, torch.float64)


def _prefill_case(
    kv_dtype: torch.dtype,
    q_dtype: torch.dtype,
    lens: list[int],
    q_lens: list[int],
    h: int,
    group: int,
    d: int,
    bs: int,
    per_head: bool,
    window: int | None = None,
    record: Callable[[str, object], None] | None = None,
) -> None:
    """Triton fp8 prefill of `q_lens` new tokens per sequence against both oracles."""
    kc, vc, tables, seq_lens, keys, values, ks, vs = _fp8_batch(
        lens, h, d, bs, kv_dtype, per_head, seed=sum(lens)
    )
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    gen = torch.Generator().manual_seed(len(lens))
    q = torch.randn(int(cu[-1]), h * group, d, generator=gen).to(q_dtype)
    out = torch.full_like(q, float("nan"))
    ops.paged_prefill_attention(
        q, kc, vc, tables, cu, seq_lens, out=out, backend="triton", k_scale=ks, v_scale=vs,
        window=window,
    )  # fmt: skip
    refs, exact = [], []
    for b in range(len(lens)):
        rows = q[int(cu[b]) : int(cu[b + 1])].double()
        kq, vq = _dequantized(keys[b], ks, kv_dtype), _dequantized(values[b], vs, kv_dtype)
        refs.append(oracle.extend_attention(rows, kq, vq, window=window))
        exact.append(
            oracle.extend_attention(rows, keys[b].double(), values[b].double(), window=window)
        )
    err = oracle.relative_error(out, torch.cat(refs))
    assert err <= oracle.tolerance(q_dtype), err
    cost = oracle.relative_error(out, torch.cat(exact))
    if record is not None:
        record("fp8_cost", cost)
    assert cost <= COST_BOUND[kv_dtype] + oracle.tolerance(q_dtype), cost


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("q_dtype", Q_DTYPES, ids=str)
@pytest.mark.parametrize(
    ("lens", "q_lens", "h", "group", "per_head"),
    [
        ([19, 6], [5, 6], 2, 2, True),  # an extend over a cached prefix, a whole prompt
        ([40, 9], [33, 1], 1, 4, False),  # GQA 4: 33 x 4 rows span several query tiles
    ],
)
def test_fp8_triton_prefill_matches_float64_over_dequantized_kv(
    kv_dtype: torch.dtype,
    q_dtype: torch.dtype,
    lens: list[int],
    q_lens: list[int],
    h: int,
    group: int,
    per_head: bool,
    record_property: Callable[[str, object], None],
) -> None:
    _prefill_case(kv_dtype, q_dtype, lens, q_lens, h, group, 48, 8, per_head,
                  record=record_property)  # fmt: skip


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
def test_fp8_triton_sliding_window_prefill(kv_dtype: torch.dtype) -> None:
    """fp8 and a window together: dequantized in registers and windowed, against both
    oracles with the window mask (test_kernels_sliding_window_prefill.py proves with NaN
    that keys before the window are not read)."""
    _prefill_case(kv_dtype, torch.float16, [30, 12], [9, 12], 2, 2, 48, 8, True, window=7)


def _all_bytes_pool(kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per sequence: K small and finite, V's two heads x 128 dims holding the
    256 byte patterns (head 0: 0x00-0x7F, head 1: 0x80-0xFF)."""
    v = torch.arange(256, dtype=torch.int32).to(torch.uint8).reshape(1, 1, 2, 128)
    k = torch.full_like(v, 0x30)  # a small positive finite value in both formats
    return k.view(kv_dtype), v.view(kv_dtype)


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("q_dtype", Q_DTYPES, ids=str)
@pytest.mark.parametrize("op", ["decode", "prefill"])
def test_fp8_triton_reads_every_byte_exactly(
    kv_dtype: torch.dtype, q_dtype: torch.dtype, op: str
) -> None:
    kc, vc = _all_bytes_pool(kv_dtype)
    ks = torch.tensor([0.75, 0.75])
    vs = torch.tensor([0.3, 1.7])  # not powers of two: the product is rounded
    tables = torch.zeros(1, 1, dtype=torch.int32)
    lens = torch.ones(1, dtype=torch.int32)
    q = torch.randn(1, 2, 128, generator=torch.Generator().manual_seed(0)).to(q_dtype)
    kw: Fp8Launch = {"backend": "triton", "k_scale": ks, "v_scale": vs}
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


def _spread_batch(
    lens: list[int], h: int, spread: float, kv_dtype: torch.dtype, per_head: bool, seed: int
) -> tuple[T, T, T, T, list[T], list[T], T, T]:
    """Block 32, head dim 64: K and V of KV head i scaled by spread^(i / (h - 1)) (one head:
    by `spread`), written with amax scales into shuffled blocks of a zero pool."""
    bs, d = 32, 64
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 1
    kc = torch.zeros((nb, bs, h, d), dtype=torch.uint8).view(kv_dtype)
    vc = torch.zeros_like(kc)
    expo = torch.arange(h) / max(1, h - 1) if h > 1 else torch.ones(1)
    mag = (spread**expo).view(1, h, 1)
    keys = [torch.randn(n, h, d, generator=gen) * mag for n in lens]
    values = [torch.randn(n, h, d, generator=gen) * mag for n in lens]
    fmt = fp8.fp8_format(kv_dtype)
    gran = "head" if per_head else "tensor"
    ks = fp8.dynamic_scale(torch.cat(keys), fmt, gran)
    vs = fp8.dynamic_scale(torch.cat(values), fmt, gran)
    perm = torch.randperm(nb, generator=gen).tolist()
    tables = torch.full((len(lens), max(need)), -1, dtype=torch.int32)
    for b, (n, k) in enumerate(zip(lens, need, strict=True)):
        blocks, perm = perm[:k], perm[k:]
        tables[b, :k] = torch.tensor(blocks, dtype=torch.int32)
        slots = (torch.tensor(blocks).repeat_interleave(bs) * bs + torch.arange(bs).repeat(k))[:n]
        ops.write_kv(kc, vc, keys[b], values[b], slots, backend="torch", k_scale=ks, v_scale=vs)
    return kc, vc, tables, torch.tensor(lens, dtype=torch.int32), keys, values, ks, vs


@pytest.mark.parametrize(
    ("kv_dtype", "per_head", "h", "spread", "window"),
    [
        (torch.float8_e4m3fn, False, 1, 16.0, None),  # issue 36 item 6: 3.06e-3 on f4a07b7
        (torch.float8_e4m3fn, True, 4, 64.0, 37),  # 1.95e-3 on f4a07b7
        (torch.float8_e5m2, True, 5, 256.0, None),  # heads 1 .. 256 apart
        (torch.float8_e5m2, False, 5, 256.0, 37),
    ],
    ids=("e4m3-tensor-x16", "e4m3-head-x64-w37", "e5m2-head-x256", "e5m2-tensor-x256-w37"),
)
def test_fp8_triton_decode_within_float16_bound_at_head_spreads(
    kv_dtype: torch.dtype,
    per_head: bool,
    h: int,
    spread: float,
    window: int | None,
    record_property: Callable[[str, object], None],
) -> None:
    """Issue 36 item 6: the float16-query decode rounded each scaled K/V value to float16
    and landed 3.0-3.3e-3 from float64 over the dequantized K/V (over float16's 2e-3). It
    now converts the fp8 values to float16 exactly and scales in float32: 1.6-2.8e-4 over
    these shapes and spreads up to 256 (measured under the interpreter)."""
    kc, vc, tables, seq_lens, keys, values, ks, vs = _spread_batch(
        [70, 130], h, spread, kv_dtype, per_head, seed=0
    )
    q = torch.randn(2, 2 * h, 64, generator=torch.Generator().manual_seed(7)).to(torch.float16)
    out = ops.paged_decode_attention(q, kc, vc, tables, seq_lens, backend="triton",
                                     k_scale=ks, v_scale=vs, window=window)  # fmt: skip
    kq = [_dequantized(k, ks, kv_dtype) for k in keys]
    vq = [_dequantized(v, vs, kv_dtype) for v in values]
    ref = oracle.batched_decode_attention(q.double(), kq, vq, window=window)
    err = oracle.relative_error(out, ref)
    record_property("fp8_error_vs_dequantized", err)
    assert err <= oracle.tolerance(torch.float16), err
