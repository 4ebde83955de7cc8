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
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from kvbench.reports import calibration as calibration_page
from kvbench.reports import claims as claims_mod
from kvbench.reports import (
    figure_specs,
    figures,
    figures_serving,
    fp8_tables,
    kernel_labels,
    table_columns,
    tables,
)
from kvbench.reports import kv_specs as kv_specs_page
from kvbench.reports import provenance as produced_by
from kvbench.reports import serving as serving_tables
from kvbench.reports.site_common import slug as _slug
from kvbench.reports.site_peers import PEERS_HREF, peers_view
from kvbench.reports.site_status import SweepOutcomes, run_outcomes, sweep_outcomes
from kvbench.reports.store.frame import to_frame
from kvbench.reports.store.reader import Run
from kvbench.reports.store.schema import ResultsError

TEMPLATE_DIR = Path(__file__).resolve().parent


@dataclass
class SweepPage:
    name: str
    href: str
    description: str
    cases: int
    header: list[str] = field(default_factory=list)
    rows: list[list[dict[str, str]]] = field(default_factory=list)
    #: debug columns (table_columns.is_detail), shown collapsed under the main table
    detail_header: list[str] = field(default_factory=list)
    detail_rows: list[list[dict[str, str]]] = field(default_factory=list)
    n_keys: int = 0
    figure_files: list[dict[str, str]] = field(default_factory=list)
    provenance: list[str] = field(default_factory=list)
    incomplete: list[str] = field(default_factory=list)
    kind_note: str = ""
    #: what produced the numbers (reports.provenance): the short tag and its sentence
    produced: str = ""
    produced_sentence: str = ""
    derived: list[serving_tables.DerivedTable] = field(default_factory=list)
    #: case parameters every case shares, stated once above the table ("name = value")
    fixed: list[str] = field(default_factory=list)
    outcomes: SweepOutcomes = field(default_factory=SweepOutcomes)

    @property
    def figures(self) -> int:
        return len(self.figure_files)


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
    name: str,
    frame: pd.DataFrame,
    href: str,
    description: str,
    fig_dir: Path,
    declared: Mapping[str, tuple[str, ...]],
) -> SweepPage:
    keys, metrics, rows, spread = tables.wide_with_spread(frame)
    unit = tables.units(frame)
    page = SweepPage(name, href, description, len(rows))
    main = [j for j, m in enumerate(metrics) if not table_columns.is_detail(m, name)]
    detail = [j for j, m in enumerate(metrics) if table_columns.is_detail(m, name)]
    shown, page.fixed = _fixed_keys(name, keys, rows)
    page.header = [table_columns.header(keys[i]) for i in shown] + [metrics[j] for j in main]
    page.detail_header = [table_columns.header(keys[i]) for i in shown]
    page.detail_header += [metrics[j] for j in detail]
    page.n_keys = len(shown)
    for row, row_spread in zip(rows, spread, strict=True):
        keys_cells = [
            _cell(tables.format_value(row[i], table_columns.param_cell_unit(keys[i])))
            for i in shown
        ]
        cells = []
        for v, m, sp in zip(row[len(keys) :], metrics, row_spread, strict=True):
            u = unit.get(m, "")
            cells.append(_cell(tables.format_value(v, u), sp.text(u) if sp is not None else ""))
        page.rows.append(keys_cells + [cells[j] for j in main])
        if detail:
            page.detail_rows.append(keys_cells + [cells[j] for j in detail])
    page.kind_note = _provenance(frame)
    made = produced_by.produced(name, frame, declared)
    page.produced, page.produced_sentence = made.tag(), made.sentence()
    for i, spec in enumerate(figure_specs.specs_for(name)):
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
                "produced": made.only(spec.kinds).tag(),
            }
        )
    extra = figures_serving.extra_figures(name, frame) + kv_specs_page.extra_figures(name, frame)
    for title, svg in extra:
        fname = f"{_slug(name)}-x{len(page.figure_files)}.svg"
        (fig_dir / fname).write_text(svg, encoding="utf-8")
        page.figure_files.append(
            {"src": f"figures/{fname}", "title": title, "spread": "", "width": "1000"}
        )
    for i, (title, svg) in enumerate(
        calibration_page.scatter_svgs(frame) if name == calibration_page.SUITE else []
    ):
        fname = f"{_slug(name)}-scatter-{i}.svg"
        (fig_dir / fname).write_text(svg, encoding="utf-8")
        page.figure_files.append({"src": f"figures/{fname}", "title": title, "spread": ""})
    page.derived = serving_tables.derived_tables(name, frame)
    page.derived += fp8_tables.derived_tables(name, frame)
    page.derived += kv_specs_page.derived_tables(name, frame)
    if name == calibration_page.SUITE:
        page.derived += calibration_page.error_tables(frame)
    return page


