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

Host speed, measured beside the steps: on a shared host the same step's time drifts by
10-20% over seconds (other jobs contend for the caches, the memory and the core). Where
every step carries the time of an empty call measured beside it (`StepWork.empty_s`: the
mean of the two empty calls that bracket it, `suites.e2e.serving_run.ModelStep
.probe_every`), a step is priced at the host's speed of that moment:

    (empty_s / empty_ref) x (fixed + max(bytes / bandwidth, FLOPs / peak))

with `empty_ref` the median empty call over the fit steps (`Fit.empty_ref`): the three
coefficients describe the host at its typical speed, and the ratio (`host_factor`),
measured and paired with the step, never fitted, scales the whole step. Why a factor and
not the empty call as an additive fixed term (the first try, issue 27): contention slows
a step's memory reads and arithmetic too, not only its fixed part; and with an additive
term the fit traded the empty call's own weight read against the fixed cost (bandwidth
fitted at 1.7 GB/s, 20x under the copy peak, the memory term then carrying per-token
host costs). On the same recorded steps (load ~9): constant 10.6%, additive 10.1%,
factor 9.0% held-out error.

Per-sequence cost (optional, `fit_profile(per_sequence=True)`): an engine whose host
side works per request every step (vLLM's CPU path: input preparation, the sampled row's
logits and sampling, output processing) costs `per_seq` seconds per scheduled sequence
on top of the fixed term:

    h x (fixed + per_seq x sequences + max(bytes / bandwidth, FLOPs / peak))

Without it one FLOP/s coefficient buys a decode token's per-request cost too and prices
a 512-token prefill step 2.3-2.7x too slow (vLLM on the build machine, serving.
vllm_engine); with it the same steps are 1.3-1.5x. Off by default (0): kvbench's own
steps (serving.measured) are fitted as before.

Host speed on the host-side terms only (optional, `fit_profile(host_on_overhead=True)`):

    h x (fixed + per_seq x sequences) + max(bytes / bandwidth, FLOPs / peak)

For vLLM on the build machine the probe between steps (interpreter work and small
matmuls) tracked its per-request host work but not its large matmuls: 512-token prefill
steps took 61-74 ms whether the probe read h = 1.0 or 1.4, and the whole-step factor
priced them up to 40% too slow (held-out per-step error 12.3% whole-step, 10.4% on the
host terms, same steps).

Per-prefill-step cost (optional, `fit_profile(prefill_step=True)`): a step that carries
at least one prefill chunk costs `prefill` seconds more, a host term beside the fixed
and per-sequence ones:

    h x (fixed + per_seq x sequences + prefill x [the step has a prefill chunk]) + ...

