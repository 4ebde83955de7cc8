"""What a run of the engine produces: its timeline and metric sums, step by step, and its
summary at the end.

`record_span` is the one place a `StepRow` is built: a visited step (`Engine._record_step`)
and a skipped quiet stretch of event mode (`Engine.skip_quiet`) both record through it, so
a row, the metric sums and the modeled clock always move together. `run_result` turns the
run state into the `SimulationResult` callers get. Both only read and add to the run
state (`state.EngineState`); neither decides anything, which is why they live apart from
the phases.
"""

from __future__ import annotations

import time

from kvbench.paged.serving.engine.state import EngineState
from kvbench.paged.serving.latency import summarize
from kvbench.paged.serving.time_model import SimulationResult, StepRow


def record_span(
    st: EngineState,
    first: int,
    span: int,
    occupancy: tuple[int, int, int, int, int],
    live_first: int,
    live_sum: int,
    time_ps: int,
) -> None:
    """The one StepRow builder: a timeline row standing for `span` steps from step
    `first` (live tokens `live_first` at its first step, `live_sum` over all of
    them; the batch and the cache's blocks unchanged across them), added to the
    metric sums, and `time_ps` added to the clock."""
    free_b, used_b, cached_b, _, reserved = occupancy
    running = len(st.running)
    st.timeline.append(
        StepRow(
            first,
            span,
            running,
            st.agg_d,
            len(st.waiting),
            len(st.swapped),
            free_b,
            used_b,
            cached_b,
            live_first,
            reserved,
            time_ps,
        )
    )
    st.sum_live += live_sum
    st.sum_reserved += span * reserved
    st.sum_running += span * running
    st.now_ps += time_ps


def run_result(st: EngineState, mode: str, t_wall: float, t_cpu: float) -> SimulationResult:
    """The run's summary, records and timeline; `mode` is the run's SchedulerConfig mode,
    `t_wall` and `t_cpu` the perf_counter and process_time readings at its start."""
    steps, gen = st.t, st.generated
    seconds = st.now_ps / 1e12
    wall = time.perf_counter() - t_wall
    records = [s.rec for s in st.seqs]
    return SimulationResult(
        utilization=st.sum_live / st.sum_reserved if st.sum_reserved else 1.0,
        peak_concurrency=st.peak,
        preemptions=st.preemptions,
        swaps=st.swaps,
        recomputes=st.recomputes,
        steps=steps,
        generated_tokens=gen,
        tokens_per_step=gen / steps if steps else 0.0,
        modeled_seconds=seconds,
        tokens_per_second=gen / seconds if seconds else 0.0,
        processed_steps=st.processed,
        wall_seconds=wall,
        mean_running=st.sum_running / steps if steps else 0.0,
        records=records,
        timeline=st.timeline,
        info={
            "bound_overrides": st.overrides,
            "mode": mode,
            "events": st.events,
            "events_per_second": st.events / max(time.perf_counter() - t_wall, 1e-9),
            "cpu_seconds": time.process_time() - t_cpu,
        },
        latency=summarize(records),
    )
