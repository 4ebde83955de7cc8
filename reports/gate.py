"""The regression gate: compare a candidate run with committed baselines.

Two kinds of evidence, judged differently because they fail differently:

* **Static costs** of every compiled kernel configuration (registers, spills, shared
  memory, SASS instruction count), from the ahead-of-time compile for one architecture.
  They are deterministic for a given source and triton version, so they are compared
  exactly, with a documented slack (`Thresholds`): any spill the baseline did not have
  fails; registers or shared memory above the baseline plus its slack (default 0) fail;
  SASS instructions up by more than `sass_pct` percent (default 2%) fail. A baseline
  from another triton version is not compared at all (`GateInputError`), since a compiler
  change moves every number.
* **Timing ratios** measured within one run (e.g. torch paged decode over contiguous SDPA
  on the same KV, repeats interleaved), so the machine's speed and load cancel. The
  candidate's ratio samples are compared with the baseline's by a one-sided Mann-Whitney
  U test *and* a minimum effect size on the medians: a regression needs
  p < `alpha` (default 0.01) and a median ratio up by more than `min_effect` (default
  10%). Noise alone does not pass both; a real slowdown of more than the effect size does.

A baseline file (JSON, under version control, e.g. ``reports/baselines/sm90.json``) has a
*target*: an architecture (``sm_80``, ``sm_90``) for static costs, or a timing device
(``cpu``, or ``cuda`` for GPU timings). It is written only by `make_baseline` (the
``kvbench gate --update-baseline`` command) and carries a digest of its data, so a
hand-edited, damaged or truncated file is refused rather than half-read.

A candidate comes from a results run (`reports.results`) whose rows use the suites
`STATIC_SUITE`, `TIMING_SUITE` and `CONFORMANCE_SUITE` (written by ``suites/gate``).

This module is pure comparison logic plus rendering (text table, JSON, HTML fragment);
it imports nothing from ``kernels`` or ``paged``. Unusable input raises `GateInputError`
(a KVBenchError: the CLI exits 2).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from workloads.errors import KVBenchError

#: Result-row suites a gate run writes.
STATIC_SUITE = "gate.static"
TIMING_SUITE = "gate.timing"
CONFORMANCE_SUITE = "gate.conformance"

#: Static metrics, in table order, with their units.
STATIC_METRICS: dict[str, str] = {
    "registers": "regs/thread",
    "spills": "B",
    "shared_bytes": "B",
    "sass_instructions": "instr",
}

BASELINE_KIND = "kvbench-gate-baseline"
BASELINE_SCHEMA = 1
#: Timing targets a baseline may have (architectures are "sm_NN").
TIMING_TARGETS = ("cpu", "cuda")

#: Verdicts. FAILING ones make the gate exit 1.
PASS, IMPROVED, NEW, REGRESSION, MISSING, FAILED = (
    "pass",
    "improved",
    "new",
    "REGRESSION",
    "MISSING",
    "FAILED",
)
FAILING = frozenset({REGRESSION, MISSING, FAILED})


class GateInputError(KVBenchError):
    """A baseline or candidate the gate cannot use: unreadable, truncated, hand-edited,
    from another triton version, or for another device. The CLI exits 2."""


@dataclass(frozen=True)
class Thresholds:
    """What counts as a regression (all documented defaults; the CLI can override).

    Attributes:
        register_slack: registers per thread allowed above the baseline (default 0).
        shared_slack: shared-memory bytes allowed above the baseline (default 0).
        sass_pct: percent increase in SASS instructions allowed (default 2.0).
        alpha: significance level of the one-sided Mann-Whitney U test (default 0.01).
        min_effect: smallest relative increase of the median ratio that fails (0.10).
        min_samples: fewest samples per side for a timing comparison (default 5).
    Spills have no slack: any spill the baseline did not have fails.
    """

    register_slack: int = 0
    shared_slack: int = 0
    sass_pct: float = 2.0
    alpha: float = 0.01
    min_effect: float = 0.10
    min_samples: int = 5

    def __post_init__(self) -> None:
        if self.register_slack < 0 or self.shared_slack < 0 or self.sass_pct < 0:
            raise GateInputError(f"slack must be >= 0: {self!r}")
        if not 0 < self.alpha < 1:
            raise GateInputError(f"alpha must be in (0, 1), got {self.alpha!r}")
        if self.min_effect < 0:
            raise GateInputError(f"min_effect must be >= 0, got {self.min_effect!r}")
        if self.min_samples < 2:
            raise GateInputError(f"min_samples must be >= 2, got {self.min_samples!r}")


# --------------------------------------------------------------------------- data


def normalize_arch(arch: Any) -> str:
    """'sm_80' for 80, '80', 'sm80', 'sm_80' (GateInputError otherwise)."""
    text = str(arch).strip().lower().removeprefix("sm").lstrip("_")
    if not text.isdigit():
        raise GateInputError(f"not a CUDA architecture: {arch!r} (expected e.g. sm_80)")
    return f"sm_{int(text)}"


def normalize_target(target: Any) -> str:
    """A baseline target: 'cpu', 'cuda' or an architecture 'sm_NN'."""
    text = str(target).strip().lower()
    if text in TIMING_TARGETS:
        return text
    return normalize_arch(text)


def is_arch(target: str) -> bool:
    """Whether `target` names an architecture (static costs) rather than a timing device."""
    return target.startswith("sm_")


def config_key(config: Mapping[str, Any]) -> str:
    """Canonical text of a kernel configuration (sorted keys, compact JSON)."""
    return json.dumps(dict(config), sort_keys=True, separators=(",", ":"), default=str)


@dataclass(frozen=True)
class StaticRecord:
    """Compiled costs of one kernel configuration for one architecture."""

    kernel: str
    config: dict[str, Any]
    arch: str
    registers: int
    spills: int
    shared_bytes: int
    sass_instructions: int

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kernel, config_key(self.config), self.arch)

    @property
    def label(self) -> str:
        cfg = ",".join(f"{k}={v}" for k, v in sorted(self.config.items()))
        return f"{self.kernel}[{cfg}]@{self.arch}"

    @classmethod
    def from_mapping(cls, m: Mapping[str, Any], where: str) -> StaticRecord:
        """Build from a dict (an AOT record or a baseline entry); GateInputError if bad."""
        try:
            config = m["config"]
            if isinstance(config, str):
                config = json.loads(config)
            if not isinstance(config, Mapping):
                raise TypeError("config is not an object")
            values = {name: m[name] for name in STATIC_METRICS}
            for name, v in values.items():
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v < 0:
                    raise TypeError(f"{name}={v!r} is not a non-negative number")
                if float(v) != int(v):
                    raise TypeError(f"{name}={v!r} is not a whole number")
            return cls(
                kernel=str(m["kernel"]),
                config=dict(config),
                arch=normalize_arch(m["arch"]),
                **{k: int(v) for k, v in values.items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise GateInputError(f"{where}: bad static record ({exc}): {dict(m)!r:.200}") from exc


@dataclass(frozen=True)
class TimingSeries:
    """Repeat samples of one same-run timing ratio (unitless: candidate / reference)."""

    name: str
    case: dict[str, Any]
    samples: tuple[float, ...]

    @property
    def key(self) -> str:
        return config_key({"name": self.name, **self.case})

    @property
    def label(self) -> str:
        params = ",".join(f"{k}={v}" for k, v in sorted(self.case.items()))
        return f"{self.name}[{params}]"

    @property
    def median(self) -> float:
        return statistics.median(self.samples)


@dataclass
class Candidate:
    """What a gate run measured (see `candidate_from_run`)."""

    run_id: str
    environment: dict[str, Any]
    triton_version: str | None
    static: list[StaticRecord] = field(default_factory=list)
    timing: list[TimingSeries] = field(default_factory=list)
    timing_device: str | None = None
    conformance: list[dict[str, Any]] = field(default_factory=list)
    #: kernel source hash (`kernels.aot.source_hash`) the static rows were measured on
    source_hash: str | None = None
    #: per architecture, how many static records were reused from a baseline, not compiled
    reused: dict[str, int] = field(default_factory=dict)
    #: sha256 of the frozen kernel source the `*_vs_baseline` ratios were measured against
    frozen_sha256: str | None = None
    #: this run's own torch kernel source and its sha256 (frozen into a new baseline)
    current_source: str | None = None
    current_sha256: str | None = None

    def archs(self) -> list[str]:
        return sorted({r.arch for r in self.static})

    def conformance_failures(self) -> list[str]:
        """Labels of failed conformance checks ([] when all passed)."""
        return [c["label"] for c in self.conformance if not c["passed"]]


@dataclass
class Baseline:
    """A loaded, verified baseline file."""

    path: str
    target: str
    triton_version: str | None
    created: str
    source_run: str
    environment: dict[str, Any]
    static: list[StaticRecord] = field(default_factory=list)
    timing: list[TimingSeries] = field(default_factory=list)
    source_hash: str | None = None
    #: the frozen torch kernel source (timing baselines): what `*_vs_baseline` runs against
    frozen_source: str | None = None
    frozen_sha256: str | None = None


def sha256_text(text: str) -> str:
    """Hex sha256 of a text (UTF-8)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --------------------------------------------------------------------------- candidates


