"""Fitted GPU efficiencies shipped with kvbench (data, with their source).

Each entry: the fractions of the datasheet HBM bandwidth and dense fp16 FLOP/s that the
linear layers of the measured models reach, and the per-kernel floor, fitted by
`kvbench.workloads.gpu_fit.fit_efficiency` on every row of both models' `mlp.csv` of
Vidur's operator profiles (microsoft/vidur `data/profiling`, MIT license; the copy in
`shared/data/vidur`: compute/<gpu>/meta-llama/{Llama-2-7b-hf,Llama-2-70b-hf}, num_tokens
1-4096, TP 1/2/4/8, 1,044 rows x 4 linear layers per model). Regenerate with
`kvbench calibrate gpu --profiles DIR` (its "fit on every <gpu> model" lines);
`suites/tests/workloads/test_gpu_fit.py` checks that a refit on the shared data
reproduces them.

Held-out error (fit on one model, judged on the other, linear layers, mean |pred/meas-1|),
from `kvbench calibrate gpu --profiles ../shared/data/vidur`:
a100 6.3% (fit 7B, judge 70B) and 8.0% (fit 70B, judge 7B), 7.2% together;
h100 9.6% and 9.1%, 9.3% together; the datasheet roofline 35.4% (a100) and 40.7% (h100).
"""

from __future__ import annotations

from kvbench.workloads.efficiency import Efficiency

_SOURCE = (
    "fitted to Vidur's measured operator profiles (microsoft/vidur data/profiling, MIT) "
    "{gpu}: Llama-2-7B and Llama-2-70B linear layers, num_tokens 1-4096, TP 1-8 "
    "(kvbench calibrate gpu)"
)
_MODELS = ("meta-llama/Llama-2-70b-hf", "meta-llama/Llama-2-7b-hf")

#: Vidur's GPU folder names -> kvbench profile names (Vidur's A100 is the 80 GB DGX part).
VIDUR_GPU_NAMES = {"a100": "a100-80gb", "h100": "h100"}

#: Fitted efficiency per kvbench profile name (a100-40gb and h200: see TRANSFERRED).
_MEASURED: dict[str, Efficiency] = {
    "a100-80gb": Efficiency(
        hbm_fraction=0.8626,
        flops_fraction=0.7289,
        kernel_floor_s=5.62e-6,
        source=_SOURCE.format(gpu="A100-80GB"),
        fitted_on=_MODELS,
    ),
    "h100": Efficiency(
        hbm_fraction=0.9659,
        flops_fraction=0.7240,
        kernel_floor_s=6.31e-6,
        source=_SOURCE.format(gpu="H100-SXM"),
        fitted_on=_MODELS,
    ),
}


def _transferred(src: str, to: str, why: str) -> Efficiency:
    e = _MEASURED[src]
    return Efficiency(
        e.hbm_fraction,
        e.flops_fraction,
        e.kernel_floor_s,
        f"{src}'s fit applied to {to} (an assumption, not measured on {to}: {why}); " + e.source,
        e.fitted_on,
        from_profile=src,
    )


#: Devices with no measured profile here that take a sibling's fractions (same die, other
#: HBM): stated as an assumption in their source.
TRANSFERRED: dict[str, Efficiency] = {
    "a100-40gb": _transferred("a100-80gb", "a100-40gb", "same GA100 die, HBM2 instead of HBM2e"),
    "h200": _transferred("h100", "h200", "same GH100 die, HBM3e instead of HBM3"),
}
FITTED: dict[str, Efficiency] = {**_MEASURED, **TRANSFERRED}
