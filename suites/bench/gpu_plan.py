"""The first GPU run as one plan (`kvbench gpu`, `nox -s gpu`): what it runs, how long each
part is expected to take, and, after the run, every timed Triton kernel case beside the
time `kernel.predicted` gives it on that GPU.

A GPU may be at hand for only minutes, so the run is planned ahead and bounded: each
step has a budget (the gpu tests, the kernel timing, the predictions, the report), and
the runner (`kvbench.suites.cli.gpu`) interrupts a step at its budget and goes on, so the
whole run ends inside `TOTAL_BUDGET_S` whatever the device does.

The estimates are modeled, with their fixed costs measured on an H200 (runs
gpu-20261128-084929 and gpu-20261128-second, Triton 3.6, 16 host cores; `MEASURED_H200`
holds each step's wall time there, which the dry run prints beside the plan). Each kernel
case's time is its bandwidth bound: the bytes the sweep counts for one call over
`predict.ATTAINABLE` of the profile's HBM bandwidth, or its FLOPs over the profile's peak
where that is longer, plus `predict.LAUNCH_SECONDS` (the memory term of `kernels.predict`
without its occupancy factor, so no compile is needed to plan). Timing one callable with a
CUDA graph (`harness.time_gpu`, `triton.testing.do_bench_cudagraph` with rep=100 ms)
captures 100 ms / estimate calls, where the estimate is its 5-call event timing outside a
graph (host-bound for short kernels: max(kernel, `HOST_CALL_S`)), each captured at
`HOST_CALL_S` (the host cost of one call of the public op, measured 100-250 us on the
H200's host), then replays the graph `GRAPH_REPLAYS` times. A case times the paged call, the contiguous SDPA call and, per repeat,
the scattered and contiguous paged layouts (`paging_layout.paired_gpu_times`), and
measures the host cost per call (`harness.host_call_time`: 50 calls a repeat). Each
distinct Triton configuration the grid reaches is compiled once at its first call
(`JIT_COMPILE_S`), and again ahead of time for the predictions (`AOT_COMPILE_S`, skipped
where `out/aot` already holds the record). The fixed costs are stated as constants below.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvbench.suites.bench.registry import Case
from kvbench.workloads.errors import ConfigError

#: The sweeps whose cases run the Triton kernels on a GPU.
GPU_SWEEPS = ("kernel.decode", "kernel.prefill")
#: The whole run's bound (s): issue 39 asks for under 8 minutes on one H100.
TOTAL_BUDGET_S = 450.0
#: Per-step budgets (s); they add up to TOTAL_BUDGET_S.
BUDGETS = {"tests": 140.0, "bench": 210.0, "predict": 70.0, "report": 30.0}
#: Repeats per kernel case (bench --repeats): the paging pair is timed this many times.
DEFAULT_REPEATS = 3
#: Fixed costs of the estimate (s), measured on an H200 (2026-11-28) unless marked assumed.
HOST_CALL_S = 160e-6  # host cost of one public-op call (host_time_paged: 104-254 us, median)
GRAPH_REP_S = 0.1  # do_bench_cudagraph's rep: the calls captured into one graph
GRAPH_REPLAYS = 10  # replays it times (each one sample)
GRAPH_FIXED_S = 0.05  # graph instantiation and stream set-up per timed callable (assumed)
HOST_CALLS_PER_REPEAT = 50  # harness.host_call_time
JIT_COMPILE_S = 0.8  # Triton JIT of one configuration at its first call (0.3-0.9 s)
AOT_COMPILE_S = 8.0  # the same configuration compiled ahead of time (assumed; cached here)
PREDICT_START_S = 30.0  # the predict step's imports and reading the run (34 s, all cached)
GPU_TEST_S = 0.65  # one gpu-marked test (100 in 73.6 s, 102 in 63.2 s)
PYTEST_START_S = 8.0  # pytest start-up and collection of suites/conformance
BENCH_START_S = 8.0  # kvbench bench start-up: imports, the run's copy peak
REPORT_S = 10.0  # kvbench report over one run (9 s)
HOST_ELEMENTS_PER_S = 5e7  # the cases' K/V built on the host and copied over (fitted)
CASE_FIXED_S = 1.0  # per case: reference calls and checks (batch 1 took 2.8-2.9 s in all)
#: Each step's wall time in the two H200 runs (s): the plan's yardstick.
MEASURED_H200 = {"tests": (80.0, 72.0), "bench": (90.0, 95.0), "predict": (34.0,), "report": (9.0,)}

#: GPU profile names `kernels.predict.GPUS` knows, by what the device name contains.
PROFILE_NAMES = (("H200", "h200"), ("H100", "h100"), ("A100", "a100"))


def gpu_profile(device_name: str) -> str | None:
    """The `kernels.predict` profile of a CUDA device name ('NVIDIA H100 80GB HBM3' ->
    'h100'), or None when no profile matches (the run then has no predictions)."""
    upper = device_name.upper()
    for needle, key in PROFILE_NAMES:
        if needle in upper:
            return key
    return None


def gpu_grid() -> list[tuple[str, Case]]:
    """Every Triton kernel case of the default grid as a CUDA machine plans it (whatever
    machine asks): (sweep, case) for kernel.decode, then kernel.prefill."""
    from kvbench.suites.bench.sweeps import kernels

    return [("kernel.decode", c) for c in kernels._decode_cases(False, gpu=True)] + [
        ("kernel.prefill", c) for c in kernels._prefill_cases(False, gpu=True)
    ]


def _shape(sweep: str, case: Mapping[str, Any]) -> tuple[int, int, int, int, int, int]:
    """(batch, context, query heads, KV heads, head dim, element bytes) of a case."""
    from kvbench.suites.bench.sweeps import kernels

    sizes = {"float16": 2, "bfloat16": 2, "float32": 4}
    if case.get("dtype") not in sizes:
        raise ConfigError(f"{sweep} case {dict(case)} has no known dtype")
    hkv, d = kernels.NUM_KV_HEADS, kernels.HEAD_DIM
    return case["batch"], case["ctx_len"], hkv * case["gqa"], hkv, d, sizes[case["dtype"]]


def case_bytes_flops(sweep: str, case: Mapping[str, Any]) -> tuple[int, int]:
    """Bytes one call moves and its FLOPs, counted as kernel.decode / kernel.prefill count
    them (K and V of every cached token, queries and outputs, block tables)."""
    b, length, hq, hkv, d, es = _shape(sweep, case)
    kv = 2 * b * length * hkv * d * es
    tables = b * -(-length // case["block_size"]) * 4
    if sweep == "kernel.decode":
        return kv + 2 * b * hq * d * es + tables, 4 * b * hq * d * length
    n = case["q_len"]
    flops = 4 * b * hq * d * (n * (length - n) + n * (n + 1) // 2)
    return kv + 2 * b * n * hq * d * es + tables, flops


def bound_seconds(sweep: str, case: Mapping[str, Any], profile: str) -> float:
    """The case's bandwidth (or FLOP) bound on `profile` (s): see the module docstring."""
    from kvbench.kernels import predict

    gpu = predict.GPUS[profile]
    nbytes, flops = case_bytes_flops(sweep, case)
    peak = gpu.fp32_flops if case["dtype"] == "float32" else gpu.tensor_flops
    return (
        max(nbytes / (predict.ATTAINABLE * gpu.hbm_bandwidth), flops / peak)
        + predict.LAUNCH_SECONDS
    )


