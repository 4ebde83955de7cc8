"""The kvbench-driven decode loop: the tiny HF Llama generating through a `KVCache`.

A small continuous-batching engine in the shape of vLLM's, written only against the
KVCache contract (plus `swap_out` / `swap_in` where the cache has them), so the same loop
drives `ContiguousKVCache` and `PagedKVCache` and any cache plugged in the same way.

Each step:
    1. swapped-out requests are swapped back in, then waiting ones admitted, oldest first,
       while the cache accepts them (admission reports the prompt tokens already cached
       by the prefix cache; only the rest is computed);
    2. every running request's uncomputed tokens (the prompt after the cache hit, or a
       chunk of it with chunked prefill, or the newest generated token) are packed into one ragged batch; the prefix each needs is
       read back from the cache with `gather` (so a cache that returns wrong KV, or wrong
       blocks on a prefix hit, corrupts the logits);
    3. the "write pass" runs the model with a chosen attention engine (float64 oracle or
       kvbench's paged kernels) and yields every layer's K/V of the new tokens, which are
       appended to the cache, oldest request first; when an append finds no room the
       latest-arrived running request is preempted (by swap or by recompute) and the
       append retried;
    4. the "read pass" runs each request's newest token through the model again with
       attention served by `cache.attend` over what the cache now holds; its logits pick
       the next token (greedy, or a forced token) and are what the suite compares with
       Hugging Face.

Parallel sampling: a request with `branch_tokens` forks (after its prompt) into one
branch per listed token, each forced down that token and then greedy, sharing the
prompt's KV (copy-on-write in a paged cache).

Preemption by recompute frees the request and requeues it with all its tokens as the new
prompt; by swap it calls `cache.swap_out` / `swap_in`, or, for a cache without them,
gathers the KV, frees the request, and re-admits and re-appends the saved KV later.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from kvbench.reference.contract import KVCache, RequestId
from kvbench.suites.e2e.llama_forward import (
    Attention,
    CacheAttention,
    KernelAttention,
    LlamaForward,
    OracleAttention,
    PagedNativeAttention,
    pack,
)
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE
from kvbench.workloads.errors import CapacityError, ConfigError

log = logging.getLogger(__name__)

PREEMPTION_MODES = ("swap", "recompute")


@dataclass(frozen=True)
class GenerationRequest:
    """What to generate: `max_new_tokens` tokens after `prompt`.

    branch_tokens: when given, the request forks after its prompt into one branch per
    token (branch i is forced to emit branch_tokens[i] first, then decodes greedily);
    branch ids are (request_id, i).
    forced_tokens: when given, the tokens emitted (teacher forcing), whatever the logits
    say: the logits are still recorded, so a run's logits can be compared position by
    position with another's on the same context (the fp8 accuracy cases do).
    """

    request_id: RequestId
    prompt: tuple[int, ...]
    max_new_tokens: int
    salt: str | None = None
    branch_tokens: tuple[int, ...] | None = None
    forced_tokens: tuple[int, ...] | None = None
    encoder_input: torch.Tensor | None = None


@dataclass
class _Seq:
    """One sequence being generated (a request or a branch of one)."""

    seq_id: RequestId
    arrival: int
    prompt_len: int
    max_new_tokens: int
    salt: str | None
    tokens: list[int]
    branch_tokens: tuple[int, ...] | None = None
    forced: list[int] = field(default_factory=list)
    computed: int = 0  # tokens whose KV the cache holds
    logits: list[torch.Tensor] = field(default_factory=list)
    write_logits: list[torch.Tensor] = field(default_factory=list)
    saved_kv: tuple[torch.Tensor, torch.Tensor] | None = None  # generic swap
    swapped: bool = False

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_len :]

    @property
    def done(self) -> bool:
        return len(self.generated) >= self.max_new_tokens


@dataclass
class SequenceResult:
    """Generated tokens and the logits that chose them ([n, vocab] float32).

    `write_logits` are the same positions' logits from the write pass (attention over the
    gathered prefix), kept for diagnosis.
    """

    seq_id: RequestId
    prompt: tuple[int, ...]
    tokens: tuple[int, ...]
    logits: torch.Tensor
    write_logits: torch.Tensor


@dataclass
class RunStats:
    """What happened during a run (counts)."""

    steps: int = 0
    prefix_hit_tokens: int = 0
    prefix_hits: int = 0
    preemptions: int = 0
    swaps_out: int = 0
    swaps_in: int = 0
    recomputes: int = 0
    forks: int = 0
    partial_prefills: int = 0  # appends that left a request mid-prompt (chunked prefill)
    hits: dict[RequestId, list[int]] = field(default_factory=dict)  # per admission


class LlamaCacheRunner:
    """Generate with the tiny HF Llama, the KV held by `cache` (see module docstring).

    Args:
        model: a `transformers` LlamaForCausalLM (float32, CPU).
        cache: any KVCache; its geometry must match the model's.
        write_attention: the write pass's attention: "oracle" (float64 over the gathered
            prefix), "kernels" (paged kernels over a scratch pool of the gathered prefix),
            "native" (paged kernels over a PagedKVCache's own pool and block tables), or
            an Attention engine.
        preemption: "swap" or "recompute".
        block_size: block size of the kernel engine's scratch pool (defaults to the
            cache's `block_size` attribute, else DEFAULT_BLOCK_SIZE).
        kernel_backend: backend passed to kernels.ops ("torch", "triton", None).
        read_via_cache: pick tokens from the `cache.attend` read pass (True) or from the
            write pass (False).
        prefill_chunk: chunked prefill: at most this many prompt tokens of a request per
            step (None: whole prompts). A request mid-prompt samples nothing; its next
            chunk attends over the chunks the cache already holds.
        max_steps: a guard against a loop that makes no progress.
    """

    def __init__(
        self,
        model,
        cache: KVCache,
        write_attention: str | Attention = "oracle",
        *,
        preemption: str = "recompute",
        block_size: int | None = None,
        kernel_backend: str | None = "torch",
        read_via_cache: bool = True,
        prefill_chunk: int | None = None,
        max_steps: int = 10_000,
    ) -> None:
        if prefill_chunk is not None and prefill_chunk < 1:
            raise ConfigError(f"prefill_chunk must be >= 1 or None, got {prefill_chunk!r}")
        if preemption not in PREEMPTION_MODES:
            raise ConfigError(f"unknown preemption {preemption!r}; known: {PREEMPTION_MODES}")
        self.forward = self._make_forward(model)
        self.cache = cache
        self._check_cache(model, cache)
        if isinstance(write_attention, str):
            write_attention = self._make_write_attention(
                write_attention, block_size, kernel_backend
            )
        self.write_attention = write_attention
        self.read_attention = self._make_read_attention(kernel_backend)
        self.preemption = preemption
        self.read_via_cache = read_via_cache
        self.prefill_chunk = prefill_chunk
        self.max_steps = max_steps
        self.stats = RunStats()
        self._arrivals = 0
        self._waiting: deque[_Seq] = deque()
        self._swapped: deque[_Seq] = deque()
        self._running: list[_Seq] = []
        self._finished: dict[RequestId, _Seq] = {}

    # ------------------------------------------------------------------ construction hooks
    # (the layer-group runner, suites/e2e/spec_runner.py, overrides these four)
    def _make_forward(self, model) -> LlamaForward:
        """The model's forward on a packed batch."""
        return LlamaForward(model)

    def _check_cache(self, model, cache: KVCache) -> None:
        """ConfigError unless the cache's KV geometry is the model's."""
        g = cache.geometry
        if (g.num_layers, g.num_kv_heads, g.head_dim) != (
            len(model.model.layers),
            self.forward.num_kv_heads,
            self.forward.head_dim,
        ):
            raise ConfigError(f"cache geometry {g} does not match the model")

    def _make_write_attention(
        self, name: str, block_size: int | None, kernel_backend: str | None
    ) -> Attention:
        """The write pass's attention engine named `name` (see the class docstring)."""
        cache = self.cache
        if name == "oracle":
            return OracleAttention(self.forward.scale)
        if name == "native":
            return PagedNativeAttention(cache, self.forward.scale, kernel_backend)
        if name == "kernels":
            bs = block_size or int(getattr(cache, "block_size", DEFAULT_BLOCK_SIZE))
            return KernelAttention(bs, self.forward.scale, kernel_backend)
        raise ConfigError(f"unknown write attention {name!r}")

    def _make_read_attention(self, kernel_backend: str | None) -> Attention:
        """The read pass's attention: decode through the cache under test."""
        return CacheAttention(self.cache, self.forward.scale)

    # ------------------------------------------------------------------ submission
    def submit(self, request: GenerationRequest) -> None:
        """Queue a request (admitted at the next step, in submission order)."""
        if request.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be >= 1, got {request.max_new_tokens}")
        if request.branch_tokens is not None and not request.branch_tokens:
            raise ConfigError("branch_tokens must name at least one token")
        seq = _Seq(
            seq_id=request.request_id,
            arrival=self._next_arrival(),
            prompt_len=len(request.prompt),
            max_new_tokens=request.max_new_tokens,
            salt=request.salt,
            tokens=list(request.prompt),
            branch_tokens=request.branch_tokens,
            forced=list(request.forced_tokens or ()),
        )
        self._waiting.append(seq)

    def _next_arrival(self) -> int:
        self._arrivals += 1
        return self._arrivals

    # ------------------------------------------------------------------ driving
    def run(self, requests: Sequence[GenerationRequest] = ()) -> dict[RequestId, SequenceResult]:
        """Submit `requests`, step until every sequence finished, return their results."""
        for r in requests:
            self.submit(r)
        while self.has_work():
            if self.stats.steps >= self.max_steps:
                raise RuntimeError(f"no completion after {self.max_steps} steps")
            self.step()
        return {sid: self._result(s) for sid, s in self._finished.items()}

    def has_work(self) -> bool:
        """Whether any sequence is waiting, swapped out or running."""
        return bool(self._waiting or self._swapped or self._running)

    def _result(self, s: _Seq) -> SequenceResult:
        return SequenceResult(
            s.seq_id,
            tuple(s.tokens[: s.prompt_len]),
            tuple(s.generated),
            torch.stack(s.logits),
            torch.stack(s.write_logits),
        )

    def step(self) -> None:
        """One iteration: restore/admit, write pass, append, read pass, choose tokens."""
        self.stats.steps += 1
        self._restore_and_admit()
        if not self._running:
            raise CapacityError("no request could be admitted or swapped in: the pool is too small")
        batch_seqs = sorted(self._running, key=lambda s: s.arrival)
        # Engines that read the cache's own pool need no gathered copy of the prefix.
        gather = getattr(self.write_attention, "needs_prefix", True)
        prefixes: list[tuple[torch.Tensor, torch.Tensor] | None] = []
        for s in batch_seqs:
            if gather:
                prefixes.append(self._prefix(s))
            else:  # the engine reads the cache itself: only its length is checked
                self._check_len(s)
                prefixes.append(None)
        chunks = [self._chunk(s) for s in batch_seqs]
        batch = pack(
            [s.seq_id for s in batch_seqs],
            chunks,
            [s.computed for s in batch_seqs],
            prefixes,
        )
        out = self.forward(batch, self.write_attention)
        appended = []
        for s, chunk, start, n in zip(batch_seqs, chunks, batch.starts, batch.lengths, strict=True):
            if s not in self._running:
                continue  # preempted by an older request's append this step
            k, v = out.keys[:, start : start + n], out.values[:, start : start + n]
            if not self._append_with_preemption(s, k, v, chunk):
                continue
            s.computed += n
            if s.computed < len(s.tokens):
                self.stats.partial_prefills += 1
                continue  # mid-prompt (chunked prefill): nothing to sample yet
            s.write_logits.append(out.logits[start + n - 1])
            appended.append(s)
        if not appended:
            return
        self._read_pass(appended)
        for s in appended:
            self._choose_next(s)

    # ------------------------------------------------------------------ pieces
    def _chunk(self, s: _Seq) -> list[int]:
        """The tokens `s` computes this step: its next prompt chunk, or its newest token."""
        todo = s.tokens[s.computed :]
        return todo if self.prefill_chunk is None else todo[: self.prefill_chunk]

    def _check_len(self, s: _Seq) -> None:
        """The cache must hold exactly the tokens the loop computed for `s`."""
        seq_len = self.cache.seq_len(s.seq_id)
        if seq_len != s.computed:
            raise AssertionError(
                f"{s.seq_id!r}: cache holds {seq_len} tokens, expected {s.computed}"
            )

    def _prefix(self, s: _Seq) -> tuple[torch.Tensor, torch.Tensor]:
        """The KV of the tokens `s` has cached, read back with `gather`."""
        self._check_len(s)
        if s.computed == 0:
            g = self.cache.geometry
            empty = torch.empty(g.num_layers, 0, g.num_kv_heads, g.head_dim)
            return empty, empty.clone()
        k, v = self.cache.gather(s.seq_id)
        quant = getattr(self.cache, "kv_quant", None)
        if quant is not None:  # fp8 bytes: their values are the bytes times the scales
            pairs = [quant.dequantize(i, k[i], v[i]) for i in range(len(k))]
            k, v = torch.stack([p[0] for p in pairs]), torch.stack([p[1] for p in pairs])
        return k.float(), v.float()

    def _restore_and_admit(self) -> None:
        while self._swapped:
            s = self._swapped[0]
            try:
                self._swap_in(s)
            except CapacityError:
                return  # swapped requests go first: admit nothing new meanwhile
            self._swapped.popleft()
            self._running.append(s)
        while self._waiting:
            s = self._waiting[0]
            try:
                hit = self.cache.admit(s.seq_id, s.tokens, salt=s.salt)
            except CapacityError:
                return
            self._waiting.popleft()
            s.computed = hit
            self.stats.hits.setdefault(s.seq_id, []).append(hit)
            if hit:
                self.stats.prefix_hits += 1
                self.stats.prefix_hit_tokens += hit
            self._running.append(s)

    def _append_with_preemption(
        self, s: _Seq, k: torch.Tensor, v: torch.Tensor, ids: list[int]
    ) -> bool:
        """Append, preempting the latest-arrived running sequence while there is no room.
        False when `s` itself was preempted."""
        # an fp8 cache quantizes what it is given (float32 here); others take their dtype
        quant = getattr(self.cache, "kv_quant", None)
        dtype = k.dtype if quant is not None else self.cache.torch_dtype
        while True:
            try:
                self.cache.append(s.seq_id, k.to(dtype), v.to(dtype), ids)
                return True
            except CapacityError:
                victim = max(self._running, key=lambda r: r.arrival)
                if victim is s and len(self._running) == 1:
                    raise
                self._preempt(victim)
                if victim is s:
                    return False

    def _preempt(self, s: _Seq) -> None:
        self.stats.preemptions += 1
        self._running.remove(s)
        if self.preemption == "recompute":
            self.stats.recomputes += 1
            self.cache.free(s.seq_id)
            s.computed = 0
            self._waiting.appendleft(s)
            log.debug("preempted %r by recompute", s.seq_id)
            return
        self.stats.swaps_out += 1
        swap_out = getattr(self.cache, "swap_out", None)
        if swap_out is not None:
            swap_out(s.seq_id)
        else:
            s.saved_kv = self.cache.gather(s.seq_id)
            self.cache.free(s.seq_id)
        s.swapped = True
        self._swapped.append(s)
        log.debug("preempted %r by swap", s.seq_id)

    def _swap_in(self, s: _Seq) -> None:
        swap_in = getattr(self.cache, "swap_in", None)
        if swap_in is not None:
            swap_in(s.seq_id)
        else:
            assert s.saved_kv is not None
            hit = self.cache.admit(s.seq_id, s.tokens, salt=s.salt)
            k, v = s.saved_kv
            if hit < s.computed:
                try:
                    self.cache.append(s.seq_id, k[:, hit:], v[:, hit:], s.tokens[hit : s.computed])
                except CapacityError:
                    self.cache.free(s.seq_id)
                    raise
            s.saved_kv = None
        s.swapped = False
        self.stats.swaps_in += 1

    def _read_pass(self, seqs: list[_Seq]) -> None:
        batch = pack(
            [s.seq_id for s in seqs],
            [[s.tokens[s.computed - 1]] for s in seqs],
            [s.computed - 1 for s in seqs],
            [None] * len(seqs),
        )
        if self.read_via_cache:
            out = self.forward(batch, self.read_attention)
            for i, s in enumerate(seqs):
                s.logits.append(out.logits[i])
        else:
            for s in seqs:
                s.logits.append(s.write_logits[-1])

    def _choose_next(self, s: _Seq) -> None:
        logits = s.logits[-1]
        if s.branch_tokens is not None and not s.generated:
            self._fork_branches(s)
            return
        token = s.forced.pop(0) if s.forced else int(torch.argmax(logits))
        s.tokens.append(token)
        if s.done:
            self._finish(s)

    def _fork_branches(self, s: _Seq) -> None:
        """Split `s` after its prompt into one branch per forced first token."""
        branch_tokens = s.branch_tokens or ()
        s.branch_tokens = None
        parent_id = s.seq_id
        branches = []
        for i, token in enumerate(branch_tokens):
            child_id = (parent_id, i)
            self.cache.fork(parent_id, child_id)
            self.stats.forks += 1
            child = _Seq(
                seq_id=child_id,
                arrival=self._next_arrival(),
                prompt_len=s.prompt_len,
                max_new_tokens=s.max_new_tokens,
                salt=s.salt,
                tokens=[*s.tokens, token],
                computed=s.computed,
                logits=list(s.logits),
                write_logits=list(s.write_logits),
            )
            branches.append(child)
        self.cache.free(parent_id)
        self._running.remove(s)
        for child in branches:
            if child.done:
                self._finish(child)
            else:
                self._running.append(child)

    def _finish(self, s: _Seq) -> None:
        self.cache.free(s.seq_id)
        if s in self._running:
            self._running.remove(s)
        self._finished[s.seq_id] = s
