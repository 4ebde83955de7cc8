"""The vllm-v1 replay's two fast paths change nothing but speed (issue 37 item 4):

* `PlainAppend.append_chained` (a decoder's append keyed from its whole-sequence chain,
  every step inline) against the general `append_tokens` of the same chain-admitted
  requests (the whole cache snapshot equal after every call) and against the ids path
  (admitted without a chain, every append handing its ids, each block hashed as it
  fills: the same index, pool, tables and keys);
* `SharedPrefixChains.packed` (a given prompt's chain, its shared prefix's keys taken
  from the last prompt that began the same way) against `packed_chain` of the ids.
* `packed_chain` itself (each later parent taken as a 32-byte digest, inline) against
  `block_key` and `token_bytes` block by block.

Drawn by hypothesis over small pools (evictions, duplicates, forks that force
copy-on-write, appends past a chain's end, capacity errors); the engine-level
comparison of the whole replay is `test_v1_keys.py`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kvbench.paged.block_chain import BlockChain
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.prefix_cache import block_key, packed_chain, token_bytes
from kvbench.paged.serving.engine.v1_keys import SharedPrefixChains, _common_blocks
from kvbench.suites.conformance.peer_vllm_scheduler import GEOM
from kvbench.workloads.errors import CapacityError, ConfigError

STEMS = [tuple(range(100, 124)), (*range(100, 110), *range(300, 314)), tuple(range(500, 524))]

OPS = st.lists(
    st.tuples(
        st.sampled_from(["admit", "append", "append", "append", "fork", "free"]),
        st.integers(0, 7),  # which live request
        st.integers(1, 12),  # tokens
        st.integers(0, 5),  # variant: stem, salt, output length
    ),
    min_size=1,
    max_size=50,
)


def _cache(block_size: int, dups: bool) -> PagedKVCache:
    return PagedKVCache(
        GEOM, 20, block_size, max_seq_len=200, store_kv=False, enable_prefix_caching=True,
        index_duplicates=dups,
    )  # fmt: skip


def _state(cache: PagedKVCache) -> tuple[Any, ...]:
    """What both key paths must agree on: index, pool, each table, length and keys."""
    assert cache.prefix is not None
    reqs = [(r.request_id, tuple(r.blocks), r.seq_len, tuple(r.keys), r.hashable)
            for r in cache.requests.states()]  # fmt: skip
    return (cache.prefix.snapshot(), cache.pool.snapshot(), cache.pool.lru_order(), reqs)


@given(
    ops=OPS,
    block_size=st.sampled_from([1, 2, 4, 8]),
    dups=st.booleans(),
)
def test_append_chained_equals_the_general_append_and_the_ids_path(
    ops: list[tuple[str, int, int, int]], block_size: int, dups: bool
) -> None:
    fast, general, ids = (_cache(block_size, dups) for _ in range(3))
    whole: dict[int, tuple[int, ...]] = {}  # each request's prompt + output ids
    live: list[int] = []
    taken = 0  # appends the fast path took (it declines forks' shared blocks, etc.)
    out: list[object] = []  # each call's outcome on the three caches
    for step, (kind, pick, n, variant) in enumerate(ops):
        if kind == "admit" or not live:
            rid = step
            prompt = STEMS[variant % 3][: 3 + n + variant]
            salt = "s" if variant == 5 else None
            # the chain covers the prompt and 0-40 output ids (appends may go past it)
            whole[rid] = (*prompt, *range(1000 * (rid + 1), 1000 * (rid + 1) + 8 * variant))
            keys, chunks = packed_chain(whole[rid], block_size, (salt, None))
            out.clear()
            for cache in (fast, general, ids):
                try:
                    if cache is ids:
                        got = cache.admit(rid, prompt, salt=salt)
                    else:
                        chain = BlockChain(
                            prompt, block_size, (salt, None), block_key, tuple(keys), tuple(chunks)
                        )
                        got = cache.admit(rid, prompt, salt=salt, chain=chain)
                    cache.append_tokens(rid, len(prompt) - got)
                    out.append(got)
                except CapacityError:
                    if rid in cache.request_ids():
                        cache.free(rid)  # the prompt's append did not fit: drop it
                    out.append(-1)
            assert out[0] == out[1] == out[2]
            if out[0] != -1:
                live.append(rid)
        else:
            rid = live[pick % len(live)]
            out.clear()
            for cache in (fast, general, ids):
                try:
                    if kind == "free":
                        cache.free(rid)
                    elif kind == "fork":
                        cache.fork(rid, step)
                        whole[step] = whole[rid]
                    elif cache is fast:
                        if cache.plain.append_chained(rid, n):
                            taken += 1
                        else:
                            cache.append_tokens(rid, n)
                    elif cache is general:
                        cache.append_tokens(rid, n)
                    else:
                        s = cache.seq_len(rid)
                        given_ids: list[int | None] = list(whole[rid][s : s + n])
                        given_ids += [None] * (n - len(given_ids))  # past the chain: unknown
                        cache.append_tokens(rid, n, given_ids)
                    out.append("ok")
                except (CapacityError, ConfigError) as exc:
                    out.append(type(exc).__name__)
            assert out[0] == out[1] == out[2], (kind, out)
            if out[0] == "ok" and kind == "free":
                live.remove(rid)
            elif out[0] == "ok" and kind == "fork":
                live.append(step)
        assert fast.snapshot()["requests"] == general.snapshot()["requests"]
        assert _state(fast) == _state(general) == _state(ids)
        fast.check()
    assert taken <= len(ops)


def test_append_chained_declines_what_it_does_not_take() -> None:
    """False and nothing changed: an unknown id, a request inside its prompt, no chain,
    a chain that does not cover the block that fills, n <= 0."""
    bs = 4
    cache = _cache(bs, True)
    prompt = tuple(range(10))
    keys, chunks = packed_chain((*prompt, 50, 51), bs, (None, None))  # 3 full blocks
    chain = BlockChain(prompt, bs, (None, None), block_key, tuple(keys), tuple(chunks))
    cache.admit("a", prompt, chain=chain)
    cache.admit("b", tuple(range(40, 47)))  # no chain
    before = cache.snapshot()
    assert not cache.plain.append_chained("zz", 1)
    assert not cache.plain.append_chained(["unhashable"], 1)  # type: ignore[arg-type]
    assert not cache.plain.append_chained("a", 3)  # still inside its prompt
    cache.append_tokens("a", 10)
    cache.append_tokens("b", 7)
    before = cache.snapshot()
    assert not cache.plain.append_chained("b", 1)  # no chain
    assert not cache.plain.append_chained("a", 6)  # fills block 3: the chain has 0-2
    assert not cache.plain.append_chained("a", 0)
    assert not cache.plain.append_chained("a", -1)
    assert cache.snapshot() == before
    assert cache.plain.append_chained("a", 2)  # fills block 2 from the chain
    assert cache.prefix is not None and cache.prefix.is_cached(cache.requests.get("a").blocks[2])


@given(
    prompts=st.lists(
        st.tuples(
            st.integers(0, 2),  # stem
            st.integers(0, 30),  # stem ids kept
            st.lists(st.integers(0, 2), max_size=20),  # own ids (a small alphabet)
            st.integers(0, 12),  # tail length
            st.booleans(),  # given as a list
            st.sampled_from([(None, None), ("t", None)]),
        ),
        min_size=1,
        max_size=12,
    ),
    block_size=st.sampled_from([1, 2, 3, 4, 16]),
    limit=st.sampled_from([1, 16, 1 << 22]),
)
def test_shared_prefix_chains_equal_packed_chain(
    prompts: list[tuple[int, int, list[int], int, bool, tuple[str | None, None]]],
    block_size: int,
    limit: int,
) -> None:
    memo = SharedPrefixChains(block_size, limit)
    for stem, keep, own, tail_len, as_list, extra in prompts:
        ids = (*STEMS[stem][:keep], *own)
        if not ids:
            continue
        tail = tuple(range(7000, 7000 + tail_len))
        given_ids: Sequence[int] = list(ids) if as_list else ids
        assert memo.packed(given_ids, extra, tail) == packed_chain((*ids, *tail), block_size, extra)


def test_shared_prefix_chains_reuse_the_shared_blocks() -> None:
    """Prompts behind one system prompt take its blocks from the memo (the speed)."""
    memo = SharedPrefixChains(4)
    system = tuple(range(100, 117))  # 4 full blocks and one id
    for i in range(5):
        memo.packed((*system, i, i + 1, 9), (None, None), range(50, 60))
    assert memo.reused == 4 * 4  # every prompt after the first: the 4 system blocks


@given(
    a=st.lists(st.integers(0, 2), min_size=1, max_size=40),
    b=st.lists(st.integers(0, 2), min_size=1, max_size=40),
    bs=st.sampled_from([1, 2, 3, 5]),
)
def test_common_blocks_is_the_longest_agreeing_block_prefix(
    a: list[int], b: list[int], bs: int
) -> None:
    m = min(len(a), len(b)) // bs
    b[:bs] = a[:bs]  # the memo's key: the first block agrees
    if m == 0:
        return
    expect = max(k for k in range(1, m + 1) if a[: k * bs] == b[: k * bs])
    assert _common_blocks(tuple(a), tuple(b), m, bs) == expect


@given(
    ids=st.lists(st.integers(0, 2**63 - 1), max_size=40),
    block_size=st.sampled_from([1, 2, 3, 16]),
    parent=st.sampled_from([None, bytes(range(32)), b"short parent", bytes(33)]),
    extra=st.sampled_from([(None, None), ("t", None), ("t", "lora")]),
)
def test_packed_chain_is_block_key_block_by_block(
    ids: list[int], block_size: int, parent: bytes | None, extra: tuple[str | None, str | None]
) -> None:
    """`packed_chain` (its loop takes every parent after the first as a 32-byte digest,
    the first through `_head`) against `block_key` and `token_bytes` of each block,
    from a root, a 32-byte parent and parents of other lengths."""
    keys, chunks = packed_chain(ids, block_size, extra, parent)
    want_keys, want_chunks, key = [], [], parent
    for i in range(len(ids) // block_size):
        block = ids[i * block_size : (i + 1) * block_size]
        key = block_key(key, block, extra)
        want_keys.append(key)
        want_chunks.append(token_bytes(block))
    assert (keys, chunks) == (want_keys, want_chunks)