def timed_callable_seconds(kernel_s: float) -> float:
    """Wall time of timing one callable with `harness.time_gpu` (CUDA graph) (s)."""
    estimate = max(kernel_s, HOST_CALL_S)  # its 5-call estimate runs outside a graph
    captured = max(1, int(GRAPH_REP_S / estimate))
    return (
        6 * estimate  # do_bench_cudagraph's warm-up call and its 5-call estimate
        + captured * HOST_CALL_S  # the capture launches every call from the host
        + GRAPH_REPLAYS * captured * kernel_s
        + GRAPH_FIXED_S
    )


def case_seconds(sweep: str, case: Mapping[str, Any], profile: str, repeats: int) -> float:
    """Expected wall time of one kernel case in `kvbench bench` on the GPU (s), without
    its first-call compile: the host builds its K/V, then the paged and contiguous calls
    are timed, the scattered / contiguous layouts `repeats` times each, and the host cost
    is sampled."""
    b, length, _, hkv, d, _ = _shape(sweep, case)
    kernel_s = bound_seconds(sweep, case, profile)
    setup = 2 * b * hkv * length * d / HOST_ELEMENTS_PER_S
    timed = (2 + 2 * repeats) * timed_callable_seconds(kernel_s)
    host = (3 + repeats * HOST_CALLS_PER_REPEAT) * max(kernel_s, HOST_CALL_S)
    return CASE_FIXED_S + setup + timed + host


