"""Measured peaks that bound a fitted time model: copy bandwidth and FMA throughput.

A step-time model fitted to measured steps (`paged.serving.calibration.fit_profile`) is
physical only if its bandwidth is at most what this machine can stream and its FLOP/s at
most what it can multiply-add. Both are measured here, in the calling process, with the
thread count and clock of the measured serving run (`suites.e2e.serving_run`):

* copy peak: a `COPY_PEAK_BYTES` copy (source and destination beyond the last-level
  cache), bytes read plus bytes written per second (STREAM's copy convention);
* FMA peak: an n x n x n float32 matrix product, 2 n^3 FLOPs (one fused multiply-add
  counts 2, as the time model counts 2 FLOPs per weight per token).

A peak is the fastest sample (the best the machine reached), the median beside it. On a
CPU the clock is the thread's CPU time (`time.thread_time`, as the serving run's steps),
which leaves out time other jobs hold the core; on a GPU, wall time around a synchronize.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from kvbench.suites.bench.harness import COPY_PEAK_BYTES
from kvbench.workloads.errors import ConfigError

#: Matrix size of the FMA probe: 2 x 512^3 = 268 MFLOP, ~5-20 ms on one CPU core, and
#: three 1 MiB operands that stay in cache (the probe measures arithmetic, not memory).
FMA_N = 512


@dataclass(frozen=True)
class Peak:
    """A measured peak: `best` (fastest sample) and `median`, in `unit`, over `samples`."""

    best: float
    median: float
    samples: int
    unit: str


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `fn` after one warm-up call."""
    if repeats < 1:
        raise ConfigError(f"repeats must be >= 1, got {repeats}")
    gpu = device.type == "cuda"
    clock = time.perf_counter if gpu else time.thread_time
    fn()
    out = []
    for _ in range(repeats):
        if gpu:
            torch.cuda.synchronize(device)
        start = clock()
        fn()
        if gpu:
            torch.cuda.synchronize(device)
        out.append(clock() - start)
    return out


def _peak(work: float, seconds: list[float], unit: str) -> Peak:
    positive = [s for s in seconds if s > 0]
    if not positive:
        raise ConfigError(f"every timed sample was 0 s: the clock cannot resolve ({unit})")
    return Peak(work / min(positive), work / statistics.median(positive), len(positive), unit)


def copy_peak(
    device: torch.device | str = "cpu", repeats: int = 9, nbytes: int = COPY_PEAK_BYTES
) -> Peak:
    """Copy bandwidth (B/s, bytes read + written) of an `nbytes` float32 copy."""
    dev = torch.device(device)
    n = max(1, nbytes // 4)
    src = torch.rand(n, device=dev)
    dst = torch.empty_like(src)
    return _peak(2.0 * n * 4, _timed(lambda: dst.copy_(src), dev, repeats), "B/s")


def fma_peak(device: torch.device | str = "cpu", repeats: int = 9, n: int = FMA_N) -> Peak:
    """Multiply-add throughput (FLOP/s) of an `n`^3 float32 matrix product."""
    dev = torch.device(device)
    a = torch.rand(n, n, device=dev)
    b = torch.rand(n, n, device=dev)
    c = torch.empty(n, n, device=dev)
    return _peak(2.0 * n**3, _timed(lambda: torch.mm(a, b, out=c), dev, repeats), "FLOP/s")
