"""Offsets into K/V pools are 64-bit: a real pool past 2**31 elements, read and written.

The pool is narrow (1 KV head, head dim 64, block size 16: 1024 elements per block) and
has 2**21 + 64 blocks, so every block from 2**21 on starts past element 2**31 (float16:
4 GiB; K and V share the one allocation). Sequences mix blocks below and above that line.
With 32-bit offset arithmetic the kernels would wrap around and read or write the wrong
block; here the Triton kernels (interpreter) and the torch versions write K/V, copy and
swap blocks, and run decode and prefill there, checked against the float64 oracle and
plain indexing. Needs ~9 GiB free memory; marked slow.
"""

from __future__ import annotations

import pytest
import torch

from kvbench.kernels import ops
from kvbench.reference import oracle

BLOCK, HEADS, DIM = 16, 1, 64
HIGH = 2**31 // (BLOCK * HEADS * DIM)  # first block starting past element 2**31
NUM_BLOCKS = HIGH + 64


def _available_bytes() -> int:
    try:
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        _available_bytes() < 9 * 2**30, reason="needs ~9 GiB of free memory for a 4 GiB pool"
    ),
]


@pytest.fixture(scope="module")
def pool() -> torch.Tensor:
    # One allocation serves as K and V cache (validation only needs equal shapes): the
    # test writes K and V through distinct calls and compares with the same tensor.
    return torch.empty((NUM_BLOCKS, BLOCK, HEADS, DIM), dtype=torch.float16)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_kernels_past_two_to_the_31_elements(pool: torch.Tensor, backend: str) -> None:
    gen = torch.Generator().manual_seed(1)
    assert pool[HIGH].storage_offset() >= 2**31
    blocks = [[HIGH + 5, 3, HIGH + 60, HIGH + 61], [7, HIGH + 63, -1, -1]]  # -1: padding
    lens = [60, 20]
    tables = torch.tensor(blocks, dtype=torch.int32)
    # write every token through write_kv (slots past 2**31 elements)
    keys = []
    for b, n in enumerate(lens):
        row = tables[b].long().repeat_interleave(BLOCK) * BLOCK
        slots = (row + torch.arange(BLOCK).repeat(tables.shape[1]))[:n]
        k = torch.randn((n, HEADS, DIM), generator=gen).half()
        ops.write_kv(pool, pool, k, k, slots, backend=backend)
        assert torch.equal(pool.view(-1, HEADS, DIM)[slots], k)
        keys.append(k)
    # decode over blocks on both sides of the line (K and V are the same tensor here)
    q = torch.randn((2, 2, DIM), generator=gen).half()
    out = torch.full_like(q, float("nan"))
    ops.paged_decode_attention(
        q,
        pool,
        pool,
        tables,
        torch.tensor(lens, dtype=torch.int32),
        out=out,
        backend=backend,
        partition_size=32,
    )
    ref = oracle.batched_decode_attention(q, keys, keys)
    assert oracle.relative_error(out, ref) <= oracle.tolerance(torch.float16)
    # prefill: the last 9 tokens of sequence 0 over its whole (high + low) history
    cu = torch.tensor([0, 9], dtype=torch.int32)
    qp = torch.randn((9, 2, DIM), generator=gen).half()
    outp = ops.paged_prefill_attention(
        qp, pool, pool, tables[:1], cu, torch.tensor([60], dtype=torch.int32), backend=backend
    )
    refp = oracle.extend_attention(qp, keys[0], keys[0])
    assert oracle.relative_error(outp, refp) <= oracle.tolerance(torch.float16)
    # copy a high block onto a low one and back up high; swap a high block out and in
    ops.copy_blocks(pool, pool, [(HIGH + 5, 11), (7, HIGH + 40)], backend=backend)
    assert torch.equal(pool[11], pool[HIGH + 5]) and torch.equal(pool[HIGH + 40], pool[7])
    host = torch.zeros((2, BLOCK, HEADS, DIM), dtype=torch.float16)
    ops.swap_blocks(pool, host, [(HIGH + 60, 1)], backend=backend)
    assert torch.equal(host[1], pool[HIGH + 60])
    ops.swap_blocks(host, pool, [(1, HIGH + 62)], backend=backend)
    assert torch.equal(pool[HIGH + 62], pool[HIGH + 60])
