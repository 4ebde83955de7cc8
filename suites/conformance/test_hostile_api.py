"""The hostile-input battery, Python API: bad calls on both caches of the contract
(ContiguousKVCache and PagedKVCache), and requests and time scales with extreme
magnitudes (1e30, 10^30 and 10^400 as ints, NaN, infinities, 1e-320, -0). Hypothesis draws the bad value of each kind (an
unhashable, unknown or duplicate id; a bad prompt, output_len or salt; K/V of the wrong
shape, dtype or type; bad token ids; a bad query, layer or scale). For each call:

    the kind's error class (a KVBenchError), a message naming the bad value, and the
    cache exactly as it was (every request's tokens, K/V and ids, and stats()).

`hostile.TRIED` counts the calls by kind.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvbench.paged.block_identity import DescribedIdentities
from kvbench.paged.block_pool import BlockPool
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.cache_spec import CacheSpec
from kvbench.paged.layer_groups import LayerGroupsPagedCache
from kvbench.paged.serving.time_model import TimeModel
from kvbench.paged.spec_serving import LayerGroupServingCache
from kvbench.reference import oracle
from kvbench.reference.contiguous import ContiguousKVCache
from kvbench.suites.conformance.hostile import TRIED
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    KVBenchError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.hf_spec import model_spec_from_hf_config
from kvbench.workloads.kv_spec import AttentionKind, KVCacheSpec, LayerGroup, ModelKVSpec
from kvbench.workloads.planner import plan_capacity
from kvbench.workloads.prefix_oracle import block_accesses
from kvbench.workloads.profiles import get_profile
from kvbench.workloads.spec_capacity import plan_spec_capacity
from kvbench.workloads.time_scale import time_scaled
from kvbench.workloads.trace import MAX_ARRIVAL_S, MAX_TOKENS, Trace, TraceError, TraceRequest

Q_HEADS = 4
G = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=4, dtype="float32", num_q_heads=Q_HEADS)
MAX_LEN = 32


def _kv(n: int, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(n)
    shape = (G.num_layers, n, G.num_kv_heads, G.head_dim)
    return torch.randn(shape, generator=gen).to(dtype), torch.randn(shape, generator=gen).to(dtype)


def _contiguous() -> ContiguousKVCache:
    return ContiguousKVCache(G, 4 * MAX_LEN, MAX_LEN, "pow2")


def _paged() -> PagedKVCache:
    return PagedKVCache(G, 12, 4, max_seq_len=MAX_LEN, num_cpu_blocks=8)


CACHES: dict[str, Callable[[], Any]] = {"contiguous": _contiguous, "paged": _paged}


def _filled(make: Callable[[], Any]) -> Any:
    """A cache holding two requests with KV and token ids (one forked from the other)."""
    cache = make()
    cache.admit("a", [1, 2, 3, 4, 5], output_len=4)
    k, v = _kv(5)
    cache.append("a", k, v)
    cache.fork("a", "b")
    k, v = _kv(1)
    cache.append("b", k, v, token_ids=[9])
    return cache


def state(cache: Any) -> tuple:
    """Everything a caller can observe: ids, lengths, token ids, K/V bytes, stats."""
    ids = sorted(map(str, cache.request_ids()))
    per = []
    for rid in sorted(cache.request_ids(), key=str):
        k, v = cache.gather(rid)
        per.append(
            (
                rid,
                cache.seq_len(rid),
                tuple(cache.token_ids(rid)),
                k.numpy().tobytes(),
                v.numpy().tobytes(),
            )
        )
    return ids, per, cache.stats()


@dataclass(frozen=True)
class BadCall:
    kind: str
    call: Callable[[Any], object]
    error: type[KVBenchError]
    names: str


UNHASHABLE = st.one_of(
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=2),
    st.sets(st.integers(), max_size=2),
)
NOT_INT = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.none(),
    st.booleans(),
    st.lists(st.integers(), max_size=2),
)


@st.composite
def bad_calls(draw: st.DrawFn) -> BadCall:
    kind = draw(
        st.sampled_from(
            [
                "unhashable id (admit)",
                "unhashable id (fork)",
                "duplicate id",
                "unknown id",
                "empty prompt",
                "negative token id (prompt)",
                "non-integer token id (prompt)",
                "prompt too long",
                "bad output_len",
                "bad salt",
                "K/V of the wrong shape",
                "K/V of the wrong dtype",
                "K/V not tensors",
                "negative token id (append)",
                "token ids of the wrong length",
                "query not a tensor",
                "query of the wrong shape",
                "bad layer",
                "too big to admit",
            ]
        )
    )
    return _request_call(draw, kind) or _tensor_call(draw, kind)


def _request_call(draw: st.DrawFn, kind: str) -> BadCall | None:
    """A bad call about ids, prompts and admission hints (None for the other kinds)."""
    if kind.startswith("unhashable id"):
        rid: object = draw(UNHASHABLE)  # any id, deliberately bad ones included
        if kind.endswith("(admit)"):
            return BadCall(kind, lambda c: c.admit(rid, [1, 2]), ConfigError, repr(rid))
        return BadCall(kind, lambda c: c.fork("a", rid), ConfigError, repr(rid))
    if kind == "duplicate id":
        rid = draw(st.sampled_from(["a", "b"]))
        how = draw(st.sampled_from(["admit", "fork"]))
        call = (lambda c: c.admit(rid, [1])) if how == "admit" else (lambda c: c.fork("a", rid))
        return BadCall(kind, call, DuplicateRequestError, repr(rid))
    if kind == "unknown id":
        rid = draw(
            st.one_of(st.text(max_size=3).filter(lambda t: t not in ("a", "b")), st.integers())
        )
        op = draw(st.sampled_from(["append", "free", "gather", "seq_len", "fork", "attend"]))
        k, v = _kv(1)
        calls = {
            "append": lambda c: c.append(rid, k, v),
            "free": lambda c: c.free(rid),
            "gather": lambda c: c.gather(rid),
            "seq_len": lambda c: c.seq_len(rid),
            "fork": lambda c: c.fork(rid, "new"),
            "attend": lambda c: c.attend([rid], torch.zeros(1, Q_HEADS, G.head_dim)),
        }
        return BadCall(f"{kind} ({op})", calls[op], UnknownRequestError, repr(rid))
    if kind == "empty prompt":
        prompt = draw(st.sampled_from([[], (), range(0)]))
        return BadCall(kind, lambda c: c.admit("n", prompt), ConfigError, "empty")
    if kind == "negative token id (prompt)":
        bad: object = draw(st.integers(max_value=-1))  # any value, deliberately bad
        return BadCall(kind, lambda c: c.admit("n", [1, bad, 2]), ConfigError, repr(bad))
    if kind == "non-integer token id (prompt)":
        bad = draw(NOT_INT.filter(lambda x: x is not None or True))
        return BadCall(kind, lambda c: c.admit("n", [1, bad]), ConfigError, repr(bad)[:20])
    if kind == "prompt too long":
        n = draw(st.integers(MAX_LEN + 1, 4 * MAX_LEN))
        return BadCall(kind, lambda c: c.admit("n", list(range(n))), ConfigError, str(n))
    if kind == "bad output_len":
        bad = draw(
            st.one_of(st.integers(max_value=-1), st.text(max_size=3), st.floats(), st.booleans())
        )
        return BadCall(kind, lambda c: c.admit("n", [1], output_len=bad), ConfigError, repr(bad))
    if kind == "bad salt":
        bad = draw(
            st.one_of(
                st.integers(), st.floats(allow_nan=False), st.lists(st.integers(), max_size=2)
            )
        )
        return BadCall(kind, lambda c: c.admit("n", [1], salt=bad), ConfigError, repr(bad))
    return None


def _tensor_call(draw: st.DrawFn, kind: str) -> BadCall:
    """A bad call about K/V, token ids of an append, queries, layers and capacity."""
    if kind == "K/V of the wrong shape":
        dims = draw(
            st.lists(st.integers(1, 5), min_size=1, max_size=5).filter(
                lambda d: (
                    len(d) != 4 or d[0] != G.num_layers or d[2:] != [G.num_kv_heads, G.head_dim]
                )
            )
        )
        t = torch.zeros(dims)
        return BadCall(kind, lambda c: c.append("a", t, t), ShapeError, str(tuple(dims)))
    if kind == "K/V of the wrong dtype":
        dtype = draw(st.sampled_from([torch.float16, torch.bfloat16, torch.float64, torch.int32]))
        k, v = _kv(1, dtype)
        return BadCall(kind, lambda c: c.append("a", k, v), ShapeError, str(dtype))
    if kind == "K/V not tensors":
        bad = draw(
            st.one_of(
                st.none(), st.integers(), st.lists(st.floats(), max_size=3), st.text(max_size=3)
            )
        )
        return BadCall(kind, lambda c: c.append("a", bad, bad), ShapeError, type(bad).__name__)
    if kind == "negative token id (append)":
        bad = draw(st.integers(max_value=-1))
        k, v = _kv(2)
        return BadCall(
            kind, lambda c: c.append("a", k, v, token_ids=[7, bad]), ConfigError, repr(bad)
        )
    if kind == "token ids of the wrong length":
        n = draw(st.integers(0, 5).filter(lambda x: x != 2))
        k, v = _kv(2)
        return BadCall(kind, lambda c: c.append("a", k, v, token_ids=[1] * n), ShapeError, str(n))
    if kind == "query not a tensor":
        bad = draw(
            st.one_of(
                st.none(), st.integers(), st.text(max_size=3), st.lists(st.floats(), max_size=3)
            )
        )
        return BadCall(kind, lambda c: c.attend(["a"], bad), ShapeError, repr(bad)[:20])
    if kind == "query of the wrong shape":
        dims = draw(
            st.lists(st.integers(1, 5), min_size=1, max_size=4).filter(
                lambda d: d != [1, Q_HEADS, G.head_dim]
            )
        )
        q = torch.zeros(dims)
        return BadCall(
            kind,
            lambda c: c.attend(["a"], q),
            ShapeError,
            str(tuple(dims)) if len(dims) == 3 else "query",
        )
    if kind == "bad layer":
        bad = draw(
            st.one_of(
                st.integers(max_value=-1),
                st.integers(min_value=G.num_layers),
                st.text(max_size=2),
                st.floats(),
                st.booleans(),
                st.none(),
            )
        )
        q = torch.zeros(1, Q_HEADS, G.head_dim)
        return BadCall(kind, lambda c: c.attend(["a"], q, layer=bad), ConfigError, repr(bad))
    assert kind == "too big to admit"
    n = draw(st.integers(1, 3))
    prompts = [list(range(1, MAX_LEN + 1))] * (n + 8)

    def flood(c: Any) -> None:
        for i, p in enumerate(prompts):
            c.admit(f"big{i}", p)

    return BadCall(kind, flood, CapacityError, "cannot admit")


@pytest.mark.parametrize("which", sorted(CACHES))
@settings(max_examples=150)
@given(bad=bad_calls())
def test_bad_call_raises_the_right_error_naming_the_value_and_changes_nothing(
    which: str, bad: BadCall
) -> None:
    cache = _filled(CACHES[which])
    # a flood admits some requests before the one that fails: only its error is judged
    before = None if bad.kind == "too big to admit" else state(cache)
    with pytest.raises(bad.error) as info:
        bad.call(cache)
    assert bad.names in str(info.value), f"{bad.kind}: {bad.names!r} not in {info.value}"
    if before is not None:
        assert state(cache) == before, bad.kind
    TRIED[f"api: {bad.kind.split(' (')[0]}"] += 1


def test_a_failed_pow2_admit_leaves_external_fragmentation_as_it_was() -> None:
    """The pow2 contiguous cache counts gaps smaller than the last reservation size as
    external fragmentation; a CapacityError must not update that size first."""
    cache = ContiguousKVCache(G, 4 * MAX_LEN, MAX_LEN, "pow2", store_kv=False)
    for rid, n in (("a", 16), ("b", 16), ("c", 32), ("d", 16), ("e", 32), ("f", 16)):
        cache.admit(rid, list(range(1, n + 1)))
    cache.free("b")
    cache.free("d")
    cache.admit("g", [1, 2, 3, 4, 5])  # 8 slots: gaps of 8 and 16 left, none < 8
    before = cache.stats()
    assert before.external_fragmentation_slots == 0
    with pytest.raises(CapacityError):
        cache.admit("h", list(range(1, 21)))  # needs 32 contiguous slots
    assert cache.stats() == before
    TRIED["api: too big to admit"] += 1


G8 = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=4, dtype="fp8_e4m3", num_q_heads=Q_HEADS)


def _groups(dtype: torch.dtype = torch.float8_e4m3fn, **scales: Any) -> LayerGroupsPagedCache:
    """A layer-group cache (full + window 3) of `dtype` with the given fp8 scales."""
    specs = (KVCacheSpec.full(), KVCacheSpec.sliding_window(3))
    model = ModelKVSpec("m", tuple(LayerGroup(s, 2, 2, 4, "float32") for s in specs))
    return LayerGroupsPagedCache(model, 8, 2, dtype=dtype, **scales)


BIG = KVGeometry(num_layers=80, num_kv_heads=8, head_dim=128, dtype="float16", num_q_heads=64)


@pytest.mark.parametrize(
    ("build", "error", "names"),
    [
        (lambda: ContiguousKVCache("g", 64, 16), ConfigError, "'g'"),  # type: ignore[arg-type]  # deliberately bad input
        (lambda: PagedKVCache("g", 8, 4), ConfigError, "'g'"),  # type: ignore[arg-type]  # deliberately bad input
        (lambda: ContiguousKVCache(G, 64, 16, device="warp-drive"), ConfigError, "'warp-drive'"),
        (lambda: PagedKVCache(G, 8, 4, device="warp-drive"), ConfigError, "'warp-drive'"),
        (lambda: ContiguousKVCache(G, 10**30, 16), ConfigError, str(10**30)),
        (lambda: PagedKVCache(G, 10**30, 4), ConfigError, str(10**30)),
        (lambda: PagedKVCache(G, 8, 10**30), ConfigError, str(10**30)),
        (lambda: PagedKVCache(G, 8, 4, num_cpu_blocks=10**30), ConfigError, str(10**30)),
        (lambda: PagedKVCache(G, 8, 4, watermark=float("nan")), ConfigError, "nan"),
        (lambda: ContiguousKVCache(G, 64, 16, "lifo"), ConfigError, "'lifo'"),
        (lambda: PagedKVCache(BIG, 2**30, 16), CapacityError, "2,814,749,767,106,560 bytes"),
        (lambda: ContiguousKVCache(BIG, 2**40, 16), CapacityError, "key arena"),
        # fp8 scales: zero, negative, NaN, inf, float32 underflow / overflow, wrong shape
        (lambda: PagedKVCache(G8, 8, 4, k_scale=1e-320, v_scale=1.0), ConfigError, "1e-320"),
        (lambda: PagedKVCache(G8, 8, 4, k_scale=1.0, v_scale=1e39), ConfigError, "1e+39"),
        (lambda: _groups(k_scale=0.0, v_scale=1.0), ConfigError, "holds 0.0"),
        (lambda: _groups(k_scale=-1.0, v_scale=-1.0), ConfigError, "holds -1.0"),
        (lambda: _groups(k_scale=1.0, v_scale=math.nan), ConfigError, "holds nan"),
        (lambda: _groups(k_scale=math.inf, v_scale=1.0), ConfigError, "holds inf"),
        (lambda: _groups(k_scale=1e-320, v_scale=1.0), ConfigError, "1e-320"),
        (lambda: _groups(k_scale=1e30, v_scale=1e39), ConfigError, "1e+39"),
        (lambda: _groups(k_scale=[1.0] * 3, v_scale=1.0), ConfigError, "shape (3,)"),
        (lambda: _groups(k_scale=1.0), ConfigError, "both static"),
        (lambda: _groups(torch.float16, k_scale=1.0, v_scale=1.0), ConfigError, "not fp8"),
        (lambda: _groups(torch.int8), ConfigError, "int8"),
        (lambda: _groups(kernel_backend="warp"), ConfigError, "'warp'"),
    ],
)
def test_a_bad_cache_is_refused_at_construction(build, error, names: str) -> None:
    """Bad construction arguments, and a pool too big to allocate, raise the project's
    errors naming them (the tensors are allocated before any bookkeeping, so a pool that
    cannot be had fails at once)."""
    with pytest.raises(error) as info:
        build()
    assert names in str(info.value)
    TRIED["api: bad construction"] += 1


#: Block sizes every entry point refuses (`workloads.block_size`: one range, [1, 2^16]).
BAD_BLOCK_SIZES: tuple[object, ...] = (0, -1, 10**9, 2**16 + 1, "abc", 1.5, 16.0, True, None)
#: Entry points that take a block size: each builds from it or refuses it.
BLOCK_SIZE_TAKERS: dict[str, Callable[[Any], object]] = {
    "PagedKVCache": lambda bs: PagedKVCache(G, 8, bs, num_cpu_blocks=4),
    "BlockPool": lambda bs: BlockPool(8, bs),
    "CacheSpec.build": lambda bs: CacheSpec(geometry=G, num_blocks=8, block_size=bs).build(),
    "TimeModel": lambda bs: TimeModel(get_profile("cpu"), G, 10**6, 1e6, bs),
    "plan_capacity": lambda bs: plan_capacity("m", G, 2**20, bs),
    "block_accesses": lambda bs: block_accesses(Trace((TraceRequest("a", 0.0, 4, 1),)), bs),
    "DescribedIdentities": lambda bs: DescribedIdentities(bs, 3 * 2**16),
}


@pytest.mark.parametrize("taker", sorted(BLOCK_SIZE_TAKERS))
def test_a_bad_block_size_is_refused_by_every_entry_point(taker: str) -> None:
    """0, -1, 10^9, 2^16 + 1, a word, a fraction, a float 16.0, a bool and None: a
    ConfigError naming `block_size` and the value; 3 (no power-of-two rule) and the
    range's ends are taken."""
    build = BLOCK_SIZE_TAKERS[taker]
    for bad in BAD_BLOCK_SIZES:
        with pytest.raises(ConfigError) as info:
            build(bad)
        assert "block_size" in str(info.value) and repr(bad) in str(info.value), info.value
        TRIED["api: bad block size"] += 1
    for good in (3, 1, 2**16):
        build(good)


