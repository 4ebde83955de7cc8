"""Build the static HTML report from result files alone.

    build_site(runs, out_dir) -> out_dir/index.html

Pages: `index.html` (runs with their environments, how many planned cases ended and how
(a killed run reads "incomplete: N of M cases"), skipped lines, sweeps waiting for a
module, and the list of sweeps with their failed and skipped cases), one
`sweep-<name>.html` per sweep (its figures and its table, with the related published
claims, and the cases that failed or were skipped, with why), `claims.html` (every claim of the seed
literature with source, measured value and verdict, per run), `peers.html` (kvbench
beside other implementations from the `peers.*` sweeps, with the ratios the bench
measured and the properties that differ by design; without peer rows it says how to
produce them) and, with two or more runs, `compare.html` (the first two runs side by
side). Figures are SVG files under `figures/`; nothing is fetched from the network, so
the folder can be published as it is.

All text that comes from result files is escaped by jinja2's autoescaping; figure text is
drawn as paths (no markup from the data reaches the SVG as text).
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from kvbench.reports import claims as claims_mod
from kvbench.reports import figures, tables
from kvbench.reports import serving as serving_tables
from kvbench.reports.results import ResultsError, Run, to_frame
from kvbench.reports.site_status import SweepOutcomes, run_outcomes, sweep_outcomes

TEMPLATE_DIR = Path(__file__).resolve().parent


@dataclass
class SweepPage:
    name: str
    href: str
    description: str
    cases: int
    header: list[str] = field(default_factory=list)
    rows: list[list[dict[str, str]]] = field(default_factory=list)
    n_keys: int = 0
    figure_files: list[dict[str, str]] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    kind_note: str = ""
    derived: list[serving_tables.DerivedTable] = field(default_factory=list)
    outcomes: SweepOutcomes = field(default_factory=SweepOutcomes)

    @property
    def figures(self) -> int:
        return len(self.figure_files)


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "-", text).strip("-.") or "sweep"


def _env() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
    )


def _descriptions(runs: Sequence[Run]) -> dict[str, str]:
    out: dict[str, str] = {}
    for run in runs:
        for hdr in [run.header, *run.resumes]:
            bench = hdr.get("bench") if isinstance(hdr, dict) else None
            desc = bench.get("descriptions") if isinstance(bench, dict) else None
            if isinstance(desc, dict):
                out.update({str(k): str(v) for k, v in desc.items()})
    return out


def _waiting(run: Run) -> list[tuple[str, str]]:
    bench = run.header.get("bench")
    waiting = bench.get("waiting") if isinstance(bench, dict) else None
    if not isinstance(waiting, dict):
        return []
    return [
        (str(k), ", ".join(map(str, v)) if isinstance(v, list) else str(v))
        for k, v in waiting.items()
    ]


def _cell(text: str, spread: str = "") -> dict[str, str]:
    return {"text": text, "spread": spread}


def _sweep_page(
    name: str, frame: pd.DataFrame, href: str, description: str, fig_dir: Path
) -> SweepPage:
    keys, metrics, rows, spread = tables.wide_with_spread(frame)
    unit = tables.units(frame)
    page = SweepPage(name, href, description, len(rows))
    page.header = keys + metrics
    page.n_keys = len(keys)
    for row, row_spread in zip(rows, spread, strict=True):
        cells = [_cell(tables.format_value(v)) for v in row[: len(keys)]]
        for v, m, sp in zip(row[len(keys) :], metrics, row_spread, strict=True):
            u = unit.get(m, "")
            cells.append(_cell(tables.format_value(v, u), sp.text(u) if sp is not None else ""))
        page.rows.append(cells)
    page.kind_note = _provenance(frame)
    for i, spec in enumerate(figures.specs_for(name)):
        svg = figures.render(frame, spec)
        if svg is None:
            continue
        fname = f"{_slug(name)}-{i}.svg"
        (fig_dir / fname).write_text(svg, encoding="utf-8")
        page.figure_files.append(
            {
                "src": f"figures/{fname}",
                "title": spec.title,
                "spread": figures.spread_note(frame, spec),
            }
        )
    page.derived = serving_tables.derived_tables(name, frame)
    return page


def backends(frame: pd.DataFrame) -> list[str]:
    """The kernel backends a suite's rows name: a `backend` case parameter, or the
    `backend_is_triton` metric kernel sweeps record; [] when the rows name none."""
    out: list[str] = []
    if "backend" in frame.columns:
        out += sorted({str(b) for b in frame["backend"].dropna()})
    flags = frame[frame["metric"] == "backend_is_triton"]["value"]
    if not flags.empty:
        out += sorted({"triton" if v > 0 else "torch" for v in flags})
    return list(dict.fromkeys(out))


def provenance(run: Run, frame: pd.DataFrame) -> str:
    """One line naming where a suite's rows of `run` were measured: run id, device (and
    CPU), torch / triton versions, whether Triton ran in its interpreter, and the kernel
    backends the rows name."""
    env = run.environment
    device = str(env.get("device", "?"))
    if device == "cpu" and env.get("cpu_model"):
        device = f"cpu ({env['cpu_model']}, {env.get('cpu_count', '?')} cores)"
    parts = [f"run {run.run_id}", f"started {run.created or '?'}", f"device {device}"]
    versions = [f"{k} {env[k]}" for k in ("torch", "triton") if env.get(k)]
    if versions:
        parts.append(", ".join(versions))
    interp = env.get("triton_interpret")
    if interp not in (None, "", "0"):
        parts.append("Triton in its interpreter (TRITON_INTERPRET=1)")
    used = backends(frame)
    parts.append(f"kernel backend {', '.join(used)}" if used else "no kernel backend named")
    return "; ".join(parts)


def completeness(run: Run) -> str:
    """'' for a run that ended every case it planned; else a sentence saying what is
    missing (cases that never ended, shards not merged, a torn last line of a killed
    run)."""
    notes = []
    ended = run_outcomes(run)["incomplete"]
    if ended:
        notes.append(
            f"{ended} ended (killed or interrupted); `kvbench bench --resume {run.run_id}` "
            "measures the rest"
        )
    bench = run.header.get("bench")
    missing = bench.get("missing_shards") if isinstance(bench, dict) else None
    if isinstance(missing, list) and missing:
        notes.append(f"incomplete: merged without shard(s) {', '.join(map(str, missing))}")
    torn = [p for p in run.problems if "truncated" in p.message]
    if torn:
        notes.append(
            f"its last line is torn (line {torn[-1].line}): the writer was killed mid-write"
        )
    return "; ".join(notes)


#: Written into every site folder, so a rebuild knows the folder is a kvbench site.
SITE_MARKER = ".kvbench-site"


def check_site_dir(out_dir: str | Path) -> None:
    """Refuse (ResultsError) to build a site into a folder that holds something other
    than a kvbench site: a rebuild replaces the folder's HTML pages and figures, which
    must never be someone else's files. An empty or missing folder is fine."""
    out = Path(out_dir)
    if not out.is_dir() or not any(out.iterdir()) or (out / SITE_MARKER).is_file():
        return
    index = out / "index.html"
    try:
        is_site = index.is_file() and "kvbench report" in index.read_text(errors="replace")
    except OSError:
        is_site = False
    if not is_site:
        raise ResultsError(
            f"--out {str(out)!r} is a folder with other files in it, not a kvbench site; "
            "building the site there would replace its HTML files: give a new or empty folder"
        )


