"""Exact block identities for a memory-only replay whose prompts are all described by
block ids: the prefix index keyed by interned ints instead of sha256 chain keys.

Why: replaying an imported production trace (every prompt a `BlockTokenIds`: blocks of
`bt` ids, id BLOCK_ID_BASE + block * bt + position) through the vllm-v1 engine spends a
quarter of its time making the key chains (`block_chain.DescribedChains`: each block's
ids packed, sliced and hashed; 62% of the Mooncake trace's described blocks start a
prefix never seen before, so ~5.5M sha256 a replay whatever the memo holds). Yet with
one `bt` for the whole trace a full block inside a prompt is identified exactly by its
whole prefix: the extra keys, the described block ids before it and its position in its
own described block. `DescribedIdentities` interns (parent, block id) to a dense base
once per distinct described block, as `compact_replay` does, and keys the block at
position j of it `base * (bt // block_size) + j`: one dict lookup per described block
(32 blocks of 16 at bt 512), no packing, no hashing.

Bijection with the sha256 keys (what makes every decision the same): over the prompts
of one trace, two full prompt blocks get equal identities iff their whole prefixes of
ids are equal iff their `block_key` chain keys are equal (sha256 collisions aside, as
everywhere in the index). The blocks past a prompt's full blocks (the one holding its
last ids and the first outputs, then the outputs) keep sha256 keys, chained from the
last identity (`prefix_cache.parent_field`): equal iff same identity parent and same ids. An int
never equals a bytes key, and need not: a block past the prompt holds at least one
output id, below BLOCK_ID_BASE (synthetic outputs: `SYNTH_BASE * (index + 1) + ...`;
given output ids are not taken, `qualifies`), so it never has the ids of a block wholly
inside a described prompt. So the index holds the same blocks under keys in one-to-one
correspondence with the sha256 path's, and every lookup, hit, duplicate, eviction and
statistic is the same (`suites/conformance/test_block_identity.py` compares both step by
step, and maps one index onto the other).

The replay may key those blocks past the prompt by fresh identities instead, where no
other sequence can hit them (`v1_keys.KeyChains.plan`).

An identity-keyed entry keeps `IDENTITY_CONTENT` in place of its ids' `token_bytes`: a
hit on an identity is already exact, and a memory-only replay never reads cached ids.

Memory: one memo entry per distinct (parent, described block) of the trace (a dict slot
and a 2-tuple, ~150-200 bytes, estimated; 170,899 entries for the whole Mooncake
conversation trace), kept for the life of the cache it keys, since a forgotten base
would key a cached prefix anew. The whole trace's replay peaked at 376 MiB resident,
against 475 MiB with sha256 chains (measured here).
"""

from __future__ import annotations

from collections.abc import Sequence

from kvbench.paged.prefix_cache import BlockKey, ExtraKeys, packed_chain, parent_field
from kvbench.workloads.block_size import check_block_size
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.trace import BlockTokenIds, TraceRequest

#: What an identity-keyed index entry keeps for its ids (a count of 0, then a tag): not
#: the ids, which the identity stands for (module docstring).
IDENTITY_CONTENT = b"\x00\x00\x00\x00identity"


class DescribedIdentities:
    """Key chains of described prompts by interned identity (module docstring)."""

    def __init__(self, block_size: int, block_tokens: int) -> None:
        self.block_size = check_block_size(block_size)
        if (
            isinstance(block_tokens, bool)
            or not isinstance(block_tokens, int)
            or block_tokens < block_size
            or block_tokens % block_size
        ):
            raise ConfigError(
                f"block_tokens must be a multiple of the block size {block_size}, got "
                f"{block_tokens!r}"
            )
        self.block_tokens = block_tokens
        self.per = block_tokens // block_size
        #: (parent: a base, or ("root", extra keys); described block id) -> base
        self._bases: dict[tuple[object, int], int] = {}

    @staticmethod
    def qualifies(requests: Sequence[TraceRequest], block_size: int) -> int | None:
        """The one `bt` of a trace whose every prompt is described by block ids of `bt`
        ids, a multiple of `block_size`, and that gives no output ids; None for any
        other trace (its replay keeps sha256 keys). A request with no ids given and
        its blocks described is a `BlockTokenIds` prompt (`TraceRequest.prompt_ids`)."""
        bts = {r.prompt_block_tokens for r in requests}
        if len(bts) != 1 or any(
            r.prompt is not None or r.prompt_blocks is None or r.output_tokens is not None
            for r in requests
        ):
            return None
        (bt,) = bts
        return None if bt is None or bt % block_size else bt

    def __len__(self) -> int:
        """Distinct described blocks interned so far."""
        return len(self._bases)

    def packed(
        self, prompt: BlockTokenIds, extra: ExtraKeys, tail: Sequence[int] = ()
    ) -> tuple[list[BlockKey], list[bytes]]:
        """(keys, contents) of the full blocks of `prompt` then `tail`: identities and
        `IDENTITY_CONTENT` for the prompt's full blocks, then `packed_chain` of the rest
        (the prompt's last ids and `tail`) chained from the last identity."""
        blocks, bt = prompt.described()
        if bt != self.block_tokens:
            raise ConfigError(f"prompt described by blocks of {bt} ids, not {self.block_tokens}")
        bs, per, bases = self.block_size, self.per, self._bases
        full = len(prompt) // bs
        keys: list[BlockKey] = []
        parent: object = ("root", extra)
        for block in blocks[: -(-full // per)]:
            memo = (parent, block)
            base = bases.get(memo)
            if base is None:
                base = bases[memo] = len(bases)
            keys += range(base * per, base * per + per)
            parent = base
        del keys[full:]
        contents = [IDENTITY_CONTENT] * full
        rest = prompt[full * bs :]
        if len(rest) + len(tail) >= bs:
            after = parent_field(keys[-1]) if full else None
            more, packed = packed_chain((*rest, *tail), bs, extra, after)
            keys += more
            contents += packed
        return keys, contents
