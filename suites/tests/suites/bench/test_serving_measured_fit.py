"""serving.measured's calibration case with the serving runs stubbed: synthetic steps
timed by a known machine (fixed 3 ms, 40 GB/s, 20 GFLOP/s) whose bandwidth exceeds the
copy peak the stubbed probe reports (10 GB/s). The bounded fit must sit at the peak, the
unbounded diagnostic must find the machine, and the rows must say both."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("scipy")

from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.sweeps import serving_measured as sm
from kvbench.suites.e2e.host_peaks import Peak
from kvbench.suites.e2e.serving_run import StepSample


def _fake(monkeypatch: pytest.MonkeyPatch, ctx: BenchContext):  # type: ignore[no-untyped-def]
    tm = sm._setup(ctx)["tm"]
    g = tm.geometry
    pair = 4.0 * g.num_layers * (g.num_q_heads or g.num_kv_heads) * g.head_dim

    def seconds(d: int, kv: int, chunks: list[tuple[int, int]]) -> float:
        tokens = d + sum(n for _, n in chunks)
        nbytes = tm.weight_bytes + g.bytes_per_token * (kv + sum(c + n for c, n in chunks))
        pairs = kv + sum(n * c + n * (n + 1) / 2 for c, n in chunks)
        return 3e-3 + max(nbytes / 40e9, (2.0 * tm.params * tokens + pair * pairs) / 20e9)

    def fake_run(ctx, system, trace, max_num_seqs, tm=None):  # type: ignore[no-untyped-def]
        out = []
        for i in range(1, 40):
            d, kv = i % 20 + 1, (i % 20 + 1) * (50 + 23 * i)
            out.append(StepSample(i, d, kv, [], seconds(d, kv, []), 0.0))
            chunk = [(0, 16 + 9 * i)]
            out.append(StepSample(i, 0, 0, chunk, seconds(0, 0, chunk), 0.0))
        return SimpleNamespace(), out

    monkeypatch.setattr(sm, "_run", fake_run)
    return fake_run


def test_calibration_rows_are_bounded_by_the_measured_peaks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ctx = BenchContext(torch.device("cpu"))
    fake_run = _fake(monkeypatch, ctx)
    ctx.cache["measured_peaks"] = (Peak(10e9, 9e9, 9, "B/s"), Peak(80e9, 70e9, 9, "FLOP/s"))
    rows = {m.metric: m.value for m in sm.serving_measured({"calibration": "cpu"}, ctx)}
    assert rows["copy_peak_measured"] == 10e9 and rows["fma_peak_measured"] == 80e9
    assert rows["fitted_bandwidth"] <= 10e9 and rows["fitted_flops"] <= 80e9
    assert rows["fitted_bandwidth_of_copy_peak"] == pytest.approx(1.0, abs=0.02)
    assert rows["unbounded_fitted_bandwidth"] == pytest.approx(40e9, rel=0.1)
    assert rows["unbounded_fitted_flops"] == pytest.approx(20e9, rel=0.05)
    assert rows["unbounded_fit_step_error_mean"] < 0.01 < rows["fit_step_error_mean"]
    checks = {m.metric: m.value for m in sm._model_check(ctx, fake_run(ctx, "", None, 0)[1])}
    assert checks["step_error_mean"] == pytest.approx(rows["fit_step_error_mean"], rel=1e-6)
    assert checks["step_error_mean_unbounded"] < 0.01


def test_peaks_are_the_best_of_bursts_around_the_fit_runs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A burst before the fit runs and one after each (3 batches + Poisson: 5); the bound
    is the fastest burst (the 3rd: 12 GB/s), never a later copy (the LLC probe: 99)."""
    from kvbench.suites.e2e import host_peaks

    ctx = BenchContext(torch.device("cpu"))
    _fake(monkeypatch, ctx)
    copies = iter([8e9, 9e9, 12e9, 7e9, 6e9, 99e9])
    monkeypatch.setattr(host_peaks, "copy_peak", lambda *a: Peak(next(copies), 5e9, 9, "B/s"))
    monkeypatch.setattr(host_peaks, "fma_peak", lambda *a: Peak(80e9, 70e9, 9, "FLOP/s"))
    rows = {m.metric: m.value for m in sm.serving_measured({"calibration": "cpu"}, ctx)}
    assert len(ctx.cache["peak_bursts"]) == 5
    assert rows["copy_peak_measured"] == 12e9
    assert rows["fitted_bandwidth"] <= 12e9
