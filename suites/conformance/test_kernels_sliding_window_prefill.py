"""Sliding-window paged prefill/extend (`window=` of `kernels.ops.paged_prefill_attention`)
against the float64 oracle with the window mask, in every dtype.

Sequence b of L tokens with n new ones: row i, at position p = L - n + i, sees keys
max(0, p - window + 1) .. p. Every backend must skip, not mask, what lies before the first
new token's window (position L - n - window + 1): the table entries of blocks wholly
before it are -1 (a cache released them) or point at a block of NaN, and the earlier slots
of its first block hold NaN, so a backend that loads any of them fails the oracle (a
masked NaN still poisons p @ V as 0 * NaN). Shapes: a window below one block, not a
multiple of the block size, longer than every sequence, and of one token; whole prompts
(no cached prefix) and extends over a cached prefix; GQA; more new tokens than one query
tile holds, so the programs of one sequence start their key loops at different blocks.
Backends: "triton" (the interpreter on CPU) and "torch" (gather + SDPA).
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
from kvbench.suites.conformance.test_kernels_sliding_window import _windowed_pool
from kvbench.workloads.errors import ConfigError

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
BACKENDS = ("triton", "cpp", "gather")


def _pool(lens, q_lens, window, hkv, d, bs, dtype, gen, before="nan"):  # type: ignore[no-untyped-def]
    """`_windowed_pool` for a prefill: each sequence held from its first new token's window
    on, blocks wholly before it -1 (`before="minus1"`) or a block of NaN, the earlier slots
    of its first block NaN. Returns caches, tables, lens and the true K and V."""
    reach = [q - 1 for q in q_lens]
    return _windowed_pool(lens, window, hkv, d, bs, dtype, gen, before, reach)


def _need_cpp() -> None:
    status = cpu_paged.status()
    if status.path != "cpp":
        pytest.skip(f"C++ CPU kernel unavailable here: {status.reason}")


def _prefill(backend, q, kc, vc, tables, cu, lens, window, out=None):  # type: ignore[no-untyped-def]
    """One backend's windowed prefill into `out` (NaN-filled when None)."""
    out = torch.full_like(q, float("nan")) if out is None else out
    if backend == "triton":
        ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, out=out, backend="triton",
                                    window=window)  # fmt: skip
    elif backend == "cpp":
        _need_cpp()
        ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, out=out, backend="torch",
                                    window=window)  # fmt: skip
    else:
        dims = val.check_prefill(q, kc, vc, tables, cu, lens, out, window=window)
        scale = val.check_scale(None, q.shape[-1])
        torch_ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, scale, out, dims,
                                          window=window)  # fmt: skip
    return out


def _check(  # type: ignore[no-untyped-def]
    backend, lens, q_lens, window, bs, dtype, hkv=2, group=2, d=64, before="nan", seed=0
):
    gen = torch.Generator().manual_seed(seed)
    kc, vc, tables, tlens, keys, values = _pool(
        lens, q_lens, window, hkv, d, bs, dtype, gen, before
    )
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((int(cu[-1]), hkv * group, d), generator=gen).to(dtype)
    out = _prefill(backend, q, kc, vc, tables, cu, tlens, window)
    ref = torch.cat(
        [
            oracle.extend_attention(q[cu[b] : cu[b + 1]], keys[b], values[b], window=window)
            for b in range(len(lens))
        ]
    )
    err = oracle.relative_error(out, ref)
    assert err <= oracle.tolerance(dtype), (backend, lens, q_lens, window, bs, dtype, err)