def _fixed_keys(name: str, keys: list[str], rows: list[list[Any]]) -> tuple[list[int], list[str]]:
    """(indices of the key columns the table shows, "param value" texts of those the page
    states once instead: `table_columns.SUITE_FIXED_KEYS` that take one value)."""
    fixed_names = table_columns.SUITE_FIXED_KEYS.get(name, ())
    shown: list[int] = []
    fixed: list[str] = []
    for i, k in enumerate(keys):
        values = {tables.format_value(r[i]) for r in rows}
        if k in fixed_names and len(values) == 1 and rows:
            text = tables.format_value(rows[0][i], table_columns.param_cell_unit(k))
            fixed.append(f"{table_columns.header(k)} = {text}")
        else:
            shown.append(i)
    return shown, fixed


def backends(frame: pd.DataFrame) -> list[str]:
    """The kernel paths a suite's rows name (`cpu-cpp`, `torch-sdpa`, `triton`; `torch`
    where old rows do not say which CPU path ran): see `kernel_labels.labels_of`."""
    return kernel_labels.labels_of(frame)


def provenance(run: Run, frame: pd.DataFrame, measured: bool = True) -> str:
    """One line naming where a suite's rows of `run` came from: run id, device (and
    CPU), torch / triton versions, whether Triton ran in its interpreter, and the kernel
    backends the rows name. Rows nothing timed (`measured` False: modeled, predicted,
    counted, closed form) name the host that computed them, never a measuring device."""
    env = run.environment
    device = str(env.get("device", "?"))
    if device == "cpu" and env.get("cpu_model"):
        device = f"cpu ({env['cpu_model']}, {env.get('cpu_count', '?')} cores)"
    where = f"device {device}" if measured else f"computed on host {device} (nothing timed)"
    parts = [f"run {run.run_id}", f"started {run.created or '?'}", where]
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

    baseline = (
        "the faster of the two contiguous SDPA calls (enable_gqa or grouped rows)"
        if suite == "kernel.decode"
        else "contiguous SDPA on the first backend torch accepts for it (the rows name it)"
    )
    if flag("backend_is_triton"):
        return f"Measured on a GPU: Triton kernels vs {baseline}."
    if flag("kernel_path_is_cpp"):
        return f"Measured on a CPU: kvbench's C++ kernel reading blocks in place vs {baseline}."
    return f"Measured on a CPU: the torch path (gather + SDPA) vs {baseline}."


def build_site(
    runs: Sequence[Run],
    out_dir: str | Path = "out/site",
    gates: Sequence[tuple[str, str]] = (),
) -> Path:
    """Write the site for `runs` into `out_dir` (replacing an earlier site there) and
    return the path of its index.html. Raises ResultsError when there is nothing to show.

    `gates`: (name, HTML fragment) pairs from `suites.gate.render_html`, shown on
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
    declared = produced_by.declared_kinds(hdr for run in runs for hdr in [run.header, *run.resumes])
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
        _sweep_page(
            s, frame[frame["suite"] == s], hrefs[s], descriptions.get(s, ""), fig_dir, declared
        )
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
                kinds = produced_by.kinds_of(page.name, declared)
                page.provenance.append(provenance(run, mine, produced_by.MEASURED in kinds))
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
        # a page's claims are judged on the runs that measured its sweep (another run's
        # "not measured" would contradict the page's own figures), each named when several
        measured_by = [
            r.run_id for r in runs
            if ((frame["run_id"] == r.run_id) & (frame["suite"] == page.name)).any()
        ]  # fmt: skip
        related = [
            (c, v, run_id if len(measured_by) > 1 else "")
            for run_id in measured_by
            for c, v in per_run_claims[run_id]
            if page.name in claims_mod.CLAIM_SUITES.get(c.key, ())
        ]
        write(page.href, "site_sweep.html.j2", title=page.name, sweep=page, claims=related)
    write(
        "index.html",
        "site_index.html.j2",
        title="Runs",
        sweeps=pages,
        claim_counts=claims_mod.verdict_counts([v.verdict for _, v in first]),
        runs=[_run_view(r) for r in runs],
    )
    claim_links = {
        c.key: [
            (name, hrefs[name]) for name in claims_mod.CLAIM_SUITES.get(c.key, ()) if name in hrefs
        ]
        for c, _ in first
    }
    write(
        "claims.html",
        "site_claims.html.j2",
        title="Claims",
        rule=claims_mod.RULE,
        claim_links=claim_links,
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
