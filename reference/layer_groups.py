"""The reference for a model's layer groups: every token kept, each group's view sliced.

`LayerGroupsReferenceCache` is the obviously-right side of the layer-group differential
(`paged.layer_groups`): per request and group it stores the whole K and V contiguously
(nothing is ever released, nothing shared), and answers what a group's newest query reads
by slicing: the last `window` tokens (sliding window), every token (full attention) or
the encoder output given at admission (cross-attention). Attention is the float64 oracle.
It implements `reference.contract.LayerGroupsKVCache`: no prefix caching (admission
always reports 0 cached tokens), and swap is a state change only (the KV never moves, so
swap-out cannot run short of space).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from kvbench.reference import oracle
from kvbench.reference.contract import KVPair as KV
from kvbench.workloads.errors import (
    DuplicateRequestError,
    RequestStateError,
    ShapeError,
    UnknownRequestError,
)
from kvbench.workloads.kv_spec import AttentionKind, ModelKVSpec


class LayerGroupsReferenceCache:
    """Contiguous K/V ([layers, n, heads, dim]) per request and layer group of `model`."""

    def __init__(self, model: ModelKVSpec, dtype: torch.dtype = torch.float32) -> None:
        self.model = model
        self.dtype = dtype
        self._kv: dict[Hashable, list[KV]] = {}
        self._swapped: set[Hashable] = set()

    def _get(self, request_id: Hashable, *, resident: bool = True) -> list[KV]:
        if request_id not in self._kv:
            raise UnknownRequestError(f"unknown request {request_id!r}")
        if resident and request_id in self._swapped:
            raise RequestStateError(f"request {request_id!r} is swapped out")
        return self._kv[request_id]

    def admit(
        self,
        request_id: Hashable,
        encoder_kv: Sequence[KV] = (),
        *,
        prompt: Sequence[int] | None = None,
        salt: str | None = None,
    ) -> int:
        """Register a request; `encoder_kv[i]` is the i-th cross group's encoder K/V.
        Returns 0: the reference caches no prefixes (`prompt`, `salt` are unused)."""
        if request_id in self._kv:
            raise DuplicateRequestError(f"request {request_id!r} is already admitted")
        if len(encoder_kv) != len(self.model.cross_groups):
            raise ShapeError(
                f"need {len(self.model.cross_groups)} encoder K/V, got {len(encoder_kv)}"
            )
        groups: list[KV] = []
        given = iter(encoder_kv)
        for g in self.model.groups:
            if g.spec.kind is AttentionKind.CROSS:
                k, v = next(given)
                groups.append((k.clone(), v.clone()))
            else:
                empty = torch.empty((g.num_layers, 0, g.num_kv_heads, g.head_dim), dtype=self.dtype)
                groups.append((empty, empty.clone()))
        self._kv[request_id] = groups
        return 0

    def append(
        self, request_id: Hashable, kv: Sequence[KV], token_ids: Sequence[int] | None = None
    ) -> None:
        """Append n tokens to every self-attention group (`kv[i]` for the i-th of them)."""
        groups = self._get(request_id)
        for gi, (k, v) in zip(self.model.self_groups, kv, strict=True):
            old_k, old_v = groups[gi]
            groups[gi] = (torch.cat([old_k, k], 1), torch.cat([old_v, v], 1))

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        """The child gets a copy of everything the parent holds."""
        groups = self._get(parent_id)
        if child_id in self._kv:
            raise DuplicateRequestError(f"request {child_id!r} is already admitted")
        self._kv[child_id] = [(k.clone(), v.clone()) for k, v in groups]

    def free(self, request_id: Hashable) -> None:
        self._get(request_id, resident=False)
        del self._kv[request_id]
        self._swapped.discard(request_id)

    def _check_swap(self, request_ids: Sequence[Hashable], swapped: bool) -> None:
        if len(set(request_ids)) != len(request_ids):
            raise RequestStateError(f"swap of repeated request ids {list(request_ids)!r}")
        for r in request_ids:
            self._get(r, resident=False)
            if (r in self._swapped) != swapped:
                state = "already swapped out" if not swapped else "not swapped out"
                raise RequestStateError(f"request {r!r} is {state}")

    def swap_out(self, request_ids: Sequence[Hashable]) -> None:
        """Mark the requests swapped out (their KV stays where it is)."""
        self._check_swap(request_ids, swapped=False)
        self._swapped.update(request_ids)

    def swap_in(self, request_ids: Sequence[Hashable]) -> None:
        self._check_swap(request_ids, swapped=True)
        self._swapped.difference_update(request_ids)

    def is_swapped(self, request_id: Hashable) -> bool:
        self._get(request_id, resident=False)
        return request_id in self._swapped

    def request_ids(self) -> list[Hashable]:
        return list(self._kv)

    def seq_len(self, request_id: Hashable) -> int:
        groups = self._get(request_id, resident=False)
        return groups[self.model.self_groups[0]][0].shape[1] if self.model.self_groups else 0

    def gather(self, request_id: Hashable, group: int) -> KV:
        """What the newest token reads in `group` (its window, all, or the encoder), sliced
        by the float64 oracle's own mask of the spec (`oracle.first_key`), not the rule."""
        k, v = self._get(request_id)[group]
        spec, length = self.model.groups[group].spec, k.shape[1]
        start = oracle.first_key(length - 1, **oracle.spec_mask(spec)) if length else 0
        return k[:, start:], v[:, start:]

    def attend(
        self, request_ids: Sequence[Hashable], query: torch.Tensor, group: int, layer: int
    ) -> torch.Tensor:
        """float64 decode attention of query[b] over request b's KV in one group and layer."""
        kvs = [self.gather(r, group) for r in request_ids]
        return oracle.batched_decode_attention(
            query, [k[layer] for k, _ in kvs], [v[layer] for _, v in kvs]
        )