#: (block size, window, lengths, new tokens per sequence, what the case covers)
CASES = [
    (16, 3, [3, 20, 45], [3, 20, 9], "window smaller than a block"),
    (8, 13, [13, 30, 61], [13, 7, 40], "window not a multiple of the block size"),
    (8, 200, [5, 50], [5, 20], "window longer than every sequence"),
    (8, 1, [1, 17], [1, 9], "window of one token"),
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("bs", "window", "lens", "q_lens", "what"), CASES, ids=[c[4] for c in CASES]
)
def test_sliding_window_prefill_matches_the_oracle(
    backend: str,
    dtype: torch.dtype,
    bs: int,
    window: int,
    lens: list[int],
    q_lens: list[int],
    what: str,
) -> None:
    _check(backend, lens, q_lens, window, bs, dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_prefill_skips_released_blocks(backend: str) -> None:
    """Extends over a long cached prefix whose blocks before the window are -1 (released
    by a windowed cache): not read, not refused."""
    _check(backend, [70, 90], [6, 30], 10, 8, torch.float16, before="minus1")


@pytest.mark.parametrize("backend", BACKENDS)
def test_sliding_window_prefill_gqa_odd_head_dim(backend: str) -> None:
    """GQA group 4 over one KV head, head dim 40; 50 new tokens x 4 heads span several
    query tiles, each starting its key loop at its own first window block."""
    _check(backend, [50, 66], [50, 17], 11, 8, torch.float32, hkv=1, group=4, d=40)


@settings(max_examples=10, deadline=None)
@given(
    bs=st.sampled_from([1, 4, 8, 16]),
    window=st.integers(1, 40),
    seqs=st.lists(
        st.tuples(st.integers(1, 60), st.integers(1, 60)).map(lambda t: (max(t), min(t))),
        min_size=1,
        max_size=3,
    ),
    dtype=st.sampled_from(DTYPES),
    seed=st.integers(0, 2**16),
)
def test_sliding_window_prefill_triton_hypothesis(bs, window, seqs, dtype, seed) -> None:  # type: ignore[no-untyped-def]
    """Random lengths, new-token counts, windows and block sizes, Triton vs the oracle."""
    lens, q_lens = [s[0] for s in seqs], [s[1] for s in seqs]
    _check("triton", lens, q_lens, window, bs, dtype, hkv=1, group=2, seed=seed)


def test_sliding_window_prefill_without_window_is_unchanged() -> None:
    """window=None is full causal attention; a window at least as long as every sequence
    gives the same answer."""
    gen = torch.Generator().manual_seed(1)
    lens, q_lens = [9, 30], [4, 30]
    kc, vc, tables, tlens, keys, values = _pool(lens, q_lens, 64, 2, 64, 8, torch.float32, gen)
    cu = torch.tensor([0, 4, 34], dtype=torch.int32)
    q = torch.randn((34, 2, 64), generator=gen)
    for backend in BACKENDS:
        full = _prefill(backend, q, kc, vc, tables, cu, tlens, None)
        wide = _prefill(backend, q, kc, vc, tables, cu, tlens, 30)
        torch.testing.assert_close(full, wide)
        ref = torch.cat(
            [oracle.extend_attention(q[cu[b] : cu[b + 1]], keys[b], values[b]) for b in range(2)]
        )
        assert oracle.relative_error(full, ref) <= oracle.tolerance(torch.float32)


def test_sliding_window_prefill_entry_inside_the_window_is_still_checked() -> None:
    """-1 is allowed only before the first new token's window; inside it the call is
    refused by name, before anything is written."""
    gen = torch.Generator().manual_seed(4)
    kc, vc, tables, lens, _, _ = _pool([40], [3], 10, 1, 64, 8, torch.float32, gen, "minus1")
    cu = torch.tensor([0, 3], dtype=torch.int32)
    q = torch.randn((3, 1, 64), generator=gen)
    ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, window=10)  # fine as it is
    tables[0, 3] = -1  # block 3 holds positions 24..31; the first new token (37) sees 28..37
    out = torch.full_like(q, 7.0)
    with pytest.raises(IndexRangeError, match="-1"):
        ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, out=out, window=10)
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("window", [0, -3, True, 2.5])
def test_sliding_window_prefill_bad_window_is_refused(window: object) -> None:
    gen = torch.Generator().manual_seed(2)
    kc, vc, tables, lens, _, _ = _pool([9], [2], 4, 1, 64, 8, torch.float32, gen)
    q = torch.randn((2, 1, 64), generator=gen)
    cu = torch.tensor([0, 2], dtype=torch.int32)
    out = torch.full_like(q, 7.0)
    with pytest.raises(ConfigError, match="window"):
        ops.paged_prefill_attention(q, kc, vc, tables, cu, lens, out=out, window=window)  # type: ignore[arg-type]
    assert bool((out == 7.0).all())


# ------------------------------------------------- the C++ kernel at every tile and shape

#: (block size, window, lengths, new tokens, KV heads, group, head dim, what it covers)
CPP_CASES = [
    (16, 1, [1, 40, 130], [1, 40, 70], 2, 2, 64, "window 1"),
    (16, 2, [2, 90, 200], [2, 33, 150], 2, 4, 64, "window 2"),
    (32, 3, [3, 77, 260], [3, 60, 100], 1, 4, 40, "window 3, head dim 40"),
    (16, 37, [37, 150, 300], [37, 20, 200], 2, 4, 64, "window 37 (not a multiple of 16)"),
    (8, 37, [200, 333], [1, 130], 1, 3, 40, "window 37, extends mid-sequence, GQA 3"),
    (1, 37, [90, 120], [45, 120], 2, 2, 64, "window 37, one-token blocks"),
    (4, 1000, [5, 300, 520], [5, 100, 260], 2, 4, 64, "window 1000 (beyond every sequence)"),
    (32, 100, [700], [300], 1, 8, 64, "window 100, many chunks and panels"),
]


