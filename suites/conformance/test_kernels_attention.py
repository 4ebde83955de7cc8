"""Paged decode and prefill attention vs the float64 oracle, for both kernel versions.

Every case builds per-sequence K/V, scatters it into a paged pool through a shuffled,
non-contiguous block table (unused pool blocks hold random junk, table padding is -1 so a
stray read of it would fail), poisons the output with NaN, runs the op with the torch
version and with the Triton kernel under the interpreter, and compares with
`reference.oracle` by relative error within the dtype's tolerance. The Triton cases keep
to the interpreter budget (batch and heads <= 4, lengths <= 256); longer or wider ones are
marked slow. Tests that take `device` also run, as `gpu` tests, with the pool, tables
and queries on CUDA: there "triton" is the compiled kernel, and the output is compared
with the float64 oracle (on the CPU) the same way.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from kvbench.kernels import ops
from kvbench.reference import oracle

BACKENDS = ("torch", "triton")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@dataclass
class PagedBatch:
    """A batch of sequences stored in a paged pool, with their contiguous originals."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    block_tables: torch.Tensor
    seq_lens: torch.Tensor
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def to(self, device: torch.device | str) -> PagedBatch:
        """The pool, tables and lengths on `device` (the oracle's K/V stay on the CPU)."""
        return PagedBatch(
            self.k_cache.to(device),
            self.v_cache.to(device),
            self.block_tables.to(device),
            self.seq_lens.to(device),
            self.keys,
            self.values,
        )


