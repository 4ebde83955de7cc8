"""Static kernel costs from the ahead-of-time compile (kernels.aot): registers per
thread, spilled bytes, shared memory and SASS instruction count of each Triton kernel
configuration for sm_80 and sm_90. Needs no GPU; deterministic for a given Triton version
and kernel source, so the same numbers appear on every machine (records are cached under
out/aot/). Compiling takes minutes the first time on a small CPU, so the default bench
leaves this sweep out: run it with `--only kernel.static` or `--full`. Its default grid is the headline configurations (float16, head dim 128); the
full grid is every configuration the dispatch can choose.
"""

from __future__ import annotations

from kvbench.reports.provenance import COMPILED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep


def _configs(full: bool) -> list:  # type: ignore[type-arg]
    from kvbench.kernels import aot, configs

    return configs.all_configs() if full else aot.headline_configs()


def _cases(full: bool) -> list[Case]:
    from kvbench.kernels import aot

    return [
        {"kernel": cfg.kernel, "config": aot.config_json(cfg.describe()), "arch": f"sm_{arch}"}
        for cfg in _configs(full)
        for arch in aot.ARCHS
    ]


@sweep(
    "kernel.static",
    "Triton kernels compiled ahead of time for sm_80 / sm_90: registers, spills, shared "
    "memory, SASS instructions (no GPU needed)",
    _cases,
    requires=("kvbench.kernels.aot",),
    tags=("kernel",),
    in_default=False,
    produced=(COMPILED,),
)
def static_costs(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.kernels import aot, configs

    matches = [
        cfg
        for cfg in configs.all_configs() + aot.headline_configs()
        if cfg.kernel == case["kernel"] and aot.config_json(cfg.describe()) == case["config"]
    ]
    if not matches:
        raise LookupError(f"no kernel configuration {case['kernel']} {case['config']}")
    arch = int(case["arch"].removeprefix("sm_"))
    (record,) = aot.compile_all([matches[0]], [arch], workers=1)
    out = [
        Measurement(metric, float(getattr(record, metric)), unit)
        for metric, unit in aot.METRICS.items()
    ]
    out.append(Measurement("limit_violations", float(len(record.violations())), "count"))
    return out
