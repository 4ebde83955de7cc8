"""fp8 K/V in the kernel ops: quantizing write, bit-exact copy and swap, dequantizing decode.

Oracles: the write is compared bit for bit with `workloads.fp8.quantize` (itself checked
against a bit-pattern float64 oracle in test_fp8_semantics.py) and across backends; the
decode with float64 attention over the float64-dequantized K/V (the kernel's exact
semantics, within the query dtype's tolerance: the kernels round dequantized K/V to the
query dtype) and, for the accuracy cost, with float64 attention over the unquantized K/V
(bounded loosely, see `COST_BOUND`). Pools are filled with random bytes (NaN patterns
included) where nothing is written, so a stray read fails. Triton runs under the
interpreter at small shapes.
"""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.kernels import cpu_paged, ops, torch_ops
from kvbench.kernels.validation import check_decode
from kvbench.reference import oracle
from kvbench.suites.conformance.fp8_launch import Fp8Launch
from kvbench.workloads import fp8
from kvbench.workloads.errors import ConfigError, ShapeError

BACKENDS = ("torch", "triton")
#: Decode paths: the ops' torch backend (on a CPU the C++ kernel `cpu_ext/paged_attn_fp8.cpp`
#: where it builds), the gather + SDPA torch version called directly, and Triton.
DECODE_PATHS = ("torch", "gather", "triton")
FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
FP8_IDS = ("e4m3", "e5m2")
#: Loose bound on the accuracy cost, ||out(fp8 K/V) - out(exact K/V)|| / ||out(exact)||,
#: for unit-normal K/V with per-head amax scales: e4m3 rounds each element by at most
#: 2^-4 relative, e5m2 by 2^-3; attention averages, so the output error sits well below.
COST_BOUND = {torch.float8_e4m3fn: 0.06, torch.float8_e5m2: 0.12}


def _junk_pool(shape: tuple[int, ...], dtype: torch.dtype, gen: torch.Generator) -> torch.Tensor:
    """An fp8 pool of random bytes (every pattern, NaN and inf included)."""
    raw = torch.randint(0, 256, shape, generator=gen, dtype=torch.int32).to(torch.uint8)
    return raw.view(dtype)


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


