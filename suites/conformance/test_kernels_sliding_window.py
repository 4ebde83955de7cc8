"""Sliding-window paged decode (`window=` of `kernels.ops.paged_decode_attention`) against
the float64 oracle with the window mask, on every backend and dtype.

Each sequence of L tokens reads positions max(0, L - window) .. L - 1. Every backend is
made to prove that it skips what lies outside the window rather than masking it after
reading: the table entries of blocks wholly before the window are -1 or point at a block
of NaN, and the slots of the first (partial) block before the window hold NaN, so a
backend that reads any of them fails. Shapes: windows below one block, not a multiple of
the block size, a multiple, longer than every sequence, and of one token; block sizes 7,
8, 16 and 32; GQA; head dims 64 and 40; Triton's single and split partitions (partitions
smaller than a block, so some hold no visible token). Backends: "triton" (the interpreter
on CPU, compiled on CUDA), "cpp" (the in-place C++ kernel) and "gather" (torch's gather +
SDPA fallback, called directly).
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.kernels import cpu_paged, ops, torch_ops
from kvbench.kernels import validation as val
from kvbench.kernels.validation import IndexRangeError
from kvbench.reference import oracle
from kvbench.workloads.errors import ConfigError

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("triton", "cpp", "gather")


def _windowed_pool(lens, window, hkv, d, bs, dtype, gen, before="nan", reach=None):  # type: ignore[no-untyped-def]
    """A NaN-filled pool holding each sequence in shuffled blocks; the blocks wholly before
    a sequence's window are replaced in its table by -1 (`before="minus1"`) or by a block
    of NaN (`before="nan"`), and the pre-window slots of its first window block are NaN.
    `reach[b]`: tokens sequence b's window starts earlier (a prefill's first new token
    sits q_len - 1 before the last). Returns the caches, tables, lens and each sequence's
    true K and V (for the oracle)."""
    need = [-(-n // bs) for n in lens]
    nb = sum(need) + 3
    k_cache = torch.full((nb, bs, hkv, d), float("nan"), dtype=dtype)
    v_cache = torch.full_like(k_cache, float("nan"))
    perm = torch.randperm(nb, generator=gen).tolist()
    nan_block = perm.pop()
    tables = torch.full((len(lens), max(need) + 2), -1, dtype=torch.int32)
    keys, values = [], []
    for b, (n, m) in enumerate(zip(lens, need, strict=True)):
        blocks, perm = perm[:m], perm[m:]
        k = torch.randn((n, hkv, d), generator=gen).to(dtype)
        v = torch.randn((n, hkv, d), generator=gen).to(dtype)
        lo = max(0, n - window - (0 if reach is None else reach[b]))
        slots = torch.tensor([blocks[p // bs] * bs + p % bs for p in range(lo, n)])
        k_cache.view(-1, hkv, d)[slots] = k[lo:]
        v_cache.view(-1, hkv, d)[slots] = v[lo:]
        first = lo // bs
        skipped = [-1 if before == "minus1" else nan_block] * first
        tables[b, :m] = torch.tensor(skipped + blocks[first:], dtype=torch.int32)
        keys.append(k)
        values.append(v)
    return k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), keys, values


def _decode(backend, q, kc, vc, tables, lens, window, partition_size=None):  # type: ignore[no-untyped-def]
    out = torch.full_like(q, float("nan"))
    if backend == "triton":
        ops.paged_decode_attention(
            q, kc, vc, tables, lens, out=out, backend="triton", window=window,
            partition_size=partition_size,
        )  # fmt: skip
    elif backend == "cpp":
        status = cpu_paged.status()
        if status.path != "cpp":
            pytest.skip(f"C++ CPU kernel unavailable here: {status.reason}")
        ops.paged_decode_attention(q, kc, vc, tables, lens, out=out, backend="torch", window=window)
    else:
        dims = val.check_decode(q, kc, vc, tables, lens, out, window=window)
        scale = val.check_scale(None, q.shape[-1])
        torch_ops.paged_decode_attention(q, kc, vc, tables, lens, scale, out, dims, window=window)
    return out


def _check(backend, lens, window, bs, dtype, hkv=2, group=2, d=64, before="nan", part=None, seed=0):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    kc, vc, tables, tlens, keys, values = _windowed_pool(
        lens, window, hkv, d, bs, dtype, gen, before
    )
    q = torch.randn((len(lens), hkv * group, d), generator=gen).to(dtype)
    out = _decode(backend, q, kc, vc, tables, tlens, window, part)
    ref = oracle.batched_decode_attention(q, keys, values, window=window)
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dtype), (backend, lens, window, bs, dtype, err)


#: (block size, window, lengths, what the case covers)
CASES = [
    (16, 3, [1, 2, 3, 17, 40, 100], "window smaller than a block"),
    (16, 37, [1, 36, 37, 38, 100, 257], "window not a multiple of the block size"),
    (16, 32, [31, 32, 33, 64, 65, 300], "window a multiple of the block size"),
    (8, 1000, [5, 100, 300], "window longer than every sequence"),
    (16, 1, [1, 2, 50], "window of one token"),
    (7, 20, [6, 7, 8, 27, 90], "odd block size"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("bs", "window", "lens", "what"), CASES, ids=[c[3] for c in CASES])
def test_sliding_window_decode_matches_the_oracle(
    backend: str, dtype: torch.dtype, bs: int, window: int, lens: list[int], what: str
) -> None:
    _check(backend, lens, window, bs, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_skips_released_blocks(backend: str) -> None:
    """Table entries of blocks wholly before the window are -1 (a cache released them):
    not read, not refused."""
    _check(backend, [5, 33, 80, 200], 20, 8, torch.float32, before="minus1")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_gqa_odd_head_dim(backend: str, dtype: torch.dtype) -> None:
    _check(backend, [3, 50, 129], 45, 16, dtype, hkv=1, group=4, d=40)


@pytest.mark.parametrize("part", [16, 32])
def test_sliding_window_triton_split_partitions(part: int) -> None:
    """Split-KV under a window: partitions of 16 or 32 tokens over blocks of 32, so with
    a window of 5 the first partition can hold no visible token (weight 0, no NaN)."""
    _check("triton", [40, 70, 5, 33], 5, 32, torch.float16, part=part)
    _check("triton", [100, 300, 301], 77, 32, torch.float32, part=part)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_sliding_window_decode_cuda(dtype: torch.dtype) -> None:
    """The compiled Triton kernels on CUDA, against the oracle on the CPU."""
    gen = torch.Generator().manual_seed(3)
    lens, window, bs = [1, 37, 600, 4097], 300, 16
    kc, vc, tables, tlens, keys, values = _windowed_pool(lens, window, 2, 128, bs, dtype, gen)
    q = torch.randn((len(lens), 8, 128), generator=gen).to(dtype)
    q_d, kc_d, vc_d, tables_d, lens_d = (t.cuda() for t in (q, kc, vc, tables, tlens))
    out = ops.paged_decode_attention(
        q_d, kc_d, vc_d, tables_d, lens_d, window=window, partition_size=64
    ).cpu()
    ref = oracle.batched_decode_attention(q, keys, values, window=window)
    assert oracle.relative_error(out, ref) <= oracle.tolerance(dtype)


@settings(max_examples=20, deadline=None)
@given(
    backend=st.sampled_from(BACKENDS),
    bs=st.sampled_from([1, 4, 8, 16]),
    window=st.integers(1, 70),
    lens=st.lists(st.integers(1, 120), min_size=1, max_size=4),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_sliding_window_decode_hypothesis(backend, bs, window, lens, dtype, seed) -> None:  # type: ignore[no-untyped-def]
    _check(backend, lens, window, bs, dtype, hkv=1, group=2, d=64, seed=seed)


def test_no_window_is_full_attention() -> None:
    """window=None and a window at least as long as every sequence give the full answer."""
    gen = torch.Generator().manual_seed(1)
    kc, vc, tables, lens, keys, values = _windowed_pool([9, 30], 64, 2, 64, 8, torch.float32, gen)
    q = torch.randn((2, 2, 64), generator=gen)
    full = ops.paged_decode_attention(q, kc, vc, tables, lens, backend="torch")
    wide = ops.paged_decode_attention(q, kc, vc, tables, lens, backend="torch", window=30)
    torch.testing.assert_close(full, wide)
    ref = oracle.batched_decode_attention(q, keys, values)
    assert oracle.relative_error(full, ref) <= oracle.tolerance(torch.float32)


@pytest.mark.parametrize("window", [0, -3, True, 2.5, "8"])
def test_bad_window_is_refused_before_anything_runs(window: object) -> None:
    gen = torch.Generator().manual_seed(2)
    kc, vc, tables, lens, _, _ = _windowed_pool([9], 4, 1, 64, 8, torch.float32, gen)
    q = torch.randn((1, 1, 64), generator=gen)
    out = torch.full_like(q, 7.0)
    with pytest.raises(ConfigError, match="window"):
        ops.paged_decode_attention(q, kc, vc, tables, lens, out=out, window=window)  # type: ignore[arg-type]
    assert bool((out == 7.0).all())


def test_entry_inside_the_window_is_still_checked() -> None:
    """-1 is allowed only before the window: inside it the call is refused by name."""
    gen = torch.Generator().manual_seed(4)
    kc, vc, tables, lens, _, _ = _windowed_pool([40], 10, 1, 64, 8, torch.float32, gen, "minus1")
    q = torch.randn((1, 1, 64), generator=gen)
    ops.paged_decode_attention(q, kc, vc, tables, lens, window=10)  # fine as it is
    tables[0, 4] = -1  # block 4 holds positions 32..39, inside the window 30..39
    with pytest.raises(IndexRangeError, match="-1"):
        ops.paged_decode_attention(q, kc, vc, tables, lens, window=10)


def test_sliding_window_configurations_compile_clean() -> None:
    """The windowed decode variants (float16, head dim 128, split and single partition,
    and the windowed reduction) compile for sm_80 and sm_90 without spills or limits
    exceeded; `kvbench kernels` tables every windowed variant beside its full one."""
    from kvbench.kernels import aot, configs

    cfgs = [
        configs.decode_config(torch.float16, 128, 4, single=False, windowed=True),
        configs.decode_config(torch.float16, 128, 4, single=True, windowed=True),
        configs.reduce_config(torch.float16, 128, windowed=True),
    ]
    assert all(c in configs.all_configs() for c in cfgs)
    records = aot.compile_all(cfgs, workers=2)
    assert len(records) == len(cfgs) * len(aot.ARCHS)
    problems = [
        f"{r.kernel} {r.config} {r.arch}: {r.violations()}" for r in records if r.violations()
    ]
    assert not problems, "\n".join(problems)
