"""Sliding-window fp8 decode and prefill in C++ (`kernels/cpu_ext/paged_attn_fp8.cpp`).

Oracle: float64 attention with the window mask (`reference.oracle`, HF / vLLM semantics: the
query at position p sees keys p - window + 1 .. p) over the float64-dequantized K/V
(`workloads.fp8.dequantize` of `fp8.quantize`, torch's arithmetic, not the kernel's),
within the query dtype's tolerance. What lies before a window must be skipped, not masked:
the table entries of blocks wholly before it are -1 (a cache released them) or point at a
block of NaN bytes (0x7F is NaN in both formats), and the earlier slots of the window's
first block hold NaN bytes, so a kernel that reads any of them, or multiplies one by a zero
probability, fails. The rest of the pool is random bytes (NaN and inf patterns included).
Shapes: windows of 1, 2, 3, 37 and 1000 tokens (below a block, not a multiple of it,
longer than every sequence), blocks of 1 to 32 tokens, GQA 1-4, head dims 64 (K/V
converted as loaded) and 40 (converted into a buffer), per-tensor and per-head scales with
KV heads 4^i apart, whole prompts, extends over a cached prefix, prompts prefilled in
chunks, and more new tokens than one prefill tile holds (so one sequence's tasks start
their key walks at different blocks). Skipped where the C++ kernel does not build.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cpu_paged, ops
from kvbench.kernels.validation import check_decode, check_prefill
from kvbench.reference import oracle
from kvbench.workloads import fp8

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_IDS = ("e4m3", "e5m2")
NAN_BYTE = 0x7F  # NaN in e4m3fn (S.1111.111) and in e5m2 (S.11111.11)
T = torch.Tensor


@pytest.fixture(autouse=True)
def _need_cpp() -> None:
    if cpu_paged.status().path != "cpp":
        pytest.skip(f"C++ kernel not built here: {cpu_paged.status().reason}")


def _pool(
    lens: list[int],
    firsts: list[int],
    hkv: int,
    d: int,
    bs: int,
    kv_dtype: torch.dtype,
    per_head: bool,
    before: str,
    seed: int,
) -> tuple[T, T, T, T, list[T], list[T], T, T]:
    """Pools holding sequence b's positions firsts[b] .. lens[b] - 1 (quantized through
    `ops.write_kv`) in shuffled blocks; the slots of its first held block before firsts[b]
    are NaN bytes and the blocks wholly before it are -1 (`before="minus1"`) or a block of
    NaN bytes in its table. KV head i is scaled by 4^i (values by 4^(H-1-i)); amax scales per
    head or per tensor. Returns the pools, tables, lens, each sequence's float64-dequantized
    K and V (every position: what lies before a window is the oracle's to mask) and the
    scales."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 2
    raw = torch.randint(0, 256, (2, nb, bs, hkv, d), generator=gen, dtype=torch.int32)
    raw = raw.to(torch.uint8)
    perm = torch.randperm(nb, generator=gen).tolist()
    nan_block = perm.pop()
    raw[:, nan_block] = NAN_BYTE
    kc, vc = (r.view(kv_dtype) for r in raw)
    mag = (4.0 ** torch.arange(hkv, dtype=torch.float32)).view(1, hkv, 1)
    keys = [torch.randn(n, hkv, d, generator=gen) * mag for n in lens]
    values = [torch.randn(n, hkv, d, generator=gen) * mag.flip(1) for n in lens]
    fmt = fp8.fp8_format(kv_dtype)
    gran = "head" if per_head else "tensor"
    ks = fp8.dynamic_scale(torch.cat(keys), fmt, gran)
    vs = fp8.dynamic_scale(torch.cat(values), fmt, gran)
    tables = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    for b, (n, m, lo) in enumerate(zip(lens, need, firsts, strict=True)):
        blocks, perm = perm[:m], perm[m:]
        skipped = [-1 if before == "minus1" else nan_block] * (lo // bs)
        tables[b, :m] = torch.tensor(skipped + blocks[lo // bs :], dtype=torch.int32)
        slot = [blocks[p // bs] * bs + p % bs for p in range(n)]
        raw.view(2, -1, hkv, d)[:, slot[lo // bs * bs : lo]] = NAN_BYTE
        ops.write_kv(kc, vc, keys[b][lo:], values[b][lo:], torch.tensor(slot[lo:]),
                     backend="torch", k_scale=ks, v_scale=vs)  # fmt: skip
    kq = [fp8.dequantize(fp8.quantize(k, ks, fmt), ks, torch.float64) for k in keys]
    vq = [fp8.dequantize(fp8.quantize(v, vs, fmt), vs, torch.float64) for v in values]
    return kc, vc, tables, torch.tensor(lens, dtype=torch.int32), kq, vq, ks, vs


#: (block size, window, lengths, KV heads, group, head dim)
DECODE_CASES = [
    (1, 1, [1, 2, 7], 2, 2, 64),
    (3, 2, [1, 2, 3, 10], 2, 3, 40),
    (16, 3, [1, 2, 3, 17, 40], 1, 4, 64),
    (32, 37, [36, 37, 38, 100], 2, 2, 40),
    (8, 1000, [5, 300], 2, 1, 64),
    (5, 37, [90, 41], 3, 2, 64),
]
DECODE_IDS = ("bs1-w1", "bs3-w2-d40", "bs16-w3-mqa", "bs32-w37-d40", "bs8-w1000", "bs5-w37")


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("per_head", [False, True], ids=["tensor", "head"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@pytest.mark.parametrize(("bs", "window", "lens", "hkv", "group", "d"), DECODE_CASES,
                         ids=DECODE_IDS)  # fmt: skip
def test_fp8_cpp_windowed_decode_matches_float64_over_dequantized_kv(
    kv_dtype: torch.dtype,
    per_head: bool,
    q_dtype: torch.dtype,
    bs: int,
    window: int,
    lens: list[int],
    hkv: int,
    group: int,
    d: int,
) -> None:
    before = "minus1" if (bs + window) % 2 else "nan"
    firsts = [max(0, n - window) for n in lens]
    kc, vc, tables, seq_lens, kq, vq, ks, vs = _pool(
        lens, firsts, hkv, d, bs, kv_dtype, per_head, before, seed=bs * 1000 + window
    )
    q = torch.randn(len(lens), hkv * group, d, generator=torch.Generator().manual_seed(5))
    q = q.to(q_dtype)
    out = ops.paged_decode_attention(q, kc, vc, tables, seq_lens, 0.3, backend="torch",
                                     k_scale=ks, v_scale=vs, window=window)  # fmt: skip
    for b in range(len(lens)):
        ref = oracle.decode_attention(q[b].double(), kq[b], vq[b], 0.3, window=window)
        err = oracle.relative_error(out[b], ref)
        assert err <= oracle.tolerance(q_dtype), (b, lens[b], err)
    # the ops ran the C++ kernel (no fallback): the same bits as calling it directly
    dims = check_decode(q, kc, vc, tables, seq_lens, window=window)
    direct = torch.full_like(q, float("nan"))
    cpu_paged.decode_fp8(q, kc, vc, tables, seq_lens, 0.3, direct, dims, (ks, vs),
                         window=window)  # fmt: skip
    assert torch.equal(out, direct)


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
def test_fp8_windowed_decode_with_backend_torch_runs_issue36_item5(kv_dtype: torch.dtype) -> None:
    """Issue 36 item 5: on f4a07b7 this call raised ConfigError advising backend='torch',
    which is what was passed. Both conversions honour the window."""
    kc, vc, tables, seq_lens, kq, vq, ks, vs = _pool(
        [12, 30], [7, 25], 2, 64, 4, kv_dtype, True, "minus1", seed=36
    )
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(36))
    out = ops.paged_decode_attention(q, kc, vc, tables, seq_lens, k_scale=ks, v_scale=vs,
                                     window=5, backend="torch")  # fmt: skip
    scale = oracle.default_scale(64)
    for b in range(2):
        ref = oracle.decode_attention(q[b].double(), kq[b], vq[b], scale, window=5)
        assert oracle.relative_error(out[b], ref) <= oracle.tolerance(torch.float32)
    dims = check_decode(q, kc, vc, tables, seq_lens, window=5)
    table = torch.full_like(q, float("nan"))
    cpu_paged.decode_fp8(q, kc, vc, tables, seq_lens, scale, table, dims, (ks, vs),
                         conversion="table", window=5)  # fmt: skip
    assert torch.equal(out, table)


#: (block size, window, lengths, new tokens, KV heads, group, head dim)
PREFILL_CASES = [
    (1, 1, [9, 4], [9, 2], 2, 2, 64),  # block 1, window 1: each row sees itself
    (3, 2, [10, 1, 7], [10, 1, 3], 2, 3, 40),  # window below a block, an extend
    (16, 3, [40, 17], [6, 17], 1, 4, 64),  # MQA, extend over a cached prefix
    (32, 37, [100, 38], [70, 38], 2, 2, 40),  # window not a multiple of the block
    (8, 1000, [300, 5], [40, 5], 2, 1, 64),  # window longer than every sequence
    (5, 37, [200], [150], 1, 1, 64),  # several tiles: their key walks start apart
]
PREFILL_IDS = ("bs1-w1", "bs3-w2-d40", "bs16-w3-mqa", "bs32-w37-d40", "bs8-w1000", "bs5-tiles")


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("per_head", [False, True], ids=["tensor", "head"])
@pytest.mark.parametrize("q_dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize(("bs", "window", "lens", "q_lens", "hkv", "group", "d"),
                         PREFILL_CASES, ids=PREFILL_IDS)  # fmt: skip
def test_fp8_cpp_windowed_prefill_matches_float64_over_dequantized_kv(
    kv_dtype: torch.dtype,
    per_head: bool,
    q_dtype: torch.dtype,
    bs: int,
    window: int,
    lens: list[int],
    q_lens: list[int],
    hkv: int,
    group: int,
    d: int,
) -> None:
    before = "minus1" if (bs + window) % 2 else "nan"
    firsts = [max(0, n - q - window + 1) for n, q in zip(lens, q_lens, strict=True)]
    kc, vc, tables, seq_lens, kq, vq, ks, vs = _pool(
        lens, firsts, hkv, d, bs, kv_dtype, per_head, before, seed=bs * 100 + window
    )
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(sum(q_lens), hkv * group, d, generator=torch.Generator().manual_seed(2))
    q = q.to(q_dtype)
    out = ops.paged_prefill_attention(q, kc, vc, tables, cu, seq_lens, 0.3, backend="torch",
                                      k_scale=ks, v_scale=vs, window=window)  # fmt: skip
    for b in range(len(lens)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        ref = oracle.extend_attention(q[rows].double(), kq[b], vq[b], 0.3, window=window)
        err = oracle.relative_error(out[rows], ref)
        assert err <= oracle.tolerance(q_dtype), (b, err)
    dims = check_prefill(q, kc, vc, tables, cu, seq_lens, window=window)
    direct = torch.full_like(q, float("nan"))
    cpu_paged.prefill_fp8(q, kc, vc, tables, cu, seq_lens, 0.3, direct, dims, (ks, vs),
                          window=window)  # fmt: skip
    assert torch.equal(out, direct)  # the ops ran the C++ kernel, not a fallback


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize(("window", "chunk"), [(3, 4), (37, 16), (1000, 7)])
def test_fp8_cpp_windowed_chunked_prefill_matches_the_whole_prompt(
    kv_dtype: torch.dtype, window: int, chunk: int
) -> None:
    """A 60-token prompt prefilled `chunk` tokens at a time (each chunk an extend over the
    cached ones, whose pre-window part is gone): every chunk's rows match the float64 oracle
    over the whole prompt."""
    n, bs, hkv, group, d = 60, 8, 2, 2, 64
    q = torch.randn(n, hkv * group, d, generator=torch.Generator().manual_seed(9))
    for start in range(0, n, chunk):
        end = min(n, start + chunk)
        first = max(0, start - window + 1)
        kc, vc, tables, _, kq, vq, ks, vs = _pool(
            [n], [first], hkv, d, bs, kv_dtype, True, "minus1", seed=window
        )
        lens = torch.tensor([end], dtype=torch.int32)
        cu = torch.tensor([0, end - start], dtype=torch.int32)
        out = ops.paged_prefill_attention(q[start:end], kc, vc, tables, cu, lens, 0.2,
                                          backend="torch", k_scale=ks, v_scale=vs,
                                          window=window)  # fmt: skip
        ref = oracle.extend_attention(q[start:end].double(), kq[0][:end], vq[0][:end], 0.2,
                                      window=window)  # fmt: skip
        err = oracle.relative_error(out, ref)
        assert err <= oracle.tolerance(torch.float32), (start, err)


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("d", [64, 128, 40])
def test_fp8_cpp_decode_reads_an_e4m3_nan_byte_as_nan(where: str, d: int) -> None:
    """e4m3 rows take a float16 route only after a scan finds no NaN byte (0x7F / 0xFF) in
    the block's rows: one NaN byte in the K or V rows a decode reads makes that KV head's
    outputs NaN (K: its score; V: its P V), and the other head's stay finite."""
    kc, vc, tables, seq_lens, _, _, ks, vs = _pool(
        [40], [0], 2, d, 16, torch.float8_e4m3fn, True, "nan", seed=d
    )
    pool = (kc if where == "k" else vc).view(torch.uint8)
    pool[int(tables[0, 1]), 5, 1, d // 2] = 0xFF  # position 21, KV head 1
    q = torch.randn(1, 4, d, generator=torch.Generator().manual_seed(1))
    out = ops.paged_decode_attention(q, kc, vc, tables, seq_lens, backend="torch",
                                     k_scale=ks, v_scale=vs)  # fmt: skip
    assert bool(torch.isfinite(out[0, :2]).all())
    assert bool(torch.isnan(out[0, 2:]).all() if where == "k" else torch.isnan(out[0, 2:]).any())


@pytest.mark.parametrize("where", ["k", "v"])
@pytest.mark.parametrize("d", [64, 128, 40])
def test_fp8_cpp_prefill_reads_an_e4m3_nan_byte_as_nan(where: str, d: int) -> None:
    """The prefill packs e4m3 rows through float16 only after a scan of each row finds no
    NaN byte (issue 39): one NaN byte at position 21 of KV head 1 makes that head's rows at
    positions 21 and later NaN and leaves the other head's finite; in K, also that head's
    earlier rows (a masked score is dropped), not in V, where rows in the same 48-key chunk
    multiply it by a zero probability (0 x NaN, as the 16-bit prefill does)."""
    kc, vc, tables, seq_lens, _, _, ks, vs = _pool(
        [40], [0], 2, d, 16, torch.float8_e4m3fn, True, "nan", seed=d
    )
    pool = (kc if where == "k" else vc).view(torch.uint8)
    pool[int(tables[0, 1]), 5, 1, d // 2] = 0xFF  # position 21, KV head 1
    q = torch.randn(40, 4, d, generator=torch.Generator().manual_seed(1))
    cu = torch.tensor([0, 40], dtype=torch.int32)
    out = ops.paged_prefill_attention(q, kc, vc, tables, cu, seq_lens, 0.2, backend="torch",
                                      k_scale=ks, v_scale=vs)  # fmt: skip
    assert bool(torch.isfinite(out[:, :2]).all())
    if where == "k":
        assert bool(torch.isfinite(out[:21, 2:]).all())
    assert bool(torch.isnan(out[21:, 2:]).any(dim=-1).all())