@pytest.mark.parametrize("which", sorted(CACHES))
@pytest.mark.parametrize("token_ids", [5, 2.5, object()])
def test_token_ids_that_are_not_a_sequence(which: str, token_ids: object) -> None:
    cache = _filled(CACHES[which])
    before = state(cache)
    with pytest.raises(ShapeError, match="token_ids must be a sequence"):
        cache.append("a", *_kv(1), token_ids=token_ids)
    assert state(cache) == before
    TRIED["api: token ids of the wrong length"] += 1


# ------------------------------------------------------------------ trace API, extremes

_HUGE = (1e30, 10**30, 10**400, math.inf, -math.inf, math.nan)
TRACE_EXTREMES: list[tuple[str, object]] = [
    *(("arrival", v) for v in (*_HUGE, -1e-320, 2.0**22 * (1 + 2**-52))),
    *(
        (name, v)
        for name in ("prompt_len", "output_len")
        for v in (*_HUGE, 2**24 + 1, 1e-320, -0.0, 0)
    ),
    *((name, v) for name in ("n", "beam_width") for v in (*_HUGE, 1025, 1e-320, 0)),
    ("prompt", (1, 2**63)),
    ("prompt", (1, 10**30)),
    ("output_tokens", (2**63, 1)),
]


@pytest.mark.parametrize(
    ("field", "value"), TRACE_EXTREMES, ids=[f"{f}={v!r:.20}" for f, v in TRACE_EXTREMES]
)
def test_a_trace_request_with_an_extreme_number_is_refused(field: str, value: object) -> None:
    """Every numeric field of a request (`workloads.trace`: the bounds and why) refuses
    magnitudes past its bound, NaN and infinities, naming the field and the value (a
    10^400 cut short); the largest arrival (2^22 s) and length (2^24) are taken."""
    fields: dict[str, object] = {"id": "a", "arrival": 0.0, "prompt_len": 2, "output_len": 2}
    if field == "prompt":
        fields["prompt"] = value
    elif field == "output_tokens":
        fields["output_tokens"] = value
    else:
        fields[field] = value
    with pytest.raises(TraceError) as info:
        TraceRequest(**fields)  # type: ignore[arg-type]  # deliberately bad input
    assert info.value.field == field, info.value
    assert len(str(info.value)) < 300
    TRIED["api: trace extreme"] += 1