def _case_without(case: Mapping[str, Any], *drop: str) -> dict[str, Any]:
    return {k: v for k, v in case.items() if k not in drop}


def timing_device_of(environment: Mapping[str, Any]) -> str:
    """'cuda' when the run's environment had CUDA, else 'cpu'."""
    return "cuda" if environment.get("cuda") else "cpu"


def candidate_from_run(run: Any) -> Candidate:
    """Collect the gate rows of a loaded results run (`reports.results.Run`).

    Static rows: suite `STATIC_SUITE`, case {kernel, arch, config (canonical JSON)},
    one row per metric. Timing rows: suite `TIMING_SUITE`, metric "ratio", case
    {name, repeat, ...parameters}; repeats of the same (name, parameters) form one series.
    Conformance rows: suite `CONFORMANCE_SUITE`, metric "passed" (1 or 0), case {check, ...}.
    Raises GateInputError when the run holds no gate rows.
    """
    env = run.environment
    gate_header = run.header.get("gate") if isinstance(run.header.get("gate"), dict) else {}
    static_parts: dict[tuple[str, str, str], dict[str, Any]] = {}
    timing_parts: dict[str, tuple[str, dict[str, Any], list[tuple[int, float]]]] = {}
    conformance: list[dict[str, Any]] = []
    triton_versions: set[str] = set()
    source_hashes: set[str] = set()
    reused: dict[str, int] = {}
    for row in run.rows:
        suite, case = row["suite"], row["case"]
        if suite == STATIC_SUITE:
            key = (str(case.get("kernel")), str(case.get("config")), str(case.get("arch")))
            part = static_parts.setdefault(
                key, {"kernel": key[0], "config": key[1], "arch": key[2]}
            )
            part[row["metric"]] = row["value"]
            if case.get("triton"):
                triton_versions.add(str(case["triton"]))
            if case.get("source_hash"):
                source_hashes.add(str(case["source_hash"]))
            if case.get("reused") and row["metric"] == "registers":
                arch = normalize_arch(key[2])
                reused[arch] = reused.get(arch, 0) + 1
        elif suite == TIMING_SUITE and row["metric"] == "ratio":
            name = str(case.get("name"))
            params = _case_without(case, "name", "repeat")
            series = TimingSeries(name, params, ())
            entry = timing_parts.setdefault(series.key, (name, params, []))
            entry[2].append((int(case.get("repeat", len(entry[2]))), float(row["value"])))
        elif suite == CONFORMANCE_SUITE and row["metric"] == "passed":
            label = ",".join(f"{k}={v}" for k, v in sorted(case.items()))
            conformance.append({"label": label, "case": dict(case), "passed": row["value"] >= 1})
    if not (static_parts or timing_parts or conformance):
        raise GateInputError(
            f"run {run.run_id} ({run.path}) holds no gate rows (suites {STATIC_SUITE}, "
            f"{TIMING_SUITE}); measure one with `kvbench gate` (no --candidate)"
        )
    static = [
        StaticRecord.from_mapping(p, f"run {run.run_id}") for _, p in sorted(static_parts.items())
    ]
    timing = [
        TimingSeries(name, params, tuple(v for _, v in sorted(samples)))
        for name, params, samples in timing_parts.values()
    ]
    if len(triton_versions) > 1:
        raise GateInputError(
            f"run {run.run_id} mixes static rows from triton {sorted(triton_versions)}"
        )
    if len(source_hashes) > 1:
        raise GateInputError(
            f"run {run.run_id} mixes static rows of kernel sources {sorted(source_hashes)}"
        )
    triton = next(iter(triton_versions), None) or env.get("triton")
    return Candidate(
        run_id=run.run_id,
        environment=env,
        triton_version=str(triton) if triton else None,
        static=static,
        timing=timing,
        timing_device=timing_device_of(env) if timing else None,
        conformance=conformance,
        source_hash=next(iter(source_hashes), None),
        reused=reused,
        frozen_sha256=gate_header.get("frozen_sha256"),
        current_source=gate_header.get("current_source"),
        current_sha256=gate_header.get("current_sha256"),
    )


