"""No host reads in a timed kernel call, proved on a CPU with the Triton launch stubbed.

On CUDA any read of a tensor's values on the host (`.item()`, `int(t)`, `.to("cpu")`,
a boolean-mask index, ...) synchronizes the stream; inside do_bench's events it turns
kernel time into kernel-plus-host time. Here every kernel op, every timed closure of the
kernel sweeps, the gate's GPU ratio cases, the kvbench peer adapter and the e2e attention
engines are driven through the Triton dispatch path with the launch replaced by a
recorder, under `HostReadRecorder`, and must read nothing back: the ops get their maxima
from the caller and skip index checks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kvbench.kernels import ops, triton_ops
from kvbench.kernels.host_reads import HostReadRecorder
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import all_sweeps
from kvbench.suites.conformance.fp8_launch import Fp8Launch

Launch = tuple[str, tuple[int, ...]]


class StubLaunch:
    """Stands in for `triton_ops._launch`: records (kernel, grid) and, while `run` is
    set, runs the real interpreted launch (so untimed reference calls get real output)."""

    def __init__(self, real: Callable[..., None]) -> None:
        self.real = real
        self.run = False
        self.launches: list[Launch] = []

    def __call__(self, cfg: Any, grid: tuple[int, ...], device: torch.device, *args: Any) -> None:
        self.launches.append((cfg.kernel, grid))
        if self.run:
            self.real(cfg, grid, device, *args)


@pytest.fixture
def launch(monkeypatch: pytest.MonkeyPatch) -> StubLaunch:
    stub = StubLaunch(triton_ops._launch)
    monkeypatch.setattr(triton_ops, "_launch", stub)
    return stub


def _reads(fn: Callable[[], object]) -> list[str]:
    with HostReadRecorder() as rec:
        fn()
    return rec.summary()


def _pool(blocks: int, bs: int, hkv: int, d: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    shape = (blocks, bs, hkv, d)
    return torch.randn(shape, generator=gen), torch.randn(shape, generator=gen)


def _attention_inputs() -> dict[str, Any]:
    k, v = _pool(12, 8, 2, 16)
    tables = torch.tensor([[3, 7, 1, 0, 5], [2, 9, 11, -1, -1]], dtype=torch.int32)
    return {
        "k_cache": k,
        "v_cache": v,
        "block_tables": tables,
        "seq_lens": torch.tensor([37, 20], dtype=torch.int32),
        "query": torch.randn(2, 8, 16),
    }


# ---------------------------------------------------------------- the ops themselves


@pytest.mark.parametrize("max_seq_len", [37, None], ids=["given", "bound"])
@pytest.mark.parametrize("partition_size", [None, 16], ids=["single", "split"])
def test_decode_reads_nothing(
    launch: StubLaunch, max_seq_len: int | None, partition_size: int | None
) -> None:
    x = _attention_inputs()
    out = torch.empty_like(x["query"])
    reads = _reads(
        lambda: ops.paged_decode_attention(
            **x,
            out=out,
            backend="triton",
            check_indices=False,
            max_seq_len=max_seq_len,
            partition_size=partition_size,
        )
    )
    assert reads == []
    kernels = {k for k, _ in launch.launches}
    assert "paged_decode" in kernels
    assert ("paged_decode_reduce" in kernels) == (partition_size == 16)


def test_decode_with_checks_reads_and_is_seen(launch: StubLaunch) -> None:
    """The recorder is not blind: index checks on read the lengths and tables."""
    x = _attention_inputs()
    reads = _reads(lambda: ops.paged_decode_attention(**x, backend="triton"))
    assert "to(cpu)" in reads and "int()" in reads


@pytest.mark.parametrize("maxima", [(37, 6), (None, None)], ids=["given", "bound"])
def test_prefill_reads_nothing(launch: StubLaunch, maxima: tuple[int | None, ...]) -> None:
    x = _attention_inputs()
    query = torch.randn(9, 8, 16)
    cu = torch.tensor([0, 6, 9], dtype=torch.int32)
    reads = _reads(
        lambda: ops.paged_prefill_attention(
            query,
            x["k_cache"],
            x["v_cache"],
            x["block_tables"],
            cu,
            x["seq_lens"],
            backend="triton",
            check_indices=False,
            max_seq_len=maxima[0],
            max_q_len=maxima[1],
        )
    )
    assert reads == []
    assert [k for k, _ in launch.launches] == ["paged_prefill"]


def test_fp8_write_decode_copy_read_nothing(launch: StubLaunch) -> None:
    """fp8 pools: with index checks off the scales are not read on the host either."""
    k, v = (t.to(torch.float8_e4m3fn) for t in _pool(6, 4, 2, 16))
    s = torch.ones(2)
    fp8: Fp8Launch = {"backend": "triton", "check_indices": False, "k_scale": s, "v_scale": s}
    key = torch.randn(3, 2, 16, dtype=torch.float16)
    x = _attention_inputs()
    xk, xv = (x[n].to(torch.float8_e4m3fn) for n in ("k_cache", "v_cache"))
    calls = [
        lambda: ops.write_kv(k, v, key, key, torch.tensor([5, -1, 17]), **fp8),
        lambda: ops.paged_decode_attention(
            x["query"].half(), xk, xv, x["block_tables"], x["seq_lens"], max_seq_len=37, **fp8
        ),
        lambda: ops.copy_blocks(
            k, v, torch.tensor([[1, 4]]), backend="triton", check_indices=False
        ),
    ]
    for call in calls:
        assert _reads(call) == []
    assert {name for name, _ in launch.launches} >= {"quantize_rows", "paged_decode", "copy_rows"}


def test_write_copy_swap_read_nothing(launch: StubLaunch) -> None:
    k, v = _pool(6, 4, 2, 16)
    key, value = torch.randn(3, 2, 16), torch.randn(3, 2, 16)
    slots = torch.tensor([5, -1, 17])
    pairs = torch.tensor([[1, 4], [2, 3]])
    other = torch.zeros(3, 4, 2, 16)
    mapping = torch.tensor([[0, 2], [5, 0]])
    calls = [
        lambda: ops.write_kv(k, v, key, value, slots, backend="triton", check_indices=False),
        lambda: ops.copy_blocks(k, v, pairs, backend="triton", check_indices=False),
        lambda: ops.swap_blocks(k, other, mapping, backend="triton", check_indices=False),
    ]
    for call in calls:
        assert _reads(call) == []
    assert [name for name, _ in launch.launches] == ["copy_rows"] * 5


# ---------------------------------------------------------------- the timed closures


class RecordingContext(BenchContext):
    """A bench context whose `time(fn)` runs `fn` once under the recorder (launch
    stubbed) instead of timing it; calls outside `time` run the real launch."""

    stub: StubLaunch
    timed_reads: list[list[str]]

    def time(self, fn: Any) -> dict[str, float | int]:
        self.stub.run = False
        self.timed_reads.append(_reads(fn))
        self.stub.run = True
        return {"median": 1e-3, "q1": 1e-3, "q3": 1e-3, "mean": 1e-3, "n": 1}

    def copy_peak(self) -> float:
        return 1e9


#: A tiny case per kernel sweep (the sweep's own grid is too big for the interpreter).
KERNEL_CASES: dict[str, dict[str, Any]] = {
    "kernel.decode": {"block_size": 16, "ctx_len": 40, "batch": 2, "dtype": "float32", "gqa": 2},
    "kernel.prefill": {
        "block_size": 16,
        "ctx_len": 40,
        "q_len": 8,
        "batch": 2,
        "dtype": "float32",
        "gqa": 2,
    },
}


#: Kernel sweeps that time nothing (the ahead-of-time compile costs, the predictions), and
#: kernel.decode_fp8, whose timed calls are the ops' fp8 decode, checked for host reads by
#: test_fp8_write_decode_copy_read_nothing above (it times three pools, no SDPA).
UNTIMED = {"kernel.static", "kernel.predicted", "kernel.decode_fp8"}


def test_every_kernel_sweep_is_covered() -> None:
    import kvbench.suites.bench.catalog  # noqa: F401  (registers every sweep)

    kernel_sweeps = {s.name for s in all_sweeps() if "kernel" in s.tags}
    assert kernel_sweeps - UNTIMED == set(KERNEL_CASES)


@pytest.mark.parametrize("name", sorted(KERNEL_CASES))
def test_kernel_sweep_timed_calls_read_nothing(
    launch: StubLaunch, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    import kvbench.suites.bench.catalog  # noqa: F401
    from kvbench.suites.bench.sweeps import kernels as sweeps

    monkeypatch.setattr(sweeps, "_backend", lambda device: "triton")
    monkeypatch.setattr(sweeps, "NUM_KV_HEADS", 2)
    monkeypatch.setattr(sweeps, "HEAD_DIM", 16)
    ctx = RecordingContext(device=torch.device("cpu"))
    ctx.stub, ctx.timed_reads = launch, []
    # the host cost per call is timed too: recorded like `time` (one call, launch stubbed),
    # not 750 interpreted launches
    monkeypatch.setattr(sweeps, "host_call_time", lambda fn, device, timing: ctx.time(fn))
    launch.run = True
    sweep = next(s for s in all_sweeps() if s.name == name)
    list(sweep.measure(KERNEL_CASES[name], ctx))
    # the paged call and SDPA on contiguous KV, then the paging-overhead pairs (the same
    # kernel over scattered blocks and over a contiguous layout, repeat by repeat)
    assert len(ctx.timed_reads) >= 2
    assert all(reads == [] for reads in ctx.timed_reads), ctx.timed_reads
    assert launch.launches, "the sweep never reached the Triton launch"


def test_gate_gpu_ratio_cases_read_nothing(
    launch: StubLaunch, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gate's paged-vs-SDPA cases, built as on a GPU (the dispatch's own backend)."""
    from kvbench.suites.gate import timing

    monkeypatch.setattr(timing, "_backend", lambda device: "triton")
    for case in (timing.decode_vs_sdpa(64), timing.prefill_vs_sdpa(48, 16)):
        candidate, reference = case.build(torch.device("cpu"), None)
        assert _reads(candidate) == [], case.name
        assert _reads(reference) == [], case.name
    assert launch.launches


