"""Rendering gate results: a text table, JSON, an HTML fragment, and result rows."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kvbench.suites.gate.baselines import (
    check_compatible,
    load_baseline,
    make_baseline,
    write_baseline,
)
from kvbench.suites.gate.candidates import candidate_from_run
from kvbench.suites.gate.judge import (
    GateResult,
    GateRow,
    TimingJudgement,
    compare_static,
    compare_timing,
    evaluate,
    judge_timing,
)
from kvbench.suites.gate.model import (
    CONFORMANCE_SUITE,
    FAILING,
    STATIC_METRICS,
    STATIC_SUITE,
    TIMING_SUITE,
    Baseline,
    Candidate,
    GateInputError,
    GateVerdict,
    StaticRecord,
    Thresholds,
    TimingSeries,
    config_key,
    normalize_arch,
)


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer():
        return f"{int(v)}"
    return f"{v:.4g}"


def format_table(result: GateResult, *, show_all: bool = False) -> str:
    """The verdict table as text: failing rows first, then (with `show_all`, or when
    there are few rows) the rest; a summary line at the end."""
    shown = sorted(result.rows, key=lambda r: (not r.failing, r.verdict != GateVerdict.IMPROVED))
    if not show_all:
        shown = [r for r in shown if r.verdict != GateVerdict.PASS] or []
    header = ("target", "kernel / case", "metric", "baseline", "candidate", "change", "verdict")
    lines = [
        [
            r.target,
            r.subject,
            r.metric,
            _fmt(r.baseline),
            _fmt(r.candidate),
            r.change,
            r.verdict + (f"  {r.detail}" if r.detail else ""),
        ]
        for r in shown
    ]
    widths = [max([len(h)] + [len(x[i]) for x in lines]) for i, h in enumerate(header[:-1])]
    out = []
    if lines:
        out.append(
            "  ".join(h.ljust(w) for h, w in zip(header[:-1], widths, strict=True))
            + "  "
            + header[-1]
        )
        out.extend(
            "  ".join(c.ljust(w) for c, w in zip(x[:-1], widths, strict=True)) + "  " + x[-1]
            for x in lines
        )
    counts = result.counts()
    summary = ", ".join(f"{n} {v}" for v, n in sorted(counts.items()))
    verdict = "FAIL" if result.failures else "PASS"
    hidden = len(result.rows) - len(shown)
    tail = f" ({hidden} passing rows hidden; --all shows them)" if hidden else ""
    out.extend(f"note: {n}" for n in result.notes)
    out.append(
        f"gate {verdict}: {summary or 'nothing compared'} vs {', '.join(result.baselines)}{tail}"
    )
    return "\n".join(out)


def to_json(result: GateResult) -> str:
    """The result as pretty JSON (rows, thresholds, notes, exit code)."""
    return json.dumps(result.to_dict(), indent=1)


TEMPLATE_PATH = Path(__file__).with_name("gate_fragment.html.j2")


def render_html(result: GateResult | Mapping[str, Any], *, show_all: bool = True) -> str:
    """An HTML fragment (a <section>) with the verdict table, for the report site.

    Accepts a GateResult or its `to_dict()` JSON (so the report can rebuild the page from
    a saved gate JSON alone). The template is `gate_fragment.html.j2` next to this module.
    """
    import jinja2

    data = result.to_dict() if isinstance(result, GateResult) else dict(result)
    rows = [r for r in data["rows"] if show_all or r["verdict"] != GateVerdict.PASS]
    rows.sort(key=lambda r: (r["verdict"] not in FAILING, r["verdict"] != GateVerdict.IMPROVED))
    env = jinja2.Environment(autoescape=True, undefined=jinja2.StrictUndefined)
    template = env.from_string(TEMPLATE_PATH.read_text(encoding="utf-8"))
    return template.render(gate=data, rows=rows, failing=sorted(FAILING), fmt=_fmt)


def gate_rows_as_records(result: GateResult) -> Iterable[dict[str, Any]]:
    """The verdict rows as flat dicts (for a pandas DataFrame in the report)."""
    for r in result.rows:
        yield asdict(r)


__all__ = [
    "CONFORMANCE_SUITE",
    "STATIC_METRICS",
    "STATIC_SUITE",
    "TIMING_SUITE",
    "Baseline",
    "Candidate",
    "GateInputError",
    "GateResult",
    "GateRow",
    "StaticRecord",
    "Thresholds",
    "TimingJudgement",
    "TimingSeries",
    "candidate_from_run",
    "check_compatible",
    "compare_static",
    "compare_timing",
    "config_key",
    "evaluate",
    "format_table",
    "judge_timing",
    "load_baseline",
    "make_baseline",
    "normalize_arch",
    "render_html",
    "to_json",
    "write_baseline",
]
