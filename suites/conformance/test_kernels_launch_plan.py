"""The launch plan and the backend chooser (`kernels.launch_plan`, `kernels.backends`).

* The plan's window rule (first key, first block, span) against brute force over the
  positions every query row reads (an independent enumeration, not the formula).
* Hostile plans: each combination a requested backend cannot run raises ConfigError
  naming the value that rules it out (block size, device, the request itself, the
  environment variable), before anything is written.
* Supported plans route to the expected backend with the expected reason, the others it
  skipped named with theirs; fp8 with a window routes alike for decode and prefill.
* Results unchanged: each backend asked for by name gives the output it gave before the
  plan existed (the gather path bit for bit against `torch_ops` called directly).
"""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvbench.kernels import backends, configs, cpu_paged, ops, torch_ops, window_rule
from kvbench.kernels import validation as val
from kvbench.suites.conformance.hostile import TRIED
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.kv_rules import RULES, rule_for_window
from kvbench.workloads.kv_spec import KVCacheSpec

META = torch.device("meta")


def _decode_args(bs: int, dtype: torch.dtype = torch.float32, device: str = "cpu", seed: int = 0):  # type: ignore[no-untyped-def]
    """(query, k_cache, v_cache, tables, lens): 2 sequences of bs + 3 and 2 * bs tokens."""
    gen = torch.Generator().manual_seed(seed)
    if device == "meta":
        kc = torch.empty(4, bs, 2, 16, dtype=dtype, device=META)
        q = torch.empty(2, 4, 16, dtype=torch.float32 if dtype.itemsize == 1 else dtype,
                        device=META)  # fmt: skip
        idx = torch.empty(2, 2, dtype=torch.int32, device=META)
        return q, kc, torch.empty_like(kc), idx, torch.empty(2, dtype=torch.int32, device=META)
    kc = torch.randn(4, bs, 2, 16, generator=gen)
    vc = torch.randn(4, bs, 2, 16, generator=gen)
    q = torch.randn(2, 4, 16, generator=gen)
    if dtype.itemsize == 1:  # fp8 bytes; a float32 query
        kc, vc = kc.to(dtype), vc.to(dtype)
    else:
        kc, vc, q = kc.to(dtype), vc.to(dtype), q.to(dtype)
    tables = torch.tensor([[0, 1], [2, 3]], dtype=torch.int32)
    lens = torch.tensor([bs + 3, 2 * bs], dtype=torch.int32)
    return q, kc, vc, tables, lens


def _prefill_args(bs: int, dtype: torch.dtype = torch.float32):  # type: ignore[no-untyped-def]
    q, kc, vc, tables, lens = _decode_args(bs, dtype)
    cu = torch.tensor([0, 2, 5], dtype=torch.int32)
    return q.repeat(3, 1, 1)[:5].contiguous(), kc, vc, tables, cu, lens


def _fp8_scales() -> dict[str, Any]:
    return {"k_scale": torch.tensor([0.5, 2.0]), "v_scale": torch.tensor([1.0, 0.25])}


# ------------------------------------------------------------------ the window rule


@pytest.mark.parametrize("window", [None, 1, 3, 16, 17, 40])
@pytest.mark.parametrize("bs", [1, 7, 16])
def test_window_rule_matches_the_positions_every_row_reads(window: int | None, bs: int) -> None:
    """First key, first block and span against an enumeration of the keys each query
    row attends to (row i of n new tokens at position L - n + i sees keys p with
    p <= L - n + i and, with a window, p > L - n + i - window)."""
    for length in (1, 2, 5, 16, 17, 33, 60):
        for n in {1, min(3, length), length}:
            seen = [
                p
                for i in range(n)
                for p in range(length)
                if p <= length - n + i and (window is None or p > length - n + i - window)
            ]
            assert window_rule.window_start(length, window, n) == min(seen)
            assert window_rule.first_block(length, window, bs, n) == min(seen) // bs
            lens = torch.tensor([length])
            assert int(window_rule.first_block(lens, window, bs, n)[0]) == min(seen) // bs
            # the span covers every key read, from the first block on
            read = max(seen) + 1 - window_rule.first_block(length, window, bs, n) * bs
            assert read <= window_rule.span(length, bs, window, n)


