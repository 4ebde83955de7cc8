"""Import every sweep module so that all sweeps are registered, in a stable order
(which is also the order of the default run and of `--shard`)."""

from kvbench.suites.bench.sweeps import (  # noqa: F401
    calibration,
    capacity,
    e2e_fp8,
    e2e_kv_specs,
    kernels,
    kernels_fp8,
    kv_specs,
    peers,
    predicted,
    scheduler_speed,
    scheduling,
    serving,
    serving_kv_dtype,
    serving_kv_specs,
    serving_measured,
    serving_paper,
    serving_rate,
    serving_vllm_engine,
    static,
    trace_capacity,
    trace_serving,
    utilization,
)