# --------------------------------------------------------------------------- baselines


def _digest(
    target: str,
    triton: str | None,
    source: str | None,
    static: list[dict],
    timing: list[dict],
    frozen: str | None = None,
) -> str:
    body = json.dumps(
        {
            "frozen": frozen,
            "target": target,
            "triton": triton,
            "source": source,
            "static": static,
            "timing": timing,
        },
        sort_keys=True,
        separators=(",", ":"),
    )
    return "sha256:" + hashlib.sha256(body.encode("utf-8")).hexdigest()


def _static_entry(r: StaticRecord) -> dict[str, Any]:
    return {
        "kernel": r.kernel,
        "config": dict(sorted(r.config.items())),
        "arch": r.arch,
        **{m: getattr(r, m) for m in STATIC_METRICS},
    }


def _timing_entry(t: TimingSeries) -> dict[str, Any]:
    return {
        "name": t.name,
        "case": dict(sorted(t.case.items())),
        "median": t.median,
        "samples": list(t.samples),
    }


def make_baseline(candidate: Candidate, target: str, created: str) -> dict[str, Any]:
    """The baseline document for `target` from a candidate run.

    Refuses (GateInputError) a candidate that failed conformance, that has no
    conformance record, or that lacks data for the target. `created` is an ISO time.
    """
    target = normalize_target(target)
    if not candidate.conformance:
        raise GateInputError(
            f"refusing to write a {target} baseline from run {candidate.run_id}: it has no "
            f"conformance record (suite {CONFORMANCE_SUITE}); measure it with `kvbench gate`"
        )
    failed = candidate.conformance_failures()
    if failed:
        raise GateInputError(
            f"refusing to write a {target} baseline from run {candidate.run_id}: it failed "
            f"conformance ({len(failed)} check(s): {'; '.join(failed[:3])})"
        )
    static: list[dict[str, Any]] = []
    timing: list[dict[str, Any]] = []
    frozen: dict[str, Any] | None = None
    if is_arch(target):
        records = [r for r in candidate.static if r.arch == target]
        if not records:
            raise GateInputError(
                f"run {candidate.run_id} has no static metrics for {target} "
                f"(it has: {', '.join(candidate.archs()) or 'none'})"
            )
        if candidate.reused.get(target):
            raise GateInputError(
                f"refusing to write a {target} baseline from run {candidate.run_id}: its "
                f"static costs were reused from a baseline, not compiled; measure with --full"
            )
        static = [_static_entry(r) for r in sorted(records, key=lambda r: r.key)]
        triton = candidate.triton_version
        source = candidate.source_hash
    else:
        if candidate.timing_device != target or not candidate.timing:
            raise GateInputError(
                f"run {candidate.run_id} has no {target} timings "
                f"(its timings: {candidate.timing_device or 'none'})"
            )
        if candidate.frozen_sha256 != candidate.current_sha256 or not candidate.current_source:
            raise GateInputError(
                f"refusing to write a {target} baseline from run {candidate.run_id}: its "
                "ratios were measured against another baseline's frozen kernels, not its "
                "own; measure with `kvbench gate --update-baseline`"
            )
        timing = [_timing_entry(t) for t in sorted(candidate.timing, key=lambda t: t.key)]
        triton = candidate.triton_version
        source = None
        frozen = {
            "path": "kernels/torch_ops.py",
            "sha256": candidate.current_sha256,
            "source": candidate.current_source,
        }
    env = candidate.environment
    keep = ("device", "cpu_model", "python", "torch", "triton", "torch_threads", "git_revision")
    return {
        "kind": BASELINE_KIND,
        "schema": BASELINE_SCHEMA,
        "target": target,
        "triton_version": triton,
        "source_hash": source,
        "created": created,
        "source_run": candidate.run_id,
        "environment": {k: env.get(k) for k in keep if k in env},
        "counts": {"static": len(static), "timing": len(timing)},
        "static": static,
        "timing": timing,
        "frozen": frozen,
        "digest": _digest(
            target, triton, source, static, timing, frozen["sha256"] if frozen else None
        ),
    }


