"""The serving engine's run state: one dataclass instead of closures sharing dicts.

`EngineState` holds everything one `Engine.run` changes: the queues, the event calendar
of event mode, the decoders' aggregates, the per-step scratch of the phases, the totals
and the metric sums, and the queue operations every collaborator of the engine shares
(`add_running`, `remove_running`, `finish`).

Queues (each sequence is in exactly one, or in none once finished):
    waiting   heap of (order, seq): WAITING sequences, trace order first (FCFS);
    swapped   heap of (order, seq): SWAPPED sequences, oldest first;
    running   list sorted by order: RUNNING sequences (prefilling or decoding);
    prefilling  the running ones still computing their prompt, sorted by order.

Decoder aggregates: with D decoding sequences whose lines are c = base_c + (t - base_step),
the batch's logical KV length at the start of step t is agg_a + agg_d * t
(agg_a = sum of base_c - base_step), and agg_sync = sum of their synced lengths, so the
live KV the cache does not yet know of is agg_a + agg_d * t - agg_sync.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from kvbench.paged.serving.engine.sequence import FINISHED, Seq
from kvbench.paged.serving.records import SeqRecord
from kvbench.paged.serving.time_model import StepRow


@dataclass(slots=True)
class EngineState:
    """Everything one run changes (see the module docstring for the queues)."""

    seqs: list[Seq] = field(default_factory=list)  # every record-holding sequence
    waiting: list[tuple[int, Seq]] = field(default_factory=list)
    swapped: list[tuple[int, Seq]] = field(default_factory=list)
    running: list[Seq] = field(default_factory=list)
    prefilling: list[Seq] = field(default_factory=list)
    #: event calendar: step -> [(version, seq)]; a heap of the steps that have a bucket
    buckets: dict[int, list[tuple[int, Seq]]] = field(default_factory=dict)
    event_steps: list[int] = field(default_factory=list)
    agg_a: int = 0
    agg_d: int = 0
    agg_sync: int = 0
    #: per window W_i of the time model's layout (ascending): the decoders whose context
    #: passed it (c >= W_i; their seq.nabove > i): sum of base_c - base_step, and count
    win_a: list[int] = field(default_factory=list)
    win_d: list[int] = field(default_factory=list)
    #: bumped by every cache change an admission could observe
    epoch: int = 0
    #: (epoch, queue head, running, budget) of the last failed admission (event mode
    #: retries only once one of them changed)
    fail_key: tuple[object, ...] | None = None
    next_arrival: int = 0  # index of the next trace request to arrive
    #: the run's max_concurrency cap (`SchedulerConfig.max_concurrency`; 0: none)
    cap: int = 0
    #: requests joined and not finished (the max_concurrency cap counts these)
    in_flight: int = 0
    #: finished samples per n-sample request index (a request leaves with its last)
    samples_done: dict[int, int] = field(default_factory=dict)
    #: a finish freed a slot under the cap in the step just run (its end is now_ps)
    slot_freed: bool = False
    #: when the cap last freed a slot (ps): a held-back request joins no earlier
    freed_ps: int = 0
    # ---- per-step scratch, reset by Engine.step
    preempted: bool = False  # this step preempted (no swap-in or admission then)
    cursor: int = -1  # order of the sequence decoding now (NEVER after the phase)
    swap_ps: int = 0  # modeled swap time of this step
    dec: int = 0  # sequences decoding a token this step
    kv_read: int = 0  # KV tokens this step's decodes read
    #: per window W_i: sum over this step's decoders of max(0, c + 1 - W_i)
    kv_excess: list[int] = field(default_factory=list)
    #: (sequence, KV length before its token) of this step's decodes (step hook only)
    decoded: list[tuple[Seq, int]] = field(default_factory=list)
    finished_now: list[Seq] = field(default_factory=list)
    #: records whose first token / finish this step made (stamped with its end time)
    first_now: list[SeqRecord] = field(default_factory=list)
    done_now: list[SeqRecord] = field(default_factory=list)
    # ---- totals
    preemptions: int = 0
    swaps: int = 0
    recomputes: int = 0
    generated: int = 0
    finished: int = 0
    overrides: int = 0  # preemption-bound overrides
    events: int = 0  # decoder events + admissions + swap-ins + finishes
    # ---- clock and metric sums
    t: int = 0
    now_ps: int = 0
    processed: int = 0
    peak: int = 0
    barren: int = 0  # consecutive steps without progress
    sum_live: int = 0
    sum_reserved: int = 0
    sum_running: int = 0
    last_reported: int = 0
    timeline: list[StepRow] = field(default_factory=list)

    def add_running(self, seq: Seq) -> None:
        """Insert into `running`, keeping it sorted by order."""
        running = self.running
        lo, hi = 0, len(running)
        order = seq.order
        while lo < hi:
            mid = (lo + hi) // 2
            if running[mid].order < order:
                lo = mid + 1
            else:
                hi = mid
        running.insert(lo, seq)

    def remove_running(self, seq: Seq) -> None:
        """Take a sequence out of `running` (and `prefilling`, if it is there)."""
        self.running.remove(seq)
        if seq in self.prefilling:
            self.prefilling.remove(seq)

    def finish(self, seq: Seq, t: int, sequences: int = 1) -> None:
        """Record a finish at step t: `sequences` = w for a beam group (w beams of
        output_len tokens each). A request leaves `in_flight` with its last sample; a
        leave from a full `cap` sets `slot_freed`."""
        seq.state = FINISHED
        seq.rec.finish_step = t
        seq.rec.generated = seq.generated
        self.done_now.append(seq.rec)
        self.events += 1
        self.generated += seq.generated * sequences
        self.finished += 1
        n = seq.req.n
        if n > 1 and seq.group is None:  # an n-sample request leaves with its last sample
            done = self.samples_done.get(seq.index, 0) + 1
            self.samples_done[seq.index] = done
            if done < n:
                return
            del self.samples_done[seq.index]
        if self.in_flight == self.cap:
            self.slot_freed = True
        self.in_flight -= 1


#: `step_hook(step, decoded, chunks, model_ps)`: called once per processed step, after
#: the step's appends and before its finishes free their memory, with the sequences that
#: decoded a token in it and are still running, as (sequence id, KV length before the
#: token), its prefill chunks as (sequence id, first position, tokens) and the time
#: model's price of the step (ps; 0 without a model); it may return the step's duration
#: in picoseconds, which replaces the model's (a measured clock).
StepHook = Callable[[int, list[tuple[str, int]], list[tuple[str, int, int]], int], "int | None"]