def test_the_bounds_themselves_are_taken() -> None:
    req = TraceRequest("a", float(MAX_ARRIVAL_S), MAX_TOKENS, MAX_TOKENS, n=1024)
    assert req.arrival == 2.0**22 and req.prompt_len == 2**24
    assert TraceRequest("z", -0.0, 1, 1).arrival.hex() == "0x0.0p+0"  # -0 reads as +0


@pytest.mark.parametrize("scale", [1e-300, 1e-320, 1e-6])
def test_time_scaling_past_the_latest_arrival_is_refused(scale: float) -> None:
    """Scaled arrivals are checked after scaling: 10 s / 1e-6 = 10^7 s is past 2^22 s
    (the scale alone is in the flags' range); the error names the scale and request."""
    trace = Trace((TraceRequest("early", 0.0, 1, 1), TraceRequest("late", 10.0, 1, 1)))
    with pytest.raises(ConfigError) as info:
        time_scaled(trace, scale, "--time-scale")
    assert "--time-scale" in str(info.value) and "'late'" in str(info.value)
    assert time_scaled(trace, 1e300).requests[1].arrival == 10.0 / 1e300
    TRIED["api: trace extreme"] += 1


@st.composite
def bad_kernel_requests(draw: st.DrawFn) -> tuple[dict[str, Any], int, str]:
    """(keyword arguments, block size, the text the refusal must hold) of a paged decode
    whose requested backend cannot run the launch plan, or names no backend."""
    kind = draw(st.sampled_from(["C++ block size", "unknown backend"]))
    if kind == "C++ block size":
        bs = draw(st.sampled_from([257, 300, 512]))
        window = draw(st.one_of(st.none(), st.integers(1, 40),
                                st.integers(1, 40).map(KVCacheSpec.chunked_local)))  # fmt: skip
        return {"backend": "cpu_paged", "window": window}, bs, f"block size {bs} > 256"
    name = draw(st.text(min_size=1, max_size=6).filter(lambda s: s not in (
        "torch", "triton", "cpu_paged", "torch_gather")))  # fmt: skip
    return {"backend": name}, 16, f"backend={name!r}"