def configs_reached(grid: Iterable[tuple[str, Case]]) -> list[Any]:
    """The distinct Triton configurations the GPU dispatch picks for `grid` (the decode's
    stage 1 and split-KV reduction, the prefill tile), each compiled once."""
    from kvbench.kernels import predict
    from kvbench.workloads.torch_dtypes import torch_dtype

    seen: dict[str, Any] = {}
    for sweep, case in grid:
        b, length, hq, hkv, d, _ = _shape(sweep, case)
        dt = torch_dtype(case["dtype"])
        launches = (
            predict.decode_launches(b, hq, hkv, d, length, dt)
            if sweep == "kernel.decode"
            else predict.prefill_launches(b, hq, hkv, d, case["q_len"], dt)
        )
        for launch in launches:
            seen.setdefault(repr(launch.config), launch.config)
    return list(seen.values())


def count_gpu_tests(root: Path | None = None) -> int:
    """How many gpu-marked conformance tests pytest collects (`-m gpu --collect-only`;
    30-50 s on a loaded 2-core machine). Raises ConfigError when collection fails."""
    cmd = [sys.executable, "-m", "pytest", "suites/conformance", "-m", "gpu"]
    cmd += ["--collect-only", "-q", "-p", "no:cacheprovider"]
    proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=False)
    for line in reversed(proc.stdout.splitlines()):
        words = line.split()
        if "collected" in words and words and "/" in words[0]:
            return int(words[0].split("/")[0])
        if "collected" in words and words and words[0].isdigit():
            return int(words[0])
    tail = (proc.stdout + proc.stderr).strip().splitlines()[-1:] or ["no output"]
    raise ConfigError(f"could not count the gpu tests (pytest exit {proc.returncode}): {tail[0]}")


@dataclass(frozen=True)
class Step:
    """One part of the GPU run: its name, what it does, the expected and allowed seconds,
    and how the expectation was made."""

    name: str
    what: str
    estimate_s: float
    budget_s: float
    how: str


@dataclass(frozen=True)
class Plan:
    """The GPU run's steps and its kernel cases with their bounds and expected costs."""

    profile: str
    repeats: int
    steps: tuple[Step, ...]
    cases: tuple[tuple[str, Case, float, float], ...]  # sweep, case, bound (s), cost (s)
    n_configs: int
    n_aot_cached: int

    @property
    def estimate_s(self) -> float:
        return sum(s.estimate_s for s in self.steps)


