"""vLLM's fp8 KV path (Triton write + unified attention, per-tensor scales) against
kvbench's, under `TRITON_INTERPRET=1` with the interpreter's fp8 conversions made the
sm_90 instruction's (`vllm_fp8.interpreter_fp8_as_sm90`; the stock ones are shown wrong
below). Same scales, same pools.

Write: bytes compared element for element with kvbench's `ops.write_kv`; every
disagreement is accounted for by its cause (suites/peers/vllm_fp8.py lists them: scale
convention x / s vs x * (1 / s), inf saturating to max, e5m2 stored as e4m3).
Attention: vLLM's decode over a kvbench-written pool within the query dtype's tolerance
of float64 attention over the dequantized K/V (kvbench's decode meets the same bound).
Skipped with the reason when vLLM or the interpreter is missing.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from kvbench.kernels import ops
from kvbench.reference import oracle
from kvbench.suites.conformance.test_kernels_fp8 import _fp8_batch
from kvbench.suites.peers import vllm_fp8, vllm_triton
from kvbench.suites.peers.base import PeerUnavailableError
from kvbench.workloads import fp8

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


@pytest.fixture(scope="module")
def vllm_ops():
    try:
        return vllm_triton.load_vllm_triton()
    except PeerUnavailableError as exc:
        pytest.skip(f"vLLM's Triton kernels unavailable: {exc}")


def _pools(shape: tuple[int, ...], dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Two fp8 pools filled with byte 0x55 (a finite value: a stray write shows)."""
    return tuple(torch.full(shape, 0x55, dtype=torch.uint8).view(dtype) for _ in range(2))  # type: ignore[return-value]


def _both_writes(key, value, slots, scale, dtype, shape, kv_cache_dtype=None):
    """(vLLM's pools, kvbench's pools) after writing key/value at slots, same scale."""
    s = torch.full((shape[2],), scale)
    theirs, mine = _pools(shape, dtype), _pools(shape, dtype)
    with vllm_fp8.interpreter_fp8_as_sm90():
        vllm_fp8.write_fp8(*theirs, key, value, slots, s, s, kv_cache_dtype)
    ops.write_kv(*mine, key, value, slots, backend="torch", k_scale=s, v_scale=s)
    return theirs, mine


def _all_finite_fp16(head_dim: int) -> torch.Tensor:
    """Every finite float16 value once (tokens x 1 head x head_dim), +-65504 included."""
    bits = torch.arange(0, 1 << 16, dtype=torch.int32).to(torch.int16).view(torch.float16)
    vals = bits[torch.isfinite(bits)]
    n = vals.numel() // head_dim * head_dim
    return vals[:n].reshape(-1, 1, head_dim)


@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_vllm_fp8_e4m3_write_bytes_equal_kvbench_with_a_power_of_two_scale(
    vllm_ops, in_dtype: torch.dtype
) -> None:
    """A power-of-two scale makes x / s and x * (1 / s) the same exact float32: vLLM's
    bytes equal kvbench's everywhere, saturated (+-6e4 / s > 448) and subnormal values
    included, and no other slot changes."""
    gen = torch.Generator().manual_seed(11)
    shape = (5, 16, 2, 64)
    n = 47
    key = (torch.randn(n, 2, 64, generator=gen) * 8).to(in_dtype)
    value = (torch.randn(n, 2, 64, generator=gen) / 16).to(in_dtype)
    key[0, 0, :4] = torch.tensor([6e4, -6e4, 3e-5, -3e-5]).to(in_dtype)
    slots = torch.randperm(5 * 16, generator=gen)[:n]
    theirs, mine = _both_writes(key, value, slots, 2.0**-4, E4M3, shape)
    for t, m in zip(theirs, mine, strict=True):
        assert torch.equal(t.view(torch.uint8), m.view(torch.uint8))
    assert int(theirs[0].view(torch.uint8).view(-1, 2, 64)[slots[0], 0, 0]) == 0x7E  # +448


def test_vllm_fp8_e4m3_write_disagreements_are_the_scale_convention(vllm_ops) -> None:
    """Every finite float16 value, scales that are not powers of two: vLLM divides by the
    scale, kvbench multiplies by float32(1 / scale). Each differing byte is exactly the
    division rule's (`fp8_rne(satfinite(x / s))`), and differs from kvbench's by one fp8
    step; they are rare (< 0.5% of values here)."""
    x = _all_finite_fp16(64)
    slots = torch.arange(x.shape[0])
    shape = (x.shape[0], 1, 1, 64)
    for scale in (0.0137, 0.3, 3.7):
        (tk, _), (mk, _) = _both_writes(x, x, slots, scale, E4M3, shape)
        got, mine = tk.view(torch.uint8).view(-1, 64), mk.view(torch.uint8).view(-1, 64)
        division = vllm_fp8.sm90_fp8_bits(x.float().view(-1, 64) / scale, E4M3)
        assert torch.equal(got, division), f"scale {scale}: vLLM's bytes are not x / s rounded"
        differ = got != mine
        frac = float(differ.float().mean())
        assert frac < 5e-3, f"scale {scale}: {frac:.3%} of bytes differ"
        steps = (got[differ].to(torch.int16) - mine[differ].to(torch.int16)).abs()
        assert bool((steps == 1).all()), f"scale {scale}: a byte differs by more than one step"


