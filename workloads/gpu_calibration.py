"""kvbench's GPU time model beside measured operator profiles: points, errors, fits.

`calibrate(data, judge=False)` prices every measured (GPU, model, TP, num_tokens,
operator group) of a `VidurProfiles` three ways:

    datasheet  kvbench's step-model form at 100% of the datasheet peaks, no floor
    fitted     the per-kernel form (`gpu_fit`) under a fitted `Efficiency`
    measured   the profile's median

Fit mode (`judge=False`): per GPU, each model is judged by a fit on the GPU's OTHER
models (held out); a GPU with a single model is fitted on itself and its points are not
held out. The fit on all of a GPU's models is reported too (it is what
`kvbench.workloads.fitted_gpu` ships). Judge mode: the shipped fitted efficiency of each
GPU is applied without refitting; a model the shipped fit used is not held out. A GPU
with no fitted profile is refused by name, or priced at its datasheet (stated in
`notes`) with `fallback=True`.

Errors are relative: predicted / measured - 1. "Held-out mean absolute error" is the
mean |error| of the fitted linear-layer times over held-out points.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kvbench.workloads.efficiency import DATASHEET, Efficiency
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.fitted_gpu import VIDUR_GPU_NAMES
from kvbench.workloads.gpu_fit import (
    GROUPS,
    LINEAR_GROUPS,
    allreduce_seconds,
    fit_allreduce,
    fit_efficiency,
    kernel_seconds,
    operator_work,
    roofline_seconds,
)
from kvbench.workloads.profiles import PROFILES, DeviceProfile
from kvbench.workloads.vidur import OperatorRow, VidurProfiles


@dataclass(frozen=True)
class Point:
    """One operator group of one measured row, priced (seconds per layer)."""

    gpu: str
    profile: str
    model: str
    tp: int
    num_tokens: int
    group: str
    measured_s: float
    datasheet_s: float
    fitted_s: float
    held_out: bool

    @property
    def linear(self) -> bool:
        return self.group in LINEAR_GROUPS

    def error(self, which: str) -> float:
        """predicted / measured - 1 of 'datasheet' or 'fitted'."""
        pred = self.datasheet_s if which == "datasheet" else self.fitted_s
        return pred / self.measured_s - 1.0


@dataclass(frozen=True)
class FitReport:
    """One fit: on which models, judged on which, the coefficients, the errors."""

    gpu: str
    efficiency: Efficiency
    judged_on: tuple[str, ...]
    train_mae: float
    test_mae: float  # NaN when nothing was held out
    datasheet_mae: float


@dataclass(frozen=True)
class AllReduceReport:
    """The all-reduce model against one cluster's measurements (single-node rows)."""

    cluster: str
    profile: str
    rows: int
    datasheet_latency_s: float
    datasheet_bandwidth: float
    datasheet_mae: float
    fitted_latency_s: float
    fitted_bandwidth: float
    fitted_mae: float
    by_workers: dict[int, tuple[float, float]]  # workers -> (datasheet MAE, fitted MAE)
    skipped_multinode: int


@dataclass
class Calibration:
    """Everything `calibrate` found (see module docstring)."""

    mode: str
    points: list[Point] = field(default_factory=list)
    fits: list[FitReport] = field(default_factory=list)
    full_fits: dict[str, Efficiency] = field(default_factory=dict)
    profiles: dict[str, DeviceProfile] = field(default_factory=dict)
    allreduce: list[AllReduceReport] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def held_out_mae(self, gpu: str | None = None, which: str = "fitted") -> float:
        """Mean |error| of held-out linear-layer points (NaN when there are none)."""
        errs = [
            abs(p.error(which))
            for p in self.points
            if p.linear and p.held_out and (gpu is None or p.gpu == gpu)
        ]
        return float(np.mean(errs)) if errs else math.nan


def profile_for(gpu: str) -> DeviceProfile | None:
    """kvbench's profile for a profile-folder GPU name (None when kvbench has none)."""
    name = VIDUR_GPU_NAMES.get(gpu.lower(), gpu.lower())
    return PROFILES.get(name)


def mae(errors: Iterable[float]) -> float:
    """Mean absolute value (NaN for none)."""
    vals = [abs(e) for e in errors]
    return float(np.mean(vals)) if vals else math.nan


def _price(
    rows: Sequence[OperatorRow], prof: DeviceProfile, eff: Efficiency, held_out: Callable
) -> list[Point]:
    """Each row's operator groups: measured, at `prof`'s datasheet, and at `eff`; the
    points name the device profile (never its '-datasheet' variant: `eff` priced them)."""
    name = prof.name.removesuffix("-datasheet")
    out = []
    for r in rows:
        for group, ops in GROUPS.items():
            works = [operator_work(r.shape, r.tp, r.num_tokens, op) for op in ops]
            out.append(
                Point(
                    r.gpu,
                    name,
                    r.model,
                    r.tp,
                    r.num_tokens,
                    group,
                    sum(r.median_ms[op] for op in ops) * 1e-3,
                    sum(roofline_seconds(w, prof, DATASHEET) for w in works),
                    sum(kernel_seconds(w, prof, eff) for w in works),
                    held_out(r),
                )
            )
    return out


def _linear_mae(points: Iterable[Point], which: str) -> float:
    return mae(p.error(which) for p in points if p.linear)