def make_paged(
    lens: list[int],
    num_kv_heads: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    gen: torch.Generator,
    spare_blocks: int = 3,
) -> PagedBatch:
    """Random K/V per sequence laid out in shuffled physical blocks of a junk-filled pool."""
    need = [-(-n // block_size) for n in lens]
    num_blocks = sum(need) + spare_blocks
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    k_cache = torch.randn(shape, generator=gen).to(dtype)  # junk where nothing is written
    v_cache = torch.randn(shape, generator=gen).to(dtype)
    perm = torch.randperm(num_blocks, generator=gen).tolist()
    tables = torch.full((len(lens), max(need) + 1), -1, dtype=torch.int32)
    keys, values = [], []
    for b, (n, nb) in enumerate(zip(lens, need, strict=True)):
        blocks, perm = perm[:nb], perm[nb:]
        tables[b, :nb] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn((n, num_kv_heads, head_dim), generator=gen).to(dtype)
        v = torch.randn((n, num_kv_heads, head_dim), generator=gen).to(dtype)
        slots = torch.tensor(blocks).repeat_interleave(block_size) * block_size + torch.arange(
            block_size
        ).repeat(nb)
        k_cache.view(-1, num_kv_heads, head_dim)[slots[:n]] = k
        v_cache.view(-1, num_kv_heads, head_dim)[slots[:n]] = v
        keys.append(k)
        values.append(v)
    return PagedBatch(k_cache, v_cache, tables, torch.tensor(lens, dtype=torch.int32), keys, values)


def run_decode(
    pb: PagedBatch, q: torch.Tensor, backend: str, partition_size: int | None = None
) -> torch.Tensor:
    out = torch.full_like(q, float("nan"))  # poisoned: an unwritten element fails
    res = ops.paged_decode_attention(
        q,
        pb.k_cache,
        pb.v_cache,
        pb.block_tables,
        pb.seq_lens,
        out=out,
        backend=backend,
        partition_size=partition_size,
    )
    assert res is out
    return out


def check_decode(
    lens: list[int],
    hkv: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    backend: str,
    partition_size: int | None = None,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> float:
    gen = torch.Generator().manual_seed(seed)
    pb = make_paged(lens, hkv, head_dim, block_size, dtype, gen)
    q = torch.randn((len(lens), hkv * group, head_dim), generator=gen).to(dtype)
    out = run_decode(pb.to(device), q.to(device), backend, partition_size).cpu()
    ref = oracle.batched_decode_attention(q, pb.keys, pb.values)
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dtype), (
        f"{backend} {device} {dtype} lens={lens} hkv={hkv} group={group} D={head_dim} "
        f"bs={block_size} part={partition_size}: relative error {err}"
    )
    return err


def check_prefill(
    lens: list[int],
    q_lens: list[int],
    hkv: int,
    group: int,
    head_dim: int,
    block_size: int,
    dtype: torch.dtype,
    backend: str,
    seed: int = 0,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    pb = make_paged(lens, hkv, head_dim, block_size, dtype, gen)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((int(cu[-1]), hkv * group, head_dim), generator=gen).to(dtype)
    on = pb.to(device)
    out = torch.full_like(q, float("nan")).to(device)
    ops.paged_prefill_attention(
        q.to(device), on.k_cache, on.v_cache, on.block_tables, cu.to(device), on.seq_lens,
        out=out, backend=backend,
    )  # fmt: skip
    out = out.cpu()
    ref = torch.cat(
        [
            oracle.extend_attention(q[cu[b] : cu[b + 1]], pb.keys[b], pb.values[b])
            for b in range(len(lens))
        ]
    )
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dtype), (
        f"{backend} {device} {dtype} lens={lens} q_lens={q_lens} hkv={hkv} group={group} "
        f"D={head_dim} bs={block_size}: relative error {err}"
    )
    return out


# ---------------------------------------------------------------- decode


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_boundary_lengths(backend: str, dtype: torch.dtype, device: torch.device) -> None:
    """Lengths 1, a block, one past, several blocks; single and split partitions."""
    lens = [1, 16, 17, 70]
    check_decode(lens, 2, 2, 64, 16, dtype, backend, device=device)
    if backend == "triton":  # 32-token partitions: 1, 1, 1 and 3 partitions to merge
        check_decode(lens, 2, 2, 64, 16, dtype, backend, partition_size=32, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("hkv", "group"), [(4, 1), (1, 4), (2, 2), (1, 8)])
def test_decode_gqa_and_mqa(backend: str, hkv: int, group: int, device: torch.device) -> None:
    """MHA, MQA and GQA: query head h reads KV head h // group."""
    check_decode(
        [5, 33], hkv, group, 32, 8, torch.float32, backend, partition_size=16, device=device
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim", [64, 80, 96, 128, 256])
def test_decode_head_dims(backend: str, head_dim: int, device: torch.device) -> None:
    """Head dims that are not powers of two are padded and masked."""
    check_decode(
        [3, 40], 1, 2, head_dim, 16, torch.float16, backend, partition_size=32, device=device
    )


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_wide_tile_group_32_head_dim_64(backend: str, device: torch.device) -> None:
    """Head dim 64 with 32 query heads per KV head steps the wide 64-token tile
    (`configs.DECODE_WIDE`): lengths under, across and over a tile, single and split."""
    check_decode(
        [5, 64, 150], 1, 32, 64, 16, torch.float16, backend, partition_size=128, device=device
    )


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("block_size", [8, 16, 32, 64, 128])
def test_decode_block_sizes(backend: str, block_size: int, device: torch.device) -> None:
    lens = [1, block_size + 1, 150]
    check_decode(lens, 1, 2, 32, block_size, torch.float32, backend, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_group_larger_than_one_program(backend: str, device: torch.device) -> None:
    """MQA with 80 query heads: split into chunks of query-head rows."""
    check_decode([9, 20], 1, 80, 16, 8, torch.float32, backend, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_block_size_is_invisible(backend: str, dtype: torch.dtype) -> None:
    """Metamorphic: the same KV at block size 16 and at block size 1 gives the same output."""
    lens = [1, 16, 37]
    outs = []
    for bs in (16, 1):
        gen = torch.Generator().manual_seed(7)
        pb = make_paged(lens, 2, 32, 16, dtype, gen)
        q = torch.randn((3, 4, 32), generator=gen).to(dtype)
        if bs == 1:  # re-lay every token in its own block, shuffled
            pb = _relayout(pb, 1, torch.Generator().manual_seed(3))
        outs.append(run_decode(pb, q, backend, partition_size=32))
    if backend == "triton":  # KV is visited token by token in the same order: bitwise equal
        torch.testing.assert_close(outs[0], outs[1], rtol=0, atol=0)
    else:  # the torch version pads to whole blocks, so its summation order may differ
        assert oracle.relative_error(outs[1], outs[0]) <= oracle.tolerance(dtype)


def _relayout(pb: PagedBatch, block_size: int, gen: torch.Generator) -> PagedBatch:
    """The same sequences in a fresh pool of `block_size` blocks."""
    hkv, d = pb.keys[0].shape[1:]
    lens = [k.shape[0] for k in pb.keys]
    new = make_paged(lens, hkv, d, block_size, pb.keys[0].dtype, gen)
    for b, n in enumerate(lens):
        for which, seqs in ((new.k_cache, pb.keys), (new.v_cache, pb.values)):
            tables = new.block_tables[b, : -(-n // block_size)].long()
            slots = (tables.repeat_interleave(block_size) * block_size)[:n] + torch.arange(
                n
            ) % block_size
            which.view(-1, hkv, d)[slots] = seqs[b]
    new.keys, new.values = pb.keys, pb.values
    return new


def test_decode_backends_agree() -> None:
    """The torch and Triton versions agree with each other, not just with the oracle."""
    gen = torch.Generator().manual_seed(11)
    pb = make_paged([12, 64, 100], 2, 64, 16, torch.float32, gen)
    q = torch.randn((3, 4, 64), generator=gen)
    a = run_decode(pb, q, "torch")
    b = run_decode(pb, q, "triton", partition_size=32)
    assert oracle.relative_error(b, a) <= oracle.tolerance(torch.float32)


@given(
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
    hkv=st.integers(1, 2),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 32, 48, 64, 80]),
    block_size=st.sampled_from([8, 16, 32]),
    partition_size=st.sampled_from([None, 32, 64]),
)
def test_decode_hypothesis(
    data: st.DataObject,
    dtype: torch.dtype,
    hkv: int,
    group: int,
    head_dim: int,
    block_size: int,
    partition_size: int | None,
) -> None:
    """Random small shapes within the interpreter budget, both versions."""
    lens = data.draw(st.lists(st.integers(1, 256), min_size=1, max_size=3), label="lens")
    seed = data.draw(st.integers(0, 2**16), label="seed")
    for backend in BACKENDS:
        check_decode(lens, hkv, group, head_dim, block_size, dtype, backend, partition_size, seed)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_decode_long_context(backend: str, dtype: torch.dtype, device: torch.device) -> None:
    """Contexts spanning several default (512-token) partitions at a real head size."""
    check_decode([1300, 513, 512], 2, 4, 128, 16, dtype, backend, device=device)


# ---------------------------------------------------------------- prefill


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prefill_mixed_batch(backend: str, dtype: torch.dtype, device: torch.device) -> None:
    """Full prefill, extend over a cached prefix, a one-token step and a block-aligned chunk."""
    lens = [20, 45, 9, 32]
    q_lens = [20, 13, 1, 16]
    check_prefill(lens, q_lens, 2, 2, 64, 16, dtype, backend, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("hkv", "group", "head_dim"), [(4, 1, 32), (1, 4, 80), (1, 8, 16), (2, 3, 32), (1, 80, 16)]
)
def test_prefill_heads(
    backend: str, hkv: int, group: int, head_dim: int, device: torch.device
) -> None:
    """MHA, GQA (also a group of 3: rows that are not a power of two), and MQA with more
    query heads than one program's rows."""
    lens, q_lens = [30, 7], [11, 7]
    check_prefill(lens, q_lens, hkv, group, head_dim, 8, torch.float32, backend, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_prefill_one_token_equals_decode(backend: str) -> None:
    """Metamorphic: a one-token extend step is a decode step."""
    gen = torch.Generator().manual_seed(5)
    pb = make_paged([1, 17, 40], 2, 32, 8, torch.float32, gen)
    q = torch.randn((3, 4, 32), generator=gen)
    dec = run_decode(pb, q, backend)
    pre = ops.paged_prefill_attention(
        q,
        pb.k_cache,
        pb.v_cache,
        pb.block_tables,
        torch.arange(4, dtype=torch.int32),
        pb.seq_lens,
        backend=backend,
    )
    assert oracle.relative_error(pre, dec) <= oracle.tolerance(torch.float32)


@given(
    data=st.data(),
    dtype=st.sampled_from(DTYPES),
    hkv=st.integers(1, 2),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([16, 32, 64]),
    block_size=st.sampled_from([8, 16]),
)
def test_prefill_hypothesis(
    data: st.DataObject,
    dtype: torch.dtype,
    hkv: int,
    group: int,
    head_dim: int,
    block_size: int,
) -> None:
    lens = data.draw(st.lists(st.integers(1, 96), min_size=1, max_size=3), label="lens")
    q_lens = [data.draw(st.integers(1, min(n, 40)), label="q_len") for n in lens]
    seed = data.draw(st.integers(0, 2**16), label="seed")
    for backend in BACKENDS:
        check_prefill(lens, q_lens, hkv, group, head_dim, block_size, dtype, backend, seed)


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("head_dim", [128, 256])
def test_prefill_long(backend: str, head_dim: int, device: torch.device) -> None:
    lens, q_lens = [300, 200], [300, 64]
    check_prefill(lens, q_lens, 2, 2, head_dim, 16, torch.bfloat16, backend, device=device)


@pytest.mark.parametrize("backend", BACKENDS)
def test_decode_ignores_nan_in_unused_slots(backend: str, device: torch.device) -> None:
    """Pools come from torch.empty in real engines: NaN in slots past a sequence's length,
    in spare blocks or in block 0 (where padding entries may point) must not reach the
    output."""
    gen = torch.Generator().manual_seed(7)
    lens = [5, 16, 1]
    pb = make_paged(lens, 2, 64, 8, torch.float32, gen)
    valid = torch.zeros(pb.k_cache.shape[:2], dtype=torch.bool)
    for b, n in enumerate(lens):
        for pos in range(n):
            valid[int(pb.block_tables[b, pos // 8]), pos % 8] = True
    pb.k_cache[~valid] = float("nan")
    pb.v_cache[~valid] = float("nan")
    q = torch.randn((3, 4, 64), generator=gen)
    out = run_decode(pb.to(device), q.to(device), backend).cpu()
    ref = oracle.batched_decode_attention(q, pb.keys, pb.values)
    assert oracle.relative_error(out, ref) <= oracle.tolerance(torch.float32)