def build_plan(
    *,
    profile: str = "h100",
    repeats: int = DEFAULT_REPEATS,
    n_tests: int,
    aot_cached: Callable[[Any, int], bool] | None = None,
) -> Plan:
    """The plan of a GPU run on `profile` with `repeats` repeats per kernel case and
    `n_tests` gpu tests. `aot_cached(config, arch)` says whether out/aot already holds a
    configuration's compile record (default: ask `kernels.aot`'s cache)."""
    from kvbench.kernels import predict

    if profile not in predict.GPUS:
        raise ConfigError(f"unknown GPU profile {profile!r}; known: {', '.join(predict.GPUS)}")
    if repeats < 1 or n_tests < 0:
        raise ConfigError(f"bad plan: repeats {repeats} (need >= 1), gpu tests {n_tests}")
    cached = aot_cached or _aot_cached
    grid = gpu_grid()
    rows = tuple(
        (sw, c, bound_seconds(sw, c, profile), case_seconds(sw, c, profile, repeats))
        for sw, c in grid
    )
    cfgs = configs_reached(grid)
    arch = predict.GPUS[profile].arch
    n_cached = sum(1 for c in cfgs if cached(c, arch))
    n_dec = sum(1 for sw, *_ in rows if sw == "kernel.decode")
    bench_s = BENCH_START_S + len(cfgs) * JIT_COMPILE_S + sum(r[3] for r in rows)
    steps = (
        Step(
            "tests",
            f"pytest suites/conformance -m gpu: {n_tests} gpu tests",
            PYTEST_START_S + n_tests * GPU_TEST_S,
            BUDGETS["tests"],
            f"{PYTEST_START_S:.0f} s start-up + {n_tests} tests x {GPU_TEST_S} s",
        ),
        Step(
            "bench",
            f"kvbench bench --only {' '.join(GPU_SWEEPS)} --repeats {repeats}: "
            f"{n_dec} decode + {len(rows) - n_dec} prefill cases, CUDA graphs",
            bench_s,
            BUDGETS["bench"],
            f"{BENCH_START_S:.0f} s start-up + {len(cfgs)} configurations x {JIT_COMPILE_S} s "
            f"JIT + per case: (2 + 2 x {repeats}) CUDA-graph timings of the bandwidth bound "
            f"({GRAPH_REP_S} s of calls captured at {HOST_CALL_S * 1e6:.0f} us a call, "
            f"replayed {GRAPH_REPLAYS} x) + host cost {repeats} x {HOST_CALLS_PER_REPEAT} "
            f"calls + K/V set-up + {CASE_FIXED_S:.0f} s",
        ),
        Step(
            "predict",
            f"kernel.predicted's time on {profile} for each case, measured / predicted",
            PREDICT_START_S + (len(cfgs) - n_cached) * AOT_COMPILE_S,
            BUDGETS["predict"],
            f"{PREDICT_START_S:.0f} s start-up + {len(cfgs) - n_cached} of {len(cfgs)} "
            f"configurations not in out/aot x {AOT_COMPILE_S} s (sm_{arch} compile)",
        ),
        Step("report", "kvbench report over the run", REPORT_S, BUDGETS["report"], "measured"),
    )
    return Plan(profile, repeats, steps, rows, len(cfgs), n_cached)


def _aot_cached(config: Any, arch: int) -> bool:
    """Whether out/aot holds `config`'s compile record for `arch` (no compile)."""
    import triton

    from kvbench.kernels import aot

    key = aot._cache_key(config, arch, triton.__version__, aot.source_hash())
    return (aot.default_cache_dir() / f"{key}.json").exists()


def format_plan(plan: Plan) -> str:
    """The plan as text: each step with its expected and allowed seconds, then each kernel
    case with its bandwidth bound and its expected wall time."""
    lines = [
        f"kvbench gpu plan (profile {plan.profile}, {plan.repeats} repeats a case; "
        f"estimates modeled from costs measured on an H200, 2026-11-28)",
    ]
    for s in plan.steps:
        lines.append(f"  {s.name:<8} ~{s.estimate_s:6.0f} s (budget {s.budget_s:.0f} s)  {s.what}")
        lines.append(f"  {'':<8}   how: {s.how}")
        seen = ", ".join(f"{t:.0f}" for t in MEASURED_H200.get(s.name, ()))
        if seen:
            lines.append(f"  {'':<8}   measured on an H200 (16 cases, 100-102 tests): {seen} s")
    total = sum(s.budget_s for s in plan.steps)
    lines.append(
        f"  total    ~{plan.estimate_s:6.0f} s expected, {total:.0f} s at most "
        f"(each step is interrupted at its budget)"
    )
    lines.append("  kernel cases (bound = bandwidth / FLOP bound on the profile):")
    for sweep, case, bound, cost in plan.cases:
        shape = ", ".join(f"{k} {v}" for k, v in case.items())
        lines.append(f"    {sweep:<15} {shape}: bound {bound * 1e6:8.1f} us, ~{cost:4.1f} s")
    return "\n".join(lines)


# ------------------------------------------------------------------ after the run


