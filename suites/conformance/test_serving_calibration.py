"""The CPU calibration's fit (`paged.serving.calibration.fit_profile`).

Oracle: steps priced by the model's own formula from known coefficients (the formula
written out here, independently of `predict_seconds`). Unbounded, the fit recovers the
coefficients; bounded by a cap below the truth, the fitted value sits at (never above)
the cap, and a cap above the truth changes nothing. Bad caps are refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("scipy")

from kvbench.paged.serving.calibration import StepWork, fit_profile, step_errors, with_profile
from kvbench.paged.serving.time_model import TimeModel
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.profiles import get_profile

GEOM = KVGeometry(4, 4, 64, "float32", 8)
PARAMS = 3.6e6
TRUE_FIXED, TRUE_BW, TRUE_FLOPS = 4e-3, 12e9, 30e9


def _tm() -> TimeModel:
    return TimeModel(get_profile("cpu"), GEOM, int(4 * PARAMS), PARAMS, 16)


def _truth(steps_spec: list[tuple[int, int, tuple[tuple[int, int], ...]]]) -> list[StepWork]:
    """Steps timed by fixed + max(bytes / bw, FLOPs / peak), counted by hand: weights
    (4 bytes per parameter) and every KV token read (2 x layers x kv heads x head_dim x 4
    bytes), 2 FLOPs per parameter per token and 4 x layers x q heads x head_dim per
    (query, key) pair."""
    per_token = 2 * 4 * 4 * 64 * 4
    pair = 4.0 * 4 * 8 * 64
    out = []
    for d, kv_read, chunks in steps_spec:
        tokens = d + sum(n for _, n in chunks)
        kv = kv_read + sum(c + n for c, n in chunks)
        pairs = kv_read + sum(n * c + n * (n + 1) / 2 for c, n in chunks)
        nbytes = 4 * PARAMS + per_token * kv
        flops = 2 * PARAMS * tokens + pair * pairs
        out.append(
            StepWork(d, kv_read, chunks, TRUE_FIXED + max(nbytes / TRUE_BW, flops / TRUE_FLOPS))
        )
    return out


def _steps() -> list[StepWork]:
    """Memory-bound decode steps (long contexts) and compute-bound prefill steps."""
    rng = np.random.default_rng(7)
    spec: list[tuple[int, int, tuple[tuple[int, int], ...]]] = []
    for _ in range(60):
        d = int(rng.integers(1, 40))
        spec.append((d, d * int(rng.integers(100, 2000)), ()))
    for _ in range(40):
        spec.append((0, 0, ((int(rng.integers(0, 200)), int(rng.integers(16, 400))),)))
    return _truth(spec)


def test_unbounded_fit_recovers_the_coefficients() -> None:
    fit = fit_profile(_tm(), _steps())
    p = fit.profile
    assert fit.error < 0.01
    assert p.step_overhead_s == pytest.approx(TRUE_FIXED, rel=0.05)
    assert p.hbm_bandwidth == pytest.approx(TRUE_BW, rel=0.05)
    assert p.peak_flops == pytest.approx(TRUE_FLOPS, rel=0.05)


def test_caps_bound_the_fitted_bandwidth_and_flops() -> None:
    """Caps at half the truth: each fitted value at most its cap (and at it: a lower
    value only adds error), the fit worse than the unbounded one; caps above the truth
    leave the fit where it was. The source names the caps."""
    tm, steps = _tm(), _steps()
    capped = fit_profile(tm, steps, max_bandwidth=TRUE_BW / 2, max_flops=TRUE_FLOPS / 2)
    p = capped.profile
    assert p.hbm_bandwidth <= TRUE_BW / 2 and p.peak_flops <= TRUE_FLOPS / 2
    assert p.hbm_bandwidth == pytest.approx(TRUE_BW / 2, rel=0.02)
    assert p.peak_flops == pytest.approx(TRUE_FLOPS / 2, rel=0.02)
    assert capped.error > 0.05
    assert "bandwidth <= 6e+09 measured" in p.note
    loose = fit_profile(tm, steps, max_bandwidth=4 * TRUE_BW, max_flops=4 * TRUE_FLOPS)
    assert loose.error < 0.01
    assert loose.profile.hbm_bandwidth == pytest.approx(TRUE_BW, rel=0.05)
    held = step_errors(with_profile(tm, loose.profile), steps)
    assert float(held.mean()) == pytest.approx(loose.error, abs=1e-9)


@pytest.mark.parametrize("cap", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_caps_are_refused_by_name(cap: float) -> None:
    with pytest.raises(ConfigError, match="max_bandwidth"):
        fit_profile(_tm(), _steps(), max_bandwidth=cap)
    with pytest.raises(ConfigError, match="max_flops"):
        fit_profile(_tm(), _steps(), max_flops=cap)