@settings(max_examples=25)
@given(bad=bad_kernel_requests())
def test_a_kernel_backend_that_cannot_run_the_plan_is_refused_and_writes_nothing(
    bad: tuple[dict[str, Any], int, str],
) -> None:
    """The launch plan's refusal (kernels.backends): ConfigError naming the value that
    rules the backend out, and the output buffer untouched."""
    from kvbench.kernels import ops

    kwargs, bs, names = bad
    kc = torch.zeros(2, bs, 1, 8)
    q = torch.zeros(1, 2, 8)
    out = torch.full_like(q, 3.0)
    tables, lens = (
        torch.tensor([[0, 1]], dtype=torch.int32),
        torch.tensor([bs + 1], dtype=torch.int32),
    )
    with pytest.raises(ConfigError) as info:
        ops.paged_decode_attention(q, kc, kc.clone(), tables, lens, out=out, **kwargs)
    assert names in str(info.value), (names, str(info.value))
    assert bool((out == 3.0).all())
    TRIED["api: kernel backend"] += 1


#: Chunk sizes every chunked-local entry point refuses (an int >= 1: tokens per chunk).
BAD_CHUNKS: tuple[object, ...] = (0, -1, -8, 2.5, 8.0, "8", True, None)


def _llama4_config(chunk: object) -> dict[str, object]:
    return {"model_type": "llama4_text", "num_hidden_layers": 4, "num_attention_heads": 4,
            "num_key_value_heads": 2, "hidden_size": 64, "attention_chunk_size": chunk}  # fmt: skip