@dataclass(frozen=True)
class Comparison:
    """One measured case beside its prediction (seconds; ratio = measured / predicted)."""

    sweep: str
    case: Case
    measured_s: float
    predicted_s: float
    host_s: float | None
    cuda_graph: bool

    @property
    def ratio(self) -> float:
        return self.measured_s / self.predicted_s


def measured_cases(rows: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    """From a run's rows: each GPU_SWEEPS case's time_paged, host_time_paged and timing
    method, keyed by sweep and case."""
    out: dict[str, dict[str, Any]] = {}
    for row in rows:
        if row["suite"] not in GPU_SWEEPS:
            continue
        key = f"{row['suite']}|{sorted(dict(row['case']).items())}"
        entry = out.setdefault(key, {"sweep": row["suite"], "case": dict(row["case"])})
        entry[row["metric"]] = float(row["value"])
    return {k: v for k, v in out.items() if "time_paged" in v}


def compare(
    measured: Mapping[str, Mapping[str, Any]],
    predicted: Callable[[str, Case], float],
) -> list[Comparison]:
    """Each measured case beside `predicted(sweep, case)` (s)."""
    out = []
    for entry in measured.values():
        p = predicted(entry["sweep"], entry["case"])
        if not p > 0 or not math.isfinite(p):
            raise ConfigError(f"prediction {p!r} for {entry['case']} is not a positive time")
        out.append(
            Comparison(
                entry["sweep"],
                entry["case"],
                entry["time_paged"],
                p,
                entry.get("host_time_paged"),
                bool(entry.get("timing_method_is_cudagraph", 0.0)),
            )
        )
    return out


def prediction_error(comparisons: list[Comparison]) -> dict[str, float]:
    """Mean and median of |measured / predicted - 1|, and the median ratio."""
    if not comparisons:
        raise ConfigError("no measured case to set beside a prediction")
    errs = [abs(c.ratio - 1) for c in comparisons]
    return {
        "mean_abs_error": statistics.fmean(errs),
        "median_abs_error": statistics.median(errs),
        "median_ratio": statistics.median(c.ratio for c in comparisons),
        "n": float(len(comparisons)),
    }


def kernel_predicted(profile: str) -> Callable[[str, Case], float]:
    """kernel.predicted's time (s) of a kernel.decode / kernel.prefill case on `profile`:
    the same measure function the sweep runs (compiling for that GPU's arch only)."""
    from kvbench.suites.bench.sweeps import predicted as predicted_sweep

    def one(sweep: str, case: Case) -> float:
        kind = "decode" if sweep == "kernel.decode" else "prefill"
        rows = predicted_sweep.predicted({"kernel": kind, "gpu": profile, **case}, None)  # type: ignore[arg-type]
        return next(float(m.value) for m in rows if m.metric == "predicted_time")

    return one


def write_comparison(
    results: Path, predicted: Callable[[str, Case], float], out: Path
) -> list[Comparison]:
    """Set every measured case of the run at `results` beside `predicted` and write them
    to `out` (JSON: one object per case, seconds, plus the error summary)."""
    import json

    from kvbench.reports.store.reader import load_run

    comps = compare(measured_cases(load_run(results).rows), predicted)
    payload = {
        "provenance": "measured here (CUDA graphs) / predicted (kernel.predicted)",
        "cases": [
            {
                "sweep": c.sweep,
                "case": c.case,
                "measured_s": c.measured_s,
                "predicted_s": c.predicted_s,
                "ratio": c.ratio,
                "host_s": c.host_s,
                "cuda_graph": c.cuda_graph,
            }
            for c in comps
        ],
        "error": prediction_error(comps) if comps else None,
    }
    out.write_text(json.dumps(payload, indent=1) + "\n", encoding="utf-8")
    return comps


def main(argv: list[str] | None = None) -> int:
    """`python -m kvbench.suites.bench.gpu_plan RESULTS PROFILE OUT`: the predict step of
    `kvbench gpu`, run in its own process so the runner can bound it."""
    results, profile, out = argv if argv is not None else sys.argv[1:]
    write_comparison(Path(results), kernel_predicted(profile), Path(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
