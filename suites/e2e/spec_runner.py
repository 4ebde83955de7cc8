"""The e2e decode loop for models with KV cache specs (sliding window, hybrid, encoder-decoder).

`SpecCacheRunner` is `LlamaCacheRunner` (same steps: admission with prefix hits, chunked
prefill, the write pass, appends with preemption by swap or recompute, the read pass
through the cache, forks for parallel sampling) over a `LayerGroupsKVCache`
(`paged.LayerGroupsPagedCache` or `reference.LayerGroupsReferenceCache`), with the forward
of the model's architecture (`spec_forward`) and layer-group attention engines
(`spec_attention`). `GroupCacheAdapter` gives the loop the KVCache-shaped calls it makes:

* admission computes an encoder-decoder's encoder K/V from the request's
  `encoder_input` (HF's encoder, then each decoder layer's cross K/V projections) and
  hands it to the cache, which writes it once into the cross-attention groups' blocks;
  a recomputed request runs its encoder again;
* an append of every model layer's K/V is split into one K/V per self-attention group
  (the group's layers, in its storage order);
* swap of one request is the cache's group swap of [request].

Prefix caching of an encoder-decoder: a decoder token's self-attention K/V depends on
the encoder output from the second decoder layer on (layer 1 reads the hidden state
after layer 0's cross-attention), so two requests with the same decoder prompt and
different encoder inputs must not share self-attention blocks. The layer-group cache
adds a digest of the encoder K/V to its prefix-cache keys itself; the adapter also adds
a digest of the encoder input (sha-256 of its bytes) to the salt (`key_encoder=True`, the
default; False together with a cache that keys by tokens only shows the e2e check
catches the wrong hits).
"""

from __future__ import annotations

import hashlib
from collections.abc import Hashable, Sequence

import torch

from kvbench.reference.contract import KVPair
from kvbench.suites.e2e.llama_runner import GenerationRequest, LlamaCacheRunner
from kvbench.suites.e2e.spec_attention import (
    GroupCacheAttention,
    GroupNativeAttention,
    GroupOracleAttention,
)
from kvbench.suites.e2e.spec_forward import LayerMap, SpecForward, spec_forward
from kvbench.workloads.errors import ConfigError

#: Table entry of a released block (`paged.layer_groups.NULL_BLOCK`).
NULL_BLOCK = -1


def encoder_digest(encoder_input: torch.Tensor) -> str:
    """A stable digest of an encoder input's dtype, shape and bytes (hex, 32 chars)."""
    x = encoder_input.detach().cpu().contiguous()
    h = hashlib.sha256(f"{x.dtype}{tuple(x.shape)}".encode())
    h.update(x.view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:32]