#: Entry points that take an attention chunk, each building from it or refusing it.
CHUNK_TAKERS: dict[str, Callable[[Any], object]] = {
    "KVCacheSpec.chunked_local": KVCacheSpec.chunked_local,
    "KVCacheSpec(kind, chunk=)": lambda c: KVCacheSpec(AttentionKind.CHUNKED_LOCAL, chunk=c),
    "oracle.extend_attention": lambda c: oracle.extend_attention(
        torch.ones(1, 2, 4), torch.ones(3, 1, 4), torch.ones(3, 1, 4), chunk=c
    ),
    "hf_spec (attention_chunk_size)": lambda c: model_spec_from_hf_config(_llama4_config(c)),
}


@pytest.mark.parametrize("taker", sorted(CHUNK_TAKERS))
def test_a_bad_chunk_is_refused_by_every_entry_point(taker: str) -> None:
    """0, negatives, fractions, a float 8.0, a word, a bool and None: a ConfigError naming
    the chunk and the value; 1 and 8 are taken."""
    build = CHUNK_TAKERS[taker]
    for bad in BAD_CHUNKS:
        if bad is None and taker.startswith("oracle"):
            continue  # None is the oracle's "no chunking"
        if bad is None and taker.startswith("hf_spec"):
            continue  # no attention_chunk_size: Llama 4 without chunking (all full)
        with pytest.raises(ConfigError) as info:
            build(bad)
        assert "chunk" in str(info.value) and repr(bad) in str(info.value), info.value
        TRIED["api: bad chunk"] += 1
    for good in (1, 8):
        build(good)


