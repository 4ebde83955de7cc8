"""The peers page of the site (peers.html): kvbench beside each peer on the peer benches
(figures, one table per bench with the ratios and the versions measured) and the static
cost of the kernels compiled for sm_80 / sm_90 beside vLLM's."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from kvbench.reports import figure_specs, figures, tables
from kvbench.reports.site_common import slug as _slug

PEERS_HREF = "peers.html"
#: The peer sweeps (suites/bench/sweeps/peers.py), the implementation column, the
#: implementation every ratio is taken against, and the contiguous decode baseline.
PEER_SUITES = ("peers.pool_ops", "peers.trace_replay", "peers.cpu_decode")
PEER_IMPL, PEER_BASELINE, PEER_SDPA = "impl", "kvbench", "sdpa_contiguous"


@dataclass
class PeerSection:
    """One peer sweep on the peers page: what it measured, figures, a side-by-side table."""

    suite: str
    title: str
    text: str
    href: str = ""
    fixed: str = ""
    impls: list[str] = field(default_factory=list)
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    n_keys: int = 0
    figure_files: list[dict[str, str]] = field(default_factory=list)


_PEER_TEXT = {
    "peers.pool_ops": (
        "Block pool operations per second",
        "One seeded random sequence of admit / append / free operations (prefix caching on, "
        "a pool that never runs dry) applied to each allocator; time is the median over "
        "fresh allocators. Equal hit tokens show both did the same prefix-cache work.",
    ),
    "peers.trace_replay": (
        "Trace replay",
        "The same serving trace (8 shared 64-token system prompts plus unique suffixes, 64 "
        "live requests, a pool small enough that cached prefixes are evicted) replayed "
        "through each allocator; time counts the allocator's calls only.",
    ),
    "peers.cpu_decode": (
        "CPU paged decode",
        "One decode step, every sequence at the full context: kvbench's CPU path "
        "(kernels.ops: the in-place C++ kernel, or gather + SDPA where it cannot be built), "
        "vLLM's native cpu_attention_with_kv_cache and torch SDPA over the same K/V laid out "
        "contiguously. 'of copy peak' is K and V bytes read per second over the bandwidth "
        "of a 64 MiB copy (bytes read plus written) timed in the same repeats. Both paged "
        "peers run at the same block size in every row (vLLM's CPU op takes block 16 "
        "through its vec16 ISA and picks vec at multiples of 32; its engine defaults to 128 "
        "on CPU), so each comparison is like for like. A peer whose output differs from "
        "SDPA's by more than 1e-4 is not timed.",
    ),
}

#: Columns of each peer table: (header, metric, unit, for the baseline too?) per
#: implementation; ratios are the metrics the bench emitted (measured in one process).
_PEER_COLUMNS: dict[str, list[tuple[str, str, str, bool]]] = {
    "peers.pool_ops": [
        ("ops/s", "ops_per_s", "ops/s", True),
        ("time", "time", "s", True),
        ("hit tokens", "hit_tokens", "tokens", True),
        ("time / kvbench", "ratio_vs_kvbench", "ratio", False),
    ],
    "peers.trace_replay": [
        ("time", "time", "s", True),
        ("requests/s", "requests_per_s", "requests/s", True),
        ("hit tokens", "hit_tokens", "tokens", True),
        ("time / kvbench", "ratio_vs_kvbench", "ratio", False),
    ],
    "peers.cpu_decode": [
        ("time", "time", "s", True),
        ("time / SDPA", "ratio_vs_sdpa", "ratio", True),
        ("time / kvbench", "ratio_vs_kvbench", "ratio", False),
        ("of copy peak", "copy_peak_fraction", "fraction", True),
    ],
}
_PEER_KEYS = {
    "peers.pool_ops": ["ops", "block_size", "num_blocks"],
    "peers.trace_replay": ["requests", "window", "block_size", "num_blocks"],
    "peers.cpu_decode": ["batch", "context", "block_size"],
}


def _fmt_cell(value: Any, unit: str) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return tables.format_value(value, unit)


def _impl_order(impls: Iterable[str]) -> list[str]:
    """kvbench first, SDPA last, the other peers by name between."""
    rank = {PEER_BASELINE: 0, PEER_SDPA: 2}
    return sorted(dict.fromkeys(impls), key=lambda n: (rank.get(n, 1), n))


def _fixed_text(sub: pd.DataFrame, keys: Sequence[str]) -> str:
    """Case parameters that hold one value in every row of `sub` (e.g. dtype, heads)."""
    skip = {PEER_IMPL, "version", *keys}
    parts = []
    for c in tables.case_columns(sub):
        vals = sub[c].dropna().unique()
        if c not in skip and len(vals) == 1:
            parts.append(f"{c}={tables.format_value(vals[0])}")
    return ", ".join(parts)


def _peer_table(suite: str, sub: pd.DataFrame, impls: list[str]) -> tuple[list, list, int]:
    keys = _PEER_KEYS[suite]
    columns = _PEER_COLUMNS[suite]
    paged = [i for i in impls if i != PEER_SDPA]
    metrics = [m for _, m, _, _ in columns]
    table = tables.beside(sub[sub[PEER_IMPL] != PEER_SDPA], keys, metrics)
    if table.empty:
        return [], [], 0
    index_names = list(table.index.names)
    sdpa: dict[tuple, float] = {}
    if PEER_SDPA in impls:  # contiguous SDPA has no block size: match on the other keys
        sdpa_keys = [k for k in index_names if k != "block_size"]
        st = tables.beside(sub[sub[PEER_IMPL] == PEER_SDPA], sdpa_keys, ["time"])
        for idx, line in st.iterrows():
            idx = idx if isinstance(idx, tuple) else (idx,)
            sdpa[tuple(str(v) for v in idx)] = line.get(("time", PEER_SDPA), math.nan)
    header = list(index_names)
    plan: list[tuple[str, str, str]] = []  # (metric, impl, unit)
    for label, metric, unit, for_baseline in columns:
        for impl in paged:
            if (metric, impl) not in table.columns or (impl == PEER_BASELINE and not for_baseline):
                continue
            header.append(f"{impl} {label}")
            plan.append((metric, impl, unit))
        if metric == "time" and sdpa:
            header.append("SDPA contiguous time")
            plan.append(("time", PEER_SDPA, "s"))
    rows = []
    for idx, line in table.iterrows():
        idx = idx if isinstance(idx, tuple) else (idx,)
        cells = [tables.format_value(v) for v in idx]
        named = dict(zip(index_names, idx, strict=True))
        for metric, impl, unit in plan:
            if impl == PEER_SDPA:
                key = tuple(str(named[k]) for k in index_names if k != "block_size")
                value = sdpa.get(key, math.nan)
            else:
                value = line.get((metric, impl), math.nan)
            cells.append(_fmt_cell(value, unit))
        rows.append(cells)
    return header, rows, len(index_names)


def _peer_figures(suite: str, sub: pd.DataFrame, fig_dir: Path) -> list[dict[str, str]]:
    specs = [s for s in figure_specs.specs_for(suite) if not s.fixed]
    if suite == "peers.cpu_decode":
        # One pair of figures per batch size measured at two or more context lengths; a
        # batch with one context would draw lone points, which its table rows show better.
        contexts = sub.dropna(subset=["batch"]).groupby("batch")["context"].nunique()
        for b in sorted(contexts[contexts >= 2].index):
            b = int(b)
            for metric, title, ylabel, logy in (
                ("time", "Decode time vs context", "seconds per decode step", True),
                ("ratio_vs_sdpa", "Decode time / SDPA vs context", "paged / SDPA", False),
            ):
                specs.append(
                    figure_specs.FigureSpec(
                        suite,
                        f"{title} (batch {b})",
                        "context",
                        (metric,),
                        fixed={"batch": b},
                        logx=True,
                        logy=logy,
                        ylabel=ylabel,
                        ignore=("version",),
                    )
                )
        specs.append(
            figure_specs.FigureSpec(
                suite,
                "Peer decode time / kvbench decode time (paired)",
                "context",
                ("ratio_vs_kvbench",),
                logx=True,
                ylabel="peer / kvbench",
                ignore=("version",),
            )
        )
    out = []
    for i, spec in enumerate(specs):
        svg = figures.render(sub, spec)
        if svg is None:
            continue
        fname = f"peers-{_slug(suite)}-{i}.svg"
        (fig_dir / fname).write_text(svg, encoding="utf-8")
        out.append({"src": f"figures/{fname}", "title": spec.title})
    return out


def peers_view(frame: pd.DataFrame, fig_dir: Path, hrefs: dict[str, str]) -> dict[str, Any]:
    """What site_peers.html.j2 shows: for each peer sweep with rows, its figures and a
    table with the implementations side by side; which implementations (and versions)
    were measured; and whether any peer besides kvbench was. Empty sections are left out
    (the template then says how to produce the rows)."""
    sections = []
    versions: dict[str, str] = {}
    for suite in PEER_SUITES:
        sub = frame[frame["suite"] == suite] if not frame.empty else frame
        if sub.empty or PEER_IMPL not in sub.columns:
            continue
        sub = sub[sub[PEER_IMPL].notna()]
        if sub.empty:
            continue
        impls = _impl_order(sub[PEER_IMPL].astype(str))
        if "version" in sub.columns:
            for impl, ver in sub[[PEER_IMPL, "version"]].dropna().itertuples(index=False):
                versions.setdefault(str(impl), str(ver))
        title, text = _PEER_TEXT[suite]
        section = PeerSection(suite, title, text, hrefs.get(suite, ""), impls=impls)
        section.header, section.rows, section.n_keys = _peer_table(suite, sub, impls)
        section.fixed = _fixed_text(sub, _PEER_KEYS[suite])
        section.figure_files = _peer_figures(suite, sub, fig_dir)
        sections.append(section)
    static = _peer_static_section(frame)
    if static is not None:
        sections.append(static)
    measured = _impl_order({i for s in sections for i in s.impls})
    return {
        "sections": sections,
        "impls": [(i, versions.get(i, "")) for i in measured],
        "has_peer": any(i not in (PEER_BASELINE, PEER_SDPA) for i in measured),
    }


#: Static costs of vLLM's Triton kernels beside kvbench's (`kvbench kernels --peers`).
PEER_STATIC_SUITE = "kernels.aot.peers"
_STATIC_KEYS = ["dtype", "head_dim", "block_size", "arch", "role", "impl", "variant", "kernel"]
_STATIC_METRICS = [
    ("regs/thread", "registers"),
    ("spills (B)", "spills"),
    ("shared (B)", "shared_bytes"),
    ("SASS (instr)", "sass_instructions"),
]


def _peer_static_section(frame: pd.DataFrame) -> PeerSection | None:
    """The side-by-side static table: one line per (shape, arch, kernel), kvbench first in
    each group; None when no run holds `kernels.aot.peers` rows."""
    if frame.empty or "suite" not in frame.columns:
        return None
    sub = frame[frame["suite"] == PEER_STATIC_SUITE]
    if sub.empty or not set(_STATIC_KEYS) <= set(sub.columns):
        return None
    wide = sub.pivot_table(index=_STATIC_KEYS, columns="metric", values="value", aggfunc="last")
    order = {"decode": 0, "decode-reduce": 1, "prefill": 2, "kv-write": 3}
    lines = sorted(
        wide.iterrows(),
        key=lambda kv: (
            *[str(v) for v in kv[0][:4]],
            order.get(kv[0][4], 9),
            kv[0][5] != "kvbench",
        ),
    )
    rows = []
    for idx, line in lines:
        named = dict(zip(_STATIC_KEYS, idx, strict=True))
        bs = named["block_size"]
        if named["impl"] == PEER_BASELINE and named["role"] != "kv-write":
            bs = "any (run time)"
        cells = [str(named[k]) if k != "block_size" else str(bs) for k in _STATIC_KEYS]
        cells += [tables.format_value(line.get(m, math.nan)) for _, m in _STATIC_METRICS]
        rows.append(cells)
    impls = _impl_order(sub["impl"].astype(str))
    return PeerSection(
        PEER_STATIC_SUITE,
        "Static cost of the GPU kernels (sm_80 / sm_90, compiled here)",
        "vLLM's Triton attention kernels compiled ahead of time with the configurations its "
        "own launchers choose (32 query / 8 KV heads; decode: 4 sequences at context 4096, "
        "prefill: 4 x 128 new tokens), beside kvbench's kernels for the same shapes: "
        "registers per thread, spill bytes, shared memory per block and SASS instructions. "
        "Static figures from the compiler, measured without a GPU; not times.",
        impls=impls,
        header=["dtype", "head dim", "block size", "arch", "role", "impl", "variant", "kernel"]
        + [h for h, _ in _STATIC_METRICS],
        rows=rows,
        n_keys=len(_STATIC_KEYS),
    )
