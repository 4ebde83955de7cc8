"""The contiguous layout holds the same K/V as the scattered pool, in sequential blocks,
so the paging overhead compares the same kernel on the same data (against the contiguous
K/V the pool was built from, an independent oracle)."""

from __future__ import annotations

import pytest
import torch

from kvbench.suites.bench.paging_layout import (
    LayoutsDisagreeError,
    contiguous_layout,
    layout_agreement,
    paging_from_samples,
)
from kvbench.suites.bench.sweeps.kernels import scattered_pool
from kvbench.workloads.errors import KVBenchError


@pytest.mark.parametrize(("batch", "length", "block_size"), [(3, 40, 16), (2, 64, 8), (1, 5, 4)])
def test_contiguous_layout_is_sequential_and_holds_the_same_tokens(
    batch: int, length: int, block_size: int
) -> None:
    gen = torch.Generator().manual_seed(7)
    keys = torch.randn(batch, 2, length, 4, generator=gen)
    values = torch.randn(batch, 2, length, 4, generator=gen)
    k_pool, v_pool, tables = scattered_pool(keys, values, block_size, gen)
    k, v, seq = contiguous_layout(k_pool, v_pool, tables)
    nb = tables.shape[1]
    assert seq.dtype == torch.int32
    assert seq.tolist() == [[i * nb + j for j in range(nb)] for i in range(batch)]
    for i in range(batch):  # sequence i's tokens, read from its consecutive blocks
        for name, pool, ref in (("k", k, keys), ("v", v, values)):
            flat = pool[i * nb : (i + 1) * nb].reshape(nb * block_size, 2, 4)[:length]
            assert torch.equal(flat.permute(1, 0, 2), ref[i]), name


def test_contiguous_layout_refuses_tables_sharing_a_block() -> None:
    pool = torch.zeros(4, 2, 1, 1)
    tables = torch.tensor([[0, 1], [1, 2]], dtype=torch.int32)
    with pytest.raises(KVBenchError, match="share a block"):
        contiguous_layout(pool, pool, tables)


def test_layout_agreement_raises_past_the_limit_and_on_nan() -> None:
    a = torch.ones(4)
    assert layout_agreement(a, a.clone(), 1e-6) == 0.0
    with pytest.raises(LayoutsDisagreeError, match="differs"):
        layout_agreement(a * 1.1, a, 1e-3)
    with pytest.raises(LayoutsDisagreeError):
        layout_agreement(a * float("nan"), a, 1e-3)


def test_paging_overhead_is_the_median_of_paired_ratios() -> None:
    # paired: repeat 2 is slow for both layouts; the ratio per repeat is 1.1 every time,
    # where the ratio of the two medians would not be
    times = paging_from_samples([1.1, 2.2, 11.0], [1.0, 2.0, 10.0])
    assert times.overhead["median"] == pytest.approx(0.1)
    assert times.overhead["n"] == 3
    rows = {m.metric: m for m in times.rows(0.0)}
    assert rows["paging_overhead"].value == pytest.approx(0.1)
    assert rows["time_paged_contiguous_layout"].value == 2.0
