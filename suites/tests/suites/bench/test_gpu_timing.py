"""GPU kernel timing free of host overhead: CUDA-graph replay first, do_bench where the
capture fails, the method recorded in the stats; the host cost per call on its own.

The CPU tests stub triton's two timers (no GPU needed); the `gpu` ones run the real thing.
"""

from __future__ import annotations

import time

import pytest
import torch

from kvbench.suites.bench import harness
from kvbench.suites.bench.harness import TimingConfig, host_call_time, time_gpu


def _stub(monkeypatch: pytest.MonkeyPatch, graph, plain) -> list[str]:  # type: ignore[no-untyped-def]
    import triton.testing

    used: list[str] = []

    def fake_graph(fn, rep, return_mode):  # type: ignore[no-untyped-def]
        used.append("cudagraph")
        return graph(fn)

    def fake_plain(fn, warmup, rep, return_mode):  # type: ignore[no-untyped-def]
        used.append("do_bench")
        return plain(fn)

    monkeypatch.setattr(triton.testing, "do_bench_cudagraph", fake_graph)
    monkeypatch.setattr(triton.testing, "do_bench", fake_plain)
    return used


def test_cuda_graph_is_tried_first_and_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    used = _stub(monkeypatch, lambda fn: [0.002, 0.001, 0.003], lambda fn: pytest.fail("fell back"))
    stats = time_gpu(lambda: None)
    assert used == ["cudagraph"]
    assert stats["cuda_graph"] == 1.0
    assert stats["n"] == 3 and stats["median"] == pytest.approx(2e-6)


def test_a_failed_capture_falls_back_to_do_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(fn):  # type: ignore[no-untyped-def]
        raise RuntimeError("operation not permitted when stream is capturing")

    used = _stub(monkeypatch, refuse, lambda fn: [0.010, 0.012, 0.011, 0.013])
    monkeypatch.setattr(harness, "_recover_from_capture", lambda: used.append("recover"))
    stats = time_gpu(lambda: None, TimingConfig(repeats=3))
    assert used == ["cudagraph", "recover", "do_bench"]
    assert stats["cuda_graph"] == 0.0
    assert stats["n"] == 4 and stats["median"] == pytest.approx(11.5e-6)


def test_host_call_time_is_the_per_call_wall_time() -> None:
    """A call that sleeps 2 ms costs the host at least 2 ms; every call is counted."""
    calls = []

    def slow() -> None:
        calls.append(1)
        time.sleep(0.002)

    cfg = TimingConfig(warmup=1, repeats=3)
    stats = host_call_time(slow, torch.device("cpu"), cfg)
    assert len(calls) == 1 + 3 * 50
    assert stats["n"] == 3 and stats["inner"] == 50
    assert stats["min"] >= 0.002 and stats["median"] < 0.05


@pytest.mark.gpu
def test_on_a_gpu_a_capturable_call_is_graph_timed_and_a_syncing_one_falls_back() -> None:
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    stats = time_gpu(lambda: y.copy_(x))
    assert stats["cuda_graph"] == 1.0 and stats["median"] > 0

    def syncing() -> None:
        y.copy_(x)
        torch.cuda.synchronize()  # not allowed while capturing

    stats = time_gpu(syncing)
    assert stats["cuda_graph"] == 0.0 and stats["median"] > 0
    host = host_call_time(lambda: y.copy_(x), torch.device("cuda"))
    assert host["median"] > 0


@pytest.mark.parametrize("capturable", [True, False])
def test_kernel_rows_record_the_method_and_the_host_cost(
    monkeypatch: pytest.MonkeyPatch, capturable: bool
) -> None:
    """The kernel sweeps' GPU path (`_timed_trio`) on a context that says CUDA, with the
    timers stubbed and device syncs no-ops: both kernels' stats carry the method, the
    rows add `timing_method_is_cudagraph` (1 graph, 0 fallback) and `host_time_paged`,
    the host wall time of one paged call (here a 1 ms sleep), apart from the device time."""
    from kvbench.suites.bench.context import BenchContext
    from kvbench.suites.bench.sweeps import kernels

    def graph(fn):  # type: ignore[no-untyped-def]
        if not capturable:
            raise RuntimeError("capture refused")
        return [0.004, 0.005, 0.006]

    used = _stub(monkeypatch, graph, lambda fn: [0.020, 0.030, 0.040])
    monkeypatch.setattr(harness, "_sync", lambda device: None)
    monkeypatch.setattr(harness, "_recover_from_capture", lambda: None)
    ctx = BenchContext(torch.device("cuda"), TimingConfig(warmup=1, repeats=3))
    ctx._peak = 1e12  # the run's copy peak, as if measured (no probe on a fake device)
    calls: list[str] = []

    def paged() -> None:
        calls.append("paged")
        time.sleep(0.001)

    trio = kernels._timed_trio(ctx, paged, lambda: calls.append("contiguous"), 4_000_000)
    method = 1.0 if capturable else 0.0
    assert trio.paged["cuda_graph"] == trio.contiguous["cuda_graph"] == method
    assert used == (["cudagraph", "cudagraph"] if capturable else ["cudagraph", "do_bench"] * 2)
    rows = {m.metric: m for m in trio.gpu_rows}
    assert set(rows) == {"timing_method_is_cudagraph", "host_time_paged"}
    assert rows["timing_method_is_cudagraph"].value == method
    host = rows["host_time_paged"]
    assert host.unit == "s" and host.value >= 0.001
    assert host.stats is not None and host.stats["n"] == 3
    assert calls.count("paged") == 1 + 3 * 50  # only the host timing called it (timers stubbed)
    device_s = 5e-6 if capturable else 30e-6
    assert trio.paged["median"] == pytest.approx(device_s)
    assert trio.fraction_paged == pytest.approx(4_000_000 / device_s / 1e12)
