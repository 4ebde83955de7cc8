"""The engine's invariants between steps, asserted by `Engine.check` (tests call it).

Queues: every sequence is in at most one queue and its state says which (WAITING in
`waiting`, SWAPPED in `swapped`, RUNNING in `running`); `running` and `prefilling` are
sorted by order; at most max_num_seqs run, plus w - 1 per running beam group (a beam
root is admitted with room for its w beams, but sequences admitted while it prefills
count only the seat it holds, so its fork can exceed max_num_seqs by w - 1); a running sequence is prefilling, decoding,
or a recomputed beam parked until its group's other beams are done; nothing is left in
`finished_now`.

Cache agreement: the cache holds exactly the running and swapped sequences; a
prefilling or swapped sequence holds `computed` tokens, a decoder `synced` tokens, never
more than its line's length at the next step.

Decoders: the aggregates equal their sums over the decoders; every decoder has exactly
one live calendar entry, at or after the next step (event mode: its next event).
"""

from __future__ import annotations

from itertools import pairwise

from kvbench.paged.serving.engine.decode import DecoderLines
from kvbench.paged.serving.engine.sequence import RUNNING, SWAPPED, WAITING
from kvbench.paged.serving.engine.state import EngineState
from kvbench.paged.serving.time_model import SchedulerConfig
from kvbench.reference.contract import ServingCache


def check_state(
    st: EngineState, cache: ServingCache, cfg: SchedulerConfig, lines: DecoderLines
) -> None:
    """Raise AssertionError naming the first broken invariant (module docstring) of an
    engine's state `st`, its cache, its configuration and its decoder lines."""
    running, prefilling = st.running, st.prefilling
    waiting = [s for _, s in st.waiting]
    swapped = [s for _, s in st.swapped]
    assert not st.finished_now, "finished sequences were not retired"
    assert not st.first_now and not st.done_now, "first tokens or finishes left unstamped"
    assert all(a.order < b.order for a, b in pairwise(running)), "running unsorted"
    assert all(a.order < b.order for a, b in pairwise(prefilling)), "prefilling unsorted"
    groups = {id(s.group): s.group.width for s in running if s.group is not None}
    seats = cfg.max_num_seqs + sum(w - 1 for w in groups.values())
    assert len(running) <= seats, f"{len(running)} running, {seats} seats"
    ids = [id(s) for s in (*running, *waiting, *swapped)]
    assert len(ids) == len(set(ids)), "a sequence is in two queues"
    assert all(s.state is WAITING for s in waiting), "a waiting sequence is not WAITING"
    assert all(s.state is SWAPPED and not s.decoding for s in swapped), "bad swapped state"
    assert all(s.state is RUNNING for s in running), "a running sequence is not RUNNING"
    pre = {id(s) for s in prefilling}
    assert pre <= {id(s) for s in running}, "a prefilling sequence is not running"
    for s in running:
        kinds = (s.decoding, id(s) in pre, s.parked)
        assert sum(kinds) == 1, f"{s.sid}: decoding/prefilling/parked = {kinds}"
    held = {s.sid for s in running} | {s.sid for s in swapped}
    assert set(cache.request_ids()) == held, "the cache holds other requests than the engine"
    t = st.t
    decoders = [s for s in running if s.decoding]
    for s in (*prefilling, *swapped):
        assert cache.seq_len(s.sid) == s.computed, f"{s.sid}: cache length != computed"
    for s in decoders:
        assert cache.seq_len(s.sid) == s.synced, f"{s.sid}: cache length != synced"
        assert s.synced <= s.base_c + (t - s.base_step), f"{s.sid}: synced past its line"
        entries = st.buckets.get(s.event_step, ())
        assert s.event_step >= t and (s.version, s) in entries, f"{s.sid}: no live event"
    assert st.agg_d == len(decoders), "decoder count"
    assert st.agg_a == sum(s.base_c - s.base_step for s in decoders), "decoder aggregate A"
    assert st.agg_sync == sum(s.synced for s in decoders), "decoder synced sum"
    for k, w in enumerate(lines.windows):  # decoders past window w at step t
        past = [s for s in decoders if s.base_c + (t - s.base_step) >= w]
        assert all(s.nabove > k for s in past), f"a decoder past window {w} not counted"
        assert st.win_d[k] == len(past), f"decoders past window {w}"
        assert st.win_a[k] == sum(s.base_c - s.base_step for s in past), f"window {w} A"
