"""Fitting the step-time model's device coefficients to measured steps.

A measured serving run (`suites.e2e.serving_run`) records, per step, its work (decoders,
KV tokens they read, prefill chunks) and its measured seconds. The time model prices a
step as

    fixed + max((weights + KV bytes read) / bandwidth, FLOPs / peak)

(`TimeModel.step_ps`, one rank). `fit_profile` finds the profile's three coefficients
(fixed per-step seconds, effective bandwidth, effective FLOP/s) that minimize the mean
absolute relative per-step error, by Nelder-Mead on their logarithms from a start that
fits a plain least-squares line; `step_errors` reports the error of any profile on any
steps, so a fit can be judged on steps it never saw (held-out runs).

Physical bounds: given `max_bandwidth` (a copy peak measured in the same run) and
`max_flops` (a measured multiply-add peak), the fit searches only bandwidth <= the copy
peak and FLOP/s <= the FMA peak, so a coefficient cannot buy accuracy with a machine that
does not exist (unbounded, the 2-core build machine's fit reached 62 GiB/s of "bandwidth"
beside an 8-13 GiB/s copy peak). What a step reads is counted as the kernels read it:
the weights once, and each sequence's own KV tokens (its context + its new tokens), in
place: the CPU kernels (`kernels.cpu_paged`) and the Triton ones walk each sequence's
block table up to its length, so paged and contiguous caches alike are priced by the
tokens they hold, never by a contiguous reservation's unused tail.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np

from kvbench.paged.serving.time_model import TimeModel
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.profiles import DeviceProfile


@dataclass(frozen=True)
class StepWork:
    """What one step computed: decoders, their KV tokens read (each its context + 1),
    prefill chunks as (tokens cached before, chunk length), and its measured seconds."""

    decoders: int
    kv_read: int
    chunks: tuple[tuple[int, int], ...]
    seconds: float
    #: seconds of an empty call measured beside this step (one token, no context:
    #: `suites.e2e.serving_run.ModelStep.probe_every`), 0 where none was measured
    empty_s: float = 0.0


#: The empty call's work: one token decoded over a context of one (its own).
EMPTY_CALL = StepWork(1, 1, (), 0.0)


def _features(tm: TimeModel, steps: Sequence[StepWork]) -> tuple[np.ndarray, np.ndarray]:
    """(bytes read, FLOPs) per step, one rank, as `TimeModel.step_ps` counts them."""
    g = tm.geometry
    q_heads = g.num_q_heads or g.num_kv_heads
    pair_flops = 4.0 * g.num_layers * q_heads * g.head_dim
    nbytes, flops = [], []
    for s in steps:
        tokens = s.decoders + sum(n for _, n in s.chunks)
        kv = s.kv_read + sum(c + n for c, n in s.chunks)
        pairs = s.kv_read + sum(n * c + n * (n + 1) / 2 for c, n in s.chunks)
        nbytes.append(tm.weight_bytes + g.bytes_per_token * kv)
        flops.append(2.0 * tm.params * tokens + pair_flops * pairs)
    return np.asarray(nbytes), np.asarray(flops)


def predict_seconds(
    tm: TimeModel, steps: Sequence[StepWork], fixed: float, bandwidth: float, peak: float
) -> np.ndarray:
    """Modeled seconds per step: `fixed` + max(bytes / bandwidth, FLOPs / peak); a step
    with a measured empty call (`empty_s` > 0) takes, instead of `fixed`, that call's
    seconds less the model's price of the call's own work (`measured_fixed`)."""
    nbytes, flops = _features(tm, steps)
    empty = np.array([s.empty_s for s in steps], dtype=float)
    fixed_each = np.where(empty > 0, measured_fixed(tm, empty, bandwidth, peak), fixed)
    return fixed_each + np.maximum(nbytes / bandwidth, flops / peak)


def measured_fixed(
    tm: TimeModel, empty_s: np.ndarray | float, bandwidth: float, peak: float
) -> np.ndarray:
    """The fixed per-step seconds an empty call measures: its seconds less the price of its
    own work (`EMPTY_CALL`: the weights read once, one token's FLOPs) at `bandwidth` and
    `peak`, so the weights are not counted twice; never below 0."""
    nbytes, flops = _features(tm, [EMPTY_CALL])
    own = float(max(nbytes[0] / bandwidth, flops[0] / peak))
    return np.maximum(np.asarray(empty_s, dtype=float) - own, 0.0)


@dataclass(frozen=True)
class Fit:
    """A fitted profile and its mean absolute relative per-step error on the fit steps."""

    profile: DeviceProfile
    error: float
    steps: int


def fit_profile(
    tm: TimeModel,
    steps: Sequence[StepWork],
    name: str = "cpu-fit",
    *,
    max_bandwidth: float | None = None,
    max_flops: float | None = None,
) -> Fit:
    """The profile (fixed, bandwidth, peak) that best prices `steps` (module docstring),
    with bandwidth <= `max_bandwidth` (B/s) and FLOP/s <= `max_flops` where given.

    Where every step carries an empty call measured beside it (`StepWork.empty_s`), the
    fixed term is not fitted: each step's is its empty call less the call's own work
    (`measured_fixed`), and only bandwidth and FLOP/s are fitted; the profile's constant
    `step_overhead_s` (for the engine's simulations) is the median of those."""
    from scipy.optimize import minimize

    for label, cap in (("max_bandwidth", max_bandwidth), ("max_flops", max_flops)):
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise ConfigError(f"{label} must be a finite number > 0, got {cap!r}")
    work = [s for s in steps if s.seconds > 0 and (s.decoders or s.chunks)]
    if len(work) < 3:
        raise ConfigError(f"need at least 3 measured steps to fit, got {len(work)}")
    meas = np.array([s.seconds for s in work])
    nbytes, flops = _features(tm, work)
    # start: time ~ a + b * FLOPs (least squares), memory term small
    slope, icpt = np.polyfit(flops, meas, 1)
    slope = slope if slope > 0 else float(np.median(meas / flops))
    icpt = max(float(icpt), 1e-6)
    start = np.log([icpt, float(np.median(nbytes)) / icpt, 1.0 / slope])
    upper = [0.0, _log_cap(max_bandwidth), _log_cap(max_flops)]  # fixed <= 1 s
    start = np.minimum(start, np.asarray(upper) - 1e-9)
    bounds = [(None, hi if math.isfinite(hi) else None) for hi in upper]

    empty = np.array([s.empty_s for s in work])
    probed = bool((empty > 0).all())  # the fixed term is measured: fit bandwidth, FLOP/s

    def loss(x: np.ndarray) -> float:
        if probed:
            bw, peak = np.exp(x)
            fixed = measured_fixed(tm, empty, bw, peak)
        else:
            fixed, bw, peak = np.exp(x)
        pred = fixed + np.maximum(nbytes / bw, flops / peak)
        return float(np.mean(np.abs(pred - meas) / meas))

    best = minimize(
        loss,
        start[1:] if probed else start,
        method="Nelder-Mead",
        bounds=bounds[1:] if probed else bounds,
        options={"maxiter": 4000, "xatol": 1e-4},
    )
    if probed:
        bw, peak = (float(v) for v in np.exp(best.x))
        fixed = float(np.median(measured_fixed(tm, empty, bw, peak)))
    else:
        fixed, bw, peak = (float(v) for v in np.exp(best.x))
    bw = min(bw, max_bandwidth) if max_bandwidth is not None else bw  # exp(log) rounding
    peak = min(peak, max_flops) if max_flops is not None else peak
    caps = "".join(
        f", {what} <= {cap:.3g} measured" for what, cap in
        (("bandwidth", max_bandwidth), ("FLOP/s", max_flops)) if cap is not None
    )  # fmt: skip
    profile = DeviceProfile(
        name,
        bw,
        peak,
        tm.profile.host_link_bandwidth,
        f"fitted to {len(work)} measured steps (mean |error| {best.fun:.1%}{caps}"
        + ("; fixed = median of the empty calls measured beside them)" if probed else ")"),
        step_overhead_s=fixed,
        interconnect_bandwidth=tm.profile.interconnect_bandwidth,
    )
    return Fit(profile, float(best.fun), len(work))


def _log_cap(cap: float | None) -> float:
    return math.log(cap) if cap is not None else math.inf


def step_errors(tm: TimeModel, steps: Sequence[StepWork]) -> np.ndarray:
    """|modeled - measured| / measured per step, priced by `tm`'s own profile (the same
    formula as `TimeModel.step_ps`, unrounded)."""
    work = [s for s in steps if s.seconds > 0 and (s.decoders or s.chunks)]
    if not work:
        return np.zeros(0)
    p = tm.profile
    pred = predict_seconds(tm, work, p.step_overhead_s, p.hbm_bandwidth, p.peak_flops)
    meas = np.array([s.seconds for s in work])
    errors: np.ndarray = np.abs(pred - meas) / meas
    return errors


def with_profile(tm: TimeModel, profile: DeviceProfile) -> TimeModel:
    """`tm` priced on another device profile."""
    return replace(tm, profile=profile)


def mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan
