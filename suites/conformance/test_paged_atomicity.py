"""Atomicity: every failing PagedKVCache operation raises a specific error and changes
nothing. Each case builds a cache holding every kind of state (running, forked and sharing
a partial block, swapped, mid-prompt, cached-evictable), snapshots all of it (pool,
refcounts, free stack, LRU order, prefix index and counters, tables, swap space, K/V storage
on device and CPU), makes the operation fail, and compares."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvbench.paged.cache import PagedKVCache
from kvbench.paged.snapshots import snapshots_equal
from kvbench.suites.conformance.paged_model import kv_for
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    KVBenchError,
    RequestStateError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.geometry import KVGeometry

G = KVGeometry(num_layers=2, num_kv_heads=2, head_dim=8, dtype="float32", num_q_heads=4)
F32 = torch.float32
BS = 4


def _fill(cache: PagedKVCache, rid: object, prompt: list[int], upto: int | None = None) -> None:
    cached = cache.admit(rid, prompt)
    end = len(prompt) if upto is None else upto
    if end > cached:
        cache.append(rid, *kv_for(G, F32, prompt, None, cached, end))


def build(
    num_blocks: int = 16, cpu: int = 8, watermark: float = 0.0, exhaust: str = ""
) -> PagedKVCache:
    """A cache with: 'run' (6 tokens, last block partial) forked into 'f' (sharing both
    blocks), 'sw' swapped out, 'pend' mid-prompt (5 of 9 tokens), 'full' (8 tokens, all
    blocks full), and a freed request's two cached blocks waiting in the LRU queue.
    exhaust="all": a filler request takes every remaining block (evicting the cached
    ones); exhaust="free": it takes the free stack only, leaving the cached blocks."""
    cache = PagedKVCache(G, num_blocks, BS, num_cpu_blocks=cpu, watermark=watermark, max_seq_len=40)
    _fill(cache, "run", [1, 2, 3, 4, 5, 6])
    cache.fork("run", "f")
    _fill(cache, "sw", [9, 9, 9])
    cache.swap_out("sw")
    _fill(cache, "old", [7, 7, 7, 7, 8, 8, 8, 8, 1])
    cache.free("old")
    _fill(cache, "pend", list(range(20, 29)), upto=5)
    _fill(cache, "full", [3, 3, 3, 3, 4, 4, 4, 4])
    if exhaust:
        take = cache.num_free_blocks - (cache.pool.num_evictable if exhaust == "free" else 0)
        _fill(cache, "filler", list(range(100, 100 + take * BS)))
        assert cache.num_free_blocks == (0 if exhaust == "all" else 2)
    cache.check()
    return cache


def kv(n: int, dtype: torch.dtype = F32, dim: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.ones(2, n, 2, dim, dtype=dtype), torch.ones(2, n, 2, dim, dtype=dtype)


Op = Callable[[PagedKVCache], object]
CASES: list[tuple[str, dict, Op, type[KVBenchError], str]] = [
    # admit
    ("admit duplicate", {}, lambda c: c.admit("run", [1]), DuplicateRequestError, "'run'"),
    ("admit swapped id", {}, lambda c: c.admit("sw", [1]), DuplicateRequestError, "'sw'"),
    ("admit empty", {}, lambda c: c.admit("n", []), ConfigError, "empty"),
    ("admit negative id", {}, lambda c: c.admit("n", [1, -1]), ConfigError, "-1"),
    ("admit float id", {}, lambda c: c.admit("n", [1, 2.5]), ConfigError, "2.5"),  # type: ignore[list-item]  # deliberately bad input
    ("admit too long", {}, lambda c: c.admit("n", [1] * 41), ConfigError, "41"),
    ("admit output_len", {}, lambda c: c.admit("n", [1], output_len=-2), ConfigError, "-2"),
    ("admit salt type", {}, lambda c: c.admit("n", [1], salt=5), ConfigError, "5"),  # type: ignore[arg-type]
    ("admit unhashable", {}, lambda c: c.admit(["x"], [1]), ConfigError, "hashable"),  # type: ignore[arg-type]  # deliberately bad input
    ("admit capacity", {}, lambda c: c.admit("n", [1] * 40), CapacityError, "needs 10 blocks"),
    (
        "admit with prefix hits, refused",
        {"exhaust": "free"},
        lambda c: c.admit("n", [7, 7, 7, 7, 8, 8, 8, 8, 1, 2, 3, 4, 5]),
        CapacityError,
        "'n'",
    ),
    (
        "admit under watermark",
        {"num_blocks": 20, "watermark": 0.3},
        lambda c: c.admit("n", list(range(50, 82))),  # 8 of 13 free: fits, but 5 < 6
        CapacityError,
        "watermark keeps 6",
    ),
    # append
    ("append unknown", {}, lambda c: c.append("zz", *kv(1)), UnknownRequestError, "'zz'"),
    ("append swapped", {}, lambda c: c.append("sw", *kv(1)), RequestStateError, "swapped"),
    ("append shape", {}, lambda c: c.append("run", *kv(1, dim=7)), ShapeError, "head_dim=8"),
    ("append dtype", {}, lambda c: c.append("run", *kv(1, torch.float16)), ShapeError, "float16"),
    ("append zero", {}, lambda c: c.append("run", *kv(0)), ShapeError, "0 tokens"),
    (
        "append k/v differ",
        {},
        lambda c: c.append("run", kv(1)[0], kv(2)[1]),
        ShapeError,
        "differ",
    ),
    (
        "append not a tensor",
        {},
        lambda c: c.append("run", [1.0], kv(1)[1]),  # type: ignore[arg-type]
        ShapeError,
        "list",
    ),
    (
        "append ids count",
        {},
        lambda c: c.append("run", *kv(2), token_ids=[1]),
        ShapeError,
        "1 ids for 2",
    ),
    (
        "append bad id",
        {},
        lambda c: c.append("run", *kv(2), token_ids=[1, -5]),
        ConfigError,
        "-5",
    ),
    ("append past max", {}, lambda c: c.append("run", *kv(35)), CapacityError, "max_seq_len"),
    (
        "append needs a block",
        {"exhaust": "all"},
        lambda c: c.append("full", *kv(1)),
        CapacityError,
        "1 new",
    ),
    (
        "append needs a copy",
        {"exhaust": "all"},
        lambda c: c.append("f", *kv(1)),
        CapacityError,
        "1 copy-on-write",
    ),
    (
        "append_tokens with tensors",
        {},
        lambda c: c.append_tokens("run", 1),
        ConfigError,
        "append_tokens",
    ),
    # fork
    ("fork unknown", {}, lambda c: c.fork("zz", "n"), UnknownRequestError, "'zz'"),
    ("fork duplicate", {}, lambda c: c.fork("run", "f"), DuplicateRequestError, "'f'"),
    ("fork swapped", {}, lambda c: c.fork("sw", "n"), RequestStateError, "swapped"),
    (
        "fork mid-prompt, no room",
        {"exhaust": "all"},
        lambda c: c.fork("pend", "n"),
        CapacityError,
        "reservation",
    ),
    # free
    ("free unknown", {}, lambda c: c.free("zz"), UnknownRequestError, "'zz'"),
    ("free twice", {}, lambda c: c.free("old"), UnknownRequestError, "'old'"),
    # swap
    ("swap_out unknown", {}, lambda c: c.swap_out("zz"), UnknownRequestError, "'zz'"),
    ("swap_out swapped", {}, lambda c: c.swap_out("sw"), RequestStateError, "swapped"),
    ("swap_out full", {"cpu": 1}, lambda c: c.swap_out("run"), CapacityError, "swap space"),
    ("swap_in unknown", {}, lambda c: c.swap_in("zz"), UnknownRequestError, "'zz'"),
    ("swap_in running", {}, lambda c: c.swap_in("run"), RequestStateError, "not swapped"),
    ("swap_in no room", {"exhaust": "all"}, lambda c: c.swap_in("sw"), CapacityError, "'sw'"),
    (
        "swap_in under watermark",
        {"num_blocks": 14, "watermark": 0.5},
        lambda c: c.swap_in("sw"),
        CapacityError,
        "watermark",
    ),
    # reads
    ("gather unknown", {}, lambda c: c.gather("zz"), UnknownRequestError, "'zz'"),
    ("gather swapped", {}, lambda c: c.gather("sw"), RequestStateError, "swapped"),
    (
        "attend shape",
        {},
        lambda c: c.attend(["run"], torch.ones(1, 2, 8)),
        ShapeError,
        "query",
    ),
    (
        "attend layer",
        {},
        lambda c: c.attend(["run"], torch.ones(1, 4, 8), layer=2),
        ConfigError,
        "layer 2",
    ),
    (
        "attend swapped",
        {},
        lambda c: c.attend(["sw"], torch.ones(1, 4, 8)),
        RequestStateError,
        "swapped",
    ),
    ("block_tables swapped", {}, lambda c: c.block_tables(["sw"]), RequestStateError, "'sw'"),
    ("seq_len unknown", {}, lambda c: c.seq_len("zz"), UnknownRequestError, "'zz'"),
]


@pytest.mark.parametrize(
    ("kwargs", "op", "error", "match"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_failed_operation_changes_nothing(
    kwargs: dict, op: Op, error: type[KVBenchError], match: str
) -> None:
    cache = build(**kwargs)
    before = cache.snapshot()
    stats, prefix = cache.stats(), cache.prefix_stats()
    with pytest.raises(error, match=match):
        op(cache)
    assert snapshots_equal(before, cache.snapshot())
    assert cache.stats() == stats and cache.prefix_stats() == prefix
    cache.check()


def test_every_mutating_operation_has_a_failure_case() -> None:
    covered = {name.split()[0] for name, *_ in CASES}
    mutating = {"admit", "append", "append_tokens", "fork", "free", "swap_out", "swap_in"}
    assert mutating <= covered


def test_the_fixture_state_is_what_the_cases_assume() -> None:
    cache = build(exhaust="all")
    assert cache.pool.ref[cache.block_table("f")[1]] == 2  # a shared partial block
    assert cache.is_swapped("sw") and cache.seq_len("pend") == 5
    assert cache.num_free_blocks == 0
    assert build().prefix_stats().evictable_blocks == 2
