"""Measured peaks that bound a fitted time model: copy bandwidth and FMA throughput.

A step-time model fitted to measured steps (`paged.serving.calibration.fit_profile`) is
physical only if its bandwidth is at most what this machine can stream and its FLOP/s at
most what it can multiply-add. Both are measured here, in the calling process, with the
thread count and clock of the measured serving run (`suites.e2e.serving_run`):

* copy peak: a `COPY_PEAK_BYTES` copy (source and destination beyond the last-level
  cache), bytes read plus bytes written per second (STREAM's copy convention);
* last-level-cache copy peak (`llc_copy_peak`): the same copy of a buffer that fits the
  last-level cache (source + destination = a quarter of its size, `llc_bytes`: a shared
  LLC holds other jobs' data too), warm: the rate at which data that lives in the LLC
  can be streamed;
* FMA peak: an n x n x n float32 matrix product, 2 n^3 FLOPs (one fused multiply-add
  counts 2, as the time model counts 2 FLOPs per weight per token).

A peak is the fastest sample (the best the machine reached), the median beside it. On a
CPU the clock is the thread's CPU time (`time.thread_time`, as the serving run's steps),
which leaves out time other jobs hold the core; on a GPU, wall time around a synchronize.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
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


def best_of(peaks: Sequence[Peak]) -> Peak:
    """One peak from several bursts of the same probe (measured at different moments of a
    run, so one busy moment of a shared host does not set the bound): the fastest sample
    of any burst, the median of the bursts' medians, the samples counted together."""
    if not peaks:
        raise ConfigError("best_of needs at least one measured peak, got none")
    units = {p.unit for p in peaks}
    if len(units) != 1:
        raise ConfigError(f"best_of merges one probe's peaks, got units {sorted(units)}")
    return Peak(
        max(p.best for p in peaks),
        statistics.median(p.median for p in peaks),
        sum(p.samples for p in peaks),
        peaks[0].unit,
    )


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


#: Last-level cache assumed where the OS does not say (sysfs): the smallest LLC of a
#: current server CPU core complex.
DEFAULT_LLC_BYTES = 8 * 2**20


def llc_bytes(cpu: int = 0) -> int:
    """Size of CPU `cpu`'s last-level (highest-level data or unified) cache in bytes, read
    from Linux sysfs; DEFAULT_LLC_BYTES where it cannot be read."""
    from pathlib import Path

    best = (0, 0)
    for index in Path(f"/sys/devices/system/cpu/cpu{cpu}/cache").glob("index*"):
        try:
            kind = (index / "type").read_text().strip()
            level = int((index / "level").read_text())
            size = (index / "size").read_text().strip()
        except (OSError, ValueError):
            continue
        if kind == "Instruction" or not size[:-1].isdigit():
            continue
        scale = {"K": 2**10, "M": 2**20, "G": 2**30}.get(size[-1], 1)
        nbytes = int(size[:-1]) * scale if size[-1] in "KMG" else int(size)
        best = max(best, (level, nbytes))
    return best[1] or DEFAULT_LLC_BYTES


def llc_copy_peak(device: torch.device | str = "cpu", repeats: int = 21) -> Peak:
    """Copy bandwidth (B/s, read + written) of a copy whose source and destination fit the
    last-level cache together (a quarter of `llc_bytes`), after a warm-up copy: the
    streaming rate of data that lives in the LLC. CPU only (a GPU's L2 is not probed)."""
    dev = torch.device(device)
    if dev.type != "cpu":
        raise ConfigError(f"llc_copy_peak measures a CPU's last-level cache, not {dev}")
    return copy_peak(dev, repeats, llc_bytes() // 8)


def fma_peak(device: torch.device | str = "cpu", repeats: int = 9, n: int = FMA_N) -> Peak:
    """Multiply-add throughput (FLOP/s) of an `n`^3 float32 matrix product."""
    dev = torch.device(device)
    a = torch.rand(n, n, device=dev)
    b = torch.rand(n, n, device=dev)
    c = torch.empty(n, n, device=dev)
    return _peak(2.0 * n**3, _timed(lambda: torch.mm(a, b, out=c), dev, repeats), "FLOP/s")