def _provenance(frame: pd.DataFrame) -> str:
    """What a kernel sweep's figures are: measured on which backend, or predicted."""
    suite = str(frame["suite"].iloc[0]) if len(frame) else ""
    if suite == "kernel.predicted":
        return "Predicted (not measured): kernels.predict over A100 / H100 / H200 profiles."
    if not suite.startswith("kernel."):
        return ""

    def flag(metric: str) -> bool | None:
        v = frame[frame["metric"] == metric]["value"]
        return None if v.empty else bool((v > 0).all())

    if flag("backend_is_triton"):
        return "Measured on a GPU: Triton kernels vs SDPA on contiguous K/V."
    if flag("kernel_path_is_cpp"):
        return (
            "Measured on a CPU: kvbench's C++ kernel reading blocks in place vs the faster "
            "contiguous SDPA call."
        )
    return "Measured on a CPU: the torch path (gather + SDPA) vs contiguous SDPA."


def build_site(
    runs: Sequence[Run],
    out_dir: str | Path = "out/site",
    gates: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write the site for `runs` into `out_dir` (replacing an earlier site there) and
    return the path of its index.html. Raises ResultsError when there is nothing to show.

    `gates`: (name, HTML fragment) pairs from `reports.gate.render_html`, shown on
    gate.html (the fragments are escaped by the gate's own template)."""
    if not runs:
        raise ResultsError("no runs to report; run `kvbench bench` first")
    for run in runs:
        if not run.rows and not run.statuses:
            raise ResultsError(f"run {run.run_id} ({run.path}) has no measurements to report")
    out = Path(out_dir)
    check_site_dir(out)
    fig_dir = out / "figures"
    if fig_dir.exists():
        shutil.rmtree(fig_dir)
    fig_dir.mkdir(parents=True)
    for old in out.glob("*.html"):
        old.unlink()
    (out / SITE_MARKER).write_text("built by kvbench report\n", encoding="utf-8")
    env = _env()
    frame = tables.latest(to_frame(runs))
    descriptions = _descriptions(runs)
    ended = sweep_outcomes(runs)
    suites = list(dict.fromkeys([*frame["suite"], *ended]))
    hrefs: dict[str, str] = {}
    for s in suites:
        base, n = f"sweep-{_slug(s)}", 1
        href = f"{base}.html"
        while href in hrefs.values():
            n += 1
            href = f"{base}-{n}.html"
        hrefs[s] = href
    per_run_claims = {
        run.run_id: claims_mod.evaluate(frame[frame["run_id"] == run.run_id]) for run in runs
    }
    pages = [
        _sweep_page(s, frame[frame["suite"] == s], hrefs[s], descriptions.get(s, ""), fig_dir)
        if (frame["suite"] == s).any()
        else SweepPage(s, hrefs[s], descriptions.get(s, ""), 0)
        for s in suites
    ]
    for page in pages:
        page.outcomes = ended.get(page.name, SweepOutcomes())
        sub = frame[frame["suite"] == page.name]
        for run in runs:
            mine = sub[sub["run_id"] == run.run_id]
            if not mine.empty:
                page.provenance.append(provenance(run, mine))
                note = completeness(run)
                if note:
                    page.incomplete.append(f"run {run.run_id}: {note}")
    common = {
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "has_compare": len(runs) >= 2,
        "has_gate": bool(gates),
        "nav_sweeps": [{"name": "peers", "href": PEERS_HREF}]
        + [{"name": p.name, "href": p.href} for p in pages],
        "incomplete_runs": [
            {"run_id": r.run_id, "note": completeness(r)} for r in runs if completeness(r)
        ],
    }

    def write(name: str, template: str, **ctx: Any) -> None:
        html = env.get_template(template).render(**common, **ctx)
        (out / name).write_text(html, encoding="utf-8")

    first = per_run_claims[runs[0].run_id]
    for page in pages:
        related = [(c, v) for c, v in first if page.name in claims_mod.CLAIM_SUITES.get(c.key, ())]
        write(page.href, "site_sweep.html.j2", title=page.name, sweep=page, claims=related)
    counts: dict[str, int] = {}
    for _, v in first:
        counts[v.verdict] = counts.get(v.verdict, 0) + 1
    write(
        "index.html",
        "site_index.html.j2",
        title="Runs",
        sweeps=pages,
        claim_counts=sorted(counts.items()),
        runs=[_run_view(r) for r in runs],
    )
    write(
        "claims.html",
        "site_claims.html.j2",
        title="Claims",
        runs=[
            {
                "run_id": r.run_id,
                "device": r.environment.get("device", "?"),
                "claims": per_run_claims[r.run_id],
            }
            for r in runs
        ],
    )
    write(PEERS_HREF, "site_peers.html.j2", title="Peers", **peers_view(frame, fig_dir, hrefs))
    if gates:
        write("gate.html", "site_gate.html.j2", title="Gate", gates=list(gates))
    if len(runs) >= 2:
        a, b = runs[0], runs[1]
        write(
            "compare.html",
            "site_compare.html.j2",
            title="Compare",
            **_compare(a, b, frame, per_run_claims),
        )
    return out / "index.html"


# ---------------------------------------------------------------- peers page
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
        "One decode step, every sequence at the full context: kvbench's torch path "
        "(kernels.ops), vLLM's native cpu_attention_with_kv_cache and torch SDPA over the "
        "same K/V laid out contiguously. Both paged peers run at the same block size in "
        "every row (vLLM's CPU op takes block 16 through its vec16 ISA and picks vec "
        "at multiples of 32; its engine defaults to 128 on CPU), so each comparison is like "
        "for like. A peer whose output differs from SDPA's by more than 1e-4 is not timed.",
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


def _impl_order(impls: Sequence[str]) -> list[str]:
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
    specs = [s for s in figures.specs_for(suite) if not s.fixed]
    if suite == "peers.cpu_decode":  # one pair of figures per batch size measured
        for b in sorted(sub["batch"].dropna().unique()):
            b = int(b)
            for metric, title, ylabel, logy in (
                ("time", "Decode time vs context", "seconds per decode step", True),
                ("ratio_vs_sdpa", "Decode time / SDPA vs context", "paged / SDPA", False),
            ):
                specs.append(
                    figures.FigureSpec(
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
            figures.FigureSpec(
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


def _run_view(run: Run) -> dict[str, Any]:
    env = run.environment
    bench = run.header.get("bench")
    return {
        "run_id": run.run_id,
        "created": run.created,
        "path": str(run.path),
        "rows": len(run.rows),
        "suites": run.suites,
        "resumes": len(run.resumes),
        "environment": [(k, _fmt_env(env[k])) for k in sorted(env)],
        "bench": json.dumps(
            {k: v for k, v in bench.items() if k != "descriptions"}, sort_keys=True, default=str
        )
        if isinstance(bench, dict)
        else "",
        "waiting": _waiting(run),
        "problems": [str(p) for p in run.problems],
        "incomplete": completeness(run),
        "outcomes": run_outcomes(run),
    }


def _fmt_env(v: Any) -> str:
    if isinstance(v, float):
        return tables.format_value(v)
    return v if isinstance(v, str) else json.dumps(v, default=str)


def _case_text(key: str) -> str:
    try:
        _, case = json.loads(key)
        return ", ".join(f"{k}={v}" for k, v in case.items())
    except (ValueError, TypeError):
        return key


def _compare(a: Run, b: Run, frame: pd.DataFrame, claims: dict) -> dict[str, Any]:
    ea, eb = a.environment, b.environment
    env_rows = [
        (k, _fmt_env(ea.get(k, "")), _fmt_env(eb.get(k, ""))) for k in sorted(set(ea) | set(eb))
    ]
    both = tables.compare(frame[frame["run_id"] == a.run_id], frame[frame["run_id"] == b.run_id])
    rows = [
        {
            "suite": r.suite,
            "case": _case_text(r.case_key),
            "metric": r.metric,
            "a": tables.format_value(r.value_a, r.unit),
            "b": tables.format_value(r.value_b, r.unit),
            "spread_a": r.spread_a.text(r.unit) if r.spread_a is not None else "",
            "spread_b": r.spread_b.text(r.unit) if r.spread_b is not None else "",
            "ratio": "" if pd.isna(r.ratio) else tables.format_value(r.ratio, "ratio"),
            "verdict": r.verdict,
        }
        for r in both.itertuples(index=False)
    ]
    counts = {v: sum(1 for r in rows if r["verdict"] == v) for v in tables._RANK}
    claim_rows = [
        (ca, va, vb) for (ca, va), (_, vb) in zip(claims[a.run_id], claims[b.run_id], strict=True)
    ]
    return {
        "a": a,
        "b": b,
        "env_rows": env_rows,
        "rows": rows,
        "counts": counts,
        "claim_rows": claim_rows,
    }
