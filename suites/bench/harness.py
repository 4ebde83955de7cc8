"""Timing: a warm-up + repeats + median harness on CPU, CUDA graphs on GPU
(`triton.testing.do_bench_cudagraph`, falling back to `do_bench` where capture fails;
statistics over every sample it took, the method in `stats["cuda_graph"]`), the host
cost of one call (`host_call_time`), and a copy-bandwidth peak to judge achieved
bandwidth against (`CopyProbe`): timed once per run (`BenchContext.copy_peak`), or paired
with a kernel repeat by repeat (`paired_fraction`) where the machine is noisy.

Timings are in seconds. Statistics are over repeats: median, q1, q3 (25th / 75th
percentiles), min, max, mean and n. Very short calls are batched (`inner` calls per
sample) so one sample is long enough for the clock to resolve.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvbench.suites.bench.measurement import Measurement
from kvbench.workloads.errors import ConfigError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TimingConfig:
    """How hard to time: warm-up calls, repeats, and the shortest sample (seconds)."""

    warmup: int = 3
    repeats: int = 15
    min_sample_s: float = 1e-3

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.repeats < 1 or self.min_sample_s < 0:
            raise ConfigError(f"bad timing config {self!r}: need warmup >= 0, repeats >= 1")


def summarize(samples: list[float], inner: int = 1) -> dict[str, float | int]:
    """Repeat statistics of per-call times (seconds)."""
    if not samples:
        raise ConfigError("no samples to summarize")
    ordered = sorted(samples)
    if len(ordered) >= 2:
        q1, _, q3 = statistics.quantiles(ordered, n=4, method="inclusive")
    else:
        q1 = q3 = ordered[0]
    return {
        "median": statistics.median(ordered),
        "q1": q1,
        "q3": q3,
        "min": ordered[0],
        "max": ordered[-1],
        "mean": statistics.fmean(ordered),
        "n": len(ordered),
        "inner": inner,
    }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_cpu(
    fn: Callable[[], object], config: TimingConfig = TimingConfig(), device: str = "cpu"
) -> dict[str, float | int]:
    """Time `fn` with warm-up and repeats; returns per-call statistics in seconds.

    One calibration call decides how many calls (`inner`) make one sample of at least
    `config.min_sample_s`; each sample's time is divided by `inner`.
    """
    dev = torch.device(device)
    for _ in range(config.warmup):
        fn()
    _sync(dev)
    start = time.perf_counter()
    fn()
    _sync(dev)
    once = max(time.perf_counter() - start, 1e-9)
    inner = (
        max(1, min(10_000, int(config.min_sample_s / once) + 1))
        if once < config.min_sample_s
        else 1
    )
    samples = []
    for _ in range(config.repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        _sync(dev)
        samples.append((time.perf_counter() - start) / inner)
    return summarize(samples, inner)


def time_gpu(
    fn: Callable[[], object], config: TimingConfig = TimingConfig()
) -> dict[str, float | int]:
    """Time `fn` on a CUDA device, free of host overhead where it can be.

    First `triton.testing.do_bench_cudagraph`: `fn` is captured into a CUDA graph of
    back-to-back calls (~100 ms of them) and replayed, so the host's Python and launch
    cost (15-66 us a Triton call, more than a small decode takes on an H100) is off the
    clock; each sample is one replay's mean per call, and the L2 cache is not cleared
    between the calls in a graph. Where capture fails (a host sync, an allocation or a
    CPU tensor inside `fn`), `triton.testing.do_bench` times each call between CUDA
    events with L2 cleared, host launch cost included. Per-call statistics in seconds
    from one measurement (`return_mode="all"`: `n` is the number of samples it took,
    not `config.repeats`); `stats["cuda_graph"]` is 1.0 for the graph, 0.0 for the
    fallback."""
    import triton.testing

    try:
        times_ms = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="all")
        method = 1.0
    except Exception as exc:  # capture refused: any error the capture raises
        log.info(
            "CUDA graph capture failed (%s: %s); timing with do_bench", type(exc).__name__, exc
        )
        _recover_from_capture()
        times_ms = triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="all")
        method = 0.0
    stats = summarize([float(t) / 1e3 for t in times_ms])
    stats["cuda_graph"] = method
    return stats


def _recover_from_capture() -> None:
    """Wait for the device after a failed capture (no-op without CUDA), so the fallback
    starts on an idle stream."""
    if torch.cuda.is_available():
        try:
            torch.cuda.synchronize()
        except RuntimeError as exc:  # the failed capture's error, reported by the sync
            log.info("synchronize after a failed capture: %s", exc)


def host_call_time(
    fn: Callable[[], object], device: torch.device, config: TimingConfig = TimingConfig()
) -> dict[str, float | int]:
    """Host cost of one call of `fn`: wall time of `calls` back-to-back calls with no
    device synchronisation inside, per call (seconds), repeated `config.repeats` times.

    On a GPU the calls only enqueue work, so while the device keeps up this is the
    Python + launch cost per call, the part CUDA-graph timing leaves out (for kernels
    slower than their launch it is bounded by the kernel time instead)."""
    dev = torch.device(device)
    calls = 50
    for _ in range(max(1, config.warmup)):
        fn()
    _sync(dev)
    samples = []
    for _ in range(config.repeats):
        _sync(dev)
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls)
    _sync(dev)
    return summarize(samples, calls)


def time_fn(
    fn: Callable[[], object], device: torch.device, config: TimingConfig = TimingConfig()
) -> dict[str, float | int]:
    """`time_gpu` on CUDA, `time_cpu` elsewhere."""
    if device.type == "cuda":
        return time_gpu(fn, config)
    return time_cpu(fn, config, str(device))


#: Bytes of the copy-peak source buffer. Source and destination together (128 MiB) exceed
#: the last-level cache of the machines kvbench targets (32 MiB of L3 on the 2-core build
#: machine, 50 MB of L2 on an H100), so the copy streams from memory.
COPY_PEAK_BYTES = 64 * 2**20


class CopyProbe:
    """A `COPY_PEAK_BYTES` copy on `device`, to time beside a kernel in the same repeats.

    On a shared CPU the copy bandwidth moves 1.5x within minutes, so a kernel's fraction
    of "the" copy peak measured once per run mixes two moments. Timed alternately with the
    kernel (`suites.bench.sweeps.peers._paired_times`), each repeat gives one kernel time
    and one copy time taken side by side, and `paired_fraction` divides them repeat by
    repeat. `bytes_moved` counts bytes read plus bytes written.
    """

    def __init__(self, device: torch.device, nbytes: int = COPY_PEAK_BYTES) -> None:
        n = max(1, nbytes // 4)
        self.src = torch.rand(n, device=device)
        self.dst = torch.empty_like(self.src)
        self.bytes_moved = 2 * n * 4

    def __call__(self) -> torch.Tensor:
        return self.dst.copy_(self.src)

    def rows(self, copy_seconds: list[float]) -> list[Measurement]:
        """The paired copy's own rows: its bandwidth (B/s) at the median time, and the time
        statistics of the copies timed beside the kernel."""
        stats = summarize(copy_seconds)
        return [
            Measurement("copy_peak_paired", self.bytes_moved / float(stats["median"]), "B/s"),
            Measurement("copy_time_paired", float(stats["median"]), "s", stats),
        ]


#: Rounds of the FMA probe per call (12 vector FMAs each, on every thread): about 4 ms on
#: the 2-core build machine at its peak; `FmaProbe.lasting` stretches it to a kernel's time.
FMA_PROBE_ITERS = 2_000_000
#: Most rounds `FmaProbe.lasting` gives a call (about 0.4 s at the build machine's peak).
FMA_PROBE_MAX_ITERS = 100 * FMA_PROBE_ITERS


class FmaProbe:
    """The C++ build's peak-rate FMA loop (`kernels.cpu_paged.fma_probe`: 12 independent
    vector FMA chains on every thread), to time beside a kernel in the same repeats as
    `CopyProbe` is: its FLOPs per second in a repeat is the FMA peak of that moment, and
    a kernel's FLOPs per second over it (`paired_fraction` with FLOPs for bytes) the
    fraction of that peak it reached."""

    def __init__(self, iters: int = FMA_PROBE_ITERS) -> None:
        from kvbench.kernels import cpu_paged

        self._probe = cpu_paged.fma_probe
        self.iters = iters
        self.flops = cpu_paged.fma_probe(1) * iters  # FLOPs per call (one warm call)

    @classmethod
    def lasting(cls, seconds: float) -> FmaProbe:
        """A probe whose call takes about `seconds` now (scaled from one timed call of
        `FMA_PROBE_ITERS` rounds, between that and `FMA_PROBE_MAX_ITERS`). On a shared
        host a probe as long as the kernel it is paired with is preempted about as often
        as the kernel is; a few-ms probe runs inside one time slice at full speed while
        the kernel shares the cores, and the fraction would read low."""
        probe = cls()
        t0 = time.perf_counter()
        probe()
        took = time.perf_counter() - t0
        iters = int(FMA_PROBE_ITERS * seconds / max(took, 1e-9))
        return cls(min(FMA_PROBE_MAX_ITERS, max(FMA_PROBE_ITERS, iters)))

    def __call__(self) -> int:
        return self._probe(self.iters)

    def rows(
        self, kernel_seconds: list[float], probe_seconds: list[float], flops: int
    ) -> list[Measurement]:
        """The paired FMA peak (FLOP/s at the probe's median time) and the kernel's
        fraction of it (median of per-repeat ratios)."""
        stats = summarize(probe_seconds)
        return [
            Measurement("fma_peak_paired", self.flops / float(stats["median"]), "FLOP/s"),
            Measurement(
                "fma_peak_fraction",
                paired_fraction(kernel_seconds, probe_seconds, flops, self.flops),
                "fraction",
            ),
        ]


def paired_fraction(
    kernel_seconds: list[float], copy_seconds: list[float], kernel_bytes: int, copy_bytes: int
) -> float:
    """Median over repeats of (kernel_bytes / kernel time) / (copy_bytes / copy time): the
    fraction of the copy peak a kernel reached, with both taken in the same repeat."""
    if len(kernel_seconds) != len(copy_seconds) or not kernel_seconds:
        raise ConfigError(
            f"paired_fraction needs one copy time per kernel time, got "
            f"{len(kernel_seconds)} and {len(copy_seconds)}"
        )
    return statistics.median(
        (kernel_bytes / k) / (copy_bytes / c)
        for k, c in zip(kernel_seconds, copy_seconds, strict=True)
    )
