"""vLLM's offline engine serving a trace on this CPU, watched step by step.

`VllmServer` builds vLLM's offline engine (`vllm.LLM`, v1, CPU backend, engine core in
this process: `VLLM_ENABLE_V1_MULTIPROCESSING=0`) over a random-weight Llama built and
saved in code with transformers (`VllmEngineSpec`: hidden 256, 4 query heads of 64, 2 KV
heads, 2 layers, vocab 1,000; nothing is downloaded), with an explicit KV size
(`kv_cache_memory_bytes`, so the number of blocks does not depend on what the host has
free) and the scheduling knobs kvbench's vllm-v1 engine takes too. `serve` adds every
request of a trace at once and drives `LLMEngine.step()` itself, so it sees each step:

* what vLLM's scheduler decided (its `SchedulerOutput`, read by wrapping
  `Scheduler.schedule`): the tokens scheduled per request, each one's tokens computed
  before the step, the preempted requests, each admission's prefix-cache hit;
* the step's time: the serving thread's CPU time (`time.thread_time`) of the whole
  `step()` call - scheduling, the forward pass, sampling, the scheduler's update and the
  output processing - and its wall time beside it. Why CPU time: on the shared 2-core
  build machine (load 8-12) a 10 ms step's wall time was 40-90 ms, the rest waiting for
  a core; vLLM runs with one torch thread here (`VLLM_CPU_OMP_THREADS_BIND=nobind`, one
  intra-op thread), so the thread's CPU time is the step's own work, as
  `suites.e2e.serving_run` times kvbench's;
* per request: the step of its first token and of its last (TTFT and end-to-end
  latency on both clocks, all requests arriving at t = 0);
* vLLM's own prefix-cache counts (`PrefixCacheStats`: requests, queried tokens, hit
  tokens, and the same for re-admissions after preemption), accumulated by vLLM's
  `KVCacheManager.record_prefix_cache_stats` over the whole run.

Token ids are the trace's (`TraceRequest.prompt`, ids below the vocab); outputs are
greedy with `ignore_eos`, so every request generates exactly its `output_len` tokens.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.trace import Trace

#: Environment the engine is built under (restored afterwards): the engine core in this
#: process, no OpenMP thread binding (one intra-op thread, set by the caller's torch).
#: Steps either side of a step whose host probes set its host speed (`VllmServer.serve`).
PROBE_WINDOW = 4
ENGINE_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind"}


@dataclass(frozen=True)
class VllmEngineSpec:
    """The model and the engine's knobs (sizes as the issue's probe: a step takes
    milliseconds on one CPU thread)."""

    hidden_size: int = 256
    num_heads: int = 4
    num_kv_heads: int = 2
    num_layers: int = 2
    intermediate_size: int = 704
    vocab_size: int = 1000
    #: vLLM's CPU attention takes block sizes that are multiples of 32
    block_size: int = 32
    num_blocks: int = 128
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    long_prefill_token_threshold: int = 0
    max_model_len: int = 1024
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_heads", "num_kv_heads", "num_layers", "vocab_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)!r}")
        if self.block_size < 32 or self.block_size % 32:
            raise ConfigError(
                f"block_size must be a multiple of 32 (vLLM's CPU attention), got {self.block_size}"
            )
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ConfigError(
                f"hidden {self.hidden_size} / heads {self.num_heads} / KV heads "
                f"{self.num_kv_heads} do not divide"
            )
        if self.num_blocks * self.block_size < self.max_model_len:
            raise ConfigError(
                f"{self.num_blocks} blocks of {self.block_size} hold less than max_model_len "
                f"{self.max_model_len} tokens"
            )

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    def geometry(self) -> KVGeometry:
        return KVGeometry(
            self.num_layers, self.num_kv_heads, self.head_dim, "float32", self.num_heads
        )

    @property
    def kv_cache_bytes(self) -> int:
        """The KV size given to vLLM: exactly `num_blocks` blocks of K and V, all layers."""
        return self.num_blocks * self.block_size * self.geometry().bytes_per_token


def save_model(spec: VllmEngineSpec, directory: str) -> int:
    """Build the random-weight LlamaForCausalLM of `spec` (seeded, float32) and save it
    (config and safetensors) into `directory`; returns its parameter count."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=spec.hidden_size,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_kv_heads,
        num_hidden_layers=spec.num_layers,
        intermediate_size=spec.intermediate_size,
        vocab_size=spec.vocab_size,
        max_position_embeddings=max(2048, spec.max_model_len),
        head_dim=spec.head_dim,
    )
    state = torch.random.get_rng_state()
    torch.manual_seed(spec.seed)
    try:
        model = LlamaForCausalLM(cfg)
    finally:
        torch.random.set_rng_state(state)
    model.save_pretrained(directory)
    return sum(p.numel() for p in model.parameters())


