"""The scheduler's configuration, its modeled clock, and its results.

Modeled time is kept in integer picoseconds so that a span of k identical decode steps
can be priced in closed form and still equal, to the picosecond, the sum of the k steps
priced one by one (the event-driven and token-stepping engines must agree exactly):

    decode step   = weight_ps + kv_ps_per_token * (KV tokens read by the batch)
    prefill step  = round(FLOPs * 1e12 / peak), FLOPs = 2 * params * tokens
                    + 4 * layers * q_heads * head_dim * (attention pairs of the chunk)
    swap          = round(blocks * block_bytes * 1e12 / host link) per direction

weight_ps and kv_ps_per_token are each rounded once (bytes * 1e12 / bandwidth). A step
with both decodes and prefill chunks costs the sum (no overlap is modeled).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from kvbench.paged.latency import flat
from kvbench.workloads.errors import ConfigError
from kvbench.workloads.geometry import KVGeometry
from kvbench.workloads.profiles import DeviceProfile

PREEMPTION_POLICIES = ("swap", "recompute", "auto")
BATCHING_POLICIES = ("continuous", "static")
MODES = ("event", "token")
SAMPLE_PREEMPTION = ("request", "sequence")


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
        sample_preemption: what preemption takes of an n-sample request: "request"
            (every running sample together, as vLLM preempts a sequence group, when the
            whole family fits the cache) or "sequence" (the victim sample alone; its
            shared blocks are copied per sample when swapped). Beam groups always go
            whole.
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

    def __post_init__(self) -> None:
        for name in ("max_batched_tokens", "max_num_seqs", "max_preemptions"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {v!r}")
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
        if self.static_batch_size < 0:
            raise ConfigError(f"static_batch_size must be >= 0, got {self.static_batch_size!r}")
        if self.hash_outputs not in ("auto", "always", "never"):
            raise ConfigError(f"hash_outputs must be auto/always/never, got {self.hash_outputs!r}")
        if self.sample_preemption not in SAMPLE_PREEMPTION:
            raise ConfigError(
                f"unknown sample_preemption {self.sample_preemption!r}; known: {SAMPLE_PREEMPTION}"
            )


@dataclass(frozen=True)
class TimeModel:
    """Integer-picosecond step pricing for one model on one device (module docstring)."""

    profile: DeviceProfile
    geometry: KVGeometry
    weight_bytes: int
    params: float
    block_size: int = 16

    @property
    def weight_ps(self) -> int:
        return round(self.weight_bytes * 1e12 / self.profile.hbm_bandwidth)

    @property
    def kv_ps_per_token(self) -> int:
        return round(self.geometry.bytes_per_token * 1e12 / self.profile.hbm_bandwidth)

    def decode_ps(self, kv_tokens: int) -> int:
        """One decode step reading `kv_tokens` tokens of KV (plus all weights)."""
        return self.weight_ps + self.kv_ps_per_token * kv_tokens

    def prefill_ps(self, chunks: list[tuple[int, int]]) -> int:
        """Prefill of chunks (tokens already cached before the chunk, chunk length)."""
        g = self.geometry
        assert g.num_q_heads is not None
        attn = 4 * g.num_layers * g.num_q_heads * g.head_dim
        flops = 0.0
        for ctx, n in chunks:
            flops += 2.0 * self.params * n + attn * (n * ctx + n * (n + 1) / 2)
        return round(flops * 1e12 / self.profile.peak_flops)

    def swap_ps(self, blocks: int) -> int:
        """One direction of copying `blocks` blocks over the host link."""
        nbytes = blocks * self.geometry.bytes_per_block(self.block_size)
        return round(nbytes * 1e12 / self.profile.host_link_bandwidth)

    def recompute_ps(self, tokens: int) -> int:
        """Cost model of recomputation: tokens / prefill rate (prefill rate = peak / 2P)."""
        return round(tokens * 1e12 / self.profile.prefill_tokens_per_second(self.params))


@dataclass
class SeqRecord:
    """What happened to one sequence (a request, or a child `id#k` of an n-sample one).

    Steps are engine iterations; times are modeled seconds from the trace's t = 0
    (`kvbench.paged.latency`): `arrival_s` the trace's arrival, `first_token_s` the end of
    the step that sampled its first token, `finish_s` the end of the step that generated
    its last (-1.0 until stamped; 0.0 throughout without a time model).
    """

    id: str
    request: str | int
    arrival_s: float
    prompt_len: int
    output_len: int
    generated: int = 0
    admit_step: int = -1
    first_token_step: int = -1
    finish_step: int = -1
    preemptions: int = 0
    swaps: int = 0
    recomputes: int = 0
    cached_tokens: int = 0
    first_token_s: float = -1.0
    finish_s: float = -1.0

    def key(self) -> tuple:
        """The scheduling decisions, for comparing two runs."""
        return (
            self.id,
            self.generated,
            self.admit_step,
            self.first_token_step,
            self.finish_step,
            self.preemptions,
            self.swaps,
            self.recomputes,
            self.cached_tokens,
        )

    def times(self) -> tuple:
        """(id, arrival_s, first_token_s, finish_s), for comparing two runs' latencies."""
        return (self.id, self.arrival_s, self.first_token_s, self.finish_s)

    def as_dict(self) -> dict[str, Any]:
        """The fields plus this sequence's ttft_s, tpot_s (NaN for one output token),
        e2e_s and normalized_latency_s (per output token): a row of `--out` records."""
        out = asdict(self)
        e2e = self.finish_s - self.arrival_s
        decode = self.finish_s - self.first_token_s
        out.update(
            ttft_s=self.first_token_s - self.arrival_s,
            tpot_s=decode / (self.output_len - 1) if self.output_len > 1 else math.nan,
            e2e_s=e2e,
            normalized_latency_s=e2e / self.output_len,
        )
        return out


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
            the stats mean, p50, p90, p99 (`kvbench.paged.latency`); in `summary()` as
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

    def decisions(self) -> list[tuple]:
        """Per-sequence decisions in a canonical order (compare two runs with ==)."""
        return sorted(r.key() for r in self.records)
