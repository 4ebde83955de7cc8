"""Which figures each sweep's page draws: one `FigureSpec` per figure, all in `SPECS`.

Each sweep (suite) has zero or more specs: an x case parameter, one or more metrics on y,
optional fixed case parameters (a slice of the grid), scales, and the provenance kinds the
figure shows. Suites without a spec get a table only. This is the table a new figure is
added to; how a spec is drawn (series labels, colours, panels, axes) is
`reports.figures`, which takes a spec and never names a sweep.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kvbench.reports.provenance import COUNTED, MEASURED, MODELED
from kvbench.workloads.block_size import DEFAULT_BLOCK_SIZE


@dataclass(frozen=True)
class FigureSpec:
    """One figure of one suite (see the module docstring)."""

    suite: str
    title: str
    x: str
    metrics: tuple[str, ...]
    fixed: dict[str, Any] = field(default_factory=dict)
    kind: str = "line"  # or "bar"
    logx: bool = False
    logy: bool = False
    ylabel: str = ""
    percent: bool = False  # y values are fractions: show as %
    #: case parameters that never define a series of their own (they follow from others,
    #: e.g. a peer's library version follows from the peer)
    ignore: tuple[str, ...] = ()
    #: metrics whose value at an x is the same in every series (a trace's ceiling beside
    #: each policy's hit rate): drawn once, labelled by the metric alone
    shared: tuple[str, ...] = ()
    #: base of the log x axis (2 for sizes and batches, 10 for decades of capacity)
    logx_base: int = 2
    #: what produced the numbers this figure draws (`reports.provenance` kinds), where its
    #: sweep mixes kinds and the figure shows only some of them (trace.serving's modeled
    #: views beside its measured replay); () = the sweep's own kinds
    kinds: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return "".join(c if c.isalnum() else "-" for c in f"{self.suite}-{self.title}").lower()


SPECS: tuple[FigureSpec, ...] = (
    FigureSpec(
        "capacity.footprint",
        "KV bytes per token by model",
        "model",
        ("bytes_per_token",),
        kind="bar",
        ylabel="bytes per token",
        logy=True,
    ),
    FigureSpec(
        "serving.batch",
        "Utilization vs batch size (scheduler replay)",
        "batch",
        ("utilization",),
        percent=True,
        ylabel="live / held slots",
        kinds=(COUNTED,),
    ),
    FigureSpec(
        "serving.batch",
        "Modeled throughput vs batch size",
        "batch",
        ("tokens_per_second",),
        ylabel="tokens / s (modeled)",
        kinds=(MODELED,),
    ),
    FigureSpec(
        "serving.batch",
        "Peak concurrency vs batch size",
        "batch",
        ("peak_concurrency",),
        ylabel="running requests",
        kinds=(COUNTED,),
    ),
    FigureSpec(
        "serving.block_size",
        "Modeled throughput vs block size",
        "block_size",
        ("tokens_per_second",),
        logx=True,
        ylabel="tokens / s (modeled)",
        kinds=(MODELED,),
    ),
    FigureSpec(
        "serving.block_size",
        "Utilization vs block size",
        "block_size",
        ("utilization",),
        logx=True,
        percent=True,
        ylabel="live / held slots",
        kinds=(COUNTED,),
    ),
    FigureSpec(
        "serving.sample_preemption",
        "Modeled throughput: n-sample requests preempted whole vs per sample",
        "n",
        ("tokens_per_second",),
        kind="bar",
        ylabel="tokens / s (modeled)",
        kinds=(MODELED,),
    ),
    FigureSpec(
        "capacity.concurrency",
        "Requests held in a 42 GB budget",
        "avg_len",
        ("paged_requests", "contiguous_requests"),
        logx=True,
        logy=True,
        ylabel="concurrent requests",
    ),
    FigureSpec(
        "capacity.prefix_formula",
        "Prefix storage saved vs block size",
        "block_size",
        ("saved_fraction",),
        logx=True,
        percent=True,
        ylabel="saved",
    ),
    FigureSpec(
        "utilization.static",
        "Utilization vs batch size",
        "batch",
        ("utilization",),
        logx=True,
        percent=True,
        ylabel="live / held slots",
    ),
    FigureSpec(
        "kernel.decode",
        "Paging overhead vs context length (same kernel, scattered vs contiguous layout)",
        "ctx_len",
        ("paging_overhead",),
        fixed={"block_size": DEFAULT_BLOCK_SIZE},
        logx=True,
        percent=True,
        ylabel="scattered / contiguous layout - 1",
    ),
    FigureSpec(
        "kernel.decode",
        "Second baseline: paged kernel vs SDPA on contiguous K/V",
        "ctx_len",
        ("overhead_vs_sdpa",),
        fixed={"block_size": DEFAULT_BLOCK_SIZE},
        logx=True,
        percent=True,
        ylabel="paged / SDPA - 1",
    ),
    FigureSpec(
        "kernel.decode",
        "Decode time vs context length",
        "ctx_len",
        ("time_paged", "time_paged_contiguous_layout", "time_contiguous"),
        fixed={"block_size": DEFAULT_BLOCK_SIZE},
        logx=True,
        logy=True,
        ylabel="seconds per call",
    ),
    FigureSpec(
        "kernel.decode",
        "Paging overhead vs block size (same kernel, scattered vs contiguous layout)",
        "block_size",
        ("paging_overhead",),
        fixed={"ctx_len": 1024},
        logx=True,
        percent=True,
        ylabel="scattered / contiguous layout - 1",
    ),
    FigureSpec(
        "kernel.decode",
        "Achieved bandwidth vs copy peak",
        "ctx_len",
        ("bandwidth_fraction", "contiguous_bandwidth_fraction"),
        fixed={"block_size": DEFAULT_BLOCK_SIZE},
        logx=True,
        logy=True,
        percent=True,
        ylabel="of copy peak",
    ),
    FigureSpec(
        "kernel.predicted",
        "Predicted decode HBM fraction vs context length (predicted, not measured)",
        "ctx_len",
        ("predicted_hbm_fraction",),
        fixed={"kernel": "decode", "block_size": DEFAULT_BLOCK_SIZE},
        logx=True,
        percent=True,
        ylabel="of HBM bandwidth (predicted)",
    ),
    FigureSpec(
        "kernel.predicted",
        "Predicted decode time vs context length (predicted, not measured)",
        "ctx_len",
        ("predicted_time",),
        fixed={"kernel": "decode", "block_size": DEFAULT_BLOCK_SIZE},
        logx=True,
        logy=True,
        ylabel="seconds per call (predicted)",
    ),
    FigureSpec(
        "kernel.prefill",
        "Paging overhead vs context length (same kernel, scattered vs contiguous layout)",
        "ctx_len",
        ("paging_overhead",),
        logx=True,
        percent=True,
        ylabel="scattered / contiguous layout - 1",
    ),
    FigureSpec(
        "kernel.prefill",
        "Prefill time vs context length",
        "ctx_len",
        ("time_paged", "time_paged_contiguous_layout", "time_contiguous"),
        logx=True,
        logy=True,
        ylabel="seconds per call",
    ),
    FigureSpec(
        "cow.parallel_sampling",
        "KV saved by sharing among n samples",
        "n",
        ("saved_fraction",),
        percent=True,
        ylabel="saved (time-averaged)",
    ),
    FigureSpec(
        "cow.beam_search",
        "KV saved by sharing beams",
        "width",
        ("saved_fraction",),
        percent=True,
        ylabel="saved (time-averaged)",
    ),
    FigureSpec(
        "prefix.scenarios",
        "Prefix caching savings by scenario",
        "scenario",
        ("saved_fraction", "published_saved_fraction"),
        kind="bar",
        percent=True,
        ylabel="KV memory saved",
    ),
    FigureSpec(
        "prefix.shared_prompt",
        "100 requests sharing 1,000 prompt tokens",
        "mode",
        ("saved_fraction",),
        kind="bar",
        percent=True,
        ylabel="prefix blocks saved",
    ),
    FigureSpec(
        "peers.pool_ops",
        "Block pool operations per second",
        "impl",
        ("ops_per_s",),
        kind="bar",
        ylabel="operations / s",
        ignore=("version",),
    ),
    FigureSpec(
        "peers.trace_replay",
        "Trace replay time",
        "impl",
        ("time",),
        kind="bar",
        ylabel="seconds in allocator calls",
        ignore=("version",),
    ),
    FigureSpec(
        "peers.cpu_decode",
        "CPU decode time vs context (batch 8)",
        "context",
        ("time",),
        fixed={"batch": 8},
        logx=True,
        logy=True,
        ylabel="seconds per decode step",
        ignore=("version",),
    ),
    FigureSpec(
        "peers.cpu_decode",
        "CPU decode time / SDPA time (batch 8)",
        "context",
        ("ratio_vs_sdpa",),
        fixed={"batch": 8},
        logx=True,
        ylabel="paged / contiguous SDPA",
        ignore=("version",),
    ),
    FigureSpec(
        "serving.measured",
        "Tokens/s vs batch size: measured here beside the calibrated CPU model",
        "batch",
        ("tokens_per_second", "tokens_per_second_modeled"),
        ylabel="tokens/s (measured / modeled)",
    ),
    FigureSpec(
        "serving.measured",
        "Normalized latency vs request rate: measured here beside the calibrated CPU model",
        "rate",
        ("normalized_latency", "normalized_latency_modeled"),
        logy=True,
        ylabel="mean normalized latency [s/token]",
        ignore=("duration",),
    ),
    *(
        FigureSpec(
            "trace.prefix_capacity",
            f"Prefix hit rate vs cache capacity, Mooncake conversation trace, block {bs} "
            "(computed exactly)",
            "capacity_tokens",
            ("hit_rate", "hit_rate_ceiling"),
            fixed={"block_size": bs, "trace": "mooncake-conversation"},
            logx=True,
            percent=True,
            ylabel="prefix-hit tokens / prompt tokens",
            ignore=("version",),
            shared=("hit_rate_ceiling",),
            logx_base=10,
        )
        for bs in (512, 16)
    ),
    *(
        FigureSpec(
            "trace.serving",
            title,
            "time_scale",
            metrics,
            fixed={"view": "grid"},
            logy=logy,
            percent=percent,
            ylabel=ylabel,
            kinds=(MODELED,),
        )
        for title, metrics, ylabel, logy, percent in (
            (
                "Goodput and throughput vs time scale (modeled)",
                ("goodput", "requests_per_second"),
                "requests/s (modeled)",
                False,
                False,
            ),
            (
                "SLO attainment vs time scale (modeled)",
                ("slo_attainment",),
                "requests meeting the SLO",
                False,
                True,
            ),
            (
                "TTFT vs time scale (modeled)",
                ("ttft_p50", "ttft_p90", "ttft_p99"),
                "time to first token [s] (modeled)",
                True,
                False,
            ),
            (
                "TPOT vs time scale (modeled)",
                ("tpot_p50", "tpot_p90", "tpot_p99"),
                "time per output token [s] (modeled)",
                True,
                False,
            ),
        )
    ),
    FigureSpec(
        "trace.serving",
        "Timeline: running and waiting sequences (modeled)",
        "t_s",
        ("window_running", "window_waiting"),
        fixed={"view": "timeline"},
        ylabel="sequences (window mean)",
        kinds=(MODELED,),
    ),
    FigureSpec(
        "trace.serving",
        "Timeline: KV in use, KV utilization, prefix hit rate (modeled)",
        "t_s",
        ("window_kv_used", "window_kv_utilization", "window_prefix_hit_rate"),
        fixed={"view": "timeline"},
        percent=True,
        ylabel="fraction (window)",
        kinds=(MODELED,),
    ),
    FigureSpec(
        "trace.serving",
        "Engine replay time at time scale 1 (measured here: median of the replay's runs)",
        "window_s",
        ("replay_wall_time", "replay_cpu_time"),
        fixed={"view": "replay"},
        kind="bar",
        ylabel="host seconds (measured here)",
        kinds=(MEASURED,),
    ),
    FigureSpec(
        "preempt.swap_vs_recompute",
        "Swap vs recompute cost",
        "seq_len",
        ("swap_seconds", "recompute_seconds"),
        fixed={"block_size": DEFAULT_BLOCK_SIZE},
        logx=True,
        logy=True,
        ylabel="seconds",
    ),
)


def specs_for(suite: str) -> list[FigureSpec]:
    """The figure specs of `suite` (possibly none)."""
    return [s for s in SPECS if s.suite == suite]
