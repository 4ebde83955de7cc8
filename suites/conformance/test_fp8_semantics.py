"""fp8 KV semantics (`workloads.fp8`) against an independent float64 oracle.

The oracle enumerates every finite value of the format from its bit patterns in float64
and picks the nearest (ties to the even bit pattern), so it shares nothing with torch's
own conversion that `fp8.quantize` uses.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError

FORMATS = list(fp8.FORMATS.values())
IDS = [f.name for f in FORMATS]


def _finite_table(fmt: fp8.Fp8Format) -> tuple[torch.Tensor, torch.Tensor]:
    """(values float64, bit patterns) of every finite value of `fmt`, decoded from the
    bits by the format's definition (sign, biased exponent, mantissa, subnormals)."""
    m = fmt.mantissa_bits
    e_bits = 7 - m
    bias = 1 - fmt.min_exponent
    vals, bits = [], []
    for b in range(256):
        sign = -1.0 if b & 0x80 else 1.0
        e = (b >> m) & ((1 << e_bits) - 1)
        man = b & ((1 << m) - 1)
        if fmt.name == "fp8_e4m3" and e == 15 and man == 7:
            continue  # e4m3fn NaN
        if fmt.name == "fp8_e5m2" and e == 31:
            continue  # e5m2 inf / NaN
        if e == 0:
            v = man / (1 << m) * 2.0 ** (1 - bias)
        else:
            v = (1 + man / (1 << m)) * 2.0 ** (e - bias)
        vals.append(sign * v)
        bits.append(b)
    return torch.tensor(vals, dtype=torch.float64), torch.tensor(bits)


def _oracle_bits(y: torch.Tensor, fmt: fp8.Fp8Format) -> torch.Tensor:
    """Bits of the nearest finite value to float64 `y` (already saturated), ties to even."""
    vals, bits = _finite_table(fmt)
    dist = (y.reshape(-1, 1) - vals.reshape(1, -1)).abs()
    best = dist.min(dim=1, keepdim=True).values
    cand = dist == best
    # among ties prefer an even mantissa (bit 0 clear); a zero result keeps y's sign
    even = (bits & 1) == 0
    pick = torch.where(cand & even, 2, 0) + cand.to(torch.int64)
    idx = pick.argmax(dim=1)
    out = bits[idx]
    negative = torch.signbit(y.reshape(-1))
    out = torch.where((vals[idx] == 0) & negative, out | 0x80, out)
    return out.reshape(y.shape)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_fp8_table_matches_torch_decoding(fmt: fp8.Fp8Format) -> None:
    vals, bits = _finite_table(fmt)
    torch_vals = bits.to(torch.uint8).view(fmt.dtype).to(torch.float64)
    assert torch.equal(torch_vals, vals)
    assert float(vals.max()) == fmt.max


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@given(seed=st.integers(0, 2**31 - 1), log_scale=st.floats(-12, 12))
def test_fp8_quantize_is_nearest_even_after_float32_multiply(
    fmt: fp8.Fp8Format, seed: int, log_scale: float
) -> None:
    g = torch.Generator().manual_seed(seed)
    heads = 3
    scales = (torch.rand(heads, generator=g, dtype=torch.float64) * 2**log_scale + 1e-30).to(
        torch.float32
    )
    # values around the format's range, some past it (saturation), some tiny (subnormals)
    mag = torch.exp2(torch.empty(5, heads, 8).uniform_(-20, 20, generator=g))
    x = (torch.randn(5, heads, 8, generator=g).sign() * mag).to(torch.float32)
    x = x * scales.unsqueeze(-1)
    q = fp8.quantize(x, scales, fmt)
    y = (x * fp8.reciprocal(scales).unsqueeze(-1)).to(torch.float64).clamp(-fmt.max, fmt.max)
    assert torch.equal(q.view(torch.uint8).to(torch.int64), _oracle_bits(y, fmt))


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_fp8_every_value_round_trips_exactly(fmt: fp8.Fp8Format) -> None:
    vals, bits = _finite_table(fmt)
    scales = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float32)  # powers of two: exact
    x = (vals.reshape(-1, 1, 1) * scales.to(torch.float64).reshape(1, 3, 1)).expand(-1, 3, 2)
    q = fp8.quantize(x.to(torch.float32), scales, fmt)
    assert torch.equal(q.view(torch.uint8)[:, 0, 0].to(torch.int64), bits)
    assert torch.equal(fp8.dequantize(q, scales, torch.float64), x)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_fp8_overflow_saturates_to_max(fmt: fp8.Fp8Format) -> None:
    scales = torch.tensor([2.0], dtype=torch.float32)
    x = torch.tensor([[[fmt.max * 2 * 1.01, -fmt.max * 2 * 1e3, 3e38, -3e38]]])
    q = fp8.quantize(x, scales, fmt)
    back = fp8.dequantize(q, scales, torch.float64).reshape(-1)
    expected = torch.tensor([1.0, -1.0, 1.0, -1.0], dtype=torch.float64) * fmt.max * 2
    assert torch.equal(back, expected)


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_fp8_non_finite_is_refused_or_stored_as_nan(fmt: fp8.Fp8Format, bad: float) -> None:
    x = torch.ones(2, 2, 4)
    x[1, 0, 3] = bad
    with pytest.raises(fp8.NonFiniteError, match=rf"{bad}.*index \(1, 0, 3\)"):
        fp8.check_finite(x, "keys")
    q = fp8.quantize(x, torch.ones(2), fmt)
    assert q.view(torch.uint8)[1, 0, 3] == fp8.NAN_BITS
    assert torch.isnan(q.to(torch.float32)[1, 0, 3])  # never a finite value
    assert int(torch.isfinite(q.to(torch.float32)).sum()) == x.numel() - 1


