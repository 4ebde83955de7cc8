"""KV write, block copy and block swap, both versions, plus the shared input checks.

The data ops are exact (pure copies), so they are compared element for element with a
plain-indexing model of what they should do. The checks must reject bad input with an
error naming the bad value and leave every tensor untouched.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvbench.kernels import ops
from kvbench.kernels.validation import IndexRangeError
from kvbench.workloads.errors import ConfigError, ShapeError

BACKENDS = ("torch", "triton")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _pool(
    num_blocks: int,
    block_size: int,
    hkv: int,
    d: int,
    dtype: torch.dtype,
    seed: int,
    device: torch.device | str = "cpu",
):
    gen = torch.Generator().manual_seed(seed)
    shape = (num_blocks, block_size, hkv, d)
    return (
        torch.randn(shape, generator=gen).to(device, dtype),
        torch.randn(shape, generator=gen).to(device, dtype),
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=str)
def test_write_kv(
    backend: str, dtype: torch.dtype, slot_dtype: torch.dtype, device: torch.device
) -> None:
    """Rows land at their slots, -1 rows are skipped, everything else is untouched; the
    key/value may be strided slices of a fused QKV tensor."""
    k_cache, v_cache = _pool(6, 8, 2, 24, dtype, 0, device)
    k0, v0 = k_cache.clone(), v_cache.clone()
    qkv = torch.randn(7, 4 + 2 + 2, 24).to(device, dtype)  # fused [q(4 heads), k(2), v(2)]
    key, value = qkv[:, 4:6], qkv[:, 6:8]
    slots = torch.tensor([5, -1, 47, 0, 8, -1, 23], dtype=slot_dtype, device=device)
    ops.write_kv(k_cache, v_cache, key, value, slots, backend=backend)
    keep = slots >= 0
    for cache, before, src in ((k_cache, k0, key), (v_cache, v0, value)):
        expect = before.view(-1, 2, 24).clone()
        expect[slots[keep].long()] = src[keep]
        assert torch.equal(cache.view(-1, 2, 24), expect)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_copy_blocks(backend: str, dtype: torch.dtype, device: torch.device) -> None:
    k_cache, v_cache = _pool(8, 4, 2, 16, dtype, 1, device)
    k0, v0 = k_cache.clone(), v_cache.clone()
    pairs = [(1, 6), (3, 0), (1, 2)]
    ops.copy_blocks(k_cache, v_cache, pairs, backend=backend)
    for cache, before in ((k_cache, k0), (v_cache, v0)):
        expect = before.clone()
        for s, d in pairs:
            expect[d] = before[s]
        assert torch.equal(cache, expect)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_swap_blocks_out_and_in(backend: str, dtype: torch.dtype, device: torch.device) -> None:
    """Swap out to a smaller host pool and back into other blocks: the data round-trips
    (on CUDA: across the host link, into and out of a pinned pool)."""
    gpu_pool, _ = _pool(8, 4, 2, 16, dtype, 2, device)
    cpu_pool, _ = _pool(3, 4, 2, 16, dtype, 3)
    if device.type == "cuda":
        cpu_pool = cpu_pool.pin_memory()
    original = gpu_pool.clone()
    out_map = torch.tensor([[5, 0], [2, 2]])
    ops.swap_blocks(gpu_pool, cpu_pool, out_map, backend=backend)
    original_host = original.cpu()
    assert torch.equal(cpu_pool[0], original_host[5])
    assert torch.equal(cpu_pool[2], original_host[2])
    ops.swap_blocks(cpu_pool, gpu_pool, [(0, 7), (2, 1)], backend=backend)
    assert torch.equal(gpu_pool[7], original[5]) and torch.equal(gpu_pool[1], original[2])
    untouched = [0, 2, 3, 4, 5, 6]
    assert torch.equal(gpu_pool[untouched], original[untouched])


@pytest.mark.gpu
@pytest.mark.parametrize("backend", BACKENDS)
def test_swap_blocks_across_devices(backend: str) -> None:
    gpu_pool = torch.randn(4, 4, 2, 16, device="cuda")
    cpu_pool = torch.zeros(4, 4, 2, 16)
    ops.swap_blocks(gpu_pool, cpu_pool, [(3, 1)], backend=backend)
    assert torch.equal(cpu_pool[1], gpu_pool[3].cpu())


@given(
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
    block_size=st.sampled_from([1, 8, 16]),
    hkv=st.integers(1, 3),
    d=st.sampled_from([8, 16, 80]),
)
def test_write_then_copy_hypothesis(
    data: st.DataObject, dtype: torch.dtype, block_size: int, hkv: int, d: int
) -> None:
    """Random writes followed by random copies: both versions give the same pools as
    plain indexing."""
    num_blocks = data.draw(st.integers(2, 6), label="num_blocks")
    cap = num_blocks * block_size
    n = data.draw(st.integers(0, min(cap, 24)), label="num_tokens")
    slots = data.draw(st.permutations(range(cap)), label="perm")[:n]
    slots = [s if data.draw(st.booleans(), label="keep") else -1 for s in slots]
    blocks = data.draw(st.permutations(range(num_blocks)), label="blocks")
    k = data.draw(st.integers(0, num_blocks // 2), label="n_pairs")
    pairs = list(zip(blocks[:k], blocks[k : 2 * k], strict=True))
    key = torch.randn(n, hkv, d).to(dtype)
    value = torch.randn(n, hkv, d).to(dtype)
    slot_t = torch.tensor(slots, dtype=torch.int64)
    results = []
    for backend in BACKENDS:
        k_cache, v_cache = _pool(num_blocks, block_size, hkv, d, dtype, 9)
        ops.write_kv(k_cache, v_cache, key, value, slot_t, backend=backend)
        ops.copy_blocks(k_cache, v_cache, pairs, backend=backend)
        results.append((k_cache, v_cache))
    k_exp, v_exp = _pool(num_blocks, block_size, hkv, d, dtype, 9)
    keep = slot_t >= 0
    k_exp.view(-1, hkv, d)[slot_t[keep]] = key[keep]
    v_exp.view(-1, hkv, d)[slot_t[keep]] = value[keep]
    for s, t in pairs:
        k_exp[t], v_exp[t] = k_exp[s].clone(), v_exp[s].clone()
    for k_cache, v_cache in results:
        assert torch.equal(k_cache, k_exp) and torch.equal(v_cache, v_exp)


# ---------------------------------------------------------------- input checks


def _decode_args(**over):
    k_cache, v_cache = _pool(4, 8, 2, 16, torch.float32, 4)
    args = {
        "query": torch.randn(2, 4, 16),
        "k_cache": k_cache,
        "v_cache": v_cache,
        "block_tables": torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
        "seq_lens": torch.tensor([9, 8], dtype=torch.int32),
    }
    args.update(over)
    return args


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("over", "error", "names"),
    [
        ({"query": torch.randn(2, 3, 16)}, ShapeError, "num_q_heads=3"),
        ({"query": torch.randn(2, 4, 8)}, ShapeError, "head_dim 8"),
        ({"query": torch.randn(2, 4, 16, dtype=torch.float64)}, ShapeError, "float64"),
        ({"query": torch.randn(3, 4, 16)}, ShapeError, "batch 3"),
        ({"seq_lens": torch.tensor([9, 17], dtype=torch.int32)}, IndexRangeError, "17"),
        ({"seq_lens": torch.tensor([0, 8], dtype=torch.int32)}, IndexRangeError, "holds 0"),
        ({"seq_lens": torch.tensor([9.0, 8.0])}, ShapeError, "seq_lens has dtype"),
        (
            {"block_tables": torch.tensor([[0, 4], [2, -1]], dtype=torch.int32)},
            IndexRangeError,
            "block 4",
        ),
        (
            {"block_tables": torch.tensor([[0, 1], [-1, 2]], dtype=torch.int32)},
            IndexRangeError,
            "block -1",
        ),
        ({"k_cache": torch.randn(4, 8, 16, 2).transpose(2, 3)}, ShapeError, "contiguous"),
        ({"v_cache": torch.randn(4, 8, 2, 16, dtype=torch.float16)}, ShapeError, "float16"),
        ({"scale": float("nan")}, ConfigError, "nan"),
        ({"scale": -1.0}, ConfigError, "-1.0"),
    ],
)
def test_decode_rejects(backend: str, over: dict, error: type, names: str) -> None:
    with pytest.raises(error, match=names):
        ops.paged_decode_attention(**_decode_args(**over), backend=backend)


def test_unknown_backend_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="'cuda'"):
        ops.paged_decode_attention(**_decode_args(), backend="cuda")


def test_prefill_rejects_bad_cu_seqlens() -> None:
    args = _decode_args()
    q = torch.randn(5, 4, 16)
    common = (q, args["k_cache"], args["v_cache"], args["block_tables"])
    with pytest.raises(IndexRangeError, match="12 query tokens"):
        ops.paged_prefill_attention(
            *common, torch.tensor([0, 12, 5], dtype=torch.int32), args["seq_lens"]
        )
    with pytest.raises(IndexRangeError, match="total_q=5"):
        ops.paged_prefill_attention(
            *common, torch.tensor([0, 2, 4], dtype=torch.int32), args["seq_lens"]
        )
    with pytest.raises(ShapeError, match="batch \\+ 1 = 3"):
        ops.paged_prefill_attention(
            *common, torch.tensor([0, 5], dtype=torch.int32), args["seq_lens"]
        )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("slots", "names"),
    [([0, 32], "slot 32"), ([-2, 3], "slot -2"), ([4, 4], "slot 4 more than once")],
)
def test_write_kv_rejects_without_writing(backend: str, slots: list[int], names: str) -> None:
    k_cache, v_cache = _pool(4, 8, 2, 16, torch.float16, 5)
    k0, v0 = k_cache.clone(), v_cache.clone()
    key = torch.randn(2, 2, 16).half()
    with pytest.raises(IndexRangeError, match=names):
        ops.write_kv(k_cache, v_cache, key, key.clone(), torch.tensor(slots), backend=backend)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


def test_write_kv_rejects_shapes() -> None:
    k_cache, v_cache = _pool(4, 8, 2, 16, torch.float32, 6)
    slots = torch.tensor([0, 1])
    with pytest.raises(ShapeError, match=r"\[num_tokens, 2, 16\]"):
        ops.write_kv(k_cache, v_cache, torch.randn(2, 3, 16), torch.randn(2, 3, 16), slots)
    with pytest.raises(ShapeError, match="cache dtype"):
        key = torch.randn(2, 2, 16).half()
        ops.write_kv(k_cache, v_cache, key, key, slots)
    with pytest.raises(ShapeError, match="strides"):
        key = torch.randn(2, 16, 2).transpose(1, 2)
        ops.write_kv(k_cache, v_cache, key, key, slots)
    with pytest.raises(ShapeError, match="3 entries for 2 tokens"):
        key = torch.randn(2, 2, 16)
        ops.write_kv(k_cache, v_cache, key, key, torch.tensor([0, 1, 2]))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("pairs", "names"),
    [
        ([(0, 9)], "block 9"),
        ([(0, 2), (1, 2)], "block 2 more than once"),
        ([(0, 1), (1, 2)], "block 1 is both"),
    ],
)
def test_copy_blocks_rejects_without_copying(backend: str, pairs: list, names: str) -> None:
    k_cache, v_cache = _pool(4, 8, 2, 16, torch.float32, 7)
    k0, v0 = k_cache.clone(), v_cache.clone()
    with pytest.raises(IndexRangeError, match=names):
        ops.copy_blocks(k_cache, v_cache, pairs, backend=backend)
    assert torch.equal(k_cache, k0) and torch.equal(v_cache, v0)


def test_swap_blocks_rejects() -> None:
    src, _ = _pool(4, 8, 2, 16, torch.float32, 8)
    dst = torch.zeros(2, 8, 2, 16)
    with pytest.raises(IndexRangeError, match="dst has 2 blocks"):
        ops.swap_blocks(src, dst, [(0, 2)])
    with pytest.raises(ShapeError, match="same block shape"):
        ops.swap_blocks(src, torch.zeros(2, 4, 2, 16), [(0, 0)])
    assert (dst == 0).all()


def test_dispatch_follows_device_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """CUDA -> Triton; CPU -> the interpreter only when TRITON_INTERPRET=1 (read at call
    time); a forced backend wins."""
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert ops.choose_backend(cpu) == "torch"
    assert ops.choose_backend(cuda) == "triton"
    assert ops.choose_backend(cuda, "torch") == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert ops.choose_backend(cpu) == "triton"
    assert ops.choose_backend(cpu, "torch") == "torch"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert ops.choose_backend(cpu) == "torch"


@pytest.mark.parametrize("backend", BACKENDS)
def test_caller_maxima_are_checked(backend: str) -> None:
    """A max_seq_len / max_q_len below the true maximum is refused when indices are
    checked; a value that is not a positive int always is."""
    args = _decode_args()  # seq_lens [9, 8]
    with pytest.raises(IndexRangeError, match="max_seq_len=8"):
        ops.paged_decode_attention(**args, backend=backend, max_seq_len=8)
    for bad in (0, 2.5, True):
        with pytest.raises(ConfigError, match="max_seq_len"):
            ops.paged_decode_attention(
                **args,
                backend=backend,
                max_seq_len=bad,  # type: ignore[arg-type]  # deliberately bad input
            )
    q = torch.randn(5, 4, 16)
    common = (q, args["k_cache"], args["v_cache"], args["block_tables"])
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    with pytest.raises(IndexRangeError, match="max_q_len=2"):
        ops.paged_prefill_attention(*common, cu, args["seq_lens"], backend=backend, max_q_len=2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_loose_maxima_give_the_same_result(backend: str) -> None:
    """Without index checks and without maxima the ops size their launch by the shapes
    (more partitions and query tiles than needed): the output is unchanged."""
    args = _decode_args()
    exact = ops.paged_decode_attention(**args, backend=backend, partition_size=4)
    loose = ops.paged_decode_attention(
        **args, backend=backend, partition_size=4, check_indices=False
    )
    assert torch.equal(exact, loose)
    q = torch.randn(5, 4, 16)
    common = (q, args["k_cache"], args["v_cache"], args["block_tables"])
    cu = torch.tensor([0, 3, 5], dtype=torch.int32)
    exact = ops.paged_prefill_attention(*common, cu, args["seq_lens"], backend=backend)
    loose = ops.paged_prefill_attention(
        *common, cu, args["seq_lens"], backend=backend, check_indices=False
    )
    assert torch.equal(exact, loose)
