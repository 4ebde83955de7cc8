"""Measured peaks that bound the CPU calibration (`suites.e2e.host_peaks`): the work each
probe counts, the fastest sample as the peak, and the refusals."""

from __future__ import annotations

import pytest

from kvbench.suites.e2e import host_peaks
from kvbench.workloads.errors import ConfigError


def test_work_counted_and_fastest_sample_is_the_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    """With the clock stubbed to 3, 1, 2 ms: copy counts read + written bytes, the FMA
    probe 2 n^3 FLOPs; best = work / 1 ms, median = work / 2 ms."""
    monkeypatch.setattr(host_peaks, "_timed", lambda fn, dev, repeats: [3e-3, 1e-3, 2e-3])
    copy = host_peaks.copy_peak(nbytes=4096)
    assert (copy.best, copy.median, copy.samples, copy.unit) == (8192 / 1e-3, 8192 / 2e-3, 3, "B/s")
    fma = host_peaks.fma_peak(n=8)
    assert fma.best == pytest.approx(2 * 8**3 / 1e-3) and fma.unit == "FLOP/s"


def test_a_clock_that_cannot_resolve_and_bad_repeats_are_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with pytest.raises(ConfigError, match="repeats must be >= 1, got 0"):
        host_peaks.copy_peak(repeats=0, nbytes=4096)
    monkeypatch.setattr(host_peaks, "_timed", lambda fn, dev, repeats: [0.0, 0.0])
    with pytest.raises(ConfigError, match="cannot resolve"):
        host_peaks.fma_peak(n=8)


def test_real_probes_time_every_repeat() -> None:
    """Unstubbed: one sample per repeat, the fastest at least the median, both > 0."""
    for peak in (
        host_peaks.copy_peak(repeats=3, nbytes=1 << 20),
        host_peaks.fma_peak(repeats=3, n=64),
    ):
        assert peak.samples == 3 and peak.best >= peak.median > 0


def test_llc_copy_fits_the_last_level_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    """The LLC probe copies a buffer of an eighth of the LLC each way (source + destination
    a quarter of it), and refuses a GPU device."""
    assert host_peaks.llc_bytes() > 0
    seen: list[int] = []

    def fake_copy(device, repeats, nbytes):  # type: ignore[no-untyped-def]
        seen.append(nbytes)
        return host_peaks.Peak(1.0, 1.0, repeats, "B/s")

    monkeypatch.setattr(host_peaks, "copy_peak", fake_copy)
    monkeypatch.setattr(host_peaks, "llc_bytes", lambda cpu=0: 32 * 2**20)
    host_peaks.llc_copy_peak("cpu", repeats=3)
    assert seen == [4 * 2**20]
    with pytest.raises(ConfigError, match="last-level cache, not cuda"):
        host_peaks.llc_copy_peak("cuda")


def test_best_of_takes_the_fastest_burst_and_refuses_mixed_or_no_peaks() -> None:
    """Bursts at 10 / 30 / 20 GB/s best (medians 8 / 25 / 15): the bound is 30, the
    median the bursts' median 15, the samples 9 + 9 + 5."""
    bursts = [
        host_peaks.Peak(10e9, 8e9, 9, "B/s"),
        host_peaks.Peak(30e9, 25e9, 9, "B/s"),
        host_peaks.Peak(20e9, 15e9, 5, "B/s"),
    ]
    assert host_peaks.best_of(bursts) == host_peaks.Peak(30e9, 15e9, 23, "B/s")
    with pytest.raises(ConfigError, match="got none"):
        host_peaks.best_of([])
    with pytest.raises(ConfigError, match="units"):
        host_peaks.best_of([bursts[0], host_peaks.Peak(1.0, 1.0, 1, "FLOP/s")])