def _cpp_tiles(bs, window, lens, q_lens, hkv, group, d, dtype, tiles, seed=0):  # type: ignore[no-untyped-def]
    """The C++ windowed prefill called directly at each query tile, against the oracle,
    over a pool whose blocks before each first new token's window are -1 and whose earlier
    slots are NaN. Returns the outputs per tile."""
    _need_cpp()
    gen = torch.Generator().manual_seed(seed)
    kc, vc, tables, tlens, keys, values = _pool(
        lens, q_lens, window, hkv, d, bs, dtype, gen, "minus1"
    )
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn((int(cu[-1]), hkv * group, d), generator=gen).to(dtype)
    scale = d**-0.5
    ref = torch.cat(
        [
            oracle.extend_attention(q[cu[b] : cu[b + 1]], keys[b], values[b], window=window)
            for b in range(len(lens))
        ]
    )
    mod = cpu_paged._module()
    assert mod is not None  # _need_cpp() skipped the test where it is absent
    outs = []
    for tile in tiles:
        out = torch.full_like(q, float("nan"))
        mod.paged_prefill_windowed(q, kc, vc, tables, cu, tlens, scale, out, tile, window)
        err = oracle.relative_error(out, ref)
        assert err <= oracle.tolerance(dtype), (tile, bs, window, lens, q_lens, dtype, err)
        outs.append(out)
    return outs


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("bs", "window", "lens", "q_lens", "hkv", "group", "d", "what"),
    CPP_CASES,
    ids=[c[7] for c in CPP_CASES],
)
def test_sliding_window_prefill_cpp_every_tile(  # type: ignore[no-untyped-def]
    dtype, bs, window, lens, q_lens, hkv, group, d, what
) -> None:
    """Tiles of 1, 5 and 16 tokens: tasks whose rows fill part of a panel, several panels,
    and whose key loops start at their own first row's window."""
    _cpp_tiles(bs, window, lens, q_lens, hkv, group, d, dtype, (1, 5, 16))


def test_sliding_window_prefill_cpp_runs_the_cpp_kernel(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """On a CPU a windowed prefill no longer falls back to gather + SDPA."""
    _need_cpp()

    def refuse(*args, **kwargs):  # type: ignore[no-untyped-def]
        raise AssertionError("the windowed CPU prefill fell back to gather + SDPA")

    monkeypatch.setattr(torch_ops, "paged_prefill_attention", refuse)
    _check("cpp", [70, 90], [6, 30], 10, 8, torch.float32, before="minus1")


def test_sliding_window_prefill_cpp_full_window_is_the_full_kernel() -> None:
    """A window covering every sequence gives bit for bit the full kernel's output (the same
    chunks, in the same order, with nothing masked beyond causality)."""
    _need_cpp()
    gen = torch.Generator().manual_seed(5)
    lens, q_lens = [100, 300], [60, 300]
    kc, vc, tables, tlens, _, _ = _pool(lens, q_lens, 1000, 2, 64, 16, torch.float32, gen)
    cu = torch.tensor([0, 60, 360], dtype=torch.int32)
    q = torch.randn((360, 4, 64), generator=gen)
    mod = cpu_paged._module()
    assert mod is not None
    full, wide = torch.empty_like(q), torch.empty_like(q)
    mod.paged_prefill(q, kc, vc, tables, cu, tlens, 0.125, full, 16)
    mod.paged_prefill_windowed(q, kc, vc, tables, cu, tlens, 0.125, wide, 16, 1000)
    assert torch.equal(full, wide)


@settings(max_examples=25, deadline=None)
@given(
    bs=st.sampled_from([1, 2, 5, 8, 16, 32]),
    window=st.integers(1, 80),
    seqs=st.lists(
        st.tuples(st.integers(1, 150), st.integers(1, 150)).map(lambda t: (max(t), min(t))),
        min_size=1,
        max_size=3,
    ),
    dtype=st.sampled_from(DTYPES),
    group=st.sampled_from([1, 2, 4]),
    d=st.sampled_from([64, 40]),
    tile=st.integers(1, 40),
    seed=st.integers(0, 2**16),
)
def test_sliding_window_prefill_cpp_hypothesis(  # type: ignore[no-untyped-def]
    bs, window, seqs, dtype, group, d, tile, seed
) -> None:
    """Random lengths, new-token counts, windows, blocks, groups, head dims and tiles."""
    lens, q_lens = [s[0] for s in seqs], [s[1] for s in seqs]
    _cpp_tiles(bs, window, lens, q_lens, 1, group, d, dtype, (tile,), seed)
