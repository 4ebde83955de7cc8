"""The scheduler's configuration, its modeled clock, and its results.

Modeled time is kept in integer picoseconds so that a span of k identical decode steps
can be priced in closed form and still equal, to the picosecond, the sum of the k steps
priced one by one (the event-driven and token-stepping engines must agree exactly).
`TimeModel.step_ps` prices a step that runs T tokens (D decodes + prefill chunks):

    step     = fixed + all-reduce(T) + max(memory, compute)
    memory   = weight_ps + kv_ps_per_token * (KV tokens read: each decoder its c + 1,
               each chunk its context and itself)
    compute  = dense_ps_per_token * T + attn_ps_per_kv_token * (decoders' KV tokens)
               + round(attention pairs of the chunks * 4 * layers * q_heads * head_dim
                       / peak)
    all-reduce (tp > 1) = 2 * layers * (latency + ring bytes of T tokens' activations
               / interconnect)
    swap     = round(blocks * block_bytes / tp * 1e12 / host link) per direction

With an attention layout (`attention_layout.AttentionLayout`: windowed, hybrid and
encoder-decoder models) KV reads and attention FLOPs are priced per layer instead: a
windowed layer's query reads min(c + 1, window) tokens, a cross-attention layer's the
encoder's length, a full layer's c + 1 (`kv_ps_per_layer_token`,
`attn_ps_per_layer_kv_token`; each decoder's excess over each window comes from the
engine). Without one every layer reads the whole context, as before.

Bandwidth and FLOP/s are the profile's effective figures (datasheet x fitted fraction,
`DeviceProfile.efficiency`), and `fixed` includes the fitted per-kernel floor of the
4 linear kernels of every layer. The per-kernel fit combines memory and compute in
quadrature (`kvbench.workloads.gpu_fit`); the step keeps the max, which is exact for
spans of decode steps and optimistic near the knee.

Every coefficient (weight_ps, kv_ps_per_token, dense_ps_per_token, ...) is rounded once
to integer picoseconds, with weights, KV and FLOPs divided over the `tp` ranks. A step
that runs no token (it only swaps) costs its swaps alone. Decode-only steps are linear
in the KV read on both sides of the max, so `decode_span_ps` sums a quiet stretch exactly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from kvbench.paged.serving.attention_layout import AttentionLayout
from kvbench.paged.serving.latency import flat
from kvbench.paged.serving.records import SeqRecord
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE, check_block_size
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry, require_positive
from kvbench.workloads.profiles import DeviceProfile

PREEMPTION_POLICIES = ("swap", "recompute", "auto")
#: QKV, O, up (gate+up) and down projections: the kernels the fitted floor applies to.
LINEAR_KERNELS_PER_LAYER = 4
BATCHING_POLICIES = ("continuous", "static")
MODES = ("event", "token")
SAMPLE_PREEMPTION = ("request", "sequence")
#: Whose decisions the engine makes: the 2023 paper's vLLM (watermark admission, swap,
#: decodes before prefills) or vLLM v1's scheduler (`engine.v1`).
POLICIES = ("vllm-2023", "vllm-v1")


@dataclass(frozen=True)
class SchedulerConfig:
    """How the engine schedules.

    Attributes:
        max_batched_tokens: token budget per step (decodes count 1 each, prefill chunks
            their length).
        max_num_seqs: most sequences running at once.
        chunked_prefill: split prompts longer than the remaining budget over steps
            (otherwise a prompt is admitted only when it fits whole).
        preemption: "swap", "recompute" or "auto" (cheaper by the cost model; swap
            falls back to recompute where the cache cannot swap or swap space is full).
        max_preemptions: a sequence preempted this many times is no longer chosen as a
            victim while any other running sequence can be (progress bound).
        batching: "continuous" (iteration-level) or "static" (a batch runs until its
            last sequence finishes before the next is admitted).
        static_batch_size: sequences per static batch (0: as many as fit).
        mode: "event" (advance from event to event; memory-only fast path) or "token"
            (every decoding sequence appended every step: the reference behaviour).
        hash_outputs: pass generated token ids to the cache so generated blocks are
            prefix-cacheable. "auto": only for trace-given output tokens (multi-turn);
            synthetic outputs are private to their request.
        max_concurrency: most requests in flight at once (0: no cap), as
            `vllm bench serve --max-concurrency` caps its client: a request whose arrival
            time has come joins the engine only while fewer than this many requests are
            in flight (joined and not finished: waiting, running or swapped); the rest
            queue outside, FCFS, and join as requests finish. Its latencies count from
            when it joined (as vLLM's client times a request from when it is sent).
        sample_preemption: what preemption takes of an n-sample request: "request"
            (every running sample together, as vLLM preempts a sequence group, when the
            whole family fits the cache) or "sequence" (the victim sample alone; its
            shared blocks are copied per sample when swapped). Beam groups always go
            whole.
        policy: "vllm-2023" (the paper's scheduler, above) or "vllm-v1" (vLLM v1's
            `Scheduler`: one token budget over running requests in order, then waiting
            ones; allocation per chunk; recompute preemption of the last running request;
            `kvbench.paged.serving.engine.v1`). vllm-v1 ignores `preemption` (always
            recompute), `max_preemptions`, the cache's watermark-free admission aside.
        long_prefill_token_threshold: vllm-v1 only: a prefill chunk is cut to this many
            tokens while more than one request is running or waiting (0: no cut), as
            vLLM's option of that name.
    """

    max_batched_tokens: int = 4096
    max_num_seqs: int = 256
    chunked_prefill: bool = True
    preemption: str = "auto"
    max_preemptions: int = 8
    batching: str = "continuous"
    static_batch_size: int = 0
    mode: str = "event"
    hash_outputs: str = "auto"
    sample_preemption: str = "request"
    max_concurrency: int = 0
    policy: str = "vllm-2023"
    long_prefill_token_threshold: int = 0

    def __post_init__(self) -> None:
        for name in ("max_batched_tokens", "max_num_seqs", "max_preemptions"):
            require_positive(name, getattr(self, name))
        if self.max_num_seqs > self.max_batched_tokens:
            raise ConfigError(
                f"max_num_seqs={self.max_num_seqs} exceeds max_batched_tokens="
                f"{self.max_batched_tokens}: every running sequence needs a token per step"
            )
        if self.preemption not in PREEMPTION_POLICIES:
            raise ConfigError(
                f"unknown preemption policy {self.preemption!r}; known: {PREEMPTION_POLICIES}"
            )
        if self.batching not in BATCHING_POLICIES:
            raise ConfigError(f"unknown batching {self.batching!r}; known: {BATCHING_POLICIES}")
        if self.mode not in MODES:
            raise ConfigError(f"unknown mode {self.mode!r}; known: {MODES}")
        mc = self.max_concurrency
        if isinstance(mc, bool) or not isinstance(mc, int) or mc < 0:
            raise ConfigError(f"max_concurrency must be an integer >= 0 (0: no cap), got {mc!r}")
        if self.static_batch_size < 0:
            raise ConfigError(f"static_batch_size must be >= 0, got {self.static_batch_size!r}")
        if self.hash_outputs not in ("auto", "always", "never"):
            raise ConfigError(f"hash_outputs must be auto/always/never, got {self.hash_outputs!r}")
        if self.policy not in POLICIES:
            raise ConfigError(f"unknown policy {self.policy!r}; known: {POLICIES}")
        lpt = self.long_prefill_token_threshold
        if isinstance(lpt, bool) or not isinstance(lpt, int) or lpt < 0:
            raise ConfigError(f"long_prefill_token_threshold must be an integer >= 0, got {lpt!r}")
        if self.policy == "vllm-v1" and (
            self.preemption == "swap" or self.batching != "continuous"
        ):
            raise ConfigError(
                f"policy 'vllm-v1' recomputes and batches continuously (vLLM v1 has no swap "
                f"and no static batches), got preemption={self.preemption!r}, "
                f"batching={self.batching!r}"
            )
        if self.sample_preemption not in SAMPLE_PREEMPTION:
            raise ConfigError(
                f"unknown sample_preemption {self.sample_preemption!r}; known: {SAMPLE_PREEMPTION}"
            )


@dataclass(frozen=True)
class TimeModel:
    """Integer-picosecond step pricing for one model on one device (module docstring).

    Attributes:
        profile: the device (bandwidths, peak FLOP/s, fixed step cost, interconnect).
        geometry: the model's KV geometry (layers, heads, head dim; query heads for
            attention FLOPs).
        weight_bytes: the whole model's weight bytes (divided over `tp` ranks).
        params: parameter count (2 FLOPs per parameter per token).
        block_size: tokens per block (swap sizes) when the model prices swaps alone; an
            engine prices a cache's swaps at the cache's block size (`for_cache`: the
            cache decides, whatever this says).
        tp: tensor-parallel ranks: weights, KV and FLOPs divide over them; each layer
            adds two all-reduces of the step's activations.
        hidden_size: model width (all-reduce message size); defaults to q heads x head dim.
        layout: which KV each layer reads (None: every layer the whole context); its
            layers must add up to the geometry's.
        swap_block_bytes: bytes of one block the cache swaps (0: a block of every layer,
            `geometry.bytes_per_block`); a layer-group cache swaps pages of one group
            (`ModelKVSpec.page_bytes`).
    """

    profile: DeviceProfile
    geometry: KVGeometry
    weight_bytes: int
    params: float
    block_size: int = DEFAULT_BLOCK_SIZE
    tp: int = 1
    hidden_size: int = 0
    layout: AttentionLayout | None = None
    swap_block_bytes: int = 0

    def __post_init__(self) -> None:
        check_block_size(self.block_size)
        require_positive("tp", self.tp)
        if self.layout is not None and self.layout.num_layers != self.geometry.num_layers:
            raise ConfigError(
                f"the attention layout has {self.layout.num_layers} layers, the geometry "
                f"{self.geometry.num_layers}"
            )
        if not (self.params > 0 and self.weight_bytes >= 0):
            raise ConfigError(
                f"params must be > 0 and weight_bytes >= 0, got {self.params!r}, "
                f"{self.weight_bytes!r}"
            )

    def for_cache(self, cache_block_size: int, can_swap: bool) -> TimeModel:
        """This model as it prices a cache whose blocks hold `cache_block_size` tokens:
        the cache decides the block size swaps are priced at. Itself when the sizes agree
        or the cache never swaps (no blocks, 0, or no swap space); else a copy at the
        cache's block size (`simulate(trace, cache)` once priced every cache's swaps at 16
        tokens). A model given `swap_block_bytes` (a layer-group page) for another block
        size is refused (ConfigError naming both sizes): those bytes cannot be re-derived
        here."""
        if not can_swap or not cache_block_size or cache_block_size == self.block_size:
            return self
        if self.swap_block_bytes:
            raise ConfigError(
                f"the time model's swap_block_bytes={self.swap_block_bytes} are pages of "
                f"{self.block_size}-token blocks but the cache's blocks hold "
                f"{cache_block_size} tokens; build it with block_size={cache_block_size} "
                "and that block size's page bytes"
            )
        return replace(self, block_size=check_block_size(cache_block_size))

    # -- integer coefficients, each rounded once (ps) --------------------------------
    def _ps(self, seconds: float) -> int:
        return round(seconds * 1e12)

    @cached_property
    def fixed_ps(self) -> int:
        """Fixed cost of a step that runs the model: profile.step_overhead_s plus the
        fitted per-kernel floor once per linear-layer kernel (4 per layer; 0 at the
        datasheet)."""
        floor = LINEAR_KERNELS_PER_LAYER * self.geometry.num_layers
        return self._ps(
            self.profile.step_overhead_s + floor * self.profile.efficiency.kernel_floor_s
        )

    @cached_property
    def weight_ps(self) -> int:
        """Reading one rank's share of the weights once."""
        return self._ps(self.weight_bytes / self.tp / self.profile.effective_hbm_bandwidth)

    @cached_property
    def kv_ps_per_token(self) -> int:
        """Reading one token's KV (one rank's share of the heads)."""
        return self._ps(
            self.geometry.bytes_per_token / self.tp / self.profile.effective_hbm_bandwidth
        )

    @cached_property
    def dense_ps_per_token(self) -> int:
        """The dense layers' compute for one token (2 FLOPs per parameter), per rank."""
        return self._ps(2.0 * self.params / self.tp / self.profile.effective_peak_flops)

    @cached_property
    def _attn_flops_per_pair(self) -> float:
        """Attention FLOPs of one (query token, key token) pair over all layers, per rank:
        QK^T and PV, 2 FLOPs per multiply-add each."""
        g = self.geometry
        q_heads = g.num_q_heads if g.num_q_heads is not None else g.num_kv_heads
        return 4.0 * g.num_layers * q_heads * g.head_dim / self.tp

    @cached_property
    def attn_ps_per_kv_token(self) -> int:
        """Decode attention compute per cached token read by one decoding query."""
        return self._ps(self._attn_flops_per_pair / self.profile.effective_peak_flops)

    @cached_property
    def windows(self) -> tuple[int, ...]:
        """The layout's distinct windows, ascending (() without a layout)."""
        return () if self.layout is None else self.layout.windows

    @cached_property
    def kv_ps_per_layer_token(self) -> int:
        """Reading one token's KV of one layer (one rank's share of the heads)."""
        g = self.geometry
        per_layer = g.bytes_per_token / g.num_layers
        return self._ps(per_layer / self.tp / self.profile.effective_hbm_bandwidth)

    @cached_property
    def attn_ps_per_layer_kv_token(self) -> int:
        """Decode attention compute per cached token one layer's query reads."""
        per_layer = self._attn_flops_per_pair / self.geometry.num_layers
        return self._ps(per_layer / self.profile.effective_peak_flops)

    @cached_property
    def allreduce_fixed_ps(self) -> int:
        """Latency of a step's all-reduces (two per layer; 0 without tensor parallelism)."""
        if self.tp == 1:
            return 0
        return self._ps(2 * self.geometry.num_layers * self.profile.allreduce_latency_s)

    @cached_property
    def allreduce_ps_per_token(self) -> int:
        """Ring all-reduce traffic of one token's activations, two per layer."""
        if self.tp == 1:
            return 0
        g = self.geometry
        hidden = self.hidden_size or (g.num_q_heads or g.num_kv_heads) * g.head_dim
        nbytes = hidden * 2 * 2 * (self.tp - 1) / self.tp  # fp16 activations, ring factor
        return self._ps(2 * g.num_layers * nbytes / self.profile.interconnect_bandwidth)

    # -- steps --------------------------------------------------------------------------
    def step_ps(
        self,
        decoders: int,
        kv_read: int,
        chunks: Sequence[tuple[int, int]] = (),
        excess: Sequence[int] = (),
    ) -> int:
        """One step running `decoders` decoding sequences that read `kv_read` KV tokens
        in all, plus prefill `chunks` (tokens cached before the chunk, chunk length):

            fixed + all-reduce(tokens) + max(memory, compute)
            memory  = weights + KV tokens read (decoders' + each chunk's context and itself)
            compute = dense x tokens + attention (decode pairs + each chunk's pairs)

        With a layout, KV and pairs are counted per layer (`attention_layout`), and
        `excess[i]` is the decoders' sum of max(0, c + 1 - W_i) for each of `windows`
        (omitted: as if each decoder read kv_read / decoders).
        0 for a step that runs no token (it only swaps or waits)."""
        if self.layout is not None:
            return self._layout_step_ps(decoders, kv_read, chunks, excess)
        tokens = decoders
        kv = kv_read
        pairs = 0.0
        for ctx, n in chunks:
            tokens += n
            kv += ctx + n
            pairs += n * ctx + n * (n + 1) / 2
        if tokens == 0:
            return 0
        mem = self.weight_ps + self.kv_ps_per_token * kv
        comp = self.dense_ps_per_token * tokens + self.attn_ps_per_kv_token * kv_read
        if pairs:
            comp += self._ps(pairs * self._attn_flops_per_pair / self.profile.effective_peak_flops)
        return (
            self.fixed_ps
            + self.allreduce_fixed_ps
            + self.allreduce_ps_per_token * tokens
            + max(mem, comp)
        )

    def _layout_step_ps(
        self,
        decoders: int,
        kv_read: int,
        chunks: Sequence[tuple[int, int]],
        excess: Sequence[int],
    ) -> int:
        """`step_ps` priced per layer group (a layout is set)."""
        layout = self.layout
        assert layout is not None
        tokens = decoders
        dec = layout.decode_layer_tokens(decoders, kv_read, excess) if decoders else 0
        kv = dec
        pairs = 0
        for ctx, n in chunks:
            tokens += n
            kv += layout.chunk_layer_tokens(ctx, n)
            pairs += layout.chunk_pairs(ctx, n)
        if tokens == 0:
            return 0
        mem = self.weight_ps + self.kv_ps_per_layer_token * kv
        comp = self.dense_ps_per_token * tokens + self.attn_ps_per_layer_kv_token * dec
        if pairs:
            per_pair = self._attn_flops_per_pair / self.geometry.num_layers
            comp += self._ps(pairs * per_pair / self.profile.effective_peak_flops)
        return (
            self.fixed_ps
            + self.allreduce_fixed_ps
            + self.allreduce_ps_per_token * tokens
            + max(mem, comp)
        )

    def decode_ps(self, kv_tokens: int, decoders: int = 1) -> int:
        """One decode step of `decoders` sequences reading `kv_tokens` KV tokens in all."""
        return self.step_ps(decoders, kv_tokens)

    def decode_span_ps(
        self,
        decoders: int,
        kv_first: int,
        steps: int,
        excess_first: Sequence[int] = (),
        above: Sequence[int] = (),
    ) -> int:
        """`steps` consecutive decode-only steps of `decoders` sequences whose first step
        reads `kv_first` KV tokens (each later step reads `decoders` more): exactly the
        sum of their `step_ps`, in closed form (memory minus compute is linear in the
        step, so the max switches side at most once). With a layout, `excess_first` is
        the first step's `excess` and `above[i]` the decoders past window W_i, none
        crossing a window within the span (the engine makes the crossing an event)."""
        if steps <= 0 or decoders <= 0:
            return 0
        d = decoders
        base = self.fixed_ps + self.allreduce_fixed_ps + self.allreduce_ps_per_token * d
        if self.layout is None:
            kv_ps, attn_ps, x0, x1 = self.kv_ps_per_token, self.attn_ps_per_kv_token, kv_first, d
        else:
            kv_ps, attn_ps = self.kv_ps_per_layer_token, self.attn_ps_per_layer_kv_token
            x0 = self.layout.decode_layer_tokens(d, kv_first, excess_first)
            x1 = self.layout.decode_slope(d, above)
        m0, m1 = self.weight_ps + kv_ps * x0, kv_ps * x1
        c0 = self.dense_ps_per_token * d + attn_ps * x0
        c1 = attn_ps * x1
        a, b = m0 - c0, m1 - c1
        if b >= 0:  # memory gains on compute: compute first, memory from step j on
            j = _first_nonneg(a, b, steps)
            body = _lin_sum(c0, c1, 0, j) + _lin_sum(m0, m1, j, steps)
        else:
            j = _first_nonneg(-a, -b, steps)
            body = _lin_sum(m0, m1, 0, j) + _lin_sum(c0, c1, j, steps)
        return base * steps + body

    def prefill_ps(self, chunks: list[tuple[int, int]]) -> int:
        """A prefill-only step of chunks (tokens already cached before the chunk, length)."""
        return self.step_ps(0, 0, chunks)

    def swap_ps(self, blocks: int) -> int:
        """One direction of copying `blocks` blocks over the host link (each rank copies
        its share over its own link, in parallel)."""
        block = self.swap_block_bytes or self.geometry.bytes_per_block(self.block_size)
        nbytes = blocks * block / self.tp
        return round(nbytes * 1e12 / self.profile.host_link_bandwidth)

    def recompute_ps(self, tokens: int) -> int:
        """Cost model of recomputation: tokens / prefill rate (prefill rate = peak / 2P,
        per rank)."""
        return round(tokens * 1e12 / self.profile.prefill_tokens_per_second(self.params / self.tp))