def test_the_plan_holds_the_facts_and_one_span() -> None:
    q, kc, vc, tables, lens = _decode_args(16, torch.float8_e4m3fn)
    launch = ops.decode_launch(q, kc, vc, tables, lens, window=5, backend="torch_gather",
                               **_fp8_scales())  # fmt: skip
    plan = launch.plan
    assert (plan.op, plan.device, plan.block_size, plan.head_dim) == ("decode", "cpu", 16, 16)
    assert (plan.kv_format, plan.scales, plan.window) == ("fp8_e4m3", "per_kv_head", 5)
    assert (plan.query_dtype, plan.kv_dtype) == (torch.float32, torch.float8_e4m3fn)
    assert plan.max_seq_len == 32 and plan.span == min(32, 5 + 16 - 1)
    assert plan.first_block(lens.to(torch.int64)).tolist() == [(19 - 5) // 16, (32 - 5) // 16]
    assert "fp8_e4m3" in plan.describe() and "window 5" in plan.describe()
    with pytest.raises(AttributeError):
        plan.window = None  # type: ignore[misc]  # immutable


def test_the_request_names_agree() -> None:
    assert set(val.BACKENDS) == {"torch", *backends.BACKENDS}
    assert set(backends.SUPPORTS) == set(backends.BACKENDS)


# ------------------------------------------------------------------ hostile plans


#: (what, call, the text the ConfigError must hold)
def _hostile():  # type: ignore[no-untyped-def]
    big = _decode_args(512)
    meta = _decode_args(16, device="meta")
    return [
        ("C++ asked for blocks of 512",
         lambda: ops.paged_decode_attention(*big, backend="cpu_paged"),
         "block size 512 > 256 the C++ kernel is compiled for"),
        ("C++ asked for a prefill over blocks of 512",
         lambda: ops.paged_prefill_attention(*_prefill_args(512), backend="cpu_paged",
                                             window=3),
         "block size 512 > 256"),
        ("C++ asked for meta tensors",
         lambda: ops.paged_decode_attention(*meta, backend="cpu_paged", check_indices=False,
                                            max_seq_len=20),
         "device meta: the C++ kernel reads CPU tensors only"),
        ("an unknown backend", lambda: ops.paged_decode_attention(*big, backend="cuda"),
         "backend='cuda'"),
        ("an unknown backend for a prefill",
         lambda: ops.prefill_launch(*_prefill_args(16), backend="cpp"), "backend='cpp'"),
    ]  # fmt: skip


@pytest.mark.parametrize("case", range(5))
def test_a_backend_that_cannot_run_the_plan_is_refused_naming_the_value(case: int) -> None:
    what, call, names = _hostile()[case]
    with pytest.raises(ConfigError) as info:
        call()
    assert names in str(info.value), (what, str(info.value))
    TRIED["api: kernel backend"] += 1


def test_the_refusal_lists_every_backend_and_advises_nothing_that_fails() -> None:
    """The message says what each backend answers; the ones it calls able to run the
    plan really run it."""
    q, kc, vc, tables, lens = _decode_args(512)
    with pytest.raises(ConfigError) as info:
        ops.paged_decode_attention(q, kc, vc, tables, lens, backend="cpu_paged")
    msg = str(info.value)
    for name in backends.BACKENDS:
        assert f"{name}: " in msg
    assert "torch_gather: runs it" in msg and "triton: runs it" in msg
    ops.paged_decode_attention(q, kc, vc, tables, lens, backend="torch_gather")
    assert "KVBENCH_CPU_KERNEL" not in msg and "backend='torch'" not in msg


def test_a_refused_call_writes_nothing() -> None:
    q, kc, vc, tables, lens = _decode_args(512)
    out = torch.full_like(q, 7.0)
    with pytest.raises(ConfigError):
        ops.paged_decode_attention(q, kc, vc, tables, lens, out=out, backend="cpu_paged")
    assert bool((out == 7.0).all())


@pytest.mark.parametrize("value", ["cpp", "TORCHX", "1"])
def test_a_bad_environment_request_is_refused_naming_it(
    value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KVBENCH_CPU_KERNEL", value)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ConfigError, match=f"KVBENCH_CPU_KERNEL='{value}'"):
        ops.decode_launch(*_decode_args(16))
    TRIED["api: kernel backend"] += 1


def test_triton_missing_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "_triton_installed", lambda: False)
    with pytest.raises(ConfigError, match="triton package is not installed"):
        ops.decode_launch(*_decode_args(16), backend="triton")


# ------------------------------------------------------------------ supported plans


def test_routes_without_the_cpp_build(monkeypatch: pytest.MonkeyPatch) -> None:
    """Plans decided before the C++ kernel's build status is asked."""
    monkeypatch.delenv("KVBENCH_CPU_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    big = _decode_args(512)
    got = ops.decode_launch(*big)
    assert got.backend == "torch_gather"
    assert got.reason.startswith("automatic on cpu: C++ kernel first")
    assert "skipped cpu_paged: block size 512 > 256" in got.reason
    got = ops.decode_launch(*big, backend="torch", window=4)
    assert got.backend == "torch_gather" and "backend='torch'" in got.reason
    assert "block size 512 > 256" in got.reason
    meta = ops.decode_launch(*_decode_args(16, device="meta"), check_indices=False,
                             max_seq_len=20)  # fmt: skip
    assert meta.backend == "torch_gather" and "cpu_paged: device meta" in meta.reason
    assert ops.decode_launch(*big, backend="triton").backend == "triton"
    assert ops.decode_launch(*big, backend="triton").reason == "backend='triton' requested"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    got = ops.prefill_launch(*_prefill_args(16))
    assert got.backend == "triton" and "TRITON_INTERPRET" in got.reason
    monkeypatch.setenv("KVBENCH_CPU_KERNEL", "torch")  # the interpreter still goes first
    assert ops.prefill_launch(*_prefill_args(16)).backend == "triton"
    monkeypatch.delenv("TRITON_INTERPRET")
    got = ops.prefill_launch(*_prefill_args(16))
    assert got.backend == "torch_gather" and got.reason == "KVBENCH_CPU_KERNEL=torch requested"
    got = ops.decode_launch(*_decode_args(16), backend="torch")
    assert got.backend == "torch_gather" and "KVBENCH_CPU_KERNEL=torch" in got.reason
    # an explicit backend argument wins over the variable
    assert ops.decode_launch(*big, backend="torch_gather").backend == "torch_gather"
    assert ops.choose_backend(torch.device("cpu"), "cpu_paged") == "torch"


@pytest.mark.parametrize("kv", [torch.float32, torch.bfloat16, torch.float8_e5m2])
@pytest.mark.parametrize("window", [None, 5])
def test_decode_and_prefill_route_alike(
    kv: torch.dtype, window: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """fp8 or not, window or not: decode and prefill of one geometry take one backend,
    the C++ kernel where it is built (the issue: fp8 + window once raised in decode and
    fell back silently in prefill)."""
    monkeypatch.delenv("KVBENCH_CPU_KERNEL", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    scales = _fp8_scales() if kv.itemsize == 1 else {}
    q, kc, vc, tables, lens = _decode_args(16, kv)
    dec = ops.decode_launch(q, kc, vc, tables, lens, window=window, **scales)
    pq, *_, cu, plens = _prefill_args(16, kv)
    pre = ops.prefill_launch(pq, kc, vc, tables, cu, plens, window=window, **scales)
    status = cpu_paged.status()
    want = "cpu_paged" if status.path == "cpp" else "torch_gather"
    assert dec.backend == pre.backend == want
    if want == "torch_gather":
        assert status.reason in dec.reason
    ops.paged_decode_attention(q, kc, vc, tables, lens, window=window, **scales)
    ops.paged_prefill_attention(pq, kc, vc, tables, cu, plens, window=window, **scales)


@pytest.mark.parametrize("kv", [torch.float32, torch.float8_e4m3fn])
@pytest.mark.parametrize("window", [None, 5])
def test_each_backend_gives_what_it_gave_before(kv: torch.dtype, window: int | None) -> None:
    """backend="torch_gather" is `torch_ops` bit for bit; "cpu_paged" (where built) is
    what backend="torch" ran; the two agree within float32 rounding."""
    scales = _fp8_scales() if kv.itemsize == 1 else {}
    q, kc, vc, tables, lens = _decode_args(16, kv, seed=3)
    gather = ops.paged_decode_attention(q, kc, vc, tables, lens, backend="torch_gather",
                                        window=window, **scales)  # fmt: skip
    dims = val.check_decode(q, kc, vc, tables, lens, window=window)
    kvs = (scales["k_scale"], scales["v_scale"]) if scales else None
    direct = torch_ops.paged_decode_attention(
        q, kc, vc, tables, lens, 0.25, torch.empty_like(q), dims, kvs, window=window
    )
    assert torch.equal(gather, direct)
    if cpu_paged.status().path != "cpp":
        pytest.skip(f"C++ CPU kernel unavailable here: {cpu_paged.status().reason}")
    cpp = ops.paged_decode_attention(q, kc, vc, tables, lens, backend="cpu_paged",
                                     window=window, **scales)  # fmt: skip
    side = ops.paged_decode_attention(q, kc, vc, tables, lens, backend="torch",
                                      window=window, **scales)  # fmt: skip
    assert torch.equal(cpp, side)
    assert torch.allclose(cpp, gather, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("window", "reach", "cpu", "variant"),
    [
        (None, 0, 0, {}),
        (7, 7, 7, {"windowed": True}),
        (KVCacheSpec.sliding_window(7), 7, 7, {"windowed": True}),
        (KVCacheSpec.chunked_local(8), 8, -8, {"windowed": True, "chunked": True}),
    ],
    ids=["full", "window-int", "window-spec", "chunk"],
)
def test_the_kernels_device_parameters_come_from_the_rule(
    window: Any, reach: int, cpu: int, variant: dict[str, bool]
) -> None:
    """What the Triton and C++ bodies take (no kernel module tests a kind): the Triton
    `window` int and variant keywords, the C++ signed window; and every kind's variant is
    one the AOT list compiles (a kind whose variant configs.py lacks fails here)."""
    rule = rule_for_window(window)
    assert (rule.device_reach, rule.cpu_window, dict(rule.device_variant)) == (reach, cpu, variant)
    assert cpu_paged._signed(window) == cpu
    compiled = {tuple(sorted(c.constexprs.items())) for c in configs.all_configs()}
    for cls in RULES.values():
        if not cls.self_attention:
            continue
        flags = dict(cls.device_variant)
        cfg = configs.reduce_config(torch.float16, 128, **flags)
        assert tuple(sorted(cfg.constexprs.items())) in compiled, (cls.__name__, flags)
