"""Whole-sequence key chains for the vllm-v1 replay of a memory-only `PagedKVCache`.

vLLM hashes every full block of a request, prompt and generated alike, so the vllm-v1
policy keys every block it appends (`V1Policy._grow`). Handing the cache each chunk's
ids makes it key the blocks one by one as they fill: the ids listed, type-checked and
stored, each block's ids packed twice (for its key and for its index entry) and hashed
(half of a replay's time, profiled on the ShareGPT trace of `peers.scheduler_speed`).
Yet every id a sequence will ever hold is known when it is first admitted (its prompt,
then its given or synthetic outputs, `Seq.token`), and a block's key depends on its
content only. So `KeyChains` computes a sequence's whole chain once
(`prefix_cache.packed_chain`: one packing, one sha256 a block; a prompt described by
block ids, as an imported production trace's, from `block_chain.DescribedChains`, which
hashes a prefix shared by many requests once; a prompt given as ids from
`SharedPrefixChains`, which takes the blocks it shares with the last prompt that began
alike from that prompt's chain: requests behind a shared system prompt hash it once),
and the policy:

* probes the admission's hit by walking the chain's keys (`PrefixCache.match_keyed`,
  every hit verified as `match` verifies it: parent, ids, extra keys) instead of a
  `prefix_hit` that hashes, and hands the same chain to `PagedKVCache.admit(chain=)`,
  whose own match walks it again without hashing: one hashing per sequence in all;
* appends without ids: the cache then keys each block that fills from the chain it was
  admitted with (`_register_full_blocks` inserts `chain.keys[i]` for every full block
  i the chain covers, and keeps a chain as long as no ids are given), in bulk. A
  decoder's append past its prompt (one block boundary an event) takes
  `PlainAppend.append_chained` (`KeyChains.append`): one call, the allocation, the
  advance and the filled block's index entry inline (issue 37 item 4: the per-block
  append was the largest part left of a replay at block 16, profiled).

The chain handed to `admit` is bound to the admitted part of the sequence (the identity
check of `PagedKVCache._check_chain`) but covers the whole sequence: its keys past the
admitted part key the chunks and outputs appended later. Same keys, parents and packed
ids as the ids path, so the index, its hits, duplicates and evictions are the same
(`suites/conformance/test_v1_keys.py` compares both paths step by step; the scheduler
differential holds the decisions to vLLM's). The cache keeps no output ids then
(`token_ids` reads None past the prompt), which a memory-only replay never asks for.

A trace whose every prompt is described by block ids of one size (an imported
production trace's) keys its prompts' full blocks by interned identity instead
(`paged.block_identity`): one dict lookup per described block, no packing and no
sha256. Where no block past a prompt can be hit by another sequence (synthetic outputs
only, every prompt given below the synthetic ids or described), the blocks past each
prompt take fresh identities. Both are chosen per replay (`plan`), in one-to-one
correspondence with the sha256 keys, so every decision is the same
(`suites/conformance/test_block_identity.py`); the whole Mooncake conversation trace's
replay takes 0.69-0.71x of its sha256 time, paired (docs/serving.md, *Identity keys*).

Used only where it applies (`KeyChains.applies`): a memory-only `PagedKVCache` with
prefix caching and the default key function; any other cache gets the ids path.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import repeat

from kvbench.paged.block_chain import BlockChain, DescribedChains
from kvbench.paged.block_identity import IDENTITY_CONTENT, DescribedIdentities
from kvbench.paged.cache import PagedKVCache
from kvbench.paged.prefix_cache import BlockKey, ExtraKeys, block_key, packed_chain
from kvbench.paged.serving.engine.sequence import Seq
from kvbench.reference.contract import ServingCache
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import BlockTokenIds, TraceRequest


class KeyChains:
    """Each admitted sequence's whole key chain (module docstring), by sequence order,
    from its first admission until it finishes (`drop`)."""

    def __init__(self, cache: PagedKVCache) -> None:
        assert cache.prefix is not None
        self.cache = cache
        self.prefix = cache.prefix
        self.ref = cache.pool.ref
        self.bs = cache.block_size
        #: a decoder's append, keyed from its chain (`PlainAppend.append_chained`):
        #: False, nothing changed, where it does not apply (then `append_tokens`)
        self.append = cache.plain.append_chained
        self._chains: dict[int, tuple[tuple[BlockKey, ...], tuple[bytes, ...]]] = {}
        #: the prompts' chains memoised by described block (`paged.block_chain`)
        self.described = DescribedChains(self.bs)
        #: the prompts' chains by interned identity (`paged.block_identity`), where the
        #: traces replayed over this cache qualify (`plan`), else None (sha256 keys)
        self.identities: DescribedIdentities | None = None
        #: whether the blocks past each prompt take fresh identities (`plan`), and the
        #: next one (negative: never an interned identity, which is >= 0)
        self.fresh_tails = False
        self._next_fresh = -1
        #: given prompts' chains memoised by shared prefix (`SharedPrefixChains`)
        self.shared = SharedPrefixChains(self.bs)

    @staticmethod
    def applies(cache: ServingCache) -> bool:
        """Whether `cache` takes whole-sequence chains: a memory-only PagedKVCache that
        caches prefixes with `block_key`."""
        return KeyChains.of(cache) is not None

    @staticmethod
    def of(cache: ServingCache) -> KeyChains | None:
        """The chains of a replay over `cache`, or None where it does not take them."""
        if (
            isinstance(cache, PagedKVCache)
            and not cache.store_kv
            and cache.prefix is not None
            and cache.prefix.key_fn is block_key
        ):
            return KeyChains(cache)
        return None

    def plan(self, requests: Sequence[TraceRequest], prompt_ids_reach_outputs: bool) -> None:
        """Choose the coming replay's keys (module docstring): identities for the prompts
        where the trace qualifies (`DescribedIdentities.qualifies`), and fresh identities
        for the blocks past the prompts where no such block can ever be hit by another
        sequence: every output synthetic (no output ids given) and every prompt given
        below the synthetic ids (`prompt_ids_reach_outputs` False: the engine's
        `big_prompt_ids`) or described (above them; a synthetic prompt, a range, may
        reach them). Both only on an empty index; a later trace over an index they key
        is refused (ConfigError: it could miss what the sha256 path would hit, an
        earlier replay's synthetic outputs among it)."""
        if len(self.prefix):
            if self.identities is not None or self.fresh_tails:
                raise ConfigError(
                    "this cache's prefix index is keyed by identities from an earlier "
                    "replay; replay another trace on a fresh cache"
                )
            return  # sha256 keys from an earlier replay: the same keys again
        self._chains.clear()
        bt = DescribedIdentities.qualifies(requests, self.bs)
        self.identities = DescribedIdentities(self.bs, bt) if bt else None
        self.fresh_tails = not prompt_ids_reach_outputs and all(
            r.output_tokens is None and (r.prompt is not None or r.prompt_blocks is not None)
            for r in requests
        )

    def chain(self, seq: Seq) -> tuple[tuple[BlockKey, ...], tuple[bytes, ...]]:
        """(keys, packed ids) of every full block of the sequence's prompt and all its
        output tokens, computed on first use."""
        got = self._chains.get(seq.order)
        if got is None:
            out = seq.out_tokens
            base = seq.out_base
            n_out = seq.req.output_len
            # only unpacked after the prompt's ids: a range is not listed first
            outs = out[:n_out] if out is not None else range(base, base + n_out)
            prompt, extra = seq.prompt, (seq.salt, None)
            fresh = self.fresh_tails
            if fresh:  # the prompt's chain only: the blocks past it take fresh identities
                outs = ()
            keys: list[BlockKey] | list[bytes]
            if self.identities is not None and type(prompt) is BlockTokenIds:
                keys, chunks = self.identities.packed(prompt, extra, outs)
            elif type(prompt) is tuple or type(prompt) is list:  # given ids: shared prefixes
                keys, chunks = self.shared.packed(prompt, extra, outs)
            else:  # described blocks (memoised by block) or synthetic ids (a range)
                keys, chunks = self.described.packed(prompt, extra, outs)
            more = (len(prompt) + n_out) // self.bs - len(keys) if fresh else 0
            if more > 0:
                start = self._next_fresh
                self._next_fresh = start - more
                keys = [*keys, *range(start, start - more, -1)]
                chunks = [*chunks, *repeat(IDENTITY_CONTENT, more)]
            got = self._chains[seq.order] = (tuple(keys), tuple(chunks))
        return got

    def probe(self, seq: Seq, total: int) -> tuple[int, int]:
        """`PagedKVCache.prefix_hit` of the sequence's first `total` tokens from its
        chain: (hit tokens, blocks admitting all `total` would take from the free
        count); changes nothing."""
        keys, chunks = self.chain(seq)
        blocks = self.prefix.match_keyed(keys, chunks, (seq.salt, None), (total - 1) // self.bs)[1]
        ref = self.ref
        revived = [ref[b] for b in blocks].count(0)
        return len(blocks) * self.bs, -(-total // self.bs) - len(blocks) + revived

    def admit(self, seq: Seq, part: Sequence[int], to_come: int) -> int:
        """`PagedKVCache.admit` of the sequence with `part`, its first tokens, given its
        chain bound to `part` (covering the whole sequence past them: module docstring);
        returns the cached tokens (CapacityError, nothing changed, where it does not fit)."""
        keys, chunks = self.chain(seq)
        extra = (seq.salt, None)
        bound = BlockChain(part, self.bs, extra, block_key, keys, chunks)
        return self.cache.admit(seq.sid, part, salt=seq.salt, output_len=to_come, chain=bound)

    def drop(self, seq: Seq) -> None:
        """Forget a finished sequence's chain."""
        self._chains.pop(seq.order, None)


#: Memo key of `SharedPrefixChains`: (extra keys, the ids of the prompt's first block).
_HeadKey = tuple[ExtraKeys, tuple[int, ...]]
#: A remembered prompt: (its ids, the keys and packed ids of its full blocks).
_Ref = tuple[tuple[int, ...], tuple[bytes, ...], tuple[bytes, ...]]


class SharedPrefixChains:
    """`packed_chain` of prompts given as ids, memoised by shared prefix.

    Requests behind a shared system prompt (or the turns of one chat) begin with the
    same full blocks, whose keys depend on those blocks' ids and the extra keys only.
    So the memo remembers, for each (extra keys, ids of the first block), the last
    prompt that began so with its full blocks' keys and packed ids; a prompt that begins
    the same way takes the keys and packed ids of the full blocks it shares with that
    prompt (found by comparing ids: `_common_blocks`) and packs and hashes only the
    rest, from the last shared key. The result is `packed_chain` of the prompt then the
    tail, exactly (the same bytes: each key is the same function of the same parent and
    ids; hypothesis test in `suites/conformance/test_v1_keys.py`).

    Memory: the keys and packed ids of at most 2 * `limit` prompt ids (~15 bytes an
    id), in two generations as `block_chain.DescribedChains` keeps them; the prompts'
    ids are the trace's own tuples (a list is copied into one). Only speed depends on
    `limit`."""

    def __init__(self, block_size: int, limit: int = 1 << 22) -> None:
        self.block_size = block_size
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an integer >= 1 (token ids), got {limit!r}")
        self.limit = limit
        self._new: dict[_HeadKey, _Ref] = {}
        self._old: dict[_HeadKey, _Ref] = {}
        self._held = 0  # prompt ids remembered in `_new`
        #: full blocks taken from the memo / packed and hashed (prompt and tail)
        self.reused = 0
        self.hashed = 0

    def packed(
        self, prompt: Sequence[int], extra: ExtraKeys, tail: Sequence[int] = ()
    ) -> tuple[list[bytes], list[bytes]]:
        """(keys, packed ids) of the full blocks of `prompt` then `tail`: equal to
        `packed_chain((*prompt, *tail), block_size, extra)`."""
        bs = self.block_size
        ids = prompt if type(prompt) is tuple else tuple(prompt)
        n = len(ids) // bs  # the prompt's full blocks
        if n == 0:
            keys, chunks = packed_chain((*ids, *tail), bs, extra)
            self.hashed += len(keys)
            return keys, chunks
        head: _HeadKey = (extra, ids[:bs])
        ref = self._new.get(head)
        if ref is None:
            ref = self._old.pop(head, None)
        k = 0 if ref is None else _common_blocks(ids, ref[0], min(n, len(ref[1])), bs)
        if ref is not None and k:
            keys, chunks = packed_chain((*ids[k * bs :], *tail), bs, extra, ref[1][k - 1])
            self.hashed += len(keys)
            self.reused += k
            keys[:0] = ref[1][:k]
            chunks[:0] = ref[2][:k]
        else:
            keys, chunks = packed_chain((*ids, *tail), bs, extra)
            self.hashed += len(keys)
        if self._held >= self.limit:
            self._old, self._new, self._held = self._new, {}, 0
        self._new[head] = (ids, tuple(keys[:n]), tuple(chunks[:n]))
        self._held += n * bs
        return keys, chunks


def _common_blocks(a: tuple[int, ...], b: tuple[int, ...], m: int, bs: int) -> int:
    """The largest k <= m such that a and b agree on their first k blocks of bs ids,
    given that they agree on the first (1 <= m <= both lengths in blocks): compared a
    run of blocks at a time (C speed), bisecting where the whole run differs."""
    if a[: m * bs] == b[: m * bs]:
        return m
    lo, hi = 1, m - 1  # blocks [0, lo) agree; the answer lies in [lo, hi]
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[lo * bs : mid * bs] == b[lo * bs : mid * bs]:
            lo = mid
        else:
            hi = mid - 1
    return lo