def calibrate(data: VidurProfiles, *, judge: bool = False, fallback: bool = False) -> Calibration:
    """Price every measured point (module docstring); refuses an unknown GPU by name."""
    cal = Calibration("judge" if judge else "fit")
    for gpu in data.gpus():
        prof = profile_for(gpu)
        if prof is None:
            raise ConfigError(
                f"GPU {gpu!r} in {data.root}: kvbench has no profile for it (known: "
                f"{', '.join(sorted(VIDUR_GPU_NAMES))} as {', '.join(VIDUR_GPU_NAMES.values())})"
            )
        cal.profiles[gpu] = prof
        rows = [r for r in data.operators if r.gpu == gpu]
        if judge:
            _judge_gpu(cal, gpu, prof, rows, fallback)
        else:
            _fit_gpu(cal, gpu, prof.datasheet(), rows, data.models(gpu))
    _allreduce(cal, data)
    return cal


def _fit_gpu(
    cal: Calibration, gpu: str, prof: DeviceProfile, rows: list[OperatorRow], models: list[str]
) -> None:
    cal.full_fits[gpu] = fit_efficiency(rows, prof, f"fit on every model of {gpu}")
    if len(models) < 2:
        eff = cal.full_fits[gpu]
        cal.notes.append(f"GPU {gpu}: one model ({models[0]}): fitted on itself, nothing held out")
        pts = _price(rows, prof, eff, lambda r: False)
        cal.points.extend(pts)
        cal.fits.append(
            FitReport(
                gpu, eff, (), _linear_mae(pts, "fitted"), math.nan, _linear_mae(pts, "datasheet")
            )
        )
        return
    for model in models:
        train = [r for r in rows if r.model != model]
        test = [r for r in rows if r.model == model]
        eff = fit_efficiency(train, prof)
        pts = _price(test, prof, eff, lambda r: True)
        cal.points.extend(pts)
        cal.fits.append(
            FitReport(
                gpu,
                eff,
                (model,),
                _linear_mae(_price(train, prof, eff, lambda r: False), "fitted"),
                _linear_mae(pts, "fitted"),
                _linear_mae(pts, "datasheet"),
            )
        )


def _judge_gpu(
    cal: Calibration, gpu: str, prof: DeviceProfile, rows: list[OperatorRow], fallback: bool
) -> None:
    eff = prof.efficiency
    if prof.calibration == "datasheet":
        if not fallback:
            fitted = [n for n, p in PROFILES.items() if p.calibration == "fitted"]
            raise ConfigError(
                f"GPU {gpu!r} (profile {prof.name}) has no fitted profile (fitted: "
                f"{', '.join(fitted)}); --datasheet-fallback prices it at the datasheet"
            )
        cal.notes.append(
            f"GPU {gpu}: no fitted profile for {prof.name}: priced at the datasheet "
            "(fractions 1, no floor)"
        )
    if eff.from_profile:
        cal.notes.append(f"GPU {gpu}: {prof.name} carries {eff.from_profile}'s fit (transferred)")
    used = set(eff.fitted_on)
    pts = _price(rows, prof.datasheet(), eff, lambda r: r.model not in used)
    cal.points.extend(pts)
    seen = sorted({r.model for r in rows} & used)
    if seen:
        cal.notes.append(f"GPU {gpu}: {', '.join(seen)} was used by the shipped fit: not held out")
    held = [p for p in pts if p.held_out]
    cal.fits.append(
        FitReport(
            gpu,
            eff,
            tuple(sorted({p.model for p in held})),
            _linear_mae([p for p in pts if not p.held_out], "fitted"),
            _linear_mae(held, "fitted"),
            _linear_mae(held, "datasheet"),
        )
    )


def _allreduce(cal: Calibration, data: VidurProfiles) -> None:
    by_cluster: dict[str, list] = defaultdict(list)
    for r in data.allreduce:
        by_cluster[r.cluster].append(r)
    for cluster, rows in sorted(by_cluster.items()):
        prof = profile_for(cluster.split("_")[0])
        if prof is None:
            cal.notes.append(f"all-reduce {cluster}: no kvbench profile for it, not compared")
            continue
        single = [r for r in rows if r.num_workers <= r.devices_per_node and r.num_workers > 1]
        if not single:
            cal.notes.append(f"all-reduce {cluster}: no single-node rows, not compared")
            continue
        lat, bw, fit_mae = fit_allreduce(single)
        ds = prof.allreduce_latency_s, prof.interconnect_bandwidth
        workers: dict[int, tuple[float, float]] = {}
        for n in sorted({r.num_workers for r in single}):
            sel = [r for r in single if r.num_workers == n]
            workers[n] = (
                mae(
                    allreduce_seconds(r.size_bytes, n, *ds) / (r.median_ms * 1e-3) - 1 for r in sel
                ),
                mae(
                    allreduce_seconds(r.size_bytes, n, lat, bw) / (r.median_ms * 1e-3) - 1
                    for r in sel
                ),
            )
        cal.allreduce.append(
            AllReduceReport(
                cluster,
                prof.name,
                len(single),
                ds[0],
                ds[1],
                mae(
                    allreduce_seconds(r.size_bytes, r.num_workers, *ds) / (r.median_ms * 1e-3) - 1
                    for r in single
                ),
                lat,
                bw,
                fit_mae,
                workers,
                len(rows) - len(single),
            )
        )


def token_bucket(tokens: int) -> str:
    """The num_tokens band a point is reported in."""
    for hi, label in (
        (1, "1"),
        (16, "2-16"),
        (128, "17-128"),
        (512, "129-512"),
        (1024, "513-1024"),
    ):
        if tokens <= hi:
            return label
    return "1025-4096"


TOKEN_BUCKETS = ("1", "2-16", "17-128", "129-512", "513-1024", "1025-4096")
