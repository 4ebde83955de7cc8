"""serving.measured's CPU calibration as a table: each coefficient of the step-time model,
its value with its unit, and where it came from (measured in the run, or fitted to
separate runs within a measured bound), so the page shows every coefficient beside its
source instead of a row of wide columns."""

from __future__ import annotations

import pandas as pd

from kvbench.reports.coefficient_table import CoefficientRow, coefficient_table
from kvbench.reports.derived_table import DerivedTable

SUITE = "serving.measured"

#: The coefficients shown, each with its source (`coefficient_table.CoefficientRow`).
ROWS: tuple[CoefficientRow, ...] = (
    ("fitted_step_overhead", "fixed per-step cost", "ms", 1e3,
     "fitted to the fit runs' steps, at the host speed of their median empty call"),
    ("empty_call_median", "empty call (1 token, no context)", "ms", 1e3,
     "measured here, between every two steps of every run (median over the fit steps of "
     "each step's two bracketing calls): the reference host speed; each step is priced "
     "scaled by its own bracketing calls over this"),
    ("empty_call_modeled", "empty call, priced by the fitted model", "ms", 1e3,
     "the fitted coefficients' price of the empty call's work (weights read once, one "
     "token): a check of the fitted fixed cost against the measured call above"),
    ("fitted_bandwidth", "bandwidth", "GB/s", 1e-9,
     "fitted to the fit runs' steps, bounded by the copy peak below"),
    ("copy_peak_measured", "copy peak (64 MiB, beyond the LLC)", "GB/s", 1e-9,
     "measured here, same process (fastest of 45: five bursts of 9, before the fit runs "
     "and after each; bytes read + written)"),
    ("llc_copy_peak_measured", "copy peak (buffer within the LLC)", "GB/s", 1e-9,
     "measured here, same process (fastest of 21): shown, not a bound (the steps' "
     "working set, weights + KV, exceeds what streams at this rate on a shared LLC)"),
    ("fitted_flops", "FLOP/s", "GFLOP/s", 1e-9,
     "fitted to the fit runs' steps, bounded by the FMA peak below"),
    ("fma_peak_measured", "FMA peak (512^3 float32 matmul)", "GFLOP/s", 1e-9,
     "measured here, same process (fastest of 45, in the same bursts as the copy peak)"),
    ("fit_step_error_mean", "fit-set mean |per-step error|", "%", 1e2,
     "the fitted model on the steps it was fitted to"),
    ("fit_steps", "fit steps", "steps", 1.0, "counted"),
    ("unbounded_fitted_bandwidth", "bandwidth, fit without bounds (diagnostic)", "GB/s", 1e-9,
     "the same steps fitted with no bound: what physicality costs"),
    ("unbounded_fit_step_error_mean", "fit-set error without bounds (diagnostic)", "%", 1e2,
     "as above"),
    ("constant_fit_step_error_mean", "fit-set error without the empty calls (diagnostic)",
     "%", 1e2, "the same steps fitted within the same bounds, every step at the reference "
     "speed (the definition before the empty calls; held out: step_error_mean_constant)"),
)  # fmt: skip


def calibration_table(frame: pd.DataFrame) -> DerivedTable | None:
    """The calibration case's coefficients with units and sources (None without it)."""
    return coefficient_table(
        frame,
        SUITE,
        ROWS,
        title="CPU calibration: the step-time model's coefficients and their sources",
        note="step seconds = h x (fixed + max(bytes read / bandwidth, FLOPs / FLOP/s)), bytes = the "
        "weights once + each sequence's own KV tokens (paged and contiguous alike, read in "
        "place), h = the host speed measured beside each step (the mean of its two "
        "bracketing empty calls over their fit-set median; measured, never fitted); fitted on separate runs (paged, "
        "batches 1 / 6 / 24 and Poisson 8 req/s), judged on every other case's steps (held "
        "out: their step_error_mean; without the empty calls: step_error_mean_constant).",
        required="fitted_bandwidth",
    )