@pytest.mark.parametrize("fmt", FORMATS, ids=IDS)
def test_fp8_dynamic_scale_rule(fmt: fp8.Fp8Format) -> None:
    x = torch.zeros(4, 3, 8)
    x[2, 0, 1] = -6.0
    x[1, 1, 5] = 3.0  # head 2 is all zeros
    per_tensor = fp8.dynamic_scale(x, fmt, "tensor")
    per_head = fp8.dynamic_scale(x, fmt, "head")
    expect_t = torch.tensor(6.0 / fmt.max, dtype=torch.float64).to(torch.float32)
    assert torch.equal(per_tensor, expect_t.expand(3))
    expect_h = torch.tensor([6.0 / fmt.max, 3.0 / fmt.max, 1.0], dtype=torch.float64)
    assert torch.equal(per_head, expect_h.to(torch.float32))
    # the amax element quantizes to max (or the nearest below, after float32 rounding)
    q = fp8.dequantize(fp8.quantize(x, per_head, fmt), torch.ones(3), torch.float64)
    assert abs(float(q[2, 0, 1])) == pytest.approx(fmt.max, rel=2.0**-fmt.mantissa_bits)


def test_fp8_static_scales_shapes_and_bad_values() -> None:
    assert torch.equal(fp8.static_scales(0.5, 2, 3, "k_scale"), torch.full((2, 3), 0.5))
    per_head = fp8.static_scales([1.0, 2.0, 4.0], 2, 3, "k_scale")
    assert per_head.shape == (2, 3) and per_head[1, 2] == 4.0
    for bad, msg in [(0.0, "holds 0.0"), (-1.0, "holds -1.0"), (float("nan"), "nan")]:
        with pytest.raises(ConfigError, match=msg):
            fp8.static_scales(bad, 2, 3, "k_scale")
    with pytest.raises(ConfigError, match=r"shape \(2,\)"):
        fp8.static_scales([1.0, 2.0], 2, 3, "k_scale")
    with pytest.raises(ConfigError, match="granularity 'layer'"):
        fp8.check_granularity("layer")
    with pytest.raises(ConfigError, match="not an fp8 format"):
        fp8.fp8_format("float16")
    assert fp8.fp8_format("e5m2").dtype == torch.float8_e5m2