def _scales(heads: int, per_head: bool, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    base = torch.rand(2, heads, generator=gen) * 0.02 + 0.005
    if not per_head:
        base = base[:, :1].expand(2, heads)
    return base[0].contiguous(), base[1].contiguous()


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("in_dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fp8_write_quantizes_bit_exactly_on_both_backends(
    kv_dtype: torch.dtype, in_dtype: torch.dtype
) -> None:
    gen = torch.Generator().manual_seed(7)
    nb, bs, h, d = 5, 16, 3, 40
    n = 50
    key = (torch.randn(n, h, d, generator=gen) * 4).to(in_dtype)
    value = (torch.randn(n, h, d, generator=gen) / 8).to(in_dtype)
    key[0, 0, :4] = torch.tensor([6e4, -6e4, 1e-7, -1e-7]).to(in_dtype)  # saturate, subnormal
    slots = torch.randperm(nb * bs, generator=gen)[:n]
    slots[3] = -1  # padding: skipped
    ks, vs = _scales(h, True, gen)
    pools = {}
    for backend in BACKENDS:
        kc = _junk_pool((nb, bs, h, d), kv_dtype, torch.Generator().manual_seed(1))
        vc = _junk_pool((nb, bs, h, d), kv_dtype, torch.Generator().manual_seed(2))
        ops.write_kv(kc, vc, key, value, slots, backend=backend, k_scale=ks, v_scale=vs)
        pools[backend] = (kc, vc)
    fmt = fp8.fp8_format(kv_dtype)
    keep = slots >= 0
    for cache, src, scale in ((0, key, ks), (1, value, vs)):
        want = _bytes(fp8.quantize(src[keep], scale, fmt))
        untouched = _junk_pool((nb, bs, h, d), kv_dtype, torch.Generator().manual_seed(cache + 1))
        untouched = _bytes(untouched).reshape(-1, h, d).clone()
        untouched[slots[keep]] = want
        for backend in BACKENDS:
            got = _bytes(pools[backend][cache]).reshape(-1, h, d)
            assert torch.equal(got, untouched), f"{backend} cache {cache}"
    # saturation: the huge key is +-max * scale after dequantization
    row = int(slots[0])
    back = fp8.dequantize(pools["triton"][0].reshape(-1, h, d)[row], ks, torch.float64)
    assert back[0, 0] == pytest.approx(fmt.max * float(ks[0]), rel=1e-6)
    assert back[0, 1] == pytest.approx(-fmt.max * float(ks[0]), rel=1e-6)


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_triton_and_torch_write_every_value_exactly(
    kv_dtype: torch.dtype, backend: str
) -> None:
    """Every finite fp8 value times a power-of-two scale is written as its own bits."""
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8)
    vals = bits.view(kv_dtype).to(torch.float32)
    ok = torch.isfinite(vals)
    x = (vals[ok] * 0.25).reshape(-1, 1, 1).expand(-1, 1, 16).contiguous()
    n = x.shape[0]
    kc = torch.zeros(n, 1, 1, 16, dtype=kv_dtype)
    vc = torch.zeros_like(kc)
    s = torch.tensor([0.25])
    ops.write_kv(kc, vc, x, x, torch.arange(n), backend=backend, k_scale=s, v_scale=s)
    assert torch.equal(_bytes(kc)[:, 0, 0, 0], bits[ok])
    assert torch.equal(_bytes(vc)[:, 0, 0, 15], bits[ok])


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_fp8_write_refuses_non_finite_or_stores_nan_unchecked(
    kv_dtype: torch.dtype, backend: str, bad: float
) -> None:
    kc = torch.zeros(2, 4, 1, 8, dtype=kv_dtype)
    vc = torch.zeros_like(kc)
    key = torch.ones(3, 1, 8, dtype=torch.float16)
    key[2, 0, 5] = bad
    s = torch.ones(1)
    slots = torch.tensor([0, 1, 2])
    with pytest.raises(fp8.NonFiniteError, match=rf"key holds {bad} at index \(2, 0, 5\)"):
        ops.write_kv(kc, vc, key, key.abs(), slots, backend=backend, k_scale=s, v_scale=s)
    assert not _bytes(kc).any() and not _bytes(vc).any()  # nothing written
    ops.write_kv(
        kc, vc, key, key, slots, backend=backend, k_scale=s, v_scale=s, check_indices=False
    )
    assert int(_bytes(kc)[0, 2, 0, 5]) == fp8.NAN_BITS  # stored as NaN, never finite
    assert torch.isnan(kc.to(torch.float32)[0, 2, 0, 5])


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_fp8_copy_and_swap_blocks_are_bit_exact(kv_dtype: torch.dtype, backend: str) -> None:
    gen = torch.Generator().manual_seed(3)
    shape = (6, 4, 2, 16)
    kc, vc = _junk_pool(shape, kv_dtype, gen), _junk_pool(shape, kv_dtype, gen)
    k0, v0 = _bytes(kc).clone(), _bytes(vc).clone()
    ops.copy_blocks(kc, vc, [(0, 3), (2, 5)], backend=backend)
    want_k, want_v = k0.clone(), v0.clone()
    want_k[[3, 5]] = k0[[0, 2]]
    want_v[[3, 5]] = v0[[0, 2]]
    assert torch.equal(_bytes(kc), want_k) and torch.equal(_bytes(vc), want_v)
    cpu_pool = torch.zeros((3, *shape[1:]), dtype=kv_dtype)
    ops.swap_blocks(kc, cpu_pool, [(1, 2), (4, 0)], backend=backend)
    assert torch.equal(_bytes(cpu_pool)[[2, 0]], want_k[[1, 4]])
    assert not _bytes(cpu_pool)[1].any()