def write_baseline(doc: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a baseline document atomically (temp file + rename), pretty-printed."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    os.replace(tmp, out)
    return out


def load_baseline(path: str | os.PathLike[str]) -> Baseline:
    """Load and verify a baseline file; GateInputError naming the file and the problem
    for a missing, truncated, foreign, newer-schema or hand-edited file."""
    p = Path(path)
    if not p.is_file():
        raise GateInputError(f"baseline {p} does not exist (write one with --update-baseline)")
    text = p.read_text(encoding="utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as exc:
        hint = "" if text.rstrip().endswith("}") else " (the file looks truncated)"
        raise GateInputError(
            f"baseline {p} is not valid JSON{hint}: {exc.msg} at line {exc.lineno}"
        ) from exc
    if not isinstance(doc, dict) or doc.get("kind") != BASELINE_KIND:
        raise GateInputError(f"{p} is not a kvbench gate baseline (no kind={BASELINE_KIND!r})")
    schema = doc.get("schema")
    if not isinstance(schema, int) or schema > BASELINE_SCHEMA or schema < 1:
        raise GateInputError(
            f"baseline {p} has schema {schema!r}; this kvbench reads schema {BASELINE_SCHEMA}"
        )
    missing = [k for k in ("target", "static", "timing", "digest", "counts") if k not in doc]
    if missing:
        raise GateInputError(f"baseline {p} lacks {', '.join(missing)} (truncated or edited?)")
    target = normalize_target(doc["target"])
    static_raw, timing_raw = doc["static"], doc["timing"]
    if not isinstance(static_raw, list) or not isinstance(timing_raw, list):
        raise GateInputError(f"baseline {p}: 'static' and 'timing' must be lists")
    counts = doc["counts"] if isinstance(doc["counts"], dict) else {}
    if counts.get("static") != len(static_raw) or counts.get("timing") != len(timing_raw):
        raise GateInputError(
            f"baseline {p} is truncated: it declares {counts.get('static')} static and "
            f"{counts.get('timing')} timing entries but holds {len(static_raw)} and "
            f"{len(timing_raw)}"
        )
    triton = doc.get("triton_version")
    source = doc.get("source_hash")
    frozen = doc.get("frozen") if isinstance(doc.get("frozen"), dict) else None
    frozen_sha = frozen.get("sha256") if frozen else None
    if frozen and sha256_text(str(frozen.get("source", ""))) != frozen_sha:
        raise GateInputError(f"baseline {p}: its frozen kernel source does not match its sha256")
    if _digest(target, triton, source, static_raw, timing_raw, frozen_sha) != doc["digest"]:
        raise GateInputError(
            f"baseline {p} does not match its digest: it was edited by hand or damaged; "
            "regenerate it with `kvbench gate --update-baseline`"
        )
    static = [StaticRecord.from_mapping(e, f"baseline {p}") for e in static_raw]
    if any(r.arch != target for r in static):
        raise GateInputError(f"baseline {p} (target {target}) holds records of another arch")
    timing: list[TimingSeries] = []
    for e in timing_raw:
        try:
            samples = tuple(float(x) for x in e["samples"])
            timing.append(TimingSeries(str(e["name"]), dict(e["case"]), samples))
        except (KeyError, TypeError, ValueError) as exc:
            raise GateInputError(f"baseline {p}: bad timing entry {e!r:.200}") from exc
    if not static and not timing:
        raise GateInputError(f"baseline {p} holds no entries")
    return Baseline(
        path=str(p),
        target=target,
        triton_version=str(triton) if triton else None,
        created=str(doc.get("created", "")),
        source_run=str(doc.get("source_run", "")),
        environment=dict(doc.get("environment") or {}),
        static=static,
        timing=timing,
        source_hash=str(source) if source else None,
        frozen_source=str(frozen["source"]) if frozen else None,
        frozen_sha256=str(frozen_sha) if frozen_sha else None,
    )


def check_compatible(baseline: Baseline, candidate: Candidate) -> list[str]:
    """Raise GateInputError when `candidate` cannot be compared with `baseline` (other
    triton version for static costs, other architecture or timing device); return notes
    on differences that are reported but allowed (torch version, CPU model)."""
    notes: list[str] = []
    if is_arch(baseline.target):
        if baseline.target not in candidate.archs():
            raise GateInputError(
                f"baseline {baseline.path} is for {baseline.target}, but run "
                f"{candidate.run_id} has static metrics only for "
                f"{', '.join(candidate.archs()) or 'no architecture'}"
            )
        if baseline.triton_version != candidate.triton_version:
            raise GateInputError(
                f"baseline {baseline.path} was compiled with triton "
                f"{baseline.triton_version}, run {candidate.run_id} with triton "
                f"{candidate.triton_version}: static costs are not comparable across "
                "compiler versions and were not compared; regenerate the baseline with "
                "`kvbench gate --update-baseline` on the new version"
            )
        if candidate.reused.get(baseline.target):
            notes.append(
                f"{baseline.target}: {candidate.reused[baseline.target]} configurations reused "
                f"from the baseline, not recompiled: kernel sources unchanged (hash "
                f"{candidate.source_hash}); --full recompiles"
            )
    else:
        if candidate.timing_device != baseline.target:
            raise GateInputError(
                f"baseline {baseline.path} holds {baseline.target} timings, but run "
                f"{candidate.run_id} measured {candidate.timing_device or 'no timings'}"
            )
        uses_frozen = any(t.name.endswith("_vs_baseline") for t in candidate.timing)
        if uses_frozen and candidate.frozen_sha256 != baseline.frozen_sha256:
            raise GateInputError(
                f"run {candidate.run_id} measured its *_vs_baseline ratios against frozen "
                f"kernels {str(candidate.frozen_sha256)[:12]}, not the ones in "
                f"{baseline.path} ({str(baseline.frozen_sha256)[:12]}); measure it with "
                f"`kvbench gate --baseline {baseline.path}`"
            )
        b_env, c_env = baseline.environment, candidate.environment
        for key in ("device", "cpu_model", "torch", "torch_threads"):
            if key in b_env and b_env.get(key) != c_env.get(key):
                notes.append(
                    f"{baseline.target} timings: {key} differs (baseline {b_env.get(key)!r}, "
                    f"candidate {c_env.get(key)!r}); ratios compared anyway"
                )
    return notes


# --------------------------------------------------------------------------- judging


@dataclass(frozen=True)
class GateRow:
    """One line of the verdict table."""

    target: str
    subject: str
    metric: str
    baseline: float | None
    candidate: float | None
    change: str
    verdict: str
    detail: str = ""

    @property
    def failing(self) -> bool:
        return self.verdict in FAILING


def _pct(old: float, new: float) -> str:
    if old == new:
        return "0"
    if old == 0:
        return f"+{new:g} (from 0)"
    return f"{(new - old) / old * 100:+.1f}%"


def compare_static(
    target: str,
    baseline: Sequence[StaticRecord],
    candidate: Sequence[StaticRecord],
    th: Thresholds,
) -> list[GateRow]:
    """Verdict rows for the static costs of one architecture.

    Every (kernel, config) and metric present on both sides gives a row. A configuration
    missing from the candidate is MISSING (removing one needs a deliberate baseline
    update); one only in the candidate is NEW (passes unless it spills).
    """
    rows: list[GateRow] = []
    base = {r.key: r for r in baseline if r.arch == target}
    cand = {r.key: r for r in candidate if r.arch == target}
    limits = {
        "registers": lambda b: b + th.register_slack,
        "shared_bytes": lambda b: b + th.shared_slack,
        "sass_instructions": lambda b: b * (1 + th.sass_pct / 100),
        "spills": lambda b: b,
    }
    for key in sorted(base.keys() | cand.keys()):
        b, c = base.get(key), cand.get(key)
        label = (c or b).label  # type: ignore[union-attr]
        if c is None:
            rows.append(
                GateRow(
                    target,
                    label,
                    "config",
                    None,
                    None,
                    "",
                    MISSING,
                    "in the baseline, not compiled by the candidate",
                )
            )
            continue
        if b is None:
            spill = c.spills > 0
            rows.append(
                GateRow(
                    target,
                    label,
                    "spills",
                    None,
                    c.spills,
                    "",
                    REGRESSION if spill else NEW,
                    "new configuration" + (" that spills" if spill else ""),
                )
            )
            continue
        for metric in STATIC_METRICS:
            old, new = getattr(b, metric), getattr(c, metric)
            limit = limits[metric](old)
            if new > limit:
                verdict = REGRESSION
                detail = (
                    f"new spill ({new} B)"
                    if metric == "spills" and old == 0
                    else f"above baseline {old}"
                    + (f" + slack (limit {limit:g})" if limit != old else "")
                )
            elif new < old:
                verdict, detail = IMPROVED, "below baseline: consider --update-baseline"
            else:
                verdict, detail = PASS, ""
            rows.append(GateRow(target, label, metric, old, new, _pct(old, new), verdict, detail))
    return rows


@dataclass(frozen=True)
class TimingJudgement:
    """Outcome of `judge_timing` on one pair of sample sets."""

    verdict: str
    effect: float  # median(candidate) / median(baseline) - 1
    p_slower: float  # one-sided p-value that the candidate is slower
    p_faster: float


def judge_timing(
    baseline: Sequence[float], candidate: Sequence[float], th: Thresholds
) -> TimingJudgement:
    """Mann-Whitney U (one-sided each way) plus a minimum effect on the medians.

    REGRESSION when the candidate is significantly larger (p < alpha) and its median is
    more than `min_effect` above the baseline's; IMPROVED symmetrically; PASS otherwise.
    """
    from scipy.stats import mannwhitneyu

    if len(baseline) < th.min_samples or len(candidate) < th.min_samples:
        raise GateInputError(
            f"timing comparison needs >= {th.min_samples} samples per side, got "
            f"{len(baseline)} baseline and {len(candidate)} candidate"
        )
    if not all(math.isfinite(x) and x > 0 for x in (*baseline, *candidate)):
        raise GateInputError("timing samples must be finite and positive")
    mb, mc = statistics.median(baseline), statistics.median(candidate)
    effect = mc / mb - 1
    p_slower = float(mannwhitneyu(candidate, baseline, alternative="greater").pvalue)
    p_faster = float(mannwhitneyu(candidate, baseline, alternative="less").pvalue)
    if p_slower < th.alpha and effect > th.min_effect:
        verdict = REGRESSION
    elif p_faster < th.alpha and effect < -th.min_effect:
        verdict = IMPROVED
    else:
        verdict = PASS
    return TimingJudgement(verdict, effect, p_slower, p_faster)


def compare_timing(
    target: str,
    baseline: Sequence[TimingSeries],
    candidate: Sequence[TimingSeries],
    th: Thresholds,
) -> list[GateRow]:
    """Verdict rows for same-run timing ratios (median ratio shown; see `judge_timing`)."""
    rows: list[GateRow] = []
    base = {t.key: t for t in baseline}
    cand = {t.key: t for t in candidate}
    for key in sorted(base.keys() | cand.keys()):
        b, c = base.get(key), cand.get(key)
        label = (c or b).label  # type: ignore[union-attr]
        if c is None:
            rows.append(
                GateRow(
                    target,
                    label,
                    "ratio",
                    b.median,
                    None,
                    "",
                    MISSING,  # type: ignore[union-attr]
                    "in the baseline, not measured by the candidate",
                )
            )
            continue
        if b is None:
            rows.append(
                GateRow(
                    target, label, "ratio", None, c.median, "", NEW, "no baseline for this case"
                )
            )
            continue
        j = judge_timing(b.samples, c.samples, th)
        detail = (
            f"p={j.p_slower:.2g} (slower), min effect {th.min_effect:.0%}, "
            f"n={len(b.samples)}/{len(c.samples)}"
        )
        if j.verdict == IMPROVED:
            detail = f"p={j.p_faster:.2g} (faster): consider --update-baseline"
        rows.append(
            GateRow(
                target,
                label,
                "ratio",
                b.median,
                c.median,
                f"{j.effect * 100:+.1f}%",
                j.verdict,
                detail,
            )
        )
    return rows


@dataclass
class GateResult:
    """Everything the gate decided: rows, notes, and the exit status."""

    candidate_run: str
    baselines: list[str]
    thresholds: Thresholds
    rows: list[GateRow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def failures(self) -> list[GateRow]:
        return [r for r in self.rows if r.failing]

    @property
    def exit_code(self) -> int:
        """0 pass, 1 regression (unusable input raises before a result exists)."""
        return 1 if self.failures else 0

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            out[r.verdict] = out.get(r.verdict, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "candidate_run": self.candidate_run,
            "baselines": self.baselines,
            "thresholds": asdict(self.thresholds),
            "passed": not self.failures,
            "exit_code": self.exit_code,
            "counts": self.counts(),
            "notes": self.notes,
            "rows": [asdict(r) for r in self.rows],
        }


def evaluate(
    baselines: Sequence[Baseline], candidate: Candidate, th: Thresholds = Thresholds()
) -> GateResult:
    """Compare `candidate` with every baseline (after `check_compatible`), plus its own
    conformance record: a failed check is a FAILED row."""
    if not baselines:
        raise GateInputError("no baseline given")
    result = GateResult(candidate.run_id, [b.path for b in baselines], th)
    for b in baselines:
        result.notes.extend(check_compatible(b, candidate))
    for c in candidate.conformance:
        if not c["passed"]:
            result.rows.append(
                GateRow(
                    "conformance",
                    c["label"],
                    "oracle",
                    None,
                    None,
                    "",
                    FAILED,
                    "kernel output outside the oracle tolerance",
                )
            )
    for b in baselines:
        if is_arch(b.target):
            result.rows.extend(compare_static(b.target, b.static, candidate.static, th))
        else:
            result.rows.extend(compare_timing(b.target, b.timing, candidate.timing, th))
    return result


# --------------------------------------------------------------------------- rendering


def _fmt(v: float | None) -> str:
    if v is None:
        return "-"
    if float(v).is_integer():
        return f"{int(v)}"
    return f"{v:.4g}"


def format_table(result: GateResult, *, show_all: bool = False) -> str:
    """The verdict table as text: failing rows first, then (with `show_all`, or when
    there are few rows) the rest; a summary line at the end."""
    shown = sorted(result.rows, key=lambda r: (not r.failing, r.verdict != IMPROVED))
    if not show_all:
        shown = [r for r in shown if r.verdict != PASS] or []
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
    rows = [r for r in data["rows"] if show_all or r["verdict"] != PASS]
    rows.sort(key=lambda r: (r["verdict"] not in FAILING, r["verdict"] != IMPROVED))
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
