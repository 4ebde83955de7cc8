"""What a sweep's `measure` gets besides its case: the device, timing settings, the
run's copy-bandwidth peak (measured once per process, on first use, and recorded as a
row of its own), a copy probe to time beside a kernel (its buffers allocated once), and a
seeded RNG."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from kvbench.reports.store.writer import ResultWriter
from kvbench.suites.bench.harness import COPY_PEAK_BYTES, CopyProbe, TimingConfig, time_fn

log = logging.getLogger(__name__)


@dataclass
class BenchContext:
    """Shared state of one bench process.

    Attributes:
        device: where tensors go (cuda when available, else cpu).
        timing: warm-up / repeats settings.
        full: whether the whole grid runs (sweeps may scale their workloads with it).
        writer: the run's ResultWriter (sweeps do not write to it directly; the context
            records the copy peak through it).
        session: 0 for the first process of a run, 1, 2, ... for each resume.
        seed: base seed of every random workload.
    """

    device: torch.device
    timing: TimingConfig = field(default_factory=TimingConfig)
    full: bool = False
    writer: ResultWriter | None = None
    session: int = 0
    seed: int = 0
    _peak: float | None = None
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def is_gpu(self) -> bool:
        return self.device.type == "cuda"

    def rng(self, *salt: int) -> np.random.Generator:
        """A numpy Generator seeded from the run seed and `salt` (reproducible per case)."""
        return np.random.default_rng([self.seed, *salt])

    def time(self, fn: Any) -> dict[str, float | int]:
        """Per-call timing statistics (seconds) of `fn` on this context's device."""
        return time_fn(fn, self.device, self.timing)

    def copy_peak(self) -> float:
        """Copy bandwidth of the device in B/s, measured in this process on first use."""
        if self._peak is None:
            probe = self.copy_probe()  # the same buffers the paired copies use
            stats = self.time(probe)
            peak = self._peak = probe.bytes_moved / float(stats["median"])
            log.info("copy peak on %s: %.2f GB/s", self.device, peak / 1e9)
            if self.writer is not None:
                case = {
                    "device": str(self.device),
                    "session": self.session,
                    "bytes": COPY_PEAK_BYTES,
                }
                self.writer.record("copy_peak", case, "bandwidth", peak, "B/s")
                self.writer.record("copy_peak", case, "time", stats["median"], "s", stats)
        return self._peak

    def copy_probe(self, device: torch.device | None = None) -> CopyProbe:
        """The process's CopyProbe on `device` (default: this context's), its buffers
        allocated on first use; the CPU decode peers ask for the CPU's on a GPU machine."""
        dev = torch.device(device) if device is not None else self.device
        key = f"copy_probe:{dev}"
        probe = self.cache.get(key)
        if probe is None:
            probe = self.cache[key] = CopyProbe(dev)
        return probe