@pytest.mark.parametrize(
    "build",
    [
        lambda s: LayerGroupsPagedCache(s, num_blocks=8, block_size=16),
        lambda s: LayerGroupServingCache(s, num_blocks=8, block_size=16),
        lambda s: plan_spec_capacity(s, 2**20, 16),
    ],
    ids=["LayerGroupsPagedCache", "LayerGroupServingCache", "plan_spec_capacity"],
)
def test_a_chunk_of_part_blocks_is_refused_where_pages_are_planned(build) -> None:  # type: ignore[no-untyped-def]
    """vLLM asserts attention_chunk_size % block_size == 0; so does every cache and plan
    that pages a chunked-local group (chunk 24, blocks of 16), naming both; 32 is taken."""

    def model(chunk: int) -> ModelKVSpec:
        spec = KVCacheSpec.chunked_local(chunk)
        return ModelKVSpec("m", (LayerGroup(spec, 2, 2, 4, "float32"),))

    with pytest.raises(ConfigError, match="chunk=24 is not a multiple of block_size=16"):
        build(model(24))
    build(model(32))
    TRIED["api: bad chunk"] += 1


def test_a_kernel_window_of_a_kind_that_reads_no_self_attention_is_refused() -> None:
    from kvbench.kernels import ops

    kc = torch.zeros(2, 4, 1, 8)
    q, out = torch.zeros(1, 2, 8), torch.full((1, 2, 8), 3.0)
    tables, lens = torch.tensor([[0, 1]], dtype=torch.int32), torch.tensor([5], dtype=torch.int32)
    with pytest.raises(ConfigError, match="cross-attention, encoder 4"):
        ops.paged_decode_attention(q, kc, kc.clone(), tables, lens, out=out,
                                   window=KVCacheSpec.cross_attention(4))  # fmt: skip
    assert bool((out == 3.0).all())
    TRIED["api: bad chunk"] += 1
