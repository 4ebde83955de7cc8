"""serving.kv_dtype: KV capacity and sustained request rate with an fp8 KV cache beside
float16, on the vLLM paper's set-ups (modeled).

fp8 KV (`fp8_e4m3`) stores one byte per element where float16 stores two: the same KV
memory holds twice the token slots, and a decode step reads half the KV bytes. Each case
is one (set-up, KV dtype, system) on ShareGPT-like requests under Poisson arrivals
(`serving.rate`'s traces and knee search, fitted calibration); rows carry `kv_dtype`:

* `kv_slots`: tokens of KV the set-up's memory holds (closed form: KV bytes / bytes per
  token of that dtype);
* `sustained_rate` and the latency / throughput / peak concurrency at it: the highest
  rate whose mean normalized latency stays under 10 x the set-up's one-sequence decode
  step (modeled: the engine's time model; weights stay float16, and the time model prices
  KV reads by bytes, not the dequantization arithmetic, which a memory-bound decode
  hides on a GPU but this CPU's C++ kernel does not: see kernel.decode_fp8).

Every number is modeled or closed form, never measured. The default run keeps OPT-13B
with paged and the oracle contiguous baseline; --full adds OPT-66B / OPT-175B and every
system.
"""

from __future__ import annotations

from kvbench.reports.provenance import CLOSED_FORM, MODELED
from kvbench.suites.bench.context import BenchContext
from kvbench.suites.bench.registry import Case, Measurement, sweep
from kvbench.suites.bench.sweeps import serving_rate

#: KV dtypes compared (float16 is the presets' own).
KV_DTYPES = ("float16", "fp8_e4m3")
DEFAULT_SETUPS = ("opt-13b-1xa100-40gb",)
DEFAULT_SYSTEMS = ("paged", "contiguous-oracle")
WORKLOAD = "sharegpt"


def _cases(full: bool) -> list[Case]:
    setups = serving_rate.FULL_SETUPS if full else DEFAULT_SETUPS
    systems = serving_rate.SYSTEM_NAMES if full else DEFAULT_SYSTEMS
    return [
        {
            "setup": setup,
            "workload": WORKLOAD,
            "duration": serving_rate.DURATION[WORKLOAD],
            "kv_dtype": dtype,
            "system": system,
            "calibration": "fitted",
            "bound_factor": serving_rate.BOUND_FACTOR,
        }
        for setup in setups
        for dtype in KV_DTYPES
        for system in systems
    ]


@sweep(
    "serving.kv_dtype",
    "modeled serving with fp8 (e4m3) KV beside float16 on the vLLM paper's set-ups: KV slots "
    "(closed form) and the sustained ShareGPT rate under a 10 x decode-floor latency bound "
    "(modeled; fitted calibration); default OPT-13B with paged and contiguous-oracle, --full "
    "every OPT set-up and system",
    _cases,
    requires=("kvbench.paged.serving.rate",),
    tags=("serving", "modeled", "fp8"),
    produced=(
        MODELED,
        CLOSED_FORM,
    ),
)
def serving_kv_dtype(case: Case, ctx: BenchContext) -> list[Measurement]:
    from kvbench.workloads.setups import get_setup, with_calibration, with_kv_dtype

    setup = with_calibration(get_setup(case["setup"]), case["calibration"])
    setup = with_kv_dtype(setup, case["kv_dtype"])
    trace = serving_rate._rate_trace(case["workload"], ctx.seed)
    out = [
        Measurement("kv_slots", setup.kv_slots(), "tokens"),
        Measurement("kv_bytes_per_token", setup.geometry.bytes_per_token, "B"),
    ]
    return out + serving_rate.knee_measurements(
        setup,
        case["system"],
        trace,
        case["duration"],
        case["bound_factor"],
        serving_rate._start_rate(case["setup"], case["workload"]),
    )
