"""Which columns a sweep table shows up front and which it keeps in a details section, and
the units of the case parameters in its header.

Debug columns (the runner's case wall time, kernel build and first-call times, simulation
wall time, backend and path flags, output-agreement checks) tell how a number was taken,
not what it is: the page keeps them in a collapsed "details" table under the main one.
"""

from __future__ import annotations

#: Metric-name prefixes and suffixes of the debug columns.
_DETAIL_PREFIXES = (
    "backend_is_",
    "kernel_path_is_",
    "contiguous_form_is_",
    "contiguous_sdpa_backend_",
    "rel_diff_",
)
_DETAIL_SUFFIXES = ("wall_time", "build_time", "first_call_time", "_evaluations")

#: Units of the case parameters, shown in the table header ("rate [requests/s]").
PARAM_UNITS: dict[str, str] = {
    "rate": "requests/s",
    "duration": "s",
    "duration_s": "s",
    "ctx_len": "tokens",
    "context": "tokens",
    "seq_len": "tokens",
    "q_len": "tokens",
    "avg_len": "tokens",
    "block_size": "tokens",
    "batch": "requests",
    "requests": "requests",
}


#: Case parameters whose cells carry their own unit (formatted by
#: `workloads.units.format_quantity`: 42949672960 B reads "40 GiB"), so the header has none.
PARAM_CELL_UNITS: dict[str, str] = {"kv_budget": "B"}

#: Per sweep, case parameters that the page states once above its table instead of in a
#: column, when every case has the same value (the table stays narrow enough to read).
SUITE_FIXED_KEYS: dict[str, tuple[str, ...]] = {
    "serving.kv_specs": ("kv_budget", "block_size", "profile"),
}

#: Per sweep, metrics that are its diagnostics rather than its results (kept in the
#: details table): serving.measured's calibration case has its own table of coefficients
#: and their sources (`reports.serving_measured`), so its columns, the unbounded-fit
#: diagnostic and bookkeeping counts do not widen the main table.
SUITE_DETAILS: dict[str, tuple[str, ...]] = {
    "serving.measured": (
        "fit_step_error_mean",
        "fitted_step_overhead",
        "fitted_bandwidth",
        "fitted_flops",
        "fit_steps",
        "copy_peak_measured",
        "copy_peak_measured_median",
        "llc_copy_peak_measured",
        "llc_bytes",
        "fma_peak_measured",
        "fma_peak_measured_median",
        "fitted_bandwidth_of_copy_peak",
        "fitted_flops_of_fma_peak",
        "empty_call_median",
        "empty_call_modeled",
        "constant_fit_step_error_mean",
        "constant_fitted_step_overhead",
        "constant_fitted_bandwidth",
        "constant_fitted_flops",
        "unbounded_fit_step_error_mean",
        "unbounded_fitted_step_overhead",
        "unbounded_fitted_bandwidth",
        "unbounded_fitted_flops",
        "step_error_mean_unbounded",
        "model_seconds_modeled",
        "steps_timed",
        "normalized_latency_p99",
        "ttft_p99",
    ),
    # the summary table (`reports.kv_specs`) sets windowed and full side by side; the
    # main table keeps what it shows, the rest are how it was computed
    "serving.kv_specs": (
        "mean_running",
        "peak_pages_used",
        "pool_pages",
        "page_bytes",
        "latency_bound",
        "rate_limit",
        "windowed_layers",
        "peak_pool_fraction",
        "preemptions",
    ),
}


def is_detail(metric: str, suite: str = "") -> bool:
    """True for a debug column (see the module docstring), or one of `suite`'s
    diagnostics (`SUITE_DETAILS`)."""
    if metric in SUITE_DETAILS.get(suite, ()):
        return True
    return metric.startswith(_DETAIL_PREFIXES) or metric.endswith(_DETAIL_SUFFIXES)


def param_cell_unit(param: str) -> str:
    """The unit a case parameter's cells carry themselves ("" when they carry none)."""
    return PARAM_CELL_UNITS.get(param, "")


def header(param: str) -> str:
    """A case parameter's column header, with its unit where it has one (and its cells
    do not carry it)."""
    unit = PARAM_UNITS.get(param)
    return f"{param} [{unit}]" if unit else param
