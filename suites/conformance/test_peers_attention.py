"""Peer attention kernels (kvbench's `kernels.ops` torch path, vLLM's native CPU paged
attention, plug-ins) against the float64 oracle on the decode cases each supports.

Each case writes random K/V (never zeros) of ragged sequences into randomly permuted
blocks through the peer's own write op, runs its decode over block tables and seq lens,
and compares with `reference.oracle.batched_decode_attention` by relative error within the
dtype's tolerance. Outputs are poisoned (NaN) before the run. A second check measures a
design difference: whether NaN left in the unwritten tail of a last block reaches the
output (vLLM's CPU kernel reads whole blocks; it must match the declared
`traits.needs_finite_tail`).
"""

from __future__ import annotations

import math

import pytest
import torch

from kvbench.reference.oracle import batched_decode_attention, relative_error, tolerance
from kvbench.suites.peers.base import PeerUnavailableError
from kvbench.suites.peers.registry import attention_names, load_attention

NAMES = attention_names()

# (dtype, block_size, head_dim, num_q_heads, num_kv_heads, seq_lens)
CASES = [
    (torch.float32, 16, 64, 8, 2, [1, 16, 37, 100]),
    (torch.float32, 32, 128, 4, 4, [5, 64, 65]),
    (torch.float32, 16, 64, 4, 1, [33, 2, 48]),  # MQA
    (torch.float16, 16, 64, 8, 2, [17, 80, 3]),
    (torch.bfloat16, 32, 128, 8, 2, [31, 96, 129]),
    (torch.bfloat16, 16, 64, 16, 2, [9, 40]),
    (torch.float32, 8, 64, 8, 2, [9, 40]),  # block 8: not every peer supports it
    (torch.float32, 16, 48, 4, 2, [9, 40]),  # head 48: not every peer supports it
]


def load(name: str):
    try:
        return load_attention(name)
    except PeerUnavailableError as exc:
        pytest.skip(f"peer {name!r} unavailable: {exc}")


def build(adapter, dtype, bs, d, hq, hkv, lens, seed=0, poison_tail=False):
    """Write ragged random K/V through the adapter; returns (cache, q, tables, lens, ks, vs)."""
    g = torch.Generator().manual_seed(seed)
    per_seq = [-(-n // bs) for n in lens]
    num_blocks = sum(per_seq) + 3
    cache = adapter.make_cache(num_blocks, bs, hkv, d, dtype)
    if poison_tail:
        adapter.fill_(cache, float("nan"))
    perm = torch.randperm(num_blocks, generator=g).tolist()
    tables = torch.zeros((len(lens), max(per_seq)), dtype=torch.int32)
    keys, values = [], []
    used = 0
    for i, n in enumerate(lens):
        blocks = perm[used : used + per_seq[i]]
        used += per_seq[i]
        tables[i, : len(blocks)] = torch.tensor(blocks, dtype=torch.int32)
        k = torch.randn(n, hkv, d, generator=g).to(dtype)
        v = torch.randn(n, hkv, d, generator=g).to(dtype)
        pos = torch.arange(n)
        slots = torch.tensor(blocks, dtype=torch.int64)[pos // bs] * bs + pos % bs
        adapter.write(cache, k, v, slots)
        keys.append(k)
        values.append(v)
    q = torch.randn(len(lens), hq, d, generator=g).to(dtype)
    return cache, q, tables, torch.tensor(lens, dtype=torch.int32), keys, values


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-bs{c[1]}-d{c[2]}-{c[3]}x{c[4]}")
def test_decode_matches_float64_oracle(name, case):
    dtype, bs, d, hq, hkv, lens = case
    adapter = load(name)
    reason = adapter.unsupported(dtype, bs, d, hq, hkv)
    if reason is not None:
        pytest.skip(f"{name}: {reason}")
    cache, q, tables, seq_lens, keys, values = build(adapter, dtype, bs, d, hq, hkv, lens)
    scale = 1.0 / math.sqrt(d)
    run = adapter.decode_fn(cache, q, tables, seq_lens, scale)
    out = run()
    assert out.shape == q.shape and out.dtype == dtype
    ref = batched_decode_attention(q, keys, values, scale)
    err = relative_error(out, ref)
    assert err <= tolerance(dtype), f"{name} {case}: relative error {err:.3g}"
    # a second call (benches call the same closure repeatedly) gives the same result
    assert torch.equal(run(), out)


@pytest.mark.parametrize("name", NAMES)
def test_unwritten_tail_matches_declared_trait(name):
    """NaN in never-written slots of a partial last block: harmless for kernels that mask
    by length before loading, fatal for kernels that read whole blocks (declared)."""
    adapter = load(name)
    dtype, bs, d, hq, hkv, lens = torch.float32, 16, 64, 4, 2, [20, 7]
    cache, q, tables, seq_lens, keys, values = build(
        adapter, dtype, bs, d, hq, hkv, lens, poison_tail=True
    )
    out = adapter.decode_fn(cache, q, tables, seq_lens, 1.0 / math.sqrt(d))()
    poisoned = bool(torch.isnan(out).any())
    assert poisoned == adapter.traits.needs_finite_tail
    if not poisoned:
        ref = batched_decode_attention(q, keys, values)
        assert relative_error(out, ref) <= tolerance(dtype)


@pytest.mark.parametrize("name", NAMES)
def test_unsupported_reasons_name_the_value(name):
    adapter = load(name)
    reason = adapter.unsupported(torch.int8, 16, 64, 8, 2)
    assert reason is not None and "int8" in reason
    reason = adapter.unsupported(torch.float32, 16, 64, 6, 4)
    assert reason is not None and "6" in reason
