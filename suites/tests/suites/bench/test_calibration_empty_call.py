"""The CPU fit with a measured fixed term: steps timed on a synthetic machine whose
per-step cost drifts (3 -> 6 ms, as a shared host's speed does), each carrying the empty
call measured beside it. The fit must price every step from its own empty call (and find
the machine's bandwidth and FLOP/s); the constant-fixed fit on the same steps cannot
follow the drift."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("scipy")

from kvbench.paged.serving.calibration import (
    EMPTY_CALL,
    StepWork,
    _features,
    fit_profile,
    measured_fixed,
    step_errors,
    with_profile,
)
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.sweeps import serving_measured as sm

BW, PEAK = 40e9, 200e9  # decode steps memory-bound, long chunks compute-bound


def _machine(tm, work: StepWork, fixed: float) -> float:  # type: ignore[no-untyped-def]
    nbytes, flops = _features(tm, [work])
    return fixed + max(nbytes[0] / BW, flops[0] / PEAK)


def _steps(tm, probed: bool) -> list[StepWork]:  # type: ignore[no-untyped-def]
    out = []
    for i in range(120):
        fixed = 3e-3 + 3e-3 * i / 119  # the host slows down over the run
        empty = _machine(tm, EMPTY_CALL, fixed) if probed else 0.0
        d = i % 24 + 1
        shapes = [StepWork(d, d * (40 + 17 * i), (), 0.0), StepWork(0, 0, ((0, 8 + 5 * i),), 0.0)]
        for w in shapes:
            out.append(StepWork(w.decoders, w.kv_read, w.chunks, _machine(tm, w, fixed), empty))
    return out


def test_measured_fixed_follows_the_drift_and_finds_the_machine() -> None:
    tm = sm._setup(BenchContext(torch.device("cpu")))["tm"]
    fit = fit_profile(tm, _steps(tm, probed=True))
    assert fit.profile.hbm_bandwidth == pytest.approx(BW, rel=0.05)
    assert fit.profile.peak_flops == pytest.approx(PEAK, rel=0.05)
    assert fit.error < 0.01
    errors = step_errors(with_profile(tm, fit.profile), _steps(tm, probed=True))
    assert float(errors.mean()) < 0.01
    # the profile's constant (for simulations) is the median measured fixed cost
    assert fit.profile.step_overhead_s == pytest.approx(4.5e-3, rel=0.02)
    constant = fit_profile(tm, _steps(tm, probed=False))
    assert constant.error > 5 * fit.error


def test_measured_fixed_removes_the_empty_calls_own_work_and_never_goes_negative() -> None:
    tm = sm._setup(BenchContext(torch.device("cpu")))["tm"]
    own = _machine(tm, EMPTY_CALL, 0.0)
    got = measured_fixed(tm, np.array([own + 2e-3, own / 2]), BW, PEAK)
    assert got[0] == pytest.approx(2e-3) and got[1] == 0.0