def test_peer_adapter_decode_reads_nothing(launch: StubLaunch) -> None:
    from kvbench.suites.peers.kvbench_adapter import KVBenchAttention

    adapter = KVBenchAttention(backend="triton")
    x = _attention_inputs()
    run = adapter.decode_fn(
        (x["k_cache"], x["v_cache"]), x["query"], x["block_tables"], x["seq_lens"], 0.25
    )
    assert _reads(run) == []
    assert launch.launches


# ---------------------------------------------------------------- the e2e engines


class OpsRecorder:
    """Wraps the ops the e2e engines call, recording host reads inside each call."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.reads: dict[str, list[str]] = {}
        for name in ("write_kv", "paged_decode_attention", "paged_prefill_attention"):
            real = getattr(ops, name)

            def wrapped(*a: Any, _real: Any = real, _name: str = name, **kw: Any) -> Any:
                with HostReadRecorder() as rec:
                    result = _real(*a, **kw)
                self.reads.setdefault(_name, []).extend(rec.summary())
                return result

            monkeypatch.setattr(ops, name, wrapped)


def _packed(cached: list[int], lengths: list[int], layers: int, hkv: int, d: int):
    from kvbench.suites.e2e.llama_forward import pack

    gen = torch.Generator().manual_seed(1)
    ids = [list(range(n)) for n in lengths]
    prefixes = [
        (
            torch.randn(layers, c, hkv, d, generator=gen),
            torch.randn(layers, c, hkv, d, generator=gen),
        )
        for c in cached
    ]
    return pack(list(range(len(lengths))), ids, cached, prefixes)


@pytest.mark.parametrize("lengths", [[3, 5], [1, 1]], ids=["prefill", "decode"])
def test_e2e_kernel_attention_reads_nothing(
    launch: StubLaunch, monkeypatch: pytest.MonkeyPatch, lengths: list[int]
) -> None:
    from kvbench.suites.e2e.llama_forward import KernelAttention

    rec = OpsRecorder(monkeypatch)
    batch = _packed([6, 0], lengths, layers=1, hkv=2, d=16)
    total = sum(lengths)
    q, k, v = torch.randn(total, 4, 16), torch.randn(total, 2, 16), torch.randn(total, 2, 16)
    KernelAttention(4, 0.25, backend="triton", check_indices=False)(batch, 0, q, k, v)
    assert len(rec.reads) == 2 and all(r == [] for r in rec.reads.values()), rec.reads
    assert launch.launches


@pytest.mark.parametrize("new", [3, 1], ids=["prefill", "decode"])
def test_e2e_native_attention_reads_nothing(
    launch: StubLaunch, monkeypatch: pytest.MonkeyPatch, new: int
) -> None:
    from kvbench.paged.cache import PagedKVCache
    from kvbench.suites.e2e.llama_forward import PagedNativeAttention, pack
    from kvbench.workloads.geometry import KVGeometry

    cache = PagedKVCache(KVGeometry(1, 2, 16, "float32", 4), 16, 4, max_seq_len=64)
    for rid, n in ((0, 6), (1, 9)):
        cache.admit(rid, list(range(n)))
        cache.append(rid, torch.randn(1, n, 2, 16), torch.randn(1, n, 2, 16))
    batch = pack([0, 1], [[1] * new, [2] * new], [6, 9], [None, None])
    rec = OpsRecorder(monkeypatch)
    t = 2 * new
    q, k, v = torch.randn(t, 4, 16), torch.randn(t, 2, 16), torch.randn(t, 2, 16)
    PagedNativeAttention(cache, 0.25, backend="triton", check_indices=False)(batch, 0, q, k, v)
    assert len(rec.reads) == 2 and all(r == [] for r in rec.reads.values()), rec.reads
    assert launch.launches
