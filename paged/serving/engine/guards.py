"""The engine's bug guards, run at the end of every step of the paper's policy: a run
that can never finish raises `SchedulerError` instead of looping.

Three ways a run can fail to finish, each named in its error: the queue head cannot be
admitted even into an empty cache; nothing runs, nothing can arrive and nothing changed
(a stall: no state can ever change again); or steps keep passing with no token decoded,
no prefill and no finish for `BARREN_STEP_LIMIT` steps (preemptions cycling: a
livelock). Kept apart from the phases because they decide nothing: they only read the
run state and the step's outcome (and count barren steps in `EngineState.barren`).
"""

from __future__ import annotations

from kvbench.paged.serving.engine.state import EngineState
from kvbench.paged.serving.engine.validate import SchedulerError

#: Consecutive steps in which nothing decodes, prefills or finishes before the engine
#: calls it a livelock. A sound run has such steps only between a preemption or swap-in
#: and the next decode (a few in a row); a cycle of preemptions that can never make
#: progress has nothing else, and is cheap to run this long.
BARREN_STEP_LIMIT = 10_000


def check_progress(
    st: EngineState, t: int, n_requests: int, admission_failed: bool, idle: bool, progressed: bool
) -> None:
    """Bug guards after step `t` of a trace of `n_requests` requests: a head that never
    fits, a stall, a livelock (SchedulerError); counts barren steps in `st.barren`."""
    if admission_failed:
        head = st.waiting[0][1]
        raise SchedulerError(
            f"request {head.req.id!r} cannot be admitted even into an empty cache "
            f"({head.target} prompt tokens)"
        )
    if idle and not st.agg_d and st.next_arrival >= n_requests and not st.preempted:
        raise SchedulerError(  # nothing can ever change again
            f"the engine stalled at step {t} with {len(st.waiting)} waiting and "
            f"{len(st.swapped)} swapped sequences and nothing running"
        )
    if progressed:
        st.barren = 0
        return
    st.barren += 1
    if st.barren > BARREN_STEP_LIMIT:
        raise SchedulerError(  # preemption cycling (a livelock)
            f"the engine made no progress for {st.barren} steps up to step {t} (no "
            f"token decoded, no prefill, no finish) with {len(st.running)} running, "
            f"{len(st.waiting)} waiting and {len(st.swapped)} swapped sequences"
        )