def test_vllm_fp8_write_saturates_inf_to_max_where_kvbench_refuses(vllm_ops) -> None:
    """Disagreement by design: vLLM stores +-inf as +-448 (satfinite) and NaN as NaN;
    kvbench refuses both (NonFiniteError, nothing written)."""
    key = torch.ones(3, 1, 32)
    key[0, 0, :3] = torch.tensor([float("inf"), float("-inf"), float("nan")])
    slots = torch.arange(3)
    s = torch.ones(1)
    theirs = _pools((1, 4, 1, 32), E4M3)
    with vllm_fp8.interpreter_fp8_as_sm90():
        vllm_fp8.write_fp8(*theirs, key, key, slots, s, s)
    assert theirs[0].view(torch.uint8)[0, 0, 0, :3].tolist() == [0x7E, 0xFE, 0x7F]
    mine = _pools((1, 4, 1, 32), E4M3)
    with pytest.raises(fp8.NonFiniteError, match="inf"):
        ops.write_kv(*mine, key, key, slots, backend="torch", k_scale=s, v_scale=s)
    assert bool((mine[0].view(torch.uint8) == 0x55).all())


def test_vllm_fp8_e5m2_cache_holds_e4m3_bytes(vllm_ops) -> None:
    """Disagreement by design: vLLM's Triton write views an `fp8_e5m2` cache as its
    platform's e4m3: the bytes are kvbench's e4m3 quantization, not its e5m2 one."""
    gen = torch.Generator().manual_seed(5)
    key = torch.randn(20, 2, 32, generator=gen).half()
    slots = torch.randperm(32, generator=gen)[:20]
    shape = (2, 16, 2, 32)
    (tk, _), _ = _both_writes(key, key, slots, 2.0**-6, E5M2, shape, "fp8_e5m2")
    s = torch.full((2,), 2.0**-6)
    e4m3 = fp8.quantize(key, s, fp8.fp8_format(E4M3)).view(torch.uint8)
    e5m2 = fp8.quantize(key, s, fp8.fp8_format(E5M2)).view(torch.uint8)
    got = tk.view(torch.uint8).view(-1, 2, 32)[slots]
    assert torch.equal(got, e4m3)
    assert not torch.equal(got, e5m2)


@pytest.mark.parametrize("q_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_vllm_unified_fp8_decode_matches_float64_over_dequantized_kv(
    vllm_ops, q_dtype: torch.dtype
) -> None:
    """unified_attention (3D decode, FP8_PER_TENSOR) over a kvbench-written e4m3 pool
    (lengths 1 block, past a block, several blocks; GQA group 2) within the query dtype's
    tolerance of float64 attention over the dequantized K/V, as kvbench's decode is."""
    lens, hkv, hq, d, bs = [37, 5, 70], 2, 4, 64, 16
    kc, vc, tables, seq_lens, keys, values, ks, vs = _fp8_batch(
        lens, hkv, d, bs, E4M3, False, seed=3
    )
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(8)).to(q_dtype)
    adapter = vllm_fp8.VLLMTritonUnifiedFp8()
    assert adapter.uses_3d(len(lens), hkv)
    bf16 = vllm_triton.interpreter_bf16_fixed() if q_dtype == torch.bfloat16 else None
    with vllm_fp8.interpreter_fp8_as_sm90(), bf16 or contextlib.nullcontext():
        theirs = adapter.fp8_decode_fn((kc, vc), q, tables, seq_lens, ks, vs)()
    mine = ops.paged_decode_attention(
        q, kc, vc, tables, seq_lens, backend="torch", k_scale=ks, v_scale=vs
    )
    fmt = fp8.fp8_format(E4M3)
    for b in range(len(lens)):
        kq = fp8.dequantize(fp8.quantize(keys[b], ks, fmt), ks, torch.float64)
        vq = fp8.dequantize(fp8.quantize(values[b], vs, fmt), vs, torch.float64)
        ref = oracle.decode_attention(q[b].double(), kq, vq)
        for who, out in (("vllm", theirs[b]), ("kvbench", mine[b])):
            err = oracle.relative_error(out, ref)
            assert err <= oracle.tolerance(q_dtype), f"{who} seq {b}: relative error {err:.3g}"


def test_vllm_unified_fp8_refuses_per_head_scales(vllm_ops) -> None:
    """vLLM's per-tensor fp8 mode reads one scale: kvbench's per-head scales are
    `unsupported`, with the values named."""
    adapter = vllm_fp8.VLLMTritonUnifiedFp8()
    why = adapter.unsupported_scales(torch.tensor([0.5, 0.25]), torch.ones(2))
    assert why is not None and "[0.5, 0.25]" in why
    assert adapter.unsupported_scales(torch.full((2,), 0.5), torch.ones(2)) is None


def test_interpreter_fp8_cast_defect_documented(vllm_ops) -> None:
    """Finding (Triton 3.9's interpreter, not vLLM): its float32 -> fp8 store cast is
    wrong for many values (the same write as the power-of-two test disagrees with
    kvbench); `interpreter_fp8_as_sm90()` makes it exact. Should Triton fix it, this
    test fails and the finding is retired."""
    if not vllm_triton.interpreting():
        pytest.skip("compiled Triton: the interpreter defect does not apply")
    x = torch.randn(64, 1, 64, generator=torch.Generator().manual_seed(2)) * 8
    slots = torch.arange(x.shape[0])
    s = torch.full((1,), 2.0**-4)
    stock = _pools((x.shape[0], 1, 1, 64), E4M3)
    vllm_fp8.write_fp8(*stock, x, x, slots, s, s)
    mine = _pools((x.shape[0], 1, 1, 64), E4M3)
    ops.write_kv(*mine, x, x, slots, backend="torch", k_scale=s, v_scale=s)
    assert not torch.equal(stock[0].view(torch.uint8), mine[0].view(torch.uint8))