For vLLM on the build machine (serving.vllm_engine, two recordings at load ~2 and ~8)
the fit without it priced the 33-256-token steps that carry a chunk at a median
0.78-0.85x their time (measured 2-6 ms more, whether one chunk or sixteen), while
decode-only steps came out at 0.97-1.00x: one FLOP/s fitted to both mixed and decode
steps sank to price the mid-size chunk steps, and overpriced the 400-512-token prefills
(1.08x at load 8; 1.15-1.21x in the runs at load 18-30, the miss of sharegpt-shared's
TTFT p50). With it the fitted FLOP/s rises (33.5 -> 38.3 GFLOP/s at load 8), one held-out
trace's mid-size chunk steps come out at 0.97-1.01x and its large ones at 0.97-1.03x.
Tried first and rejected on the same steps: a FLOP rate growing with a step's tokens,
peak x T / (T + L) (every L > 0 raised the fit-set error, 7.17% -> 7.2-7.95%: the
intercept it gives the compute term lands on the 1-32-token decode steps too, and the
fit answered by raising the peak to 86-8,500 GFLOP/s, large steps at 0.2-0.5x).
Prefill-heavy fit traces alone (25-37 steps of >= 256 tokens instead of 12) moved the
figures < 0.2 points (the mean relative error weighs 1,800 small steps); serving.
vllm_engine fits to them for another reason: the error is less flat in the FLOP rate.
The coefficient is fitted only where at least `PREFILL_MIN_STEPS` fit steps carry a
chunk and as many do not (else it is 0 and the profile's note says why), and kept only
where it lowers the fit-set error.

The host speed's power on the memory / compute term (optional, `fit_profile(
compute_exponent=True)`, with `host_on_overhead`):

    h x (host terms) + h^power x max(bytes / bandwidth, FLOPs / peak),  power in [0, 1]

0 is `host_on_overhead` as above, 1 the whole-step factor. For vLLM at load 8-12 the
first 512-token prefills of one recorded run took 35-40 ms at h = 0.71 and of another
65-76 ms at h = 1.5, beside the fit set's median 47 ms: large matmuls slow with the host
too, less than the probe. Fitted 0.31-0.64 on four recordings, lowering the fit-set
error on each (7.65 -> 7.25, 8.46 -> 8.28, 9.03 -> 8.90, 9.79 -> 9.71%); kept only where
it lowers the error, else 0.

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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

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
    #: seconds of the empty calls (one token, no context) that bracket this step, their
    #: mean (`suites.e2e.serving_run.ModelStep.probe_every`); 0 where none was measured
    empty_s: float = 0.0


#: The empty call's work: one token decoded over a context of one (its own).
EMPTY_CALL = StepWork(1, 1, (), 0.0)

#: The per-prefill-step cost (`fit_profile(prefill_step=True)`) is fitted only where at
#: least this many fit steps carry a prefill chunk and at least this many do not: with
#: fewer, nothing tells it from the fixed cost or the FLOP rate.
PREFILL_MIN_STEPS = 5


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


def host_factor(steps: Sequence[StepWork], empty_ref: float) -> np.ndarray:
    """Each step's host speed relative to the reference (module docstring): its empty
    call's seconds over `empty_ref`; 1 where either is not measured (0)."""
    empty = np.array([s.empty_s for s in steps], dtype=float)
    if not empty_ref > 0:
        return np.ones(len(empty))
    out: np.ndarray = np.where(empty > 0, empty / empty_ref, 1.0)
    return out


def sequences(steps: Sequence[StepWork]) -> np.ndarray:
    """Sequences each step schedules (its decoders and its prefill chunks)."""
    return np.array([s.decoders + len(s.chunks) for s in steps], dtype=float)


def prefill_steps(steps: Sequence[StepWork]) -> np.ndarray:
    """1 for each step that carries at least one prefill chunk, else 0."""
    return np.array([1.0 if s.chunks else 0.0 for s in steps])


def predict_seconds(
    tm: TimeModel,
    steps: Sequence[StepWork],
    fixed: float,
    bandwidth: float,
    peak: float,
    empty_ref: float = 0.0,
    per_seq: float = 0.0,
    host_on_overhead: bool = False,
    *,
    prefill: float = 0.0,
    compute_exponent: float = 0.0,
) -> np.ndarray:
    """Modeled seconds per step: `fixed` + `per_seq` x sequences + `prefill` where the
    step carries a prefill chunk + max(bytes / bandwidth, FLOPs / peak), scaled by the
    step's host speed (`host_factor`: its empty call over `empty_ref`; 1 without); with
    `host_on_overhead` only the first three (host) terms are, and the last by the host
    speed to the power `compute_exponent` (0: not at all)."""
    nbytes, flops = _features(tm, steps)
    overhead = fixed + per_seq * sequences(steps) + prefill * prefill_steps(steps)
    work = np.maximum(nbytes / bandwidth, flops / peak)
    factor = host_factor(steps, empty_ref)
    if not host_on_overhead:
        whole: np.ndarray = factor * (overhead + work)
        return whole
    out: np.ndarray = factor * overhead + factor**compute_exponent * work
    return out


def empty_call_seconds(tm: TimeModel, fixed: float, bandwidth: float, peak: float) -> float:
    """The model's price of the empty call (`EMPTY_CALL`: the weights read once, one
    token's FLOPs) at the reference speed: beside the measured `Fit.empty_ref`, a check
    that the fitted fixed term and the measured empty call agree."""
    return float(predict_seconds(tm, [EMPTY_CALL], fixed, bandwidth, peak)[0])


@dataclass(frozen=True)
class Fit:
    """A fitted profile and its mean absolute relative per-step error on the fit steps."""

    profile: DeviceProfile
    error: float
    steps: int
    #: median seconds of the fit steps' empty calls: the host speed the profile describes
    #: (`host_factor`); 0 where the steps carry none (every step priced at factor 1)
    empty_ref: float = 0.0
    #: seconds per scheduled sequence per step (`fit_profile(per_sequence=True)`), else 0
    seq_overhead_s: float = 0.0
    #: the host factor scales only the host terms: fixed, per-sequence, per-prefill-step
    host_on_overhead: bool = False
    #: seconds more for a step that carries a prefill chunk (`fit_profile(prefill_step=
    #: True)`), 0 where not fitted
    prefill_step_s: float = 0.0
    #: with `host_on_overhead`, the memory / compute term scaled by the host speed to this
    #: power, in [0, 1] (`fit_profile(compute_exponent=True)`), 0 where not fitted
    compute_exponent: float = 0.0


def fit_profile(
    tm: TimeModel,
    steps: Sequence[StepWork],
    name: str = "cpu-fit",
    *,
    max_bandwidth: float | None = None,
    max_flops: float | None = None,
    per_sequence: bool = False,
    host_on_overhead: bool = False,
    prefill_step: bool = False,
    compute_exponent: bool = False,
) -> Fit:
    """The profile (fixed, bandwidth, peak) that best prices `steps` (module docstring),
    with bandwidth <= `max_bandwidth` (B/s) and FLOP/s <= `max_flops` where given.

    Where every step carries an empty call measured beside it (`StepWork.empty_s`), each
    step is priced at its host speed (`host_factor`, reference: the median empty call,
    returned as `Fit.empty_ref`); the three coefficients are fitted either way, and with
    `per_sequence` a fourth, the cost per scheduled sequence (`Fit.seq_overhead_s`);
    `host_on_overhead` scales only the host terms (fixed, per-sequence, per-prefill-step);
    `prefill_step` fits the cost of a step that carries a prefill chunk
    (`Fit.prefill_step_s`, where enough steps do and do not; module docstring);
    `compute_exponent` (with `host_on_overhead`, where the steps carry their host speed)
    the power of the host speed on the memory / compute term (`Fit.compute_exponent`)."""
    from scipy.optimize import minimize

    for label, cap in (("max_bandwidth", max_bandwidth), ("max_flops", max_flops)):
        if cap is not None and not (math.isfinite(cap) and cap > 0):
            raise ConfigError(f"{label} must be a finite number > 0, got {cap!r}")
    work = [s for s in steps if s.seconds > 0 and (s.decoders or s.chunks)]
    if len(work) < 3:
        raise ConfigError(f"need at least 3 measured steps to fit, got {len(work)}")
    meas = np.array([s.seconds for s in work])
    nbytes, flops = _features(tm, work)
    empty = np.array([s.empty_s for s in work])
    probed = bool((empty > 0).all())  # every step carries its host speed
    empty_ref = float(np.median(empty)) if probed else 0.0
    factor = host_factor(work, empty_ref)
    # start: time ~ a + b * FLOPs (least squares, at the reference speed), memory small
    slope, icpt = np.polyfit(flops, meas / factor, 1)
    slope = slope if slope > 0 else float(np.median(meas / factor / flops))
    icpt = max(float(icpt), 1e-6)
    start = np.log([icpt, float(np.median(nbytes)) / icpt, 1.0 / slope])
    upper = [0.0, _log_cap(max_bandwidth), _log_cap(max_flops)]  # fixed <= 1 s
    start = np.minimum(start, np.asarray(upper) - 1e-9)
    bounds: list[tuple[float | None, float | None]] = [
        (None, hi if math.isfinite(hi) else None) for hi in upper
    ]
    seqs = sequences(work)
    prefills = prefill_steps(work)

    def loss(
        x: np.ndarray,
        seq_at: int | None = None,
        pre_at: int | None = None,
        exp_at: int | None = None,
    ) -> float:
        fixed, bw, peak = np.exp(x[:3])
        overhead = fixed + (math.exp(x[seq_at]) * seqs if seq_at is not None else 0.0)
        if pre_at is not None:
            overhead = overhead + math.exp(x[pre_at]) * prefills
        work = np.maximum(nbytes / bw, flops / peak)
        if host_on_overhead:
            scale = factor ** float(x[exp_at]) if exp_at is not None else 1.0
            pred = factor * overhead + scale * work
        else:
            pred = factor * (overhead + work)
        return float(np.mean(np.abs(pred - meas) / meas))

    best = minimize(
        loss, start, method="Nelder-Mead", bounds=bounds, options={"maxiter": 4000, "xatol": 1e-4}
    )
    fine = {"maxiter": 20000, "xatol": 1e-6, "fatol": 1e-9}
    per_seq = 0.0
    seq_at: int | None = None
    if per_sequence:  # from the 3-coefficient optimum, a tenth of the fixed cost per sequence
        x0 = np.append(best.x, best.x[0] + math.log(0.1))
        four = minimize(
            loss, x0, args=(3, None), method="Nelder-Mead", bounds=[*bounds, (None, 0.0)],
            options=fine,
        )  # fmt: skip
        if four.fun < best.fun:
            best, per_seq, seq_at = four, float(math.exp(four.x[3])), 3
            bounds = [*bounds, (None, 0.0)]
    prefill, prefill_note = 0.0, ""
    pre_at: int | None = None
    if prefill_step:
        best, prefill, prefill_note = _fit_prefill(loss, best, bounds, seq_at, prefills, fine)
        if prefill > 0:
            pre_at, bounds = len(best.x) - 1, [*bounds, (None, 0.0)]
    exponent = 0.0
    if compute_exponent and host_on_overhead and probed:  # from 0.5, within [0, 1]
        at, bounds_at = len(best.x), [*bounds, (0.0, 1.0)]
        more = minimize(
            loss, np.append(best.x, 0.5), args=(seq_at, pre_at, at), method="Nelder-Mead",
            bounds=bounds_at, options=fine,
        )  # fmt: skip
        if more.fun < best.fun:
            best, exponent = more, float(more.x[-1])
    # every later stage re-optimizes the earlier coefficients too: read them from the end
    per_seq = float(math.exp(best.x[seq_at])) if seq_at is not None else 0.0
    if pre_at is not None:
        prefill = float(math.exp(best.x[pre_at]))
        prefill_note = f"; {prefill * 1e3:.3g} ms more for a step with a prefill chunk"
    if compute_exponent and host_on_overhead and probed:
        prefill_note += f"; host speed^{exponent:.2f} on the memory / compute term"
    fixed, bw, peak = (float(v) for v in np.exp(best.x[:3]))
    bw = min(bw, max_bandwidth) if max_bandwidth is not None else bw  # exp(log) rounding
    peak = min(peak, max_flops) if max_flops is not None else peak
    caps = "".join(
        f", {what} <= {cap:.3g} measured" for what, cap in
        (("bandwidth", max_bandwidth), ("FLOP/s", max_flops)) if cap is not None
    )  # fmt: skip
    speed = (
        f"; each step at its host speed, empty call / median {empty_ref * 1e3:.3g} ms"
        if probed
        else ""
    )
    if per_sequence:
        speed += f"; {per_seq * 1e3:.3g} ms per scheduled sequence"
    speed += prefill_note
    if host_on_overhead and probed:
        speed += " (host speed on the host terms)"
    profile = DeviceProfile(
        name,
        bw,
        peak,
        tm.profile.host_link_bandwidth,
        f"fitted to {len(work)} measured steps (mean |error| {best.fun:.1%}{caps}{speed})",
        step_overhead_s=fixed,
        interconnect_bandwidth=tm.profile.interconnect_bandwidth,
    )
    return Fit(
        profile, float(best.fun), len(work), empty_ref, per_seq, host_on_overhead, prefill,
        exponent,
    )  # fmt: skip


def _fit_prefill(
    loss: Callable[..., float],
    best: Any,
    bounds: list[tuple[float | None, float | None]],
    seq_at: int | None,
    prefills: np.ndarray,
    options: dict[str, float],
) -> tuple[Any, float, str]:
    """The per-prefill-step cost added to the optimum `best` (`fit_profile(prefill_step=
    True)`): (the new optimum, the cost in seconds, why it is not fitted: the profile
    note's words, empty where it is); the cost is 0 and `best` unchanged where too few
    steps carry a chunk or too few do not, or where it does not lower the error."""
    from scipy.optimize import minimize

    with_chunk = int(prefills.sum())
    without = len(prefills) - with_chunk
    if min(with_chunk, without) < PREFILL_MIN_STEPS:
        why = f"{with_chunk} steps carry a prefill chunk, {without} do not"
        return best, 0.0, f"; no per-prefill-step cost ({why}; {PREFILL_MIN_STEPS} of each needed)"
    at = len(best.x)  # from a tenth of the fixed cost
    x0 = np.append(best.x, best.x[0] + math.log(0.1))
    more = minimize(
        loss, x0, args=(seq_at, at), method="Nelder-Mead", bounds=[*bounds, (None, 0.0)],
        options=options,
    )  # fmt: skip
    if not more.fun < best.fun:
        return best, 0.0, "; no per-prefill-step cost (it did not lower the error)"
    return more, float(math.exp(more.x[at])), ""


def _log_cap(cap: float | None) -> float:
    return math.log(cap) if cap is not None else math.inf


def step_errors(
    tm: TimeModel,
    steps: Sequence[StepWork],
    empty_ref: float = 0.0,
    per_seq: float = 0.0,
    host_on_overhead: bool = False,
    *,
    prefill: float = 0.0,
    compute_exponent: float = 0.0,
) -> np.ndarray:
    """|modeled - measured| / measured per step, priced by `tm`'s own profile (the same
    formula as `TimeModel.step_ps`, unrounded; plus `per_seq` per scheduled sequence,
    the fit's `seq_overhead_s`), each step at its host speed where `empty_ref` > 0 and it
    carries an empty call (`host_factor`; pass the fit's; `host_on_overhead`, `prefill`
    (the fit's `prefill_step_s`) and `compute_exponent` as the fit's)."""
    work = [s for s in steps if s.seconds > 0 and (s.decoders or s.chunks)]
    if not work:
        return np.zeros(0)
    p = tm.profile
    pred = predict_seconds(
        tm, work, p.step_overhead_s, p.hbm_bandwidth, p.peak_flops, empty_ref, per_seq,
        host_on_overhead, prefill=prefill, compute_exponent=compute_exponent,
    )  # fmt: skip
    meas = np.array([s.seconds for s in work])
    errors: np.ndarray = np.abs(pred - meas) / meas
    return errors


def without_empty_calls(steps: Sequence[StepWork]) -> list[StepWork]:
    """`steps` with their empty calls dropped (every step at factor 1): the constant
    model's fit and error on the same steps, a paired diagnostic."""
    return [replace(s, empty_s=0.0) for s in steps]


def with_profile(tm: TimeModel, profile: DeviceProfile) -> TimeModel:
    """`tm` priced on another device profile."""
    return replace(tm, profile=profile)


def mean(values: np.ndarray) -> float:
    return float(values.mean()) if values.size else math.nan
