"""Prompts whose token ids are described compactly instead of listed.

A replayed production trace can hold hundreds of millions of prompt tokens (Mooncake's
conversation trace: 145M); listing them costs gigabytes and their validation costs
minutes. `KnownIds` marks an immutable `Sequence[int]` whose ids are valid (ints >= 0)
by construction and whose largest id it knows (`max_id`): the caches take it without
checking or copying it (`reference.validation.validate_prompt`), the engine asks it for
its largest id (`max_token_id`). `HashBlockPrompt` is one: a prompt given by the hash
ids of its fixed-size blocks.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator, Sequence
from typing import overload

from kvbench.workloads.errors import ConfigError


class KnownIds(Sequence[int]):
    """An immutable sequence of token ids known to be ints >= 0 (module docstring)."""

    __slots__ = ()

    @abstractmethod
    def max_id(self) -> int:
        """The largest id."""


def max_token_id(prompt: Sequence[int]) -> int:
    """The largest id of a non-empty prompt (without iterating a `KnownIds`)."""
    if isinstance(prompt, KnownIds):
        return prompt.max_id()
    if isinstance(prompt, range):
        return max(prompt[0], prompt[-1])
    return max(prompt)


class HashBlockPrompt(KnownIds):
    """The token ids of a prompt described by its blocks' hash ids: token p is
    hash_ids[p // block] (Mooncake's traces: block 512). Two such prompts agree on a
    block's tokens iff they agree on its hash id, so a content-keyed block chain shares
    exactly what the ids share at every block size dividing `block`. Immutable; slices
    are tuples. Hash ids must be ints >= 0."""

    __slots__ = ("block", "hash_ids", "length")

    def __init__(self, hash_ids: tuple[int, ...], length: int, block: int = 512) -> None:
        if isinstance(block, bool) or not isinstance(block, int) or block < 1:
            raise ConfigError(f"hash block must be an integer >= 1 tokens, got {block!r}")
        if isinstance(length, bool) or not isinstance(length, int):
            raise ConfigError(f"prompt length must be an integer, got {length!r}")
        if not (len(hash_ids) - 1) * block < length <= len(hash_ids) * block:
            raise ConfigError(
                f"{len(hash_ids)} hash ids of {block} tokens do not cover exactly "
                f"{length} prompt tokens"
            )
        for h in hash_ids:
            if isinstance(h, bool) or not isinstance(h, int) or h < 0:
                raise ConfigError(f"hash id {h!r} is not an integer >= 0")
        self.block = block
        self.hash_ids = tuple(hash_ids)
        self.length = length

    def max_id(self) -> int:
        return max(self.hash_ids)

    def __len__(self) -> int:
        return self.length

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[int, ...]: ...
    def __getitem__(self, index: int | slice) -> int | tuple[int, ...]:
        n = self.length
        if isinstance(index, slice):
            start, stop, step = index.indices(n)
            if step != 1:
                return tuple(self[i] for i in range(start, stop, step))
            out: list[int] = []
            ids, block = self.hash_ids, self.block
            b = start // block
            if stop <= (b + 1) * block:  # within one block: the common case
                return (ids[b],) * (stop - start) if stop > start else ()
            while start < stop:
                b = start // block
                end = min(stop, (b + 1) * block)
                out.extend((ids[b],) * (end - start))
                start = end
            return tuple(out)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("prompt index out of range")
        return self.hash_ids[index // self.block]

    def __iter__(self) -> Iterator[int]:
        left = self.length
        for h in self.hash_ids:
            take = min(left, self.block)
            yield from (h,) * take
            left -= take

    def __eq__(self, other: object) -> bool:
        if isinstance(other, HashBlockPrompt):
            return (self.length, self.block, self.hash_ids) == (
                other.length,
                other.block,
                other.hash_ids,
            )
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.length, self.block, self.hash_ids))
