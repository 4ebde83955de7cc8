"""Per-request block tables and the tensors kernels take.

A request's block table maps logical block i (tokens i*block_size .. (i+1)*block_size - 1)
to a physical block; the flat slot of position p is
    table[p // block_size] * block_size + p % block_size.
A batch's tables go to kernels as an int32 tensor [batch, max_blocks] (rows padded with 0,
a valid block index, so an unmasked read stays in bounds; kernels read only the first
ceil(seq_len / block_size) entries) plus int32 seq_lens [batch].
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from kvbench.paged.block_chain import BlockChain
from kvbench.paged.prefix_cache import BlockKey, ExtraKeys


class RequestState:
    """Bookkeeping of one request.

    blocks: its block table (GPU blocks when resident, CPU blocks when swapped).
        Blocks past ceil(seq_len / block_size) are the prompt's reservation and are owned
        by this request alone (refcount 1).
    keys: prefix-cache keys of its leading full blocks whose token ids are all known.
    hashable: False once a block with an unknown token id fills (no later block is keyed).
    chain: the prompt's precomputed key chain (`paged.block_chain`) or None; its keys
        and block tuples replace hashing the prompt's full blocks.
    miss: the key the admission's prefix match computed for the first block it did not
        find (see `__init__`); a cache of hashing, not state (snapshots leave it out).
    tokens: ids of the cached tokens (None where not given), or None when not tracked;
        the first `head` of them are the prompt's first `head` ids and not stored (a
        replay given the prompt's chain never reads them: 10^8 ids not copied), the last
        `unknown_tail` are None and not stored (a memory-only replay appends millions of
        unknown output ids): head + len(tokens) + unknown_tail == seq_len. `token_list`
        gives them all; `materialize_head` stores the head before a reader needs the ids
        by position.
    """

    __slots__ = (
        "blocks",
        "chain",
        "extra",
        "hashable",
        "head",
        "keys",
        "miss",
        "order",
        "output_len",
        "prompt",
        "prompt_len",
        "request_id",
        "salt",
        "seq_len",
        "swapped",
        "tokens",
        "unknown_tail",
    )

    def __init__(
        self,
        request_id: Hashable,
        order: int,
        prompt: Sequence[int],
        salt: str | None,
        extra: ExtraKeys,
        output_len: int | None,
        tokens: list[int | None] | None,
        seq_len: int,
        blocks: list[int],
        keys: list[BlockKey],
    ) -> None:
        self.request_id = request_id
        self.order = order
        self.prompt = prompt
        self.prompt_len = len(prompt)
        self.salt = salt
        self.extra = extra
        self.output_len = output_len
        self.tokens = tokens
        self.unknown_tail = 0
        self.head = 0
        self.seq_len = seq_len
        self.blocks = blocks
        self.keys = keys
        self.hashable = True
        self.swapped = False
        self.chain: BlockChain | None = None
        #: (parent key, ids, key) of block len(keys) as the admission's prefix match
        #: keyed it (`PrefixCache.miss`), or None: registration reuses that key when the
        #: block fills with those ids under that parent (one sha256 per block, not two).
        self.miss: tuple[bytes | None, Sequence[int], bytes] | None = None

    @property
    def pending_prompt(self) -> int:
        """Prompt tokens admitted but not yet appended (their slots are reserved)."""
        return max(0, self.prompt_len - self.seq_len)

    def copy_as(self, request_id: Hashable, order: int, blocks: list[int]) -> RequestState:
        """A copy of this state under another id with another block table (for fork)."""
        child = RequestState(
            request_id,
            order,
            self.prompt,
            self.salt,
            self.extra,
            self.output_len,
            None if self.tokens is None else list(self.tokens),
            self.seq_len,
            blocks,
            list(self.keys),
        )
        child.hashable = self.hashable
        child.chain = self.chain
        child.unknown_tail = self.unknown_tail
        child.head = self.head
        return child

    def token_list(self) -> list[int | None] | None:
        """The ids of all cached tokens (None where not given), or None when not tracked."""
        if self.tokens is None:
            return None
        return [*self.prompt[: self.head], *self.tokens, *([None] * self.unknown_tail)]

    def known_ids(self, start: int, stop: int) -> tuple[int | None, ...]:
        """The ids at positions [start, stop) from the head and the stored ids, as a
        tuple; shorter where the range reaches into the unknown tail (tracked only)."""
        head, tokens = self.head, self.tokens
        assert tokens is not None
        if stop <= head:
            return tuple(self.prompt[start:stop])
        if start >= head:
            return tuple(tokens[start - head : stop - head])
        return (*self.prompt[start:head], *tokens[: stop - head])

    def materialize_head(self) -> None:
        """Store the prompt ids of the head in `tokens` (before reading ids by position)."""
        if self.head and self.tokens is not None:
            self.tokens[:0] = self.prompt[: self.head]
            self.head = 0

    def advance(self, end: int, token_ids: Sequence[int | None] | None) -> None:
        """Advance the request from `seq_len` to `end` tokens, recording their ids where
        ids are tracked: `token_ids` (exact ints or None, end - seq_len of them) when
        given, else the prompt's ids while the range lies in the prompt (the head grows
        without copying while nothing is stored after it), else an unknown tail."""
        start, tokens = self.seq_len, self.tokens
        if tokens is not None:
            if token_ids is not None:
                self.chain = None  # given ids may differ from the prompt's: hash them
                if self.unknown_tail:
                    self.materialize_tail()
                tokens.extend(token_ids)
            elif start < self.prompt_len:  # prompt ids are known (no unknown tail precedes)
                take = min(end, self.prompt_len) - start
                if self.head == start:  # nothing stored yet: the head grows
                    self.head = start + take
                else:
                    tokens.extend(self.prompt[start : start + take])
                self.unknown_tail += end - start - take
            else:
                self.unknown_tail += end - start
        self.seq_len = end

    def materialize_tail(self) -> None:
        """Store the unknown tail explicitly (before known ids are appended after it)."""
        if self.unknown_tail and self.tokens is not None:
            self.tokens.extend([None] * self.unknown_tail)
            self.unknown_tail = 0

    def snapshot(self) -> tuple[object, ...]:
        return (
            self.request_id,
            self.order,
            tuple(self.prompt),
            self.salt,
            self.extra,
            self.output_len,
            None if self.tokens is None else tuple(self.token_list() or ()),
            self.seq_len,
            tuple(self.blocks),
            tuple(self.keys),
            self.hashable,
            self.swapped,
        )


def slot_mapping(blocks: Sequence[int], block_size: int, start: int, n: int) -> torch.Tensor:
    """Flat slots (int64 [n]) of positions start .. start+n-1 of a request."""
    pos = torch.arange(start, start + n, dtype=torch.int64)
    table = torch.tensor(blocks, dtype=torch.int64)
    return table[pos // block_size] * block_size + pos % block_size


def block_table_tensor(
    tables: Sequence[Sequence[int]], seq_lens: Sequence[int], block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack block tables (each cut to ceil(seq_len / block_size) entries) into int32
    [batch, max_blocks], zero-padded, and seq_lens into int32 [batch]."""
    used = [-(-s // block_size) for s in seq_lens]
    width = max(used, default=0) or 1
    out = torch.zeros((len(tables), width), dtype=torch.int32)
    for i, (table, n) in enumerate(zip(tables, used, strict=True)):
        if n:
            out[i, :n] = torch.tensor(table[:n], dtype=torch.int32)
    return out, torch.tensor(list(seq_lens), dtype=torch.int32)
