"""Decoder lines and the event calendar: the engine's collaborator for decoding.

The decode phase itself is `Engine.decode`; this part keeps each decoder's line, the
event calendar and the decoders' aggregates in the run state, and makes the cache calls
that append a sequence's tokens. Token mode appends every decoder every step. Event mode keeps each decoder as a line
(see `sequence.Seq`) and an event calendar: a decoder's next event is the step at which
its append allocates (a block boundary, a contiguous relocation, a copy-on-write after a
fork), fills a block whose ids are indexed (prefix caching of given outputs), or
generates its last token. Appends in between allocate nothing and no decision can
observe them, so they are deferred and flushed with the event's append in one cache
call.

Windowed layouts (a time model with sliding windows): a decoder whose context reaches a
window W (c >= W from the next step on) moves into that window's aggregates
(`EngineState.win_a`, `win_d`), so a step's KV read per window is known in closed form;
the step at which c = W - 1 is an event, so no quiet stretch crosses a window.
"""

from __future__ import annotations

from heapq import heappop, heappush

from kvbench.paged.serving.engine.sequence import Seq, by_order, kv_for_tokens
from kvbench.paged.serving.engine.state import EngineState
from kvbench.reference.contract import ServingCache


class DecoderLines:
    """Decoder lines, the event calendar and the cache appends of one run."""

    def __init__(
        self, st: EngineState, cache: ServingCache, *, store_kv: bool, block_size: int,
        event_mode: bool, windows: tuple[int, ...] = (),
    ) -> None:  # fmt: skip
        self.st = st
        self.cache = cache
        #: The cache holds KV tensors (appends carry K and V) or not (token counts).
        self.store_kv = store_kv
        #: Tokens per block (0 for a cache without blocks).
        self.block_size = block_size
        #: Event mode (deferred appends, a calendar of events) or token mode (every step).
        self.event_mode = event_mode
        #: The time model's windows, ascending (() for none: nothing is tracked).
        self.windows: tuple[int, ...] = windows
        st.win_a = [0] * len(windows)
        st.win_d = [0] * len(windows)

    def start(self, seq: Seq, t: int, c: int, synced: int) -> None:
        """Make the sequence a decoder at step t with KV length c (synced in the cache)."""
        st = self.st
        seq.decoding = True
        seq.base_step, seq.base_c, seq.base_g, seq.synced = t, c, seq.generated, synced
        st.agg_a += c - t
        st.agg_d += 1
        st.agg_sync += synced
        seq.nabove = 0
        if self.windows:
            self.classify(seq, c - t, c)
        self.schedule(seq, t)

    def classify(self, seq: Seq, offset: int, c: int) -> None:
        """Move a decoder whose line (base_c - base_step = `offset`) now has context c
        into the aggregates of every window it reached (c >= W) and was not in."""
        windows, st = self.windows, self.st
        k = seq.nabove
        while k < len(windows) and c >= windows[k]:
            st.win_a[k] += offset
            st.win_d[k] += 1
            k += 1
        seq.nabove = k

    def stop(self, seq: Seq) -> None:
        """Take the sequence out of the aggregates; its queued event goes stale."""
        if seq.decoding:
            st = self.st
            st.agg_a -= seq.base_c - seq.base_step
            st.agg_d -= 1
            st.agg_sync -= seq.synced
            for k in range(seq.nabove):
                st.win_a[k] -= seq.base_c - seq.base_step
                st.win_d[k] -= 1
            seq.nabove = 0
            seq.decoding = False
            seq.version += 1

    def growth_point(self, seq: Seq, c: int) -> int:
        """Smallest KV length >= c at which appending one more token needs memory (c
        itself while the last block may be shared: the next append copies it)."""
        if seq.cow:
            return c
        return self.cache.next_growth(seq.sid, c)

    def schedule(self, seq: Seq, t: int) -> None:
        """Queue the decoder's next event at or after step t (its state is at the
        start of step t): the step that generates its last token, that appends at a
        growth point, or that fills an indexed block. Token mode: every step."""
        version = seq.version = seq.version + 1
        nxt = t
        if self.event_mode and seq.group is None:  # beams fork and prune every step
            dt = t - seq.base_step
            c = seq.base_c + dt
            nxt = t + (seq.req.output_len - seq.base_g - dt - 1)
            bs = self.block_size
            if bs and not seq.cow:
                gap = -c % bs  # tokens until the next block boundary
                if seq.hashed:
                    gap = min(gap, (bs - 1 - c) % bs)
            else:
                gap = self.growth_point(seq, c) - c
            if seq.nabove < len(self.windows):  # the step before it reaches a window
                gap = min(gap, self.windows[seq.nabove] - 1 - c)
            if gap < nxt - t:
                nxt = t + gap
        seq.event_step = nxt
        st = self.st
        bucket = st.buckets.get(nxt)
        if bucket is None:
            st.buckets[nxt] = [(version, seq)]
            heappush(st.event_steps, nxt)
        else:
            bucket.append((version, seq))

    def append(self, seq: Seq, start: int, n: int, ids: list[int] | None) -> None:
        """Append n tokens of the sequence from position `start` (its KV when the cache
        holds tensors; `ids` when its output ids go to the prefix cache)."""
        cache = self.cache
        if self.store_kv:
            k, v = kv_for_tokens(seq.tokens(start, start + n), range(start, start + n), cache)
            cache.append(seq.sid, k, v, ids)
        else:
            cache.append_tokens(seq.sid, n, ids)

    def sync(self, seq: Seq, upto: int) -> None:
        """Flush a decoder's deferred appends so its cache length is `upto`."""
        n = upto - seq.synced
        if n > 0:
            ids = seq.tokens(seq.synced, upto) if seq.hashed else None
            self.append(seq, seq.synced, n, ids)
            self.st.agg_sync += n
            seq.synced = upto

    def due(self, t: int) -> list[Seq]:
        """The decoders whose event is at or before step t (every decoder in token
        mode), in order; stale calendar entries are dropped."""
        st = self.st
        due: list[Seq] = []
        event_steps, buckets = st.event_steps, st.buckets
        while event_steps and event_steps[0] <= t:
            for version, seq in buckets.pop(heappop(event_steps)):
                if version == seq.version and seq.decoding:
                    due.append(seq)
        due.sort(key=by_order)
        st.events += len(due)
        return due
