"""Pause Python's cyclic garbage collector around a long bookkeeping replay.

A capacity replay or a whole-trace serving replay holds millions of live container
objects (prefix-index entries, block tuples) and allocates millions more; every full
collection of the cyclic collector walks all of them, which cost about a third of a
replay's CPU time on the Mooncake trace. The replays create no reference cycles worth
collecting while they run (what they build is reachable until they return), so the
collector is paused for their duration and restored after, exactly as it was.

Reference counting still frees everything as usual; only the cycle detector waits. No
decision of a replay depends on it.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def gc_paused() -> Iterator[None]:
    """Disable the cyclic collector inside the block; re-enable it after (also on an
    exception) only if it was enabled before (nesting and callers that had it off keep
    their setting)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
