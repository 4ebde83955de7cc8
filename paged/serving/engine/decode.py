"""The decode phase: every decoding sequence appends the KV of its last token.

Token mode appends every decoder every step. Event mode keeps each decoder as a line
(see `sequence.Seq`) and an event calendar: a decoder's next event is the step at which
its append allocates (a block boundary, a contiguous relocation, a copy-on-write after a
fork), fills a block whose ids are indexed (prefix caching of given outputs), or
generates its last token. Appends in between allocate nothing and no decision can
observe them, so they are deferred and flushed with the event's append in one cache
call.
"""

from __future__ import annotations

from heapq import heappop, heappush

from kvbench.paged.serving.engine.sequence import NEVER, Seq, by_order, kv_for_tokens
from kvbench.paged.serving.engine.state import EngineBase
from kvbench.workloads.errors import CapacityError


class DecodeMixin(EngineBase):
    """Decoder lines, the event calendar, and the decode phase."""

    # ------------------------------------------------------------------ decoder lines
    def _start_decoding(self, seq: Seq, t: int, c: int, synced: int) -> None:
        """Make the sequence a decoder at step t with KV length c (synced in the cache)."""
        st = self.st
        seq.decoding = True
        seq.base_step, seq.base_c, seq.base_g, seq.synced = t, c, seq.generated, synced
        st.agg_a += c - t
        st.agg_d += 1
        st.agg_sync += synced
        self._schedule(seq, t)

    def _stop_decoding(self, seq: Seq) -> None:
        """Take the sequence out of the aggregates; its queued event goes stale."""
        if seq.decoding:
            st = self.st
            st.agg_a -= seq.base_c - seq.base_step
            st.agg_d -= 1
            st.agg_sync -= seq.synced
            seq.decoding = False
            seq.version += 1

    def _growth_point(self, seq: Seq, c: int) -> int:
        """Smallest KV length >= c at which appending one more token needs memory (c
        itself while the last block may be shared: the next append copies it)."""
        if seq.cow:
            return c
        return self.cache.next_growth(seq.sid, c)

    def _schedule(self, seq: Seq, t: int) -> None:
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
                gap = self._growth_point(seq, c) - c
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

    def _append(self, seq: Seq, start: int, n: int, ids: list[int] | None) -> None:
        """Append n tokens of the sequence from position `start` (its KV when the cache
        holds tensors; `ids` when its output ids go to the prefix cache)."""
        cache = self.cache
        if self.traits.store_kv:
            k, v = kv_for_tokens(seq.tokens(start, start + n), range(start, start + n), cache)
            cache.append(seq.sid, k, v, ids)
        else:
            cache.append_tokens(seq.sid, n, ids)

    def _sync(self, seq: Seq, upto: int) -> None:
        """Flush a decoder's deferred appends so its cache length is `upto`."""
        n = upto - seq.synced
        if n > 0:
            ids = seq.tokens(seq.synced, upto) if seq.hashed else None
            self._append(seq, seq.synced, n, ids)
            self.st.agg_sync += n
            seq.synced = upto

    # ------------------------------------------------------------------ the phase
    def _due(self, t: int) -> list[Seq]:
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

    def decode(self, t: int) -> list[Seq]:
        """Phase 2: every due decoder appends its step-t token (with its deferred ones)
        and generates one more, oldest first; a beam group steps as a whole. When the
        cache cannot grow it, victims are preempted (`_preempt`) until the append fits
        or the decoder itself was preempted. Returns the due decoders.

        Invariants after: every decoder still decoding is synced to its line or will be
        at its next event; a decoder that generated its last token is in finished_now
        with no queued event; `st.cursor` is NEVER."""
        st = self.st
        due = self._due(t)
        bs = self.block_size
        plain_append = self.plain_append
        schedule = self._schedule
        finished_now = st.finished_now
        for seq in due:
            if not seq.decoding:
                continue  # preempted earlier in this step
            if seq.group is not None:
                if seq.group.stepped != t:
                    seq.group.stepped = t
                    self._group_step(seq.group, t)
                continue
            st.cursor = seq.order
            dt = t - seq.base_step
            c = seq.base_c + dt
            g = seq.base_g + dt
            if bs and not seq.cow:
                allocating = c % bs == 0
            else:
                allocating = seq.cow or self._growth_point(seq, c) == c
            n = c - seq.synced
            if plain_append is not None and not seq.hashed:
                try:  # deferred appends and this step's token in one call
                    plain_append(seq.sid, n + 1)
                except CapacityError:
                    if not self._grow_after_flush(seq, t, c):
                        continue
                else:
                    st.agg_sync += n
            elif not self._flush_and_grow(seq, t, c):
                continue
            if allocating or (seq.hashed and (c + 1) % bs == 0):
                st.epoch += 1
            seq.cow = False
            seq.synced = c + 1
            st.agg_sync += 1
            seq.generated = g + 1
            if self.step_hook is not None:
                st.decoded.append((seq, c))
            # the decoder's line c - t is unchanged, so the aggregates are too
            seq.base_step, seq.base_c, seq.base_g = t + 1, c + 1, g + 1
            if g + 1 >= seq.req.output_len:
                seq.version += 1  # no further events
                finished_now.append(seq)
            else:
                schedule(seq, t + 1)
        st.cursor = NEVER
        return due