@dataclass
class VllmStep:
    """One engine step as vLLM ran it: tokens scheduled per request (scheduling order),
    each one's tokens computed before the step, preempted ids, the prefix-cache hit of
    each admission, and its seconds (serving thread CPU time; wall beside it)."""

    scheduled: dict[str, int]
    starts: dict[str, int]
    preempted: list[str]
    hits: dict[str, int]
    seconds: float = 0.0
    wall_s: float = 0.0
    #: seconds of the host probes around the step, their median (`VllmServer.serve`); 0: none
    empty_s: float = 0.0


@dataclass
class VllmRun:
    """A trace served by vLLM (module docstring)."""

    steps: list[VllmStep]
    #: request id -> index of the step that produced its first / last token
    first_step: dict[str, int]
    last_step: dict[str, int]
    #: vLLM's PrefixCacheStats over the run, as fields
    prefix: dict[str, int]
    #: vLLM's RequestOutput.num_cached_tokens per request
    cached_tokens: dict[str, int] = field(default_factory=dict)

    def clock(self, wall: bool = False) -> list[float]:
        """Seconds at the end of each step (CPU time, or wall time with `wall`)."""
        out, now = [], 0.0
        for s in self.steps:
            now += s.wall_s if wall else s.seconds
            out.append(now)
        return out


@contextmanager
def _env(values: dict[str, str]) -> Iterator[None]:
    before = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


