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
    "ctx_len": "tokens",
    "context": "tokens",
    "seq_len": "tokens",
    "q_len": "tokens",
    "avg_len": "tokens",
    "block_size": "tokens",
    "batch": "requests",
    "requests": "requests",
}


def is_detail(metric: str) -> bool:
    """True for a debug column (see the module docstring)."""
    return metric.startswith(_DETAIL_PREFIXES) or metric.endswith(_DETAIL_SUFFIXES)


def header(param: str) -> str:
    """A case parameter's column header, with its unit where it has one."""
    unit = PARAM_UNITS.get(param)
    return f"{param} [{unit}]" if unit else param
