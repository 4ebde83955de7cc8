"""Chunked local attention (Llama 4's `attention_chunk_size`) in the paged kernels, against
the float64 oracle's own chunk mask, on every backend.

The kernels take the kind as their `window` argument (`KVCacheSpec.chunked_local(C)`):
the query at position p reads keys floor(p / C) x C .. p. Every backend must skip what
lies before the first key a launch reads rather than mask it after reading: the table
entries of blocks wholly before it are -1 or a block of NaN, and the earlier slots of its
first block are NaN. Shapes are small (interpreter): chunks below one block, a multiple of
the block size, not a multiple (the kernels take any chunk; caches page whole-block chunks
only), longer than every sequence, of one token; Triton's single and split partitions;
prefill extends that cross a chunk boundary.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import cpu_paged, ops, torch_ops
from kvbench.kernels import validation as val
from kvbench.reference import oracle
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_spec import KVCacheSpec

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("triton", "cpp", "gather")


def _chunk_start(p: int, chunk: int) -> int:
    return p - p % chunk


def _pool(lens, q_lens, chunk, hkv, d, bs, dtype, gen, before):  # type: ignore[no-untyped-def]
    """NaN pool; sequence b holds its tokens from the chunk start of its first new query
    (position L - q) on, in shuffled blocks; blocks wholly before it are -1 or a NaN
    block in its table. Returns caches, tables, lens and each sequence's true K and V."""
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
        lo = _chunk_start(n - q_lens[b], chunk)
        slots = torch.tensor([blocks[p // bs] * bs + p % bs for p in range(lo, n)])
        k_cache.view(-1, hkv, d)[slots] = k[lo:]
        v_cache.view(-1, hkv, d)[slots] = v[lo:]
        first = lo // bs
        skipped = [-1 if before == "minus1" else nan_block] * first
        tables[b, :m] = torch.tensor(skipped + blocks[first:], dtype=torch.int32)
        keys.append(k)
        values.append(v)
    return k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), keys, values


def _need_cpp(backend: str) -> None:
    if backend == "cpp" and cpu_paged.status().path != "cpp":
        pytest.skip(f"C++ CPU kernel unavailable here: {cpu_paged.status().reason}")


def _decode(backend, lens, chunk, bs, dtype, before="nan", part=None, hkv=2, group=2, d=64):  # type: ignore[no-untyped-def]
    _need_cpp(backend)
    gen = torch.Generator().manual_seed(chunk * 1000 + bs)
    kc, vc, tables, tlens, keys, values = _pool(
        lens, [1] * len(lens), chunk, hkv, d, bs, dtype, gen, before
    )
    q = torch.randn((len(lens), hkv * group, d), generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    spec = KVCacheSpec.chunked_local(chunk)
    if backend == "gather":
        dims = val.check_decode(q, kc, vc, tables, tlens, out, window=spec)
        scale = val.check_scale(None, d)
        torch_ops.paged_decode_attention(q, kc, vc, tables, tlens, scale, out, dims, window=spec)
    else:
        name = "triton" if backend == "triton" else "torch"
        ops.paged_decode_attention(
            q, kc, vc, tables, tlens, out=out, backend=name, window=spec, partition_size=part
        )
    ref = oracle.batched_decode_attention(q, keys, values, chunk=chunk)
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dtype), (backend, lens, chunk, bs, dtype, err)


#: (block size, chunk, lengths, what the case covers)
CASES = [
    (8, 16, [1, 8, 16, 17, 33, 70], "chunk of two blocks"),
    (8, 3, [1, 3, 4, 9, 40], "chunk smaller than a block"),
    (8, 12, [11, 12, 13, 25, 50], "chunk not a multiple of the block size"),
    (4, 1000, [5, 30], "chunk longer than every sequence"),
    (4, 1, [1, 2, 9], "chunk of one token"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("bs", "chunk", "lens", "what"), CASES, ids=[c[3] for c in CASES])
def test_chunked_decode_matches_the_oracle(
    backend: str, dtype: torch.dtype, bs: int, chunk: int, lens: list[int], what: str
) -> None:
    _decode(backend, lens, chunk, bs, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_decode_skips_released_blocks_and_splits(backend: str) -> None:
    """-1 entries before the chunk (a cache released them), and Triton's split partitions
    (partition of 4 tokens: some hold nothing the query reads)."""
    _decode(backend, [5, 17, 40, 63], 16, 8, torch.float32, before="minus1", part=4)


def _prefill(backend, lens, q_lens, chunk, bs, dtype, before="nan", hkv=2, group=2, d=64):  # type: ignore[no-untyped-def]
    _need_cpp(backend)
    gen = torch.Generator().manual_seed(chunk * 7 + bs)
    kc, vc, tables, tlens, keys, values = _pool(lens, q_lens, chunk, hkv, d, bs, dtype, gen, before)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((int(cu[-1]), hkv * group, d), generator=gen).to(dtype)
    out = torch.full_like(q, float("nan"))
    spec = KVCacheSpec.chunked_local(chunk)
    if backend == "gather":
        dims = val.check_prefill(q, kc, vc, tables, cu, tlens, out, window=spec)
        scale = val.check_scale(None, d)
        torch_ops.paged_prefill_attention(q, kc, vc, tables, cu, tlens, scale, out, dims,
                                          window=spec)  # fmt: skip
    else:
        name = "triton" if backend == "triton" else "torch"
        ops.paged_prefill_attention(q, kc, vc, tables, cu, tlens, out=out, backend=name,
                                    window=spec)  # fmt: skip
    for b in range(len(q_lens)):
        rows = slice(int(cu[b]), int(cu[b + 1]))
        ref = oracle.extend_attention(q[rows], keys[b], values[b], chunk=chunk)
        err = oracle.relative_error(out[rows], ref)
        assert err <= oracle.tolerance(dtype), (backend, b, lens, q_lens, chunk, bs, err)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_matches_the_oracle(backend: str, dtype: torch.dtype) -> None:
    """Whole prompts, extends inside a chunk and extends across one or more chunk
    boundaries (rows of one launch start different chunks)."""
    _prefill(backend, [7, 20, 37, 40], [7, 5, 20, 3], 8, 4, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_chunked_prefill_odd_chunks_and_released_blocks(backend: str) -> None:
    _prefill(backend, [13, 30, 26], [13, 11, 2], 6, 4, torch.float32, before="minus1")
    _prefill(backend, [9, 12], [9, 4], 1, 4, torch.float32)


def test_the_plan_names_the_kind_and_the_cpp_fp8_kernel_refuses_it() -> None:
    """The launch plan describes the chunk; the C++ fp8 kernel (sliding windows only)
    says why it cannot run it, naming the format, and a direct call refuses it."""
    spec = KVCacheSpec.chunked_local(8)
    q = torch.randn(1, 4, 64)
    kc = torch.zeros(6, 4, 2, 64, dtype=torch.float8_e4m3fn)
    tables = torch.tensor([[0, 1, 2, 3, 4]], dtype=torch.int32)
    lens = torch.tensor([20], dtype=torch.int32)
    dims = val.check_decode(q, kc, kc, tables, lens, None, window=spec)
    from kvbench.kernels import launch_plan

    plan = launch_plan.build("decode", q, kc, dims, window=spec)
    assert "chunked local 8" in plan.describe()
    assert plan.span == 8  # the chunk's two blocks, not the 20 tokens
    reason = cpu_paged.supports(plan)
    if cpu_paged.status().path == "cpp":
        assert reason is not None and "e4m3" in reason and "chunked local" in reason
    with pytest.raises(ConfigError, match="sliding windows only"):
        cpu_paged._fp8_window(spec)


@pytest.mark.parametrize("bad", [0, -8, 2.5, True, "8"])
def test_a_bad_chunk_is_refused_by_name(bad: object) -> None:
    with pytest.raises(ConfigError, match="chunk"):
        KVCacheSpec.chunked_local(bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="window"):
        q = torch.randn(1, 4, 64)
        kc = torch.randn(2, 4, 2, 64)
        ops.paged_decode_attention(
            q, kc, kc, torch.tensor([[0]], dtype=torch.int32), torch.tensor([2], dtype=torch.int32),
            window=KVCacheSpec.cross_attention(4),
        )  # fmt: skip