class VllmServer:
    """vLLM's offline engine over the spec's model, built once, serving traces one after
    another (the prefix cache reset between them). Build it with one torch thread set."""

    def __init__(self, spec: VllmEngineSpec) -> None:
        import torch

        self.spec = spec
        self._dir = tempfile.TemporaryDirectory(prefix="kvbench-vllm-model-")
        self.params = save_model(spec, self._dir.name)
        set_threads = torch.set_num_threads  # vLLM's CPU worker replaces it process-wide
        try:
            with _env(ENGINE_ENV):
                from vllm import LLM

                self.llm = LLM(
                    model=self._dir.name,
                    skip_tokenizer_init=True,
                    dtype="float32",
                    enforce_eager=True,
                    seed=spec.seed,
                    block_size=spec.block_size,
                    kv_cache_memory_bytes=spec.kv_cache_bytes,
                    gpu_memory_utilization=0.02,
                    max_model_len=spec.max_model_len,
                    max_num_seqs=spec.max_num_seqs,
                    max_num_batched_tokens=spec.max_num_batched_tokens,
                    long_prefill_token_threshold=spec.long_prefill_token_threshold,
                    enable_prefix_caching=True,
                    enable_chunked_prefill=True,
                )
        finally:
            torch.set_num_threads = set_threads
        self.engine = self.llm.llm_engine
        client: Any = self.engine.engine_core  # InprocClient (in-process engine core)
        core = client.engine_core  # -> EngineCore
        self.scheduler = core.scheduler
        self._schedule = self.scheduler.schedule
        self.scheduler.schedule = self._watched_schedule
        self._outputs: list[Any] = []

    @property
    def num_blocks(self) -> int:
        """The number of KV blocks vLLM chose (its `num_gpu_blocks`)."""
        blocks = self.engine.vllm_config.cache_config.num_gpu_blocks
        if blocks is None:
            raise RuntimeError("vLLM's engine has not sized its KV cache (num_gpu_blocks)")
        return int(blocks)

    def _watched_schedule(self, *args: Any, **kwargs: Any) -> Any:
        out = self._schedule(*args, **kwargs)
        self._outputs.append(out)
        return out

    def _start_prefix_stats(self) -> Any:
        """A fresh PrefixCacheStats that vLLM's KVCacheManager fills for the whole run
        (its logging switched on; nothing else reads or resets it: the scheduler's own
        stats logging stays off)."""
        from vllm.v1.metrics.stats import PrefixCacheStats

        manager = self.scheduler.kv_cache_manager
        manager.log_stats = True
        manager.prefix_cache_stats = PrefixCacheStats()
        return manager.prefix_cache_stats

    def close(self) -> None:
        self._dir.cleanup()

    def serve(
        self,
        trace: Trace,
        clock: Callable[[], float] = time.thread_time,
        probe: Callable[[], float] | None = None,
    ) -> VllmRun:
        """Serve every request of `trace` (all added at once, trace order; arrival
        times are not used) and watch each step (module docstring). `probe` (e.g.
        `host_probe`) runs before the first step and after every step, untimed by the
        step clock; each step's `empty_s` is the median of the probes from PROBE_WINDOW
        steps before it to PROBE_WINDOW after it (its bracketing pair and 4 either side:
        one probe of ~2 ms read 1.0-1.4x its neighbours at load 18; the median keeps the
        drift over seconds and drops that noise)."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt
        from vllm.sampling_params import RequestOutputKind

        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache (requests still run)")
        prompts: dict[str, int] = {}
        for r in trace.requests:
            ids = r.prompt
            if ids is None or max(ids, default=0) >= self.spec.vocab_size:
                raise ConfigError(
                    f"request {r.id!r} needs explicit prompt ids below the vocab "
                    f"({self.spec.vocab_size})"
                )
            rid = str(r.id)
            prompts[rid] = len(ids)
            self.engine.add_request(
                rid,
                TokensPrompt(prompt_token_ids=list(ids)),  # type: ignore[typeddict-item]
                SamplingParams(
                    max_tokens=r.output_len,
                    ignore_eos=True,
                    temperature=0.0,
                    detokenize=False,
                    output_kind=RequestOutputKind.DELTA,
                ),
            )
        stats = self._start_prefix_stats()
        steps: list[VllmStep] = []
        first: dict[str, int] = {}
        last: dict[str, int] = {}
        cached: dict[str, int] = {}
        self._outputs.clear()
        probes = [probe()] if probe is not None else []
        while self.engine.has_unfinished_requests():
            w0, c0 = time.perf_counter(), clock()
            outs: list[Any] = self.engine.step()  # RequestOutputs (generations)
            seconds, wall = clock() - c0, time.perf_counter() - w0
            for sched in self._outputs:
                steps.append(_decisions(sched, seconds, wall))
                seconds = wall = 0.0  # one schedule per step()
            self._outputs.clear()
            if probe is not None:
                probes.append(probe())
            k = len(steps) - 1
            for o in outs:
                rid = _external(o.request_id, prompts)
                if o.outputs and o.outputs[0].token_ids:
                    first.setdefault(rid, k)
                if o.finished:
                    last[rid] = k
                    cached[rid] = int(o.num_cached_tokens or 0)
        for k, s in enumerate(steps):  # probes k and k + 1 bracket step k
            window = probes[max(0, k - PROBE_WINDOW) : k + PROBE_WINDOW + 2]
            s.empty_s = float(statistics.median(window)) if window else 0.0
        missing = sorted(set(prompts) - set(last))
        if missing:
            raise RuntimeError(f"vLLM finished without requests {missing[:5]}")
        for s in steps:  # vLLM suffixes its internal request ids ("r0-8e1e8482")
            s.scheduled = {_external(k, prompts): n for k, n in s.scheduled.items()}
            s.starts = {_external(k, prompts): n for k, n in s.starts.items()}
            s.hits = {_external(k, prompts): n for k, n in s.hits.items()}
            s.preempted = [_external(k, prompts) for k in s.preempted]
        prefix = {
            name: int(getattr(stats, name))
            for name in (
                "requests", "queries", "hits",
                "preempted_requests", "preempted_queries", "preempted_hits",
            )
        }  # fmt: skip
        self.scheduler.kv_cache_manager.log_stats = False
        return VllmRun(steps, first, last, prefix, cached)


def _decisions(sched: Any, seconds: float, wall: float) -> VllmStep:
    """A VllmStep from vLLM's SchedulerOutput (new requests: their hit is their computed
    tokens; resumed ones likewise)."""
    starts: dict[str, int] = {}
    hits: dict[str, int] = {}
    for new in sched.scheduled_new_reqs:
        starts[new.req_id] = int(new.num_computed_tokens)
        hits[new.req_id] = int(new.num_computed_tokens)
    cached = sched.scheduled_cached_reqs
    resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
    for rid, computed in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
        starts[rid] = int(computed)
        if rid in resumed:
            hits[rid] = int(computed)
    return VllmStep(
        dict(sched.num_scheduled_tokens),
        starts,
        sorted(getattr(sched, "preempted_req_ids", None) or ()),
        hits,
        seconds,
        wall,
    )


def _external(rid: str, known: dict[str, int]) -> str:
    """The trace's id of vLLM's internal request id (the id, '-', a random suffix)."""
    if rid in known:
        return rid
    head = rid.rsplit("-", 1)[0]
    if head not in known:
        raise RuntimeError(f"vLLM scheduled an unknown request {rid!r}")
    return head


def host_probe() -> float:
    """Seconds (this thread's CPU time) of a fixed small piece of work shaped like a
    decode step of the spec's model, timed between vLLM's steps: the host's speed at
    that moment (caches, memory and the core's sibling are shared with other jobs), as
    `suites.e2e.serving_run`'s empty call is for kvbench's steps. Interpreter work (a
    loop over a few thousand ints) and 16-row float32 matmuls of the model's shapes."""
    import torch

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(16, 256, generator=gen)
    w1 = torch.randn(256, 704, generator=gen)
    w2 = torch.randn(704, 256, generator=gen)
    t0 = time.thread_time()
    for _ in range(4):
        x = torch.tanh((x @ w1) @ w2 * 1e-3)
    acc = 0
    for i in range(3000):
        acc += i & 7
    return time.thread_time() - t0 + 0.0 * acc