class GroupCacheAdapter:
    """The KVCache-shaped calls of `LlamaCacheRunner` over a LayerGroupsKVCache."""

    kv_quant = None

    def __init__(
        self, cache, layers: LayerMap, forward: SpecForward, *, key_encoder: bool = True
    ) -> None:
        self.inner = cache
        self.layers = layers
        self.forward = forward
        self.key_encoder = key_encoder
        self._inputs: dict[Hashable, torch.Tensor] = {}
        self._self_groups = list(cache.model.self_groups)
        self._cross_groups = list(cache.model.cross_groups)
        dev = cache.k.device if hasattr(cache, "k") else torch.device("cpu")
        self._index = {
            g: torch.tensor(layers.group_layers(g), dtype=torch.long, device=dev)
            for g in self._self_groups
        }
        #: The most released (-1) table entries one request held after an append.
        self.max_released = 0
        #: Admissions that wrote cross-attention blocks.
        self.cross_admissions = 0
        #: Admissions whose prefix hit left released (-1) entries before a window.
        self.hits_past_window = 0

    @property
    def torch_dtype(self) -> torch.dtype:
        return self.inner.k.dtype if hasattr(self.inner, "k") else self.inner.dtype

    def register(self, request_id: Hashable, encoder_input: torch.Tensor) -> None:
        """The encoder input of a request (used at each admission of it)."""
        self._inputs[request_id] = encoder_input

    def _encoder_kv(self, request_id: Hashable) -> list[KVPair]:
        if not self._cross_groups:
            return []
        x = self._inputs.get(request_id)
        if x is None:
            raise ConfigError(f"request {request_id!r} of an encoder-decoder has no encoder input")
        per_layer = self.forward.encoder_kv(x)
        out = []
        for g in self._cross_groups:
            ids = self.layers.group_layers(g, cross=True)
            k = torch.stack([per_layer[i][0] for i in ids]).to(self.torch_dtype)
            v = torch.stack([per_layer[i][1] for i in ids]).to(self.torch_dtype)
            out.append((k, v))
        return out

    def admit(self, request_id: Hashable, tokens: Sequence[int], salt: str | None = None) -> int:
        encoder_kv = self._encoder_kv(request_id)
        x = self._inputs.get(request_id)
        if self.key_encoder and x is not None:
            salt = f"{salt}|encoder {encoder_digest(x)}"
        hit = self.inner.admit(request_id, encoder_kv, prompt=list(tokens), salt=salt)
        if encoder_kv:
            self.cross_admissions += 1
        if hit and self._released(request_id):
            self.hits_past_window += 1
        return hit

    def _released(self, request_id: Hashable) -> int:
        """Released (-1) entries in the request's self-attention tables (paged only)."""
        if not hasattr(self.inner, "block_table"):
            return 0
        return sum(
            b == NULL_BLOCK
            for g in self._self_groups
            for b in self.inner.block_table(request_id, g)
        )

    def append(
        self,
        request_id: Hashable,
        keys: torch.Tensor,
        values: torch.Tensor,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        kv = []
        for g in self._self_groups:
            idx = self._index[g].to(keys.device)
            kv.append((keys.index_select(0, idx), values.index_select(0, idx)))
        self.inner.append(request_id, kv, token_ids)
        self.max_released = max(self.max_released, self._released(request_id))

    def fork(self, parent_id: Hashable, child_id: Hashable) -> None:
        self.inner.fork(parent_id, child_id)
        if parent_id in self._inputs:
            self._inputs[child_id] = self._inputs[parent_id]

    def free(self, request_id: Hashable) -> None:
        self.inner.free(request_id)  # the encoder input stays: recompute admits again

    def swap_out(self, request_id: Hashable) -> None:
        self.inner.swap_out([request_id])

    def swap_in(self, request_id: Hashable) -> None:
        self.inner.swap_in([request_id])

    def seq_len(self, request_id: Hashable) -> int:
        return self.inner.seq_len(request_id)

    def request_ids(self) -> list[Hashable]:
        return self.inner.request_ids()


class SpecCacheRunner(LlamaCacheRunner):
    """`LlamaCacheRunner` over a LayerGroupsKVCache (see the module docstring).

    Args:
        model: a supported HF model (`spec_forward.check_spec_supported`).
        cache: a LayerGroupsPagedCache or LayerGroupsReferenceCache whose `model`
            (ModelKVSpec) places every model layer in its groups.
        write_attention: "native" (the paged kernels over the paged cache's pool; the
            default) or "oracle" (float64 over `gather`), or a GroupAttention engine.
        key_encoder: add the encoder input's digest to prefix-cache keys (see above).
        Other keywords as `LlamaCacheRunner` (`kernel_backend` defaults to "torch").
    """

    def __init__(
        self,
        model,
        cache,
        write_attention="native",
        *,
        key_encoder: bool = True,
        kernel_backend: str | None = "torch",
        **kw,
    ) -> None:
        self._spec_forward = spec_forward(model)
        self.layers = LayerMap.of(cache.model, self._spec_forward)
        self.group_cache = cache
        self.adapter = GroupCacheAdapter(
            cache, self.layers, self._spec_forward, key_encoder=key_encoder
        )
        super().__init__(model, self.adapter, write_attention, kernel_backend=kernel_backend, **kw)  # type: ignore[arg-type]

    def _make_forward(self, model):  # type: ignore[override]
        return self._spec_forward

    def _check_cache(self, model, cache) -> None:  # type: ignore[override]
        pass  # LayerMap.of checked the groups against the model

    def _make_write_attention(self, name, block_size, kernel_backend):  # type: ignore[override]
        if name == "native":
            return GroupNativeAttention(
                self.group_cache, self.layers, self._spec_forward.scale, kernel_backend
            )
        if name == "oracle":
            return GroupOracleAttention(self.group_cache, self.layers, self._spec_forward.scale)
        raise ConfigError(f"unknown write attention {name!r} (layer groups: native, oracle)")

    def _make_read_attention(self, kernel_backend):  # type: ignore[override]
        return GroupCacheAttention(
            self.group_cache, self.layers, self._spec_forward.scale, kernel_backend
        )

    def submit(self, request: GenerationRequest) -> None:
        """Queue a request; an encoder-decoder's must carry its `encoder_input`."""
        needs = self._spec_forward.is_encoder_decoder
        if needs and request.encoder_input is None:
            raise ConfigError(f"request {request.request_id!r}: the model needs encoder_input")
        if not needs and request.encoder_input is not None:
            raise ConfigError(f"request {request.request_id!r}: the model has no encoder")
        if request.encoder_input is not None:
            self.adapter.register(request.request_id, request.encoder_input)
        super().submit(request)
