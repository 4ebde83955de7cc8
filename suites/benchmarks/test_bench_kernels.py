"""CPU benchmark: the torch paged decode path against SDPA over the same KV laid out
contiguously (batch 8, contexts 512 / 1024 / 4096, block size 16, float32).

[PA-deep-dive] puts the cost of paging at 4-15% of attention kernel time on GPUs; on a CPU the
torch path pays one gather of the blocks in use, so its overhead is the gather against
one pass of attention over the same bytes. Both sides use the same SDPA call with the
query heads of a GQA group as query rows, so the ratio isolates the paging.

`test_decode_*` time each side on its own (pytest-benchmark groups them by context);
`test_decode_overhead_ratio` times them interleaved, pair by pair, so machine load
cancels, and stores the paged / contiguous ratio (median and quartiles) in the
benchmark's extra_info. Run: pytest suites/benchmarks/test_bench_kernels.py
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import pytest
import torch
import torch.nn.functional as F

from kvbench.kernels import ops

BATCH = 8
NUM_Q_HEADS = 32
NUM_KV_HEADS = 8
HEAD_DIM = 128
BLOCK_SIZE = 16
CONTEXTS = (512, 1024, 4096)


class DecodeCase:
    """The same random KV twice: in a shuffled paged pool and as contiguous tensors."""

    def __init__(self, context: int, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        blocks_per_seq = context // BLOCK_SIZE
        num_blocks = BATCH * blocks_per_seq
        shape = (num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
        self.k_cache = torch.randn(shape, generator=gen)
        self.v_cache = torch.randn(shape, generator=gen)
        perm = torch.randperm(num_blocks, generator=gen)
        self.block_tables = perm.view(BATCH, blocks_per_seq).to(torch.int32)
        self.context = context
        self.seq_lens = torch.full((BATCH,), context, dtype=torch.int32)
        self.query = torch.randn((BATCH, NUM_Q_HEADS, HEAD_DIM), generator=gen)
        tables = self.block_tables.long()

        def contiguous(cache: torch.Tensor) -> torch.Tensor:  # [B, Hkv, L, D]
            seq = cache[tables].view(BATCH, context, NUM_KV_HEADS, HEAD_DIM)
            return seq.transpose(1, 2).contiguous()

        self.k = contiguous(self.k_cache)
        self.v = contiguous(self.v_cache)
        self.out = torch.empty_like(self.query)

    def paged(self) -> torch.Tensor:
        return ops.paged_decode_attention(
            self.query,
            self.k_cache,
            self.v_cache,
            self.block_tables,
            self.seq_lens,
            out=self.out,
            backend="torch",
            check_indices=False,
            max_seq_len=self.context,
        )

    def contiguous(self) -> torch.Tensor:
        group = NUM_Q_HEADS // NUM_KV_HEADS
        q = self.query.view(BATCH, NUM_KV_HEADS, group, HEAD_DIM)
        res = F.scaled_dot_product_attention(q, self.k, self.v)
        self.out.copy_(res.reshape(BATCH, NUM_Q_HEADS, HEAD_DIM))
        return self.out


@pytest.fixture(scope="module", params=CONTEXTS, ids=lambda c: f"ctx{c}")
def case(request: pytest.FixtureRequest) -> DecodeCase:
    c = DecodeCase(request.param)
    torch.testing.assert_close(c.paged().clone(), c.contiguous().clone())  # same answer
    return c


def test_decode_paged_torch(benchmark, case: DecodeCase) -> None:
    benchmark.group = f"decode ctx={case.k.shape[2]}"
    benchmark(case.paged)


def test_decode_contiguous_sdpa(benchmark, case: DecodeCase) -> None:
    benchmark.group = f"decode ctx={case.k.shape[2]}"
    benchmark(case.contiguous)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_decode_overhead_ratio(benchmark, case: DecodeCase) -> None:
    """Paged / contiguous time, measured pair by pair in one run (order alternating)."""
    ratios: list[float] = []

    def pair() -> None:
        if len(ratios) % 2:
            t_contig, t_paged = _timed(case.contiguous), _timed(case.paged)
        else:
            t_paged, t_contig = _timed(case.paged), _timed(case.contiguous)
        ratios.append(t_paged / t_contig)

    for _ in range(3):  # warm-up
        pair()
    ratios.clear()
    benchmark.group = "decode paged/contiguous ratio"
    benchmark.pedantic(pair, rounds=30, iterations=1)
    q1, med, q3 = statistics.quantiles(ratios, n=4)
    benchmark.extra_info.update(
        {"context": case.k.shape[2], "ratio_median": med, "ratio_q1": q1, "ratio_q3": q3}
    )
    print(f"\ncontext {case.k.shape[2]}: paged/contiguous median {med:.3f} (IQR {q1:.3f}-{q3:.3f})")
