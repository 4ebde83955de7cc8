"""The CPU fit with the host speed measured beside the steps: steps timed on a synthetic
machine whose speed drifts (everything 1x -> 1.8x slower over the run, as a shared
host's does), each carrying the empty call measured beside it. The fit must price every
step at its own speed and find the machine's coefficients; the constant fit (no empty
calls) on the same steps cannot follow the drift; an additive use of the empty call
(the first try) would not find the machine either."""

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
    empty_call_seconds,
    fit_profile,
    host_factor,
    step_errors,
    with_profile,
    without_empty_calls,
)
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.sweeps import serving_measured as sm

FIXED, BW, PEAK = 3e-3, 30e9, 40e9  # decode steps memory-bound, long chunks compute-bound


def _machine(tm, work: StepWork, slow: float) -> float:  # type: ignore[no-untyped-def]
    """Seconds of `work` on the synthetic machine, `slow` times its nominal time."""
    nbytes, flops = _features(tm, [work])
    return slow * (FIXED + max(nbytes[0] / BW, flops[0] / PEAK))


def _steps(tm, probed: bool = True) -> list[StepWork]:  # type: ignore[no-untyped-def]
    out = []
    for i in range(120):
        slow = 1.0 + 0.8 * i / 119  # the host slows down over the run
        empty = _machine(tm, EMPTY_CALL, slow) if probed else 0.0
        d = i % 24 + 1
        shapes = [StepWork(d, d * (40 + 17 * i), (), 0.0), StepWork(0, 0, ((0, 8 + 5 * i),), 0.0)]
        for w in shapes:
            out.append(StepWork(w.decoders, w.kv_read, w.chunks, _machine(tm, w, slow), empty))
    return out


def _tm():  # type: ignore[no-untyped-def]
    return sm._setup(BenchContext(torch.device("cpu")))["tm"]


def test_host_factor_follows_the_drift_and_finds_the_machine() -> None:
    tm = _tm()
    steps = _steps(tm)
    fit = fit_profile(tm, steps)
    # the reference speed is the median empty call (the machine slowed 1.4x): the
    # coefficients describe the machine at that speed, and price the empty call there
    ref = float(np.median([s.empty_s for s in steps]))
    assert fit.empty_ref == pytest.approx(ref)
    slow = ref / _machine(tm, EMPTY_CALL, 1.0)
    assert slow == pytest.approx(1.4, rel=0.01)
    assert fit.profile.hbm_bandwidth == pytest.approx(BW / slow, rel=0.05)
    assert fit.profile.peak_flops == pytest.approx(PEAK / slow, rel=0.05)
    assert fit.profile.step_overhead_s == pytest.approx(FIXED * slow, rel=0.05)
    assert fit.error < 0.01
    p = fit.profile
    assert empty_call_seconds(tm, p.step_overhead_s, p.hbm_bandwidth, p.peak_flops) == (
        pytest.approx(ref, rel=0.02)
    )
    errors = step_errors(with_profile(tm, fit.profile), steps, fit.empty_ref)
    assert float(errors.mean()) < 0.01
    # without the factor the same profile misprices the drifting steps
    assert float(step_errors(with_profile(tm, fit.profile), steps).mean()) > 0.1


def test_constant_fit_cannot_follow_the_drift() -> None:
    tm = _tm()
    steps = _steps(tm)
    fit = fit_profile(tm, steps)
    constant = fit_profile(tm, without_empty_calls(steps))
    assert constant.empty_ref == 0.0
    assert constant.error > 5 * max(fit.error, 1e-3)
    assert fit_profile(tm, _steps(tm, probed=False)).error == pytest.approx(constant.error)


def test_host_factor_is_one_where_nothing_was_measured() -> None:
    steps = [StepWork(1, 2, (), 1e-3, 4e-3), StepWork(1, 2, (), 1e-3, 0.0)]
    assert host_factor(steps, 2e-3).tolist() == [2.0, 1.0]
    assert host_factor(steps, 0.0).tolist() == [1.0, 1.0]