def _fp8_batch(
    lens: list[int], h: int, d: int, bs: int, kv_dtype: torch.dtype, per_head: bool, seed: int
):
    """Unit-normal K/V per sequence written through `ops.write_kv` (torch) into shuffled
    blocks of a junk pool, with amax scales (the dynamic rule) per head or per tensor."""
    gen = torch.Generator().manual_seed(seed)
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 2
    kc = _junk_pool((nb, bs, h, d), kv_dtype, gen)
    vc = _junk_pool((nb, bs, h, d), kv_dtype, gen)
    keys = [torch.randn(n, h, d, generator=gen) for n in lens]
    values = [torch.randn(n, h, d, generator=gen) for n in lens]
    fmt = fp8.fp8_format(kv_dtype)
    gran = "head" if per_head else "tensor"
    ks = fp8.dynamic_scale(torch.cat(keys), fmt, gran)
    vs = fp8.dynamic_scale(torch.cat(values), fmt, gran)
    perm = torch.randperm(nb, generator=gen).tolist()
    tables = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    for b, (n, k) in enumerate(zip(lens, need, strict=True)):
        blocks, perm = perm[:k], perm[k:]
        tables[b, :k] = torch.tensor(blocks, dtype=torch.int32)
        slots = (torch.tensor(blocks).repeat_interleave(bs) * bs + torch.arange(bs).repeat(k))[:n]
        ops.write_kv(kc, vc, keys[b], values[b], slots, backend="torch", k_scale=ks, v_scale=vs)
    return kc, vc, tables, torch.tensor(lens, dtype=torch.int32), keys, values, ks, vs


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("q_dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("backend", DECODE_PATHS)
@pytest.mark.parametrize(
    ("lens", "hq", "h", "per_head", "partition"),
    [
        ([37, 5], 4, 2, True, None),  # GQA group 2, one partition
        ([70, 33, 1], 4, 1, False, 16),  # MQA, split-KV partitions + reduce
    ],
)
def test_fp8_decode_matches_float64_over_dequantized_kv(
    kv_dtype: torch.dtype,
    q_dtype: torch.dtype,
    backend: str,
    lens: list[int],
    hq: int,
    h: int,
    per_head: bool,
    partition: int | None,
) -> None:
    d, bs = 48, 16
    kc, vc, tables, seq_lens, keys, values, ks, vs = _fp8_batch(
        lens, h, d, bs, kv_dtype, per_head, seed=len(lens) * 11
    )
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(len(lens), hq, d, generator=gen).to(q_dtype)
    out = torch.full_like(q, float("nan"))
    if backend == "gather":
        dims = check_decode(q, kc, vc, tables, seq_lens)
        scale = 1.0 / math.sqrt(d)
        torch_ops.paged_decode_attention(
            q, kc, vc, tables, seq_lens, scale, out, dims, kv_scales=(ks, vs)
        )
    else:
        ops.paged_decode_attention(
            q,
            kc,
            vc,
            tables,
            seq_lens,
            out=out,
            backend=backend,
            partition_size=partition,
            k_scale=ks,
            v_scale=vs,
        )
    fmt = fp8.fp8_format(kv_dtype)
    for b in range(len(lens)):
        kq = fp8.dequantize(fp8.quantize(keys[b], ks, fmt), ks, torch.float64)
        vq = fp8.dequantize(fp8.quantize(values[b], vs, fmt), vs, torch.float64)
        ref = oracle.decode_attention(q[b].double(), kq, vq)
        err = oracle.relative_error(out[b], ref)
        assert err <= oracle.tolerance(q_dtype), (b, err)
        exact = oracle.decode_attention(q[b].double(), keys[b].double(), values[b].double())
        assert oracle.relative_error(out[b], exact) <= COST_BOUND[kv_dtype] + oracle.tolerance(
            q_dtype
        )


def test_fp8_scale_arguments_are_checked() -> None:
    kc = torch.zeros(2, 4, 2, 8, dtype=torch.float8_e4m3fn)
    q = torch.randn(1, 2, 8, dtype=torch.float16)
    tables = torch.tensor([[0]], dtype=torch.int32)
    lens = torch.tensor([3], dtype=torch.int32)
    s = torch.ones(2)
    with pytest.raises(ConfigError, match="needs k_scale and v_scale"):
        ops.paged_decode_attention(q, kc, kc, tables, lens)
    with pytest.raises(ShapeError, match=r"k_scale must be float32 \[2\]"):
        ops.paged_decode_attention(q, kc, kc, tables, lens, k_scale=torch.ones(3), v_scale=s)
    with pytest.raises(ConfigError, match=r"v_scale\[1\] = 0.0 must be finite and > 0"):
        ops.paged_decode_attention(
            q, kc, kc, tables, lens, k_scale=s, v_scale=torch.tensor([1.0, 0.0])
        )
    half = torch.zeros(2, 4, 2, 8, dtype=torch.float16)
    with pytest.raises(ConfigError, match="is not fp8"):
        ops.paged_decode_attention(q, half, half, tables, lens, k_scale=s, v_scale=s)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    q32 = q.float()
    with pytest.raises(ConfigError, match="decode reads fp8 K/V with"):
        ops.paged_decode_attention(
            q32, kc, kc, tables, lens, backend="triton", k_scale=s, v_scale=s
        )
    out = torch.full_like(q32, 7.0)
    with pytest.raises(ConfigError, match="prefill reads fp8 K/V with"):
        ops.paged_prefill_attention(
            q32, kc, kc, tables, cu, lens, out=out, backend="triton", k_scale=s, v_scale=s
        )
    assert bool((out == 7.0).all())


def test_fp8_cpu_decode_runs_the_cpp_kernel() -> None:
    """On a CPU where the C++ kernel builds, fp8 decode goes through it (so the "torch"
    decode cases above test `paged_attn_fp8.cpp`), with float32 queries too."""
    if cpu_paged.status().path != "cpp":
        pytest.skip(f"C++ kernel not built here: {cpu_paged.status().reason}")
    kc, vc, tables, seq_lens, keys, values, ks, vs = _fp8_batch(
        [40, 3], 2, 64, 16, torch.float8_e5m2, True, seed=9
    )
    q = torch.randn(2, 4, 64, generator=torch.Generator().manual_seed(1))
    dims = check_decode(q, kc, vc, tables, seq_lens)
    out = torch.full_like(q, float("nan"))
    cpu_paged.decode_fp8(q, kc, vc, tables, seq_lens, 0.125, out, dims, (ks, vs))
    fmt = fp8.fp8_format(torch.float8_e5m2)
    for b in range(2):
        kq = fp8.dequantize(fp8.quantize(keys[b], ks, fmt), ks, torch.float64)
        vq = fp8.dequantize(fp8.quantize(values[b], vs, fmt), vs, torch.float64)
        ref = oracle.decode_attention(q[b].double(), kq, vq, 0.125)
        assert oracle.relative_error(out[b], ref) <= oracle.tolerance(torch.float32)


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
def test_fp8_prefill_torch_matches_float64_over_dequantized_kv(kv_dtype: torch.dtype) -> None:
    """fp8 prefill (torch: gather, dequantize, SDPA) against the float64 extend oracle."""
    lens, d = [19, 6], 32
    kc, vc, tables, seq_lens, keys, values, ks, vs = _fp8_batch(
        lens, 2, d, 8, kv_dtype, True, seed=4
    )
    q_lens = [5, 6]
    cu = torch.tensor([0, 5, 11], dtype=torch.int32)
    q = torch.randn(11, 4, d, generator=torch.Generator().manual_seed(2)).to(torch.float16)
    out = ops.paged_prefill_attention(
        q, kc, vc, tables, cu, seq_lens, backend="torch", k_scale=ks, v_scale=vs
    )
    fmt = fp8.fp8_format(kv_dtype)
    for b, n in enumerate(q_lens):
        kq = fp8.dequantize(fp8.quantize(keys[b], ks, fmt), ks, torch.float64)
        vq = fp8.dequantize(fp8.quantize(values[b], vs, fmt), vs, torch.float64)
        rows = slice(int(cu[b]), int(cu[b]) + n)
        ref = oracle.extend_attention(q[rows].double(), kq, vq)
        assert oracle.relative_error(out[rows], ref) <= oracle.tolerance(torch.float16)


def test_fp8_launches_are_in_the_aot_table_with_the_compiled_signature(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Every Triton launch the fp8 ops make (recorded, not run) names a configuration
    `configs.all_configs()` compiles, with tensors of the signature's pointer types and
    integers that fit its i32 (as test_kernels_dispatch does for the 16/32-bit grid; the
    committed gate baselines do not hold the fp8 variants yet)."""
    from kvbench.kernels import aot, configs, triton_ops
    from kvbench.kernels.triton_kernels import JIT

    calls: list = []
    monkeypatch.setattr(triton_ops, "_launch", lambda cfg, grid, dev, *a: calls.append((cfg, a)))
    for kv in FP8:
        for q_dtype in (torch.float16, torch.bfloat16):
            for d, group in ((64, 1), (128, 4), (96, 8), (256, 16)):
                hkv, bs, ctx, b = 2, 16, 1300, 2
                nb = b * -(-ctx // bs)
                kc = torch.zeros(nb, bs, hkv, d, dtype=kv)
                s = torch.ones(hkv)
                kw: Fp8Launch = {
                    "backend": "triton",
                    "check_indices": False,
                    "k_scale": s,
                    "v_scale": s,
                }
                x = torch.zeros(5, hkv, d, dtype=q_dtype)
                ops.write_kv(kc, kc.clone(), x, x, torch.arange(5), **kw)
                tables = torch.zeros(b, nb // b, dtype=torch.int32)
                lens = torch.full((b,), ctx, dtype=torch.int32)
                q = torch.zeros(b, hkv * group, d, dtype=q_dtype)
                for part in (None, 256):  # one partition, split + reduce
                    ops.paged_decode_attention(
                        q, kc, kc, tables, lens, max_seq_len=ctx, partition_size=part, **kw
                    )
                cu = torch.zeros(b + 1, dtype=torch.int32)
                for q_len, window in ((3, None), (40, None), (300, None), (300, 100)):
                    qp = torch.zeros(b * q_len, hkv * group, d, dtype=q_dtype)
                    ops.paged_prefill_attention(
                        qp, kc, kc, tables, cu, lens, max_seq_len=ctx, max_q_len=q_len,
                        window=window, **kw,
                    )  # fmt: skip
        pool = torch.zeros(6, 16, 2, 64, dtype=kv)
        ops.copy_blocks(pool, pool.clone(), [(0, 1)], backend="triton")
        ops.swap_blocks(pool, pool.clone(), [(0, 1)], backend="triton")
    table = {(c.kernel, aot.config_json(c.describe())) for c in configs.all_configs()}
    kernels = set()
    for cfg, args in calls:
        kernels.add(cfg.kernel)
        assert (cfg.kernel, aot.config_json(cfg.describe())) in table, cfg.describe()
        sig, _ = aot.signature(cfg)
        runtime = [n for n in JIT[cfg.kernel].arg_names if sig[n] != "constexpr"]
        assert len(args) == len(runtime), (cfg.kernel, len(args), len(runtime))
        for name, value in zip(runtime, args, strict=True):
            kind = sig[name]
            if kind.startswith("*"):
                got = configs.TRITON_DTYPE_NAMES[value.dtype]
                assert got == kind[1:], f"{cfg.kernel}.{name}: {got} passed, {kind} compiled"
            elif kind == "i32":
                assert isinstance(value, int) and -(2**31) <= value < 2**31, (cfg.kernel, name)
            else:
                assert kind == "fp32" and isinstance(value, float), (cfg.kernel, name, kind)
    assert kernels == {
        "quantize_rows",
        "paged_decode",
        "paged_decode_reduce",
        "copy_rows",
        "paged_prefill",
    }


@pytest.mark.parametrize("kv_dtype", FP8, ids=FP8_IDS)
@pytest.mark.parametrize("backend", ["triton", "gather", "cpp"])
@pytest.mark.parametrize("partition", [None, 8])
def test_fp8_windowed_decode_matches_float64_over_dequantized_window(
    kv_dtype: torch.dtype, backend: str, partition: int | None
) -> None:
    """fp8 K/V with a sliding window: dequantized in the kernel and only the window read.
    The table entries of blocks wholly before each window are -1 (released), so a path
    that read them would fail the index check or the oracle; the oracle is float64
    attention over the dequantized K/V with the window mask. "cpp": the ops' torch backend,
    on a CPU the C++ fp8 decode (f4a07b7 refused a window there with a ConfigError)."""
    if backend == "cpp" and cpu_paged.status().path != "cpp":
        pytest.skip(f"C++ CPU kernel unavailable here: {cpu_paged.status().reason}")
    d, bs, window, lens = 48, 8, 13, [5, 13, 14, 30, 61]
    kc, vc, tables, seq_lens, keys, values, ks, vs = _fp8_batch(
        lens, 2, d, bs, kv_dtype, True, seed=3
    )
    for b, n in enumerate(lens):
        tables[b, : max(0, n - window) // bs] = -1
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(len(lens), 4, d, generator=gen).to(torch.float16)
    out = torch.full_like(q, float("nan"))
    if backend == "gather":
        dims = check_decode(q, kc, vc, tables, seq_lens, window=window)
        scale = 1.0 / math.sqrt(d)
        torch_ops.paged_decode_attention(
            q, kc, vc, tables, seq_lens, scale, out, dims, (ks, vs), window=window
        )
    else:
        ops.paged_decode_attention(
            q, kc, vc, tables, seq_lens, out=out, partition_size=partition,
            backend="triton" if backend == "triton" else "torch",
            k_scale=ks, v_scale=vs, window=window,
        )  # fmt: skip
    fmt = fp8.fp8_format(kv_dtype)
    kq = [fp8.dequantize(fp8.quantize(k, ks, fmt), ks, torch.float64) for k in keys]
    vq = [fp8.dequantize(fp8.quantize(v, vs, fmt), vs, torch.float64) for v in values]
    ref = oracle.batched_decode_attention(q.double(), kq, vq, window=window)
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(torch.float16), (backend, err)