def _lin_sum(a: int, b: int, j0: int, j1: int) -> int:
    """sum of a + b * j for j in [j0, j1) (exact integers)."""
    n = j1 - j0
    if n <= 0:
        return 0
    return a * n + b * ((j0 + j1 - 1) * n // 2)


def _first_nonneg(a: int, b: int, k: int) -> int:
    """Smallest j in [0, k] with a + b * j >= 0, for b >= 0 (k when none is below k)."""
    if a >= 0:
        return 0
    if b <= 0:
        return k
    return min(-(a // b), k)


@dataclass
class StepRow:
    """Metrics of `span` consecutive steps starting at `step` (span > 1 only for quiet
    stretches of the event engine, where nothing but decoding happens). Block and live
    figures are at the end of the first step; live_tokens grows by `decoding` per step."""

    step: int
    span: int
    running: int
    decoding: int
    waiting: int
    swapped: int
    free_blocks: int
    used_blocks: int
    cached_blocks: int
    live_tokens: int
    reserved_slots: int
    time_ps: int


@dataclass
class SimulationResult:
    """Summary and detail of one simulated trace.

    Summary fields:
        utilization: sum over steps of live slots / sum of reserved slots (each at the
            end of the step): the time-averaged share of held memory that holds KV.
        peak_concurrency: most sequences running in one step.
        preemptions, swaps, recomputes: totals over all sequences.
        steps: engine iterations until the last sequence finished.
        generated_tokens: output tokens produced (equals the trace's total).
        tokens_per_step: generated_tokens / steps.
        modeled_seconds: modeled time under the device profile (0 without one).
        tokens_per_second: generated_tokens / modeled_seconds.
        processed_steps: steps the engine actually visited (event mode skips quiet ones).
        wall_seconds: host time the simulation took.
        latency: per-request latency in modeled seconds, {metric: {stat: value}} for the
            metrics ttft, tpot, e2e (s) and normalized_latency (s per output token) and
            the stats mean, p50, p90, p99 (`kvbench.paged.serving.latency`); in `summary()` as
            flat columns "ttft_mean", "ttft_p50", ..., "normalized_latency_p99".
    """

    utilization: float
    peak_concurrency: int
    preemptions: int
    swaps: int
    recomputes: int
    steps: int
    generated_tokens: int
    tokens_per_step: float
    modeled_seconds: float
    tokens_per_second: float
    processed_steps: int
    wall_seconds: float
    mean_running: float
    records: list[SeqRecord] = field(repr=False, default_factory=list)
    timeline: list[StepRow] = field(repr=False, default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)
    latency: dict[str, dict[str, float]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        """The summary fields as a flat dict (for tables and result rows)."""
        out = {
            k: getattr(self, k)
            for k in (
                "utilization",
                "peak_concurrency",
                "mean_running",
                "preemptions",
                "swaps",
                "recomputes",
                "steps",
                "generated_tokens",
                "tokens_per_step",
                "modeled_seconds",
                "tokens_per_second",
                "processed_steps",
                "wall_seconds",
            )
        }
        out.update(flat(self.latency))
        out.update(self.info)
        return out

    def decisions(self) -> list[tuple[str | int, ...]]:
        """Per-sequence decisions in a canonical order (compare two runs with ==)."""
        return sorted(r.key() for r in self.records)
