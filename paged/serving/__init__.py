"""The serving simulator: an iteration-level engine that replays a trace over any KV cache
and prices every step on a modeled device.

    engine/       the engine (`Engine`): admission, growth and preemption, beam groups,
                  event-mode decode, the closed-form clock, trace validation, invariants
    beams.py      beam-search groups: selection (prune and fork) planned per step
    time_model.py the step pricing (`TimeModel`), the engine's configuration
                  (`SchedulerConfig`) and what a run returns (`SimulationResult`)
    simulation.py the one call from a trace to a result: build the cache from a
                  `paged.cache_spec.CacheSpec`, price it, run the engine (`simulate`)
    latency.py    per-request latency statistics (TTFT, TPOT, end-to-end, normalized)
    rate.py       serving under a growing Poisson request rate (the vLLM paper's
                  normalized-latency curves; systems paged, Orca-like, static)
    calibration.py fitting the time model's device coefficients to measured steps

It reads caches only through the contract (`reference.contract.ServingCache`); the one
module that names cache classes is `paged.cache_spec`, outside this package.
"""
