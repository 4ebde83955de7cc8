"""Peer allocators (kvbench's PagedKVCache, vLLM's v1 KVCacheManager, entry-point plug-ins)
checked on the properties they all promise, and on the ones where they differ by design.

Shared properties (each peer alone, random operation sequences):
    * no leaks: free + used == usable blocks; each block's reference count equals the
      number of block tables holding it; freeing everything leaves no used block;
    * reserved blocks (vLLM's null block 0) are never in a block table;
    * a prefix hit is exactly the oracle's: the longest run of leading full blocks shared
      with a sequence cached before under the same salt, capped so the last prompt token is
      computed again (the pools are sized so nothing is evicted);
    * a failed admission or append (CapacityError) changes nothing (snapshot equality);
    * two peers driven by the same sequence report the same hits and block counts.
Design differences (asserted against each peer's declared `traits`): duplicate full
blocks (vLLM indexes both, kvbench only the first), eviction order, reserved blocks.

Peers whose library is not importable are skipped with the reason.
"""

from __future__ import annotations

import importlib.metadata

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from kvbench.suites.conformance.peer_allocator_model import AllocatorModel, Refused
from kvbench.suites.peers import base, registry
from kvbench.suites.peers.base import PeerUnavailableError
from kvbench.suites.peers.registry import allocator_names, load_allocator
from kvbench.workloads.errors import CapacityError

NAMES = allocator_names()


def make(name: str, num_blocks: int, block_size: int):
    try:
        return load_allocator(name, num_blocks, block_size)
    except PeerUnavailableError as exc:
        pytest.skip(f"peer {name!r} unavailable: {exc}")


def check_no_leaks(alloc, tables: dict) -> None:
    counts = alloc.counts()
    assert counts.free + counts.used == alloc.num_usable_blocks, counts
    held: dict[int, int] = {}
    for rid in tables:
        for b in alloc.block_table(rid):
            held[b] = held.get(b, 0) + 1
    for b, n in held.items():
        assert b not in alloc.traits.reserved_blocks, f"reserved block {b} handed out"
        assert alloc.ref_count(b) == n, f"block {b}: refcount {alloc.ref_count(b)} != {n}"
    assert counts.used == len(held), f"used {counts.used} != {len(held)} distinct held blocks"


