"""Build the static HTML report from result files alone.

    build_site(runs, out_dir) -> out_dir/index.html

Pages: `index.html` (runs with their environments, skipped lines, sweeps waiting for a
module, and the list of sweeps), one `sweep-<name>.html` per sweep (its figures and its
table, with the related published claims), `claims.html` (every claim of the seed
literature with source, measured value and verdict, per run) and, with two or more runs,
`compare.html` (the first two runs side by side). Figures are SVG files under `figures/`;
nothing is fetched from the network, so the folder can be published as it is.

All text that comes from result files is escaped by jinja2's autoescaping; figure text is
drawn as paths (no markup from the data reaches the SVG as text).
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jinja2
import pandas as pd

from reports import claims as claims_mod
from reports import figures, tables
from reports.results import ResultsError, Run, to_frame

TEMPLATE_DIR = Path(__file__).resolve().parent


@dataclass
class SweepPage:
    name: str
    href: str
    description: str
    cases: int
    header: list[str] = field(default_factory=list)
    rows: list[list[str]] = field(default_factory=list)
    n_keys: int = 0
    figure_files: list[dict[str, str]] = field(default_factory=list)

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


def _sweep_page(
    name: str, frame: pd.DataFrame, href: str, description: str, fig_dir: Path
) -> SweepPage:
    keys, metrics, rows = tables.wide(frame)
    unit = tables.units(frame)
    page = SweepPage(name, href, description, len(rows))
    page.header = keys + [f"{m} [{unit.get(m, '')}]" if unit.get(m) else m for m in metrics]
    page.n_keys = len(keys)
    for row in rows:
        cells = [tables.format_value(v) for v in row[: len(keys)]]
        cells += [
            tables.format_value(v, unit.get(m, ""))
            for v, m in zip(row[len(keys) :], metrics, strict=True)
        ]
        page.rows.append(cells)
    for i, spec in enumerate(figures.specs_for(name)):
        svg = figures.render(frame, spec)
        if svg is None:
            continue
        fname = f"{_slug(name)}-{i}.svg"
        (fig_dir / fname).write_text(svg, encoding="utf-8")
        page.figure_files.append({"src": f"figures/{fname}", "title": spec.title})
    return page


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
        if not run.rows:
            raise ResultsError(f"run {run.run_id} ({run.path}) has no measurements to report")
    out = Path(out_dir)
    fig_dir = out / "figures"
    if fig_dir.exists():
        shutil.rmtree(fig_dir)
    fig_dir.mkdir(parents=True)
    for old in out.glob("*.html"):
        old.unlink()
    env = _env()
    frame = tables.latest(to_frame(runs))
    descriptions = _descriptions(runs)
    suites = list(dict.fromkeys(frame["suite"]))
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
        for s in suites
    ]
    common = {
        "generated": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "has_compare": len(runs) >= 2,
        "has_gate": bool(gates),
        "nav_sweeps": [{"name": p.name, "href": p.href} for p in pages],
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
            "ratio": "" if pd.isna(r.ratio) else f"{r.ratio:.3f}",
        }
        for r in both.itertuples(index=False)
    ]
    claim_rows = [
        (ca, va, vb) for (ca, va), (_, vb) in zip(claims[a.run_id], claims[b.run_id], strict=True)
    ]
    return {"a": a, "b": b, "env_rows": env_rows, "rows": rows, "claim_rows": claim_rows}
