"""Prefix caching for the layer-group cache (`paged.layer_groups`): block keys per group,
hits by the rule of `workloads.spec_prefix`.

Every self-attention group indexes its own full blocks in one shared `PrefixCache`
under a chain key (parent key, the block's token ids, extra keys (salt, group)), so a
group's block is found only by the same tokens at the same positions in the same group.
A hit of c tokens (whole blocks, never the whole prompt) gives each group exactly the
blocks `spec_prefix.blocks_a_hit_needs` lists, every other entry the null block: under a
window the blocks before it may already have been evicted, and are not needed.
Cross-attention groups are never indexed (their KV comes with each request).

Tokens are known while the request appends its prompt, or ids it is given; from the
first append without ids past the prompt, its later blocks are never indexed.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

from kvbench.paged.prefix_cache import ExtraKeys, PrefixCache
from kvbench.workloads.kv_spec import ModelKVSpec
from kvbench.workloads.spec_prefix import blocks_a_hit_needs, longest_hit_blocks

#: Table entry of a block a hit does not need (the layer-group cache's NULL_BLOCK).
NULL = -1


@dataclass
class HashState:
    """One request's known token ids and the chain keys of its full blocks, per group."""

    prompt: tuple[int, ...]
    salt: str | None
    tokens: list[int] = field(default_factory=list)
    known: bool = True  # False once a token past the prompt came without its id
    keys: dict[int, list[bytes]] = field(default_factory=dict)  # group -> chain keys


@dataclass(frozen=True)
class Hit:
    """An admission's hit: tokens, per self group its table (NULL where not needed) and
    chain keys."""

    tokens: int
    tables: dict[int, list[int]]
    keys: dict[int, list[bytes]]
    queried: int = 0  # prompt tokens the lookup could have hit


class GroupPrefixIndex:
    """Chain keys and lookups of a model's self-attention groups over one PrefixCache."""

    def __init__(self, prefix: PrefixCache, model: ModelKVSpec, block_size: int) -> None:
        self.prefix = prefix
        self.model = model
        self.block_size = block_size
        self._state: dict[Hashable, HashState] = {}

    def _extra(self, salt: str | None, group: int) -> ExtraKeys:
        return (salt, f"group {group}")

    def lookup(self, prompt: Sequence[int], salt: str | None) -> Hit:
        """The longest hit of `prompt` every self group accepts (nothing changes, not
        even the lookup counters: `start` records the lookup)."""
        bs = self.block_size
        max_blocks = (len(prompt) - 1) // bs if prompt else 0
        groups = self.model.self_groups
        keys: dict[int, list[bytes]] = {}
        found: dict[int, list[int | None]] = {}
        for gi in groups:
            extra = self._extra(salt, gi)
            parent: bytes | None = None
            keys[gi], found[gi] = [], []
            for i in range(max_blocks):
                chunk = prompt[i * bs : (i + 1) * bs]
                key = self.prefix.key_fn(parent, chunk, extra)
                found[gi].append(self.prefix.get(key, parent, chunk, extra))
                keys[gi].append(key)
                parent = key
        specs = [self.model.groups[g].spec for g in groups]
        cached = [[b is not None for b in found[g]] for g in groups]
        m = longest_hit_blocks(specs, cached, max_blocks, bs)
        tables: dict[int, list[int]] = {}
        for gi in groups:
            table = [NULL] * m
            for i in blocks_a_hit_needs(self.model.groups[gi].spec, m, bs):
                block = found[gi][i]
                assert block is not None
                table[i] = block
            tables[gi] = table
        return Hit(m * bs, tables, {g: keys[g][:m] for g in groups}, max_blocks * bs)

    def start(
        self, request_id: Hashable, prompt: Sequence[int], salt: str | None, hit: Hit | None
    ) -> None:
        """Track a new request (its prompt and the hit it was admitted with, if any)."""
        if hit is not None:  # counted once the admission succeeds
            self.prefix.record_lookup(hit.queried, hit.tokens // self.block_size, hit.tokens)
        tokens = list(prompt[: hit.tokens]) if hit else []
        keys = {g: list(k) for g, k in hit.keys.items()} if hit else {}
        self._state[request_id] = HashState(tuple(prompt), salt, tokens, keys=keys)

    def ids_for(
        self, request_id: Hashable, start: int, n: int, token_ids: Sequence[int] | None
    ) -> Sequence[int] | None:
        """The ids of positions start .. start + n - 1: given, or the prompt's; None if unknown."""
        state = self._state[request_id]
        if token_ids is not None:
            return token_ids
        if start + n <= len(state.prompt):
            return state.prompt[start : start + n]
        return None

    def extend(self, request_id: Hashable, ids: Sequence[int] | None) -> None:
        """Record the ids of an append that succeeded (None: unknown from here on)."""
        state = self._state[request_id]
        if ids is None:
            state.known = False
        elif state.known:
            state.tokens.extend(ids)

    def index_full_blocks(self, request_id: Hashable, group: int, blocks: Sequence[int]) -> None:
        """Index the group's newly full blocks whose tokens are all known."""
        state = self._state[request_id]
        keys = state.keys.setdefault(group, [])
        bs, extra = self.block_size, self._extra(state.salt, group)
        while (len(keys) + 1) * bs <= len(state.tokens) and len(keys) < len(blocks):
            i = len(keys)
            chunk = tuple(state.tokens[i * bs : (i + 1) * bs])
            parent = keys[-1] if keys else None
            key = self.prefix.key_fn(parent, chunk, extra)
            if blocks[i] != NULL:
                self.prefix.insert(blocks[i], key, parent, chunk, extra)
            keys.append(key)

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        p = self._state[parent_id]
        self._state[child_id] = HashState(
            p.prompt, p.salt, list(p.tokens), p.known, {g: list(k) for g, k in p.keys.items()}
        )

    def forget(self, request_id: Hashable) -> None:
        del self._state[request_id]

    def snapshot(self) -> tuple[object, ...]:
        return (
            self.prefix.snapshot(),
            {
                r: (
                    s.prompt,
                    s.salt,
                    tuple(s.tokens),
                    s.known,
                    {g: tuple(k) for g, k in s.keys.items()},
                )
                for r, s in self._state.items()
            },
        )