def oracle_hit(prompt: list[int], salt, history: list[tuple[object, list[int]]], bs: int) -> int:
    """Prompt tokens a prefix cache that never evicts must serve (see module docstring)."""
    cap = (len(prompt) - 1) // bs
    best = 0
    for s, seq in history:
        if s != salt:
            continue
        common = 0
        for a, b in zip(prompt, seq, strict=False):
            if a != b:
                break
            common += 1
        best = max(best, min(common // bs, len(seq) // bs, cap))
    return best * bs


# An operation: ("admit", prompt-shape...) / ("append", ...) / ("free", ...), resolved
# against the live requests when run.
_token = st.integers(0, 2)
_op = st.one_of(
    st.tuples(
        st.just("admit"),
        st.integers(0, 3),  # which shared stem
        st.lists(_token, min_size=0, max_size=9),
        st.sampled_from([None, "tenant-a"]),
    ),
    st.tuples(st.just("append"), st.integers(0, 50), st.lists(_token, min_size=1, max_size=5)),
    st.tuples(st.just("free"), st.integers(0, 50)),
)
_STEMS = [[], [1, 2, 3, 4], [1, 2, 3, 4, 5, 6, 7, 8], [2, 2, 2, 2, 1, 1, 1, 1, 0]]


def run_ops(alloc, ops, bs: int, on_step=None):
    """Drive `alloc` with `ops`; check shared properties after every step; returns the
    trace of (op, result) for differential comparison."""
    live: dict[str, tuple[object, list[int]]] = {}
    history: list[tuple[object, list[int]]] = []
    trace: list[tuple[object, ...]] = []
    next_id = 0
    for op in ops:
        if op[0] == "admit":
            prompt = _STEMS[op[1]] + op[2]
            if not prompt:
                continue
            rid = f"r{next_id}"
            next_id += 1
            hit = alloc.admit(rid, prompt, salt=op[3])
            assert hit % bs == 0 and hit < len(prompt)
            assert hit == oracle_hit(prompt, op[3], history, bs), (prompt, op[3], history)
            live[rid] = (op[3], list(prompt))
            history.append((op[3], list(prompt)))
            trace.append(("admit", hit))
        elif op[0] == "append" and live:
            rid = sorted(live)[op[1] % len(live)]
            alloc.append(rid, op[2])
            salt, seq = live[rid]
            seq.extend(op[2])
            history.append((salt, list(seq)))
            trace.append(("append", len(alloc.block_table(rid))))
        elif op[0] == "free" and live:
            rid = sorted(live)[op[1] % len(live)]
            alloc.free(rid)
            del live[rid]
            trace.append(("free", None))
        else:
            continue
        check_no_leaks(alloc, live)
        counts = alloc.counts()
        trace.append(("counts", counts.free, counts.used))
    for rid in list(live):
        alloc.free(rid)
    assert alloc.counts().used == 0
    assert alloc.counts().free == alloc.num_usable_blocks
    return trace


@pytest.mark.parametrize("name", NAMES)
@given(ops=st.lists(_op, min_size=1, max_size=30))
def test_shared_properties_random_ops(name, ops):
    bs = 4
    # enough blocks that nothing is ever evicted: every token could own a block
    alloc = make(name, 30 * 20, bs)
    run_ops(alloc, ops, bs)


@given(ops=st.lists(_op, min_size=1, max_size=30))
def test_peers_agree_on_hits_and_counts(ops):
    if len(NAMES) < 2:
        pytest.skip("only one allocator peer is available")
    bs = 4
    traces = {}
    for name in NAMES:
        traces[name] = run_ops(make(name, 30 * 20, bs), ops, bs)
    first = next(iter(traces.values()))
    for name, trace in traces.items():
        assert trace == first, f"{name} diverges from {NAMES[0]}"


@pytest.mark.parametrize("name", NAMES)
def test_failed_admit_and_append_change_nothing(name):
    bs = 4
    alloc = make(name, 6, bs)
    alloc.admit("a", list(range(9)))  # 3 blocks (2 full)
    alloc.admit("b", list(range(20, 27)))  # 2 blocks
    before = alloc.snapshot()
    with pytest.raises(CapacityError):
        alloc.admit("c", list(range(40, 49)))  # needs 3, 1 free
    assert alloc.snapshot() == before
    alloc.append("b", [1])  # fills b's second block in place
    alloc.append("a", [1, 2, 3])  # a: 12 tokens, 3 blocks
    before = alloc.snapshot()
    with pytest.raises(CapacityError):
        alloc.append("b", [5, 6, 7, 8, 9, 10, 11, 12, 13])  # needs 3 more, 1 free
    assert alloc.snapshot() == before
    check_no_leaks(alloc, {"a": None, "b": None})


@pytest.mark.parametrize("name", NAMES)
def test_salt_isolates_and_last_token_is_recomputed(name):
    bs = 4
    alloc = make(name, 64, bs)
    prompt = list(range(12))
    assert alloc.admit("a", prompt, salt="x") == 0
    assert alloc.admit("b", prompt, salt="y") == 0  # another tenant: no sharing
    assert alloc.admit("c", prompt, salt="x") == 8  # whole prompt cached: last block redone
    assert alloc.admit("d", [*prompt, 99], salt="x") == 12
    shared = set(alloc.block_table("a")[:2])
    assert not shared & set(alloc.block_table("b"))
    assert set(alloc.block_table("c")[:2]) == shared


@pytest.mark.parametrize("name", NAMES)
def test_duplicate_full_blocks_match_declared_trait(name):
    """Two requests that compute the same block independently: neither peer merges them
    (dedups_full_blocks False); vLLM indexes both copies, kvbench only the first."""
    bs = 4
    alloc = make(name, 16, bs)
    alloc.admit("a", [7])
    alloc.admit("b", [7])
    alloc.append("a", [1, 2, 3])
    alloc.append("b", [1, 2, 3])
    ta, tb = alloc.block_table("a"), alloc.block_table("b")
    assert ta[0] != tb[0], "the two requests were never meant to share (admitted apart)"
    assert alloc.is_cached(ta[0])
    assert alloc.is_cached(tb[0]) == alloc.traits.indexes_duplicates
    assert alloc.counts().cached == (2 if alloc.traits.indexes_duplicates else 1)
    assert not alloc.traits.dedups_full_blocks


@pytest.mark.parametrize("name", NAMES)
def test_eviction_order_matches_declared_trait(name):
    """Free a request with 3 cached full blocks and a partial one, then force one eviction:
    "lru-tail-first" evicts its deepest cached block, so a re-admission hits 2 blocks."""
    bs = 4
    alloc = make(name, 7, bs)
    prompt = list(range(13))  # 3 full blocks + 1 token
    alloc.admit("a", prompt)
    table = alloc.block_table("a")
    alloc.free("a")
    assert [alloc.is_cached(b) for b in table] == [True, True, True, False]
    alloc.admit("c", list(range(100, 117)))  # 5 blocks: 4 free + 1 evicted
    evicted = [b for b in table[:3] if not alloc.is_cached(b)]
    assert len(evicted) == 1
    alloc.free("c")
    hit = alloc.admit("a2", prompt)
    if alloc.traits.eviction == "lru-tail-first":
        assert evicted == [table[2]]
        assert hit == 8
    else:  # a plug-in with another policy: still exactly one block lost
        assert hit in (0, 4, 8)


def test_entry_point_plugins_are_discovered(monkeypatch):
    """A package's `kvbench.peers` entry point adds a peer; a broken one is skipped."""

    class FakeEP:
        def __init__(self, name, fn):
            self.name, self.value, self._fn = name, f"fake:{name}", fn

        def load(self):
            return self._fn

    def good():
        from kvbench.suites.peers.kvbench_adapter import KVBenchAllocator

        class Renamed(KVBenchAllocator):
            name = "plugin"

        return base.PeerSpec(name="plugin", allocator=Renamed)

    def broken():
        raise RuntimeError("plug-in failed to import")

    def fake_entry_points(group):
        assert group == registry.ENTRY_POINT_GROUP
        return [FakeEP("plugin", good), FakeEP("broken", broken)]

    monkeypatch.setattr(importlib.metadata, "entry_points", fake_entry_points)
    assert "plugin" in registry.allocator_names()
    assert "broken" not in registry.peer_specs()
    alloc = registry.load_allocator("plugin", 8, 4)
    assert alloc.name == "plugin"
    assert alloc.admit("a", [1, 2, 3, 4, 5]) == 0
    with pytest.raises(base.ConfigError, match="unknown peer 'nope'"):
        registry.load_allocator("nope", 8, 4)


# ---------------------------------------------------------------- under eviction and refusal
# Pools of 3-8 blocks of 4 tokens: admissions evict cached prefixes and get refused;
# duplicates arise when two live requests fill the same block apart; salts include "".
_EVICT_SALTS = [None, "", "t"]
_evict_op = st.one_of(
    st.tuples(
        st.just("admit"),
        st.integers(0, 3),
        st.lists(_token, min_size=0, max_size=7),
        st.sampled_from(_EVICT_SALTS),
    ),
    st.tuples(st.just("append"), st.integers(0, 50), st.lists(_token, min_size=1, max_size=6)),
    st.tuples(st.just("free"), st.integers(0, 50)),
)


#: Eviction traces are cheap (~30 ms); the rules part peers in a few percent of them, so
#: the ci profile draws more of these than its default.
_EVICT_SETTINGS = settings(max_examples=max(150, settings().max_examples))


def drive(alloc, ops, max_len: int, refused=(CapacityError,)) -> list[tuple]:
    """Apply `ops` to an allocator adapter or an `AllocatorModel`; returns one entry per
    operation: (op, hit tokens or None, refused, free blocks, cached blocks). A refused
    operation must leave the adapter's snapshot unchanged. Requests never grow past
    `max_len` tokens (the whole pool: longer is bad input, not a refusal)."""
    is_model = isinstance(alloc, AllocatorModel)
    live: list[str] = []
    length: dict[str, int] = {}
    out: list[tuple] = []
    for n, op in enumerate(ops):
        rid = f"r{n}"
        before = None if is_model else alloc.snapshot()
        hit, refusal = None, False
        try:
            if op[0] == "admit":
                prompt = _STEMS[op[1]] + op[2]
                if not prompt or len(prompt) > max_len:
                    continue
                hit = alloc.admit(rid, prompt, salt=op[3])
                live.append(rid)
                length[rid] = len(prompt)
            elif op[0] == "append" and live:
                rid = live[op[1] % len(live)]
                if length[rid] + len(op[2]) > max_len:
                    continue
                alloc.append(rid, op[2])
                length[rid] += len(op[2])
            elif op[0] == "free" and live:
                rid = live.pop(op[1] % len(live))
                (alloc.free_request if is_model else alloc.free)(rid)
            else:
                continue
        except refused:
            refusal = True
            if before is not None:
                assert alloc.snapshot() == before, f"refused {op} changed the allocator"
        if is_model:
            free, cached = alloc.free, alloc.cached
        else:
            counts = alloc.counts()
            free, cached = counts.free, counts.cached
        out.append((op[0], hit, refusal, free, cached))
    return out


def model_trace(ops, num_blocks: int, bs: int, traits) -> list[tuple]:
    return drive(AllocatorModel(num_blocks, bs, traits), ops, num_blocks * bs, (Refused,))


@pytest.mark.parametrize("name", NAMES)
@_EVICT_SETTINGS
@given(ops=st.lists(_evict_op, min_size=1, max_size=40), num_blocks=st.integers(3, 8))
def test_peer_matches_model_of_its_declared_rules_under_eviction(name, ops, num_blocks):
    """Op by op, a peer's hits, refusals, free and cached blocks are those of the allocator
    model under the rules it declares (duplicates indexed or not, "" as no salt or not)."""
    bs = 4
    alloc = make(name, num_blocks, bs)
    got = drive(alloc, ops, num_blocks * bs)
    assert got == model_trace(ops, num_blocks, bs, alloc.traits)


@_EVICT_SETTINGS
@given(ops=st.lists(_evict_op, min_size=1, max_size=40), num_blocks=st.integers(3, 8))
def test_peers_agree_under_eviction_up_to_declared_rules(ops, num_blocks):
    """The differential: two peers driven by the same operations agree op by op (hits,
    refusals, free blocks) unless the model says their declared rules part them; where
    they part, each is exactly its own rules' model."""
    if len(NAMES) < 2:
        pytest.skip("only one allocator peer is available")
    bs = 4
    runs = {}
    for name in NAMES:
        alloc = make(name, num_blocks, bs)
        runs[name] = (
            drive(alloc, ops, num_blocks * bs),
            model_trace(ops, num_blocks, bs, alloc.traits),
        )
    first_got, first_model = runs[NAMES[0]]
    for name, (got, model) in runs.items():
        assert got == model, f"{name} is not the model of its declared rules"
        for i, (a, b) in enumerate(zip(got, first_got, strict=False)):
            if [m[:4] for m in model[: i + 1]] == [m[:4] for m in first_model[: i + 1]]:
                assert a[:4] == b[:4], f"{name} parts from {NAMES[0]} at op {i} undeclared"
        if model != first_model:
            event(f"{name} parts from {NAMES[0]} by a declared rule")


def _hits_e_a_b_c_d(alloc) -> list[int]:
    """The issue's minimal case: 4 blocks of 16; admit and free, one at a time, E (17
    tokens), A (32), B = A, C = [7], D = E + [5]."""
    e, a = list(range(100, 117)), list(range(200, 232))
    hits = []
    for rid, prompt in (("E", e), ("A", a), ("B", a), ("C", [7]), ("D", [*e, 5])):
        hits.append(alloc.admit(rid, prompt))
        alloc.free(rid)
    return hits


@pytest.mark.parametrize("name", NAMES)
def test_duplicate_rule_changes_hits_under_eviction(name):
    """B recomputes A's second block (its last token is never a hit). Indexed (vLLM), that
    copy joins the LRU queue, so C evicts E's cached block and D misses; left unindexed
    (kvbench) it is reused by C first, and D hits E's block."""
    alloc = make(name, 4, 16)
    expect = [0, 0, 16, 0, 0] if alloc.traits.indexes_duplicates else [0, 0, 16, 0, 16]
    assert _hits_e_a_b_c_d(alloc) == expect
    assert _hits_e_a_b_c_d(_ModelAsAdapter(AllocatorModel(4, 16, alloc.traits))) == expect


@pytest.mark.parametrize("name", NAMES)
def test_empty_salt_rule(name):
    """A 40-token prompt with salt "", freed, then the same prompt + 1 token without a
    salt: vLLM (empty salt = no salt) hits 32 tokens, kvbench ("" is a tenant) none."""
    alloc = make(name, 8, 16)
    prompt = list(range(40))
    assert alloc.admit("a", prompt, salt="") == 0
    alloc.free("a")
    expect = 32 if alloc.traits.empty_salt_is_no_salt else 0
    assert alloc.admit("b", [*prompt, 1]) == expect
    assert alloc.admit("c", [*prompt, 2], salt="") == 32  # "" always shares with ""


class _ModelAsAdapter:
    """Just enough of an adapter over the model for `_hits_e_a_b_c_d`."""

    def __init__(self, model: AllocatorModel) -> None:
        self.model = model

    def admit(self, rid, prompt, salt=None):
        return self.model.admit(rid, prompt, salt)

    def free(self, rid):
        self.model.free_request(rid)


@pytest.mark.parametrize("name", NAMES)
def test_trace_hit_replay_is_the_model_of_the_declared_rules(name):
    """trace.prefix_capacity's peer rows (`prefix_hit_replay`): the first 20 requests of
    the shipped Mooncake trace, one at a time through a pool of 300 blocks of 64 (it
    evicts), give each peer the hit tokens of the allocator model under its declared
    rules; kvbench's also equal the real-cache replay of `paged.hitrate`."""
    from kvbench.paged.hitrate import replay
    from kvbench.suites.peers.workloads import prefix_hit_replay
    from kvbench.workloads.shipped import shipped_trace
    from kvbench.workloads.trace import Trace

    trace = Trace(shipped_trace("mooncake-conversation").requests[:20])
    blocks, bs = 300, 64

    def prompts():
        return ((list(r.prompt_ids(i)), r.salt) for i, r in enumerate(trace.requests))

    alloc = make(name, blocks, bs)
    got = prefix_hit_replay(alloc, prompts(), blocks * bs)
    model = _ModelAsAdapter(AllocatorModel(blocks, bs, alloc.traits))
    assert got == prefix_hit_replay(model, prompts(), blocks * bs) > 0
    if name == "kvbench":
        ours = replay(trace, blocks * bs, bs)
        assert ours.evictions > 0 and got == ours.hit_tokens


def test_vllm_allocator_refuses_a_window_and_a_spec_together() -> None:
    """Two kinds named at once are refused by name, before vLLM is even imported (so the
    refusal holds where vLLM is absent too)."""
    from kvbench.suites.peers.vllm_adapter import VLLMAllocator
    from kvbench.workloads.errors import ConfigError
    from kvbench.workloads.kv_spec import KVCacheSpec

    with pytest.raises(ConfigError, match=r"not both \(window=4, spec=.*chunk"):
        VLLMAllocator(8, 16, window=4, spec=KVCacheSpec.chunked_local(32))
