"""The float64 oracle against torch's own scaled_dot_product_attention in float64."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

from kvbench.reference.oracle import (
    batched_decode_attention,
    decode_attention,
    extend_attention,
    first_key,
    relative_error,
    spec_mask,
)
from kvbench.suites.conformance.hostile import TRIED
from kvbench.workloads.errors import ShapeError
from kvbench.workloads.kv_spec import KVCacheSpec


def _sdpa_last_queries(q, k, v, scale):
    """SDPA with an explicit causal mask for queries at the last n positions."""
    n, seq_len = q.shape[0], k.shape[0]
    group = q.shape[1] // k.shape[1]
    qh = q.transpose(0, 1).unsqueeze(0)
    kh = k.repeat_interleave(group, 1).transpose(0, 1).unsqueeze(0)
    vh = v.repeat_interleave(group, 1).transpose(0, 1).unsqueeze(0)
    qpos = torch.arange(seq_len - n, seq_len).unsqueeze(1)
    mask = torch.arange(seq_len).unsqueeze(0) <= qpos
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=mask, scale=scale)
    return out[0].transpose(0, 1)


@given(
    seq_len=st.integers(1, 48),
    kv_heads=st.sampled_from([1, 2, 4]),
    group=st.sampled_from([1, 2, 4]),
    head_dim=st.sampled_from([8, 16, 24]),
    n_frac=st.floats(0.0, 1.0),
    scale=st.one_of(st.none(), st.floats(0.05, 2.0)),
    seed=st.integers(0, 2**16),
)
def test_extend_matches_sdpa(seq_len, kv_heads, group, head_dim, n_frac, scale, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    n = max(1, round(n_frac * seq_len))
    q = torch.randn(n, kv_heads * group, head_dim, dtype=torch.float64, generator=gen)
    k = torch.randn(seq_len, kv_heads, head_dim, dtype=torch.float64, generator=gen)
    v = torch.randn(seq_len, kv_heads, head_dim, dtype=torch.float64, generator=gen)
    expected = _sdpa_last_queries(q, k, v, scale if scale is not None else 1 / math.sqrt(head_dim))
    assert relative_error(extend_attention(q, k, v, scale), expected) < 1e-12


def test_decode_is_the_last_row_of_full_causal_attention() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(10, 8, 16, generator=gen)
    k = torch.randn(10, 2, 16, generator=gen)
    v = torch.randn(10, 2, 16, generator=gen)
    full = extend_attention(q, k, v)
    assert torch.allclose(decode_attention(q[-1], k, v), full[-1], atol=1e-12, rtol=0)
    # The first query sees only the first key: its output is exactly v[0] of its KV head.
    assert torch.allclose(full[0, :4], v[0, 0].double().expand(4, 16), atol=1e-12)
    assert torch.allclose(full[0, 4:], v[0, 1].double().expand(4, 16), atol=1e-12)


def test_gqa_mapping_uses_consecutive_query_heads() -> None:
    gen = torch.Generator().manual_seed(1)
    k = torch.randn(5, 2, 8, generator=gen)
    v = torch.randn(5, 2, 8, generator=gen)
    q = torch.randn(4, 8, generator=gen)
    out = decode_attention(q, k, v)
    for h in range(4):
        alone = decode_attention(q[h : h + 1], k[:, h // 2 : h // 2 + 1], v[:, h // 2 : h // 2 + 1])
        assert torch.allclose(out[h], alone[0], atol=1e-12)


def test_batched_decode_handles_ragged_lengths() -> None:
    gen = torch.Generator().manual_seed(2)
    lens = [1, 7, 3]
    keys = [torch.randn(n, 1, 8, generator=gen) for n in lens]
    values = [torch.randn(n, 1, 8, generator=gen) for n in lens]
    q = torch.randn(3, 2, 8, generator=gen)
    out = batched_decode_attention(q, keys, values)
    for i in range(3):
        assert torch.equal(out[i], decode_attention(q[i], keys[i], values[i]))


def test_relative_error_flags_nan() -> None:
    ref = torch.ones(4)
    out = torch.ones(4)
    out[2] = float("nan")
    assert not relative_error(out, ref) < 1.0


@pytest.mark.parametrize(
    ("q", "k", "names"),
    [
        (torch.randn(3, 16), torch.randn(4, 2, 16), "3 is not a multiple"),
        (torch.randn(4, 16), torch.randn(4, 2, 8), "head_dim"),
        (torch.randn(4, 2, 16), torch.randn(4, 2, 16), "num_q_heads, head_dim"),
        (torch.randn(4, 16), torch.randn(0, 2, 16), "L>=1"),
    ],
)
def test_bad_shapes_name_the_problem(q, k, names) -> None:
    with pytest.raises(ShapeError, match=names):
        decode_attention(q, k, k.clone())


# ---------------------------------------------------------------- masks from a spec
_SPECS = [
    KVCacheSpec.full(),
    KVCacheSpec.sliding_window(1),
    KVCacheSpec.sliding_window(5),
    KVCacheSpec.chunked_local(1),
    KVCacheSpec.chunked_local(4),
    KVCacheSpec.chunked_local(7),
    KVCacheSpec.cross_attention(9),
]


@pytest.mark.parametrize("spec", _SPECS, ids=lambda s: s.describe())
def test_first_key_is_the_first_key_the_mask_leaves_visible(spec: KVCacheSpec) -> None:
    """`first_key` (what the layer-group reference slices by) against extend_attention's
    own mask, read from its output: equal scores and one-hot values make row p the mean of
    the keys p sees, so its nonzero columns are exactly them (contiguous up to p)."""
    length = 23
    q = torch.zeros(length, 1, length)
    k = torch.zeros(length, 1, length)
    v = torch.eye(length).unsqueeze(1)
    mask = spec_mask(spec)
    out = extend_attention(q, k, v, 1.0, **mask)[:, 0]  # [L, L]: row p over keys
    for p in range(length):
        seen = out[p].nonzero().flatten().tolist()
        first = first_key(p, **mask)
        assert seen == list(range(first, p + 1)), (spec.describe(), p, seen, first)


@pytest.mark.parametrize("spec", _SPECS, ids=lambda s: s.describe())
def test_offset_masks_the_true_positions_of_a_gathered_suffix(spec: KVCacheSpec) -> None:
    """A KV gathered from position s on (a cache's view) with offset=s gives what the
    whole sequence gives for the same queries; without the offset a chunk's boundaries
    would fall at the wrong positions (shown for the chunk of 7, whose suffix from 5 does
    not start at a chunk start)."""
    g = torch.Generator().manual_seed(3)
    length, n = 20, 3
    q = torch.randn(n, 2, 8, generator=g)
    k = torch.randn(length, 1, 8, generator=g)
    v = torch.randn(length, 1, 8, generator=g)
    mask = spec_mask(spec)
    whole = extend_attention(q, k, v, **mask)
    for start in range(0, first_key(length - n, **mask) + 1):
        part = extend_attention(q, k[start:], v[start:], offset=start, **mask)
        torch.testing.assert_close(part, whole, rtol=1e-12, atol=1e-12)
    if spec == KVCacheSpec.chunked_local(7):
        shifted = extend_attention(q, k[5:], v[5:], **mask)
        assert not torch.allclose(shifted, whole)


@pytest.mark.parametrize("bad", [-1, 1.5, True, "0", None])
def test_a_bad_offset_is_refused_by_name(bad: object) -> None:
    q, k = torch.ones(1, 1, 4), torch.ones(3, 1, 4)
    with pytest.raises(ShapeError, match=f"offset must be an integer >= 0, got {bad!r}"):
        extend_attention(q, k, k, offset=bad)  # type: ignore[arg-type]
    TRIED["api: bad oracle offset"] += 1  # the hostile-input battery's tally


def test_spec_mask_reads_the_spec_s_own_fields() -> None:
    assert spec_mask(KVCacheSpec.sliding_window(6)) == {"window": 6, "chunk": None}
    assert spec_mask(KVCacheSpec.chunked_local(8)) == {"window": None, "chunk": 8}
    for spec in (KVCacheSpec.full(), KVCacheSpec.cross_attention(5)):
        assert spec_mask(spec) == {"window": None, "chunk": None}
