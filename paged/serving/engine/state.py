"""The serving engine's run state: one dataclass instead of closures sharing dicts.

`EngineState` holds everything one `Engine.run` changes: the queues, the event calendar
of event mode, the decoders' aggregates, the per-step scratch of the phases, the totals
and the metric sums. `EngineBase` declares the attributes the engine's phase mixins
(`decode`, `preempt`, `groups`) share, so each module reads as part of one class.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kvbench.paged.serving.engine.sequence import Seq
from kvbench.paged.serving.time_model import SchedulerConfig, SeqRecord, StepRow, TimeModel
from kvbench.reference.contract import ServingCache, ServingTraits

if TYPE_CHECKING:
    from kvbench.paged.serving.beams import BeamGroup


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
    #: bumped by every cache change an admission could observe
    epoch: int = 0
    #: (epoch, queue head, running, budget) of the last failed admission (event mode
    #: retries only once one of them changed)
    fail_key: tuple | None = None
    next_arrival: int = 0  # index of the next trace request to arrive
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


#: `step_hook(step, decoded, chunks, model_ps)`: called once per processed step, after
#: the step's appends and before its finishes free their memory, with the sequences that
#: decoded a token in it and are still running, as (sequence id, KV length before the
#: token), its prefill chunks as (sequence id, first position, tokens) and the time
#: model's price of the step (ps; 0 without a model); it may return the step's duration
#: in picoseconds, which replaces the model's (a measured clock).
StepHook = Callable[[int, list[tuple[str, int]], list[tuple[str, int, int]], int], "int | None"]


class EngineBase:
    """Attributes the engine's phase mixins share (set by `Engine`)."""

    cache: ServingCache
    cfg: SchedulerConfig
    tm: TimeModel | None
    traits: ServingTraits
    st: EngineState
    block_size: int
    event_mode: bool
    big_prompt_ids: bool
    plain_append: Callable[..., None] | None
    step_hook: StepHook | None

    # provided by the mixins and Engine (declared for readers and type checkers)
    def _schedule(self, seq: Seq, t: int) -> None:
        raise NotImplementedError

    def _start_decoding(self, seq: Seq, t: int, c: int, synced: int) -> None:
        raise NotImplementedError

    def _stop_decoding(self, seq: Seq) -> None:
        raise NotImplementedError

    def _sync(self, seq: Seq, upto: int) -> None:
        raise NotImplementedError

    def _append(self, seq: Seq, start: int, n: int, ids: list[int] | None) -> None:
        raise NotImplementedError

    def _add_running(self, seq: Seq) -> None:
        raise NotImplementedError

    def _remove_running(self, seq: Seq) -> None:
        raise NotImplementedError

    def _choose_victim(self) -> Seq:
        raise NotImplementedError

    def _grow_after_flush(self, seq: Seq, t: int, c: int) -> bool:
        raise NotImplementedError

    def _flush_and_grow(self, seq: Seq, t: int, c: int) -> bool:
        raise NotImplementedError

    def _preempt(self, victim: Seq, t: int) -> None:
        raise NotImplementedError

    def _new_seq(self, req: Any, index: int, child: int, prompt: Sequence[int]) -> Seq:
        raise NotImplementedError

    def _done(self, seq: Seq, t: int, sequences: int = 1) -> None:
        raise NotImplementedError

    def _family_fits(self, r: Any) -> bool:
        raise NotImplementedError

    def _group_step(self, group: BeamGroup, t: int) -> None:
        raise NotImplementedError
