"""calibration.gpu: kvbench's GPU kernel model beside Vidur's measured operator times.

One case per (GPU, model, TP, num_tokens) of the profile copy in `shared/data/vidur`
(or the folder named by the environment variable `KVBENCH_VIDUR_PROFILES`; cases skip,
saying so, where neither exists). Per operator group (qkv, o, up, down, norms, rope, act,
add) three figures in microseconds per layer per rank:

    <group>_measured_us   measured on a GPU (Vidur's median; not measured here)
    <group>_datasheet_us  predicted: kvbench's roofline at 100% of the datasheet peaks
    <group>_fitted_us     predicted: the per-kernel model under the efficiency fitted on
                          the GPU's OTHER model (held out: this model was not in the fit)

and `linear_abs_error_datasheet` / `linear_abs_error_fitted`: the mean |predicted /
measured - 1| over the four linear layers of the case. The calibration page (scatter and
error tables) is built from these rows alone.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvbench.reports.provenance import PREDICTED, PUBLISHED_GPU
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.workloads.errors import CaseSkipped

GPUS = ("a100", "h100")
MODELS = ("meta-llama/Llama-2-7b-hf", "meta-llama/Llama-2-70b-hf")
TPS = (1, 2, 4, 8)
TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)
ENV = "KVBENCH_VIDUR_PROFILES"


def profile_folder() -> Path | None:
    """The Vidur-layout folder the sweep reads, or None when there is none."""
    named = os.environ.get(ENV)
    if named:
        return Path(named)
    for base in Path(__file__).resolve().parents:
        cand = base / "shared" / "data" / "vidur"
        if cand.is_dir():
            return cand
    return None


def _cases(full: bool) -> list[Case]:
    return [
        {"gpu": g, "model": m, "tp": tp, "num_tokens": t}
        for g in GPUS
        for m in MODELS
        for tp in TPS
        for t in TOKENS
    ]


def _calibration(ctx: BenchContext):  # type: ignore[no-untyped-def]
    """The held-out calibration of the profile folder, computed once per process."""
    if "calibration.gpu" not in ctx.cache:
        from kvbench.workloads.gpu_calibration import calibrate
        from kvbench.workloads.vidur import read_profiles

        folder = profile_folder()
        if folder is None or not folder.is_dir():
            raise CaseSkipped(f"no Vidur profile folder: set {ENV} or provide shared/data/vidur")
        cal = calibrate(read_profiles(folder))
        index = {(p.gpu, p.model, p.tp, p.num_tokens, p.group): p for p in cal.points}
        ctx.cache["calibration.gpu"] = index
    return ctx.cache["calibration.gpu"]


@sweep(
    "calibration.gpu",
    "kvbench's GPU kernel model (datasheet roofline, and the fitted efficiency judged on a "
    "held-out model) beside Vidur's measured per-layer operator times (A100, H100; "
    "Llama-2-7B/70B; TP 1-8; num_tokens 1-4096)",
    _cases,
    requires=("scipy",),
    tags=("calibration", "predicted"),
    produced=(
        PREDICTED,
        PUBLISHED_GPU,
    ),
)
def calibration_gpu(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.workloads.gpu_fit import GROUPS, LINEAR_GROUPS

    index = _calibration(ctx)
    key = (case["gpu"], case["model"], case["tp"], case["num_tokens"])
    if (*key, "qkv") not in index:
        raise CaseSkipped(f"the profile folder has no row for {key}")
    out: list[Measurement] = []
    errs: dict[str, list[float]] = {"datasheet": [], "fitted": []}
    for group in GROUPS:
        row = (*key, group)  # (a star inside index[...] is 3.11+ syntax to mypy)
        p = index[row]
        out += [
            Measurement(f"{group}_measured_us", p.measured_s * 1e6, "us"),
            Measurement(f"{group}_datasheet_us", p.datasheet_s * 1e6, "us"),
            Measurement(f"{group}_fitted_us", p.fitted_s * 1e6, "us"),
        ]
        if group in LINEAR_GROUPS:
            for which in errs:
                errs[which].append(abs(p.error(which)))
    out += [
        Measurement(f"linear_abs_error_{w}", sum(v) / len(v), "fraction") for w, v in errs.items()
    ]
    qkv = (*key, "qkv")
    out.append(Measurement("held_out", float(index[qkv].held_out), "bool"))
    return out
